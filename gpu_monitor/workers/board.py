"""The status board: how a worker tells its parent how far it has got, without a pipe.

Each worker has a one-page file that it updates in place through an mmap and the parent reads
whenever it polls: the progress steps counted so far (``WorkerContext.step``), the worker's
state (starting, ready for a turn, in a turn, finishing), the turns it has finished and the
phase it is in ("all_reduce 8388608 B"). A write is a few bytes in memory, so a rank can count a
step before every collective; a worker that hangs leaves its last step and phase on the board,
which is how the ranks of a hung gang are told apart (pool.py, guarantee 7).
"""

from __future__ import annotations

import mmap
import struct

# A worker's state, in the order it moves through them.
STARTING, READY, IN_TURN, FINISHING = 0, 1, 2, 3

SIZE = 4096
_LAYOUT = struct.Struct("<QIII256s")  # steps, state, turns_done, phase length, phase text


def create(path: str) -> None:
    """An empty board for a worker about to start (state ``STARTING``, nothing done)."""
    with open(path, "wb") as fh:
        fh.write(b"\0" * SIZE)


def read(path: str) -> tuple[int, int, int, str] | None:
    """(steps, state, turns done, phase) as the worker last wrote them; None if unreadable."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read(_LAYOUT.size)
        steps, state, turns, n, text = _LAYOUT.unpack(raw)
        return steps, state, turns, text[:n].decode("utf-8", "replace")
    except (OSError, struct.error):
        return None


class Board:
    """The worker's end of the status board: an mmap of the file the parent reads."""

    def __init__(self, path: str):
        self._fh = open(path, "r+b")  # noqa: SIM115 - lives as long as the worker
        self._map = mmap.mmap(self._fh.fileno(), SIZE)
        self.steps, self.state, self.turns_done, self.phase = 0, STARTING, 0, ""

    def update(self, steps: int | None = None, state: int | None = None,
               turns_done: int | None = None, phase: str | None = None) -> None:
        if steps is not None:
            self.steps = steps
        if state is not None:
            self.state = state
        if turns_done is not None:
            self.turns_done = turns_done
        if phase is not None:
            self.phase = phase
            raw = phase.encode("utf-8", "replace")[:256]
            self._map[16:20 + 256] = struct.pack("<I256s", len(raw), raw)
        self._map[0:16] = struct.pack("<QII", self.steps, self.state, self.turns_done)
