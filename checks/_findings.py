"""What a check found about one target while it examines it, before the target's one result
is chosen: the problems (status, reason, message, suggested action), the details gathered on
the way and the reads that failed.

Why one place: the checks that judge a target by several readings (``ecc_memory`` per GPU,
``pcie`` per GPU and NIC) collect their problems the same way and must pick the one their
result shows the same way.

1. The problem a result shows is the most serious status, then the strongest action
   (``model.STATUS_SEVERITY``, then ``model.ACTION_SEVERITY``); the first added wins a tie.
2. Every problem is listed in ``details["problems"]`` (status, reason, message), so a result
   that shows one still tells of the others; a target with none gets no such key.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpu_monitor.model import ACTION_SEVERITY, STATUS_SEVERITY, Action, Status

Problem = tuple[Status, str, str, Action]


@dataclass
class TargetFindings:
    """Problems, details and read errors for one target while it is being examined."""

    problems: list[Problem] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    def add(self, status: Status, reason: str, message: str,
            action: Action = Action.NONE) -> None:
        self.problems.append((status, reason, message, action))

    def worst_into(self, details: dict[str, Any]) -> Problem | None:
        """The problem the result shows (guarantee 1), after listing every problem in
        ``details`` (guarantee 2); None when there is none."""
        if self.problems:
            details["problems"] = [{"status": str(s), "reason": r, "message": m}
                                   for s, r, m, _ in self.problems]
        return max(self.problems,
                   key=lambda p: (STATUS_SEVERITY[p[0]], ACTION_SEVERITY[p[3]]), default=None)
