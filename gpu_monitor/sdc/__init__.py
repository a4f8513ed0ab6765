"""Silent-data-corruption checks for PyTorch DDP training (SPEC-SDC.md; docs/sdc.md).

The public API a training script imports::

    from gpu_monitor.sdc import Schedule, attach, check_topology, rank_map, train, write_report

Names resolve lazily (PEP 562), so importing this package costs nothing and loads no torch; the
pure ring/vote logic in ``gpu_monitor.sdc.localize`` never needs torch (the node probe reuses it
in the daemon process).
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "fingerprints": "gpu_monitor.sdc.fingerprint",
    "attach": "gpu_monitor.sdc.hooks",
    "GradStats": "gpu_monitor.sdc.hooks",
    "Schedule": "gpu_monitor.sdc.schedule",
    "train": "gpu_monitor.sdc.train",
    "find_divergent_ranks": "gpu_monitor.sdc.weights",
    "check_topology": "gpu_monitor.sdc.topology",
    "rank_map": "gpu_monitor.sdc.topology",
    "write_report": "gpu_monitor.sdc.report",
    "build_report": "gpu_monitor.sdc.report",
    "deterministic_mode": "gpu_monitor.sdc.replay",
    "replay": "gpu_monitor.sdc.replay",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'gpu_monitor.sdc' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
