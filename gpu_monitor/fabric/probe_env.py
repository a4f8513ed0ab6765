"""Where a fabric-probe process sits in its group, and the test-only fault seam.

Why apart: both are read from the environment before torch starts, and both are pure (a
mapping in, a value or a ``ProbeError`` out), so the command can refuse a bad start with a
usage error (exit 2) before it joins a group, and the tests hold them with tables.

The probe runs under any torch.distributed launcher: torchrun, or an Indexed Job that sets
RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT (``JOB_COMPLETION_INDEX`` stands in for a
missing RANK: one process per pod).

Test-only fault seam: ``GPU_MONITOR_FABRIC_TEST_FAULT`` makes one process slow or corrupting,
so tests and benchmarks can prove the sweep flags it. Format: entries ``slow:RANK[:SECONDS]``
(sleep before each timed collective, default 0.05 s) or ``corrupt:RANK`` (the rank's
contribution is off by one in one element), joined by ``,``. Never set it in production; a run
with it set says so in its result (``test_fault``).
"""

from __future__ import annotations

import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass


class ProbeError(Exception):
    """The probe cannot run (launcher environment, settings)."""


# --- launcher environment ------------------------------------------------------------------------


@dataclass(frozen=True)
class LaunchEnv:
    """Where this process sits in the group, from the launcher's environment."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str
    master_port: int
    node: str
    pod: str


def launch_env(environ: Mapping[str, str]) -> LaunchEnv:
    """RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT (torchrun, or an Indexed Job where
    ``JOB_COMPLETION_INDEX`` is the rank when RANK is absent); LOCAL_RANK defaults to 0."""

    def integer(name: str, value: str | None) -> int:
        try:
            return int(str(value))
        except ValueError:
            raise ProbeError(f"{name}={value!r} is not an integer") from None

    rank_text = environ.get("RANK")
    if rank_text is None:
        rank_text = environ.get("JOB_COMPLETION_INDEX")
    missing = [n for n, v in (("RANK (or JOB_COMPLETION_INDEX)", rank_text),
                              ("WORLD_SIZE", environ.get("WORLD_SIZE")),
                              ("MASTER_ADDR", environ.get("MASTER_ADDR")),
                              ("MASTER_PORT", environ.get("MASTER_PORT"))) if v in (None, "")]
    if missing:
        raise ProbeError("not started by a torch.distributed launcher: missing "
                         + ", ".join(missing) + " (run under torchrun or an Indexed Job)")
    rank = integer("RANK", rank_text)
    world = integer("WORLD_SIZE", environ["WORLD_SIZE"])
    if world < 1 or not 0 <= rank < world:
        raise ProbeError(f"rank {rank} is outside a world of {world}")
    local = integer("LOCAL_RANK", environ.get("LOCAL_RANK", "0"))
    local_world = integer("LOCAL_WORLD_SIZE", environ.get("LOCAL_WORLD_SIZE", "1"))
    host = socket.gethostname()
    return LaunchEnv(rank=rank, world_size=world, local_rank=local,
                     local_world_size=local_world, master_addr=environ["MASTER_ADDR"],
                     master_port=integer("MASTER_PORT", environ["MASTER_PORT"]),
                     node=environ.get("NODE_NAME") or host,
                     pod=environ.get("POD_NAME") or environ.get("HOSTNAME") or host)


# --- the test-only fault seam ----------------------------------------------------------------------

TEST_FAULT_ENV = "GPU_MONITOR_FABRIC_TEST_FAULT"


@dataclass(frozen=True)
class TestFault:
    """One ``GPU_MONITOR_FABRIC_TEST_FAULT`` entry (test and benchmark use only)."""

    __test__ = False  # not a pytest class
    kind: str  # slow | corrupt
    rank: int
    delay_s: float = 0.05


def parse_test_faults(text: str | None) -> list[TestFault]:
    out: list[TestFault] = []
    for entry in filter(None, (e.strip() for e in re.split(r"[,;]", text or ""))):
        parts = entry.split(":")
        try:
            if parts[0] == "slow" and len(parts) in (2, 3):
                out.append(TestFault("slow", int(parts[1]),
                                     float(parts[2]) if len(parts) == 3 else 0.05))
                continue
            if parts[0] == "corrupt" and len(parts) == 2:
                out.append(TestFault("corrupt", int(parts[1])))
                continue
        except ValueError:
            pass
        raise ProbeError(f"{TEST_FAULT_ENV}: bad entry {entry!r} (slow:RANK[:SECONDS] or "
                         "corrupt:RANK)")
    return out

