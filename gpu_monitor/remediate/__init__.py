"""Remediation: from stored results to conditions, Events, quarantine and the fleet breaker.

Layers (DESIGN.md §7), each usable alone:

- ``policy``: pure decisions (results + node facts + settings -> operations), table-tested;
- ``lifecycle``: the per-node quarantine state machine and ``Remediator``, the daemon's entry
  point (``on_results``, ``tick``, ``start``/``stop``);
- ``kube``: the only module importing ``kubernetes`` (lazily): the wire, our Node's writes,
  ``RBAC_RULES``; ``drain``: kubectl-compatible eviction; ``breaker``: the fleet circuit
  breaker; ``reports``: GPUHealthReports and dropped report files;
- ``metrics``: the extra Prometheus collector; ``cli``: ``breaker`` and ``quarantine``.

Importing this package never imports ``kubernetes``.
"""

from __future__ import annotations

from gpu_monitor.remediate.lifecycle import Remediator, ResetOutcome
from gpu_monitor.remediate.policy import Op, PolicySettings, decide, observe

__all__ = ["Op", "PolicySettings", "Remediator", "ResetOutcome", "decide", "observe"]
