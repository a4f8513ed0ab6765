"""Idle-time active checks: multi-node fabric probes, their scheduler and bisection, and
periodic single-node checks on idle nodes (docs/fabric.md).

- ``probe``: ``gpu-monitor fabric-probe``, one rank of an all-reduce/all-gather sweep under
  torchrun or an Indexed Job: the command; ``probe_env`` (where the rank sits, the test-only
  fault seam), ``probe_settings`` (the sweep and its limits), ``transport`` (what NCCL's INFO
  lines say carried the traffic), ``probe_rank`` (the timed, exactly checked collectives: the
  only module that imports torch, when it runs) and ``probe_result`` (the group's judgement,
  result and termination summary; the arithmetic is ``gpu_monitor.nccl``'s);
- ``bisect``: the pure bisection planner that names the bad node of a failed group;
- ``idle``: when a node counts as idle and due, and the single-node active-check Job;
- ``scheduler``: the Lease-led loop of ``gpu-monitor fabric-scheduler`` that finds idle
  nodes, launches probe Jobs, bisects failures and files ``GPUHealthReport`` objects;
  ``scheduler_command`` is the command that builds it, ``scheduler_settings`` what it is told;
- ``api``, ``lease``, ``plan``, ``in_flight``, ``records``, ``metrics``, ``cache``: the
  scheduler's Kubernetes calls, its Lease election, its pure planning (groups, Jobs, probe
  state), the Jobs and bisections it is in the middle of, its per-node record in a ConfigMap,
  its ``/metrics`` and its list-watch cache of nodes and active pods;
- ``termination``: the summary a probe or check pod leaves in its termination message;
- ``cli``: the ``register`` functions the main command line calls.

Importing this package imports none of torch, pynvml or kubernetes.
"""

from __future__ import annotations
