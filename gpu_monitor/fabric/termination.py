"""The termination message: how a probe or check pod hands its summary back to the scheduler.

Why a module: Kubernetes keeps at most 4096 bytes of a container's termination message, and
the scheduler reads the outcome from it (pod status, no logs, no volume). Both the fabric probe
and the single-node check pods write one; both must fit the limit by dropping list entries, never
by cutting the JSON, and both are read back only when they are what they claim to be.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

log = logging.getLogger(__name__)

TERMINATION_LOG_LIMIT = 4096  # bytes Kubernetes keeps of a termination message


def encoded_size(summary: dict[str, Any]) -> int:
    return len(json.dumps(summary, separators=(",", ":")).encode())


def fit(summary: dict[str, Any], list_key: str, flag_key: str,
        limit: int = TERMINATION_LOG_LIMIT) -> dict[str, Any]:
    """Halve ``summary[list_key]`` until the compact JSON fits ``limit``; mark ``flag_key``."""
    while encoded_size(summary) > limit and summary[list_key]:
        summary[list_key] = summary[list_key][: len(summary[list_key]) // 2]
        summary[flag_key] = True
    return summary


def parse(text: str | None, kind: str, schema: int | None = None) -> dict[str, Any] | None:
    """The summary in a termination message, or None if it is not one of ``kind`` (and
    ``schema``, when given)."""
    if not text:
        return None
    try:
        data = json.loads(text)
    except ValueError:
        return None
    if not isinstance(data, dict) or data.get("kind") != kind:
        return None
    if schema is not None and data.get("schema") != schema:
        return None
    return data


def write(path: str, summary: Mapping[str, Any]) -> None:
    """Write the compact JSON to ``path`` (at most the limit); a pod that cannot write its
    termination message still exits with its code, so a failure is logged, not raised."""
    data = json.dumps(summary, separators=(",", ":"))
    try:
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(data[:TERMINATION_LOG_LIMIT])
    except OSError as exc:
        log.warning("cannot write the termination message to %s: %s", path, exc)
