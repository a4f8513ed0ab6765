"""What a Kubernetes request can answer besides a success, as exceptions that carry meaning.

Why apart: callers (the remediator, the breaker, the drain, the fabric scheduler, the CLIs)
decide on the kind of failure - a 409 to re-read, a 429 to wait, an unreachable server to try
again later - and must be able to name these types without loading the ``kubernetes`` package.
``error_from`` turns the client's ``ApiException`` into a ``KubeError`` (status, reason, the
decoded Status body, Retry-After); ``is_transport`` says whether an exception is the wire's.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

__all__ = [
    "KubeConfigError",
    "KubeError",
    "KubeThrottled",
    "KubeUnavailable",
    "error_from",
    "is_transport",
]


class KubeError(Exception):
    """An answer from the API server that is not a success."""

    def __init__(self, status: int, reason: str = "", message: str = "",
                 body: Mapping[str, Any] | None = None, retry_after: float = 0.0):
        super().__init__(f"{status} {reason}: {message}".strip())
        self.status = status
        self.reason = reason
        self.message = message
        self.body = dict(body or {})
        self.retry_after = retry_after

    @property
    def causes(self) -> list[Mapping[str, Any]]:
        return list((self.body.get("details") or {}).get("causes") or [])

    def has_cause(self, reason: str) -> bool:
        return any(c.get("reason") == reason for c in self.causes)


class KubeUnavailable(KubeError):
    """The API server could not be reached (or kept failing) until the retry deadline."""

    def __init__(self, message: str, retry_after: float = 0.0):
        super().__init__(0, "Unavailable", message, retry_after=retry_after)


class KubeThrottled(KubeUnavailable):
    """A write that asked not to wait found no rate-limiter token free (nothing was sent)."""


class KubeConfigError(ValueError):
    """A kubeconfig (``--kubeconfig`` / ``--context``) that cannot be used; says why."""



def error_from(exc: Exception) -> KubeError:
    status = int(getattr(exc, "status", 0) or 0)
    raw = getattr(exc, "body", None)
    body: dict[str, Any] = {}
    if raw:
        try:
            body = json.loads(raw if isinstance(raw, str) else raw.decode("utf-8", "replace"))
        except (ValueError, AttributeError):
            body = {"message": str(raw)[:500]}
    headers = getattr(exc, "headers", None) or {}
    retry = 0.0
    try:
        retry = float(headers.get("Retry-After") or 0)
    except (TypeError, ValueError, AttributeError):
        retry = 0.0
    retry = retry or float((body.get("details") or {}).get("retryAfterSeconds") or 0)
    return KubeError(status, str(body.get("reason") or getattr(exc, "reason", "") or ""),
                     str(body.get("message") or ""), body, retry)


def is_transport(exc: BaseException) -> bool:
    try:
        import urllib3
    except ImportError:  # pragma: no cover
        return isinstance(exc, OSError)
    return isinstance(exc, (urllib3.exceptions.HTTPError, OSError))

