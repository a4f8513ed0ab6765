"""Immutable nested data: the read-only mappings a ``Profile`` and a ``Config`` hold.

A profile is deep-merged several times (the ``simulation`` block, ``profile_overrides``, the
checks' declared defaults) and handed to every check; freezing it means no check can change
what the next one reads.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# One freeze for every frozen value: the results' details are frozen by the same code.
from gpu_monitor.model import freeze, thaw

__all__ = ["deep_merge", "dig", "freeze", "thaw"]


def deep_merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """``over`` merged into a copy of ``base``: mappings merge key by key; lists, scalars and
    null replace."""
    out = thaw(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = thaw(value)
    return out


def dig(data: Any, dotted: str) -> Any:
    """The value at a dotted path (``"nvlink.links_per_gpu"``, ``"rdma.ports.0"``), or None."""
    cur = data
    for part in dotted.split("."):
        if isinstance(cur, Mapping):
            if part not in cur:
                return None
            cur = cur[part]
        elif isinstance(cur, (list, tuple)) and part.isdigit() and int(part) < len(cur):
            cur = cur[int(part)]
        else:
            return None
    return cur
