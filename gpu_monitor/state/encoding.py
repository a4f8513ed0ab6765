"""How values go into the store's columns: times as integer microseconds, maps as JSON text.

Why it exists: every table keeps times and JSON the same way, and one definition keeps them
comparable across tables and releases. Integer microseconds since the Unix epoch (UTC) are
exact and order numerically, which ISO text with optional fractions does not.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime, timedelta, timezone
from enum import Enum
from types import MappingProxyType
from typing import Any

from gpu_monitor.model import iso

__all__ = ["dumps", "from_us", "loads_mapping", "to_us"]

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def to_us(ts: datetime) -> int:
    if ts.tzinfo is None:
        raise ValueError("naive datetime: gpu-monitor timestamps are always UTC-aware")
    delta = ts - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def from_us(us: int) -> datetime:
    return _EPOCH + timedelta(microseconds=us)


def _json_default(value: Any) -> Any:
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    if isinstance(value, datetime):
        return iso(value)
    if isinstance(value, Enum):
        return value.value
    raise TypeError(f"cannot store a {type(value).__name__} as JSON: {value!r:.80}")


def dumps(value: Any) -> str:
    return json.dumps(value, default=_json_default, sort_keys=True, separators=(",", ":"))


def loads_mapping(text: str) -> Mapping[str, Any]:
    value = json.loads(text) if text else {}
    return MappingProxyType(value if isinstance(value, dict) else {"value": value})

