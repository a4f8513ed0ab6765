"""Remediation: from stored results to conditions, Events, quarantine and the fleet breaker.

Layers (DESIGN.md §7), each usable alone:

- ``policy``: pure decisions (results + node facts + settings -> operations), table-tested;
- ``remediator``: ``Remediator``, the daemon's entry point (``on_results``, ``tick``,
  ``start``/``stop``), built with its settings (``settings``), a node delivery and an actuator;
- ``lifecycle`` and ``recovery``: the per-node quarantine state machine; ``record``: the
  quarantine record it resumes from; ``memory``: the policy's persisted state;
- ``delivery``: ``NodeDelivery``, the one interface every write to the node goes through, and
  ``k8s/``, its Kubernetes implementation (our Node, the drain, the breaker ConfigMap);
- ``actuator``: what the remediator asks of its host (gpu_monitor/host_actuator.py does it);
- ``breaker``: what every fleet breaker answers; ``events``: the bounded notice queue;
  ``reports``: GPUHealthReports and dropped report files; ``bootstrap_gate``: the provisioning
  gate;
- ``metrics``: the extra Prometheus collector; ``cli``: ``breaker`` and ``quarantine``.

Importing this package (or any module in it) never imports ``kubernetes``; nothing here imports
``hw/``.
"""
