"""When each SDC check runs: the one knob set a training script passes to ``train``.

Why a value of its own: every rank must take the same decisions at the same step (each check is
a collective), so the decisions are pure functions of the step number and this frozen value.
Step ``s`` (counted from 0) is an audit step when ``(s + 1) % audit_every == 0``: the 10th,
20th, ... step with ``audit_every=10``; the same rule places weight checks and checkpoints, so a
job resumed at ``start_step = s + 1`` after a checkpoint at ``s`` keeps the same rhythm.
An interval of 0 (or None) disables that check.
"""

from __future__ import annotations

from dataclasses import dataclass


def _every(n: int | None, step: int) -> bool:
    return bool(n) and (step + 1) % int(n) == 0


@dataclass(frozen=True)
class Schedule:
    """Intervals in steps; see the module docstring for which steps they select.

    - ``audit_every``: ring replay audits (0: never).
    - ``deterministic_audits``: audit steps run with deterministic kernels and compare gradient
      fingerprints too (catches backward-only faults; costs more); else the loss only.
    - ``check_every``: weight fingerprint comparisons after ``optimizer.step()`` (0: never).
    - ``ckpt_every``: ``save_checkpoint`` calls (0: never).
    - ``peer_offset``: ranks per node; rank r replays rank r + peer_offset (another node). A
      layout spanning nodes with another number of ranks per node warns; a group on one node
      replays on the next GPU where peer_offset is a multiple of the group size.
    - ``check_on_checkpoint``: a weight comparison before every checkpoint, whatever
      ``check_every`` says (the only check that can block a corrupted checkpoint).
    - ``max_grad_norm``: gradient clipping threshold (None: no clipping; the reduced gradient
      norm is still checked).
    """

    audit_every: int = 10
    deterministic_audits: bool = True
    check_every: int = 10
    ckpt_every: int = 100
    peer_offset: int = 8
    check_on_checkpoint: bool = True
    max_grad_norm: float | None = 1.0

    def __post_init__(self) -> None:
        for name in ("audit_every", "check_every", "ckpt_every"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
                raise ValueError(f"Schedule.{name} must be an int >= 0 (0: never), got {v!r}")
        if not isinstance(self.peer_offset, int) or self.peer_offset < 1:
            raise ValueError(f"Schedule.peer_offset must be an int >= 1, got {self.peer_offset!r}")
        if self.max_grad_norm is not None and not self.max_grad_norm > 0:
            raise ValueError(f"Schedule.max_grad_norm must be > 0 or None, got {self.max_grad_norm!r}")

    def is_audit(self, step: int) -> bool:
        return _every(self.audit_every, step)

    def is_deterministic_audit(self, step: int) -> bool:
        return self.deterministic_audits and self.is_audit(step)

    def is_checkpoint(self, step: int) -> bool:
        return _every(self.ckpt_every, step)

    def is_weight_check(self, step: int) -> bool:
        return _every(self.check_every, step) or (self.check_on_checkpoint and self.is_checkpoint(step))
