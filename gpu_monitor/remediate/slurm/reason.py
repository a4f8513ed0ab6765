"""The drain Reason gpu-monitor writes, and reading it back: which drains are ours.

The form (one line, no ``=`` so that it never looks like a field of ``scontrol show node``)::

    gpu-monitor: <Reason> <check> <target> [...] state:<lifecycle state> since:<time>

- ``<Reason>`` is the finding's reason token (``Xid79``, ``RowRemapFailure``), then the check
  and target(s) it was found on, as far as the length allows;
- ``state:`` mirrors the quarantine lifecycle (``claim`` while the breaker decides,
  ``quarantined``, ``retesting``, ``reboot-required``, ``replace``);
- ``since:`` is the Slurm time of our first drain of this quarantine: slurmctld re-stamps the
  reason on every update, the breaker orders our drains by when they were first made.

Length: slurmctld 22.05 keeps a reason of 100 000 characters verbatim (tests/slurm pins that
and ``MAX_LEN``); ``sinfo -R`` and ``scontrol show node`` are read by people, so ours is held to
``MAX_LEN`` characters, the targets shortened first (``+N more``), the token, state and time
never.

A reason is ours only if it parses completely: an administrator's reason, or one we cannot
read, is never taken for ours (never resumed, never counted).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["CLAIM", "MAX_LEN", "PREFIX", "STATES", "OurReason", "format_reason", "parse_reason"]

PREFIX = "gpu-monitor:"
MAX_LEN = 200
CLAIM = "claim"
STATES = (CLAIM, "quarantined", "retesting", "reboot-required", "replace")

_TOKEN = re.compile(r"[A-Za-z][A-Za-z0-9_.-]*")
_TIME = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d"
_OURS = re.compile(rf"^{re.escape(PREFIX)} (?P<token>[A-Za-z][A-Za-z0-9_.-]*)"
                   rf"(?P<detail>(?: [^ =]+)*?)"
                   rf" state:(?P<state>{'|'.join(map(re.escape, STATES))})"
                   rf"(?: since:(?P<since>{_TIME}))?$")


@dataclass(frozen=True)
class OurReason:
    token: str
    detail: tuple[str, ...]  # check and targets
    state: str
    since: str = ""  # "" before the first drain was stamped


def _clean(word: str) -> str:
    return re.sub(r"[\s=]+", "_", word.strip())[:60]


def format_reason(token: str, state: str, detail: tuple[str, ...] = (), since: str = "") -> str:
    """Our reason for ``token`` in lifecycle ``state``, within ``MAX_LEN``."""
    if state not in STATES:
        raise ValueError(f"not a lifecycle state of a Slurm reason: {state!r}")
    tok = _clean(token) if token else "Unknown"
    if not _TOKEN.fullmatch(tok):
        tok = "Unknown"
    tail = f" state:{state}" + (f" since:{since}" if since else "")
    words = [w for w in (_clean(d) for d in detail) if w]
    head = f"{PREFIX} {tok}"
    for keep in range(len(words), -1, -1):
        more = len(words) - keep
        text = " ".join([head, *words[:keep], *([f"+{more}_more"] if more else [])]) + tail
        if len(text) <= MAX_LEN:
            return text
    return head + tail


def parse_reason(text: str) -> OurReason | None:
    """Our reason read back, or None when ``text`` is not one of ours (or unreadable)."""
    m = _OURS.match(text or "")
    if m is None:
        return None
    detail = tuple(w for w in m.group("detail").split(" ") if w)
    return OurReason(m.group("token"), detail, m.group("state"), m.group("since") or "")
