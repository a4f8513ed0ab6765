"""Per-device torch workers for the active checks (burn_in, nccl_allreduce, nvlink_peer).

``pool`` is the parent side (stdlib only: the daemon and CLI never import torch) and the worker
entry point (``python -m gpu_monitor.workers.pool``); ``device`` is the device-agnostic torch
layer that only worker processes import. docs/active-checks.md describes how they run.

Names resolve lazily (PEP 562) so that running ``-m gpu_monitor.workers.pool`` does not import
the module twice.
"""

from __future__ import annotations

from typing import Any

__all__ = ["WORKER_REASONS", "DeviceRef", "Outcome", "Task", "WorkerContext", "WorkerPool"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from gpu_monitor.workers import pool

        return getattr(pool, name)
    raise AttributeError(f"module 'gpu_monitor.workers' has no attribute {name!r}")
