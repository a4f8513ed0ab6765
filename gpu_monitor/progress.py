"""The progress line of a one-shot suite on a terminal: which check, time elapsed, and an ETA.

``gpu-monitor bootstrap`` and ``check`` can run for minutes (burn-in, NCCL, DCGM level 2); a
person at a terminal sees ``[3/9] burn_in (elapsed 41 s, ETA <= 4 min)`` on stderr, rewritten in
place. Nothing is written when stderr is not a terminal (a pipe, a log file, a pod), so the
report on stdout and the logs stay clean. The ETA is built from what the store knows (each
check's last completed run) or, failing that, each check's time budget: an upper bound, never a
guess from other checks.
"""

from __future__ import annotations

import sys
import time

__all__ = ["Progress", "expected_durations"]


def expected_durations(checks, ctx) -> list[tuple[float, bool]]:
    """How long each check is expected to take: ``(seconds, measured)``.

    The duration of its last completed run in the store when there is one (``measured``),
    else its time budget (the configured ``timeout_s``, else the declared timeout): an upper
    bound, not a guess from other checks. The passive checks take milliseconds; averaging
    them said "~3 s" in front of a burn-in with half a minute to go.
    """
    out: list[tuple[float, bool]] = []
    for check in checks:
        info = None
        if ctx.store is not None:
            try:
                info = ctx.store.last_run(check.name)
            except Exception:  # noqa: BLE001 - an estimate is never worth failing a run
                info = None
        if info is not None and info.success:
            out.append((max(0.0, float(info.duration_s)), True))
            continue
        try:
            budget = float(ctx.setting(check.name, "timeout_s", check.timeout))
        except (TypeError, ValueError, AttributeError):
            budget = float(check.timeout)
        out.append((max(0.0, budget), False))
    return out


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


class Progress:
    """Check, elapsed time and an ETA on a terminal (stderr), silent otherwise.

    ``expected[i]`` is check i's ``(seconds, measured)`` (``expected_durations``): the ETA at
    check i is the sum over the checks still to run, this one included, written ``~N`` when
    every term was measured and ``<= N`` when some are only time budgets.
    """

    def __init__(self, stream=None, expected: list[tuple[float, bool]] | None = None):
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty()
        self.t0 = time.monotonic()
        self.expected = list(expected or ())

    def eta(self, i: int) -> str:
        rest = self.expected[i:]
        if not rest:
            return ""
        seconds = sum(s for s, _ in rest)
        mark = "~" if all(m for _, m in rest) else "<= "
        return f", ETA {mark}{_duration(seconds)}"

    def start(self, check, i: int, total: int) -> None:
        if not self.enabled:
            return
        elapsed = time.monotonic() - self.t0
        self.stream.write(f"\r\x1b[K[{i + 1}/{total}] {check.name} "
                          f"(elapsed {elapsed:.0f} s{self.eta(i)})")
        self.stream.flush()

    def done(self, outcome, i: int, total: int) -> None:
        if self.enabled and i + 1 == total:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
