"""The kernel-log follower alone: the issue-18 storm replayed through the real follower, checks
and store, in lines per CPU-second (the fair figure on a shared machine).

Writes the storm (bench/_kmsg_storm.py, the one bench_kmsg_storm.py appends paced) to a dmesg
-T file whole, then opens it as the daemon does at start: ``Daemon.open_kmsg()`` on the
simulated h100-sxm-8 node with a file store, the xid and nvswitch checks following. That is
the start-up replay path (bounded batches, literal pre-search, one transaction per batch). It
prints lines, CPU seconds and wall seconds of the replay, lines per CPU-second and per wall
second, and whether every GPU's Xid count is exactly what was written.

    python bench/bench_kmsg_follower.py [--seconds 20] [--rate 20500]

``--seconds`` is the storm's length as written (20 s at 20,500 lines/s: 410k lines), not how
long the bench runs. Target (issue 18): >= 50,000 lines of the mix per CPU-second.
``--source-only`` reads the same file through the pre-searching ``KmsgFileSource`` alone
(batches of 32 records, no checks, no store): the reading's share of the cost.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import random
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from _kmsg_storm import add_storm_args, storm_slices  # noqa: E402

from checks.nvswitch import NvSwitch  # noqa: E402
from checks.xid import Xid  # noqa: E402
from gpu_monitor.check import Context  # noqa: E402
from gpu_monitor.clock import Clock  # noqa: E402
from gpu_monitor.config import DEFAULT_CONFIG  # noqa: E402
from gpu_monitor.daemon import Daemon  # noqa: E402
from gpu_monitor.daemon_kmsg import BATCH_RECORDS  # noqa: E402
from gpu_monitor.hw.kmsg.files import KmsgFileSource  # noqa: E402
from gpu_monitor.profiles import load_profile  # noqa: E402
from gpu_monitor.sim.node import SimulatedNode  # noqa: E402
from gpu_monitor.state import Store  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    add_storm_args(ap)
    ap.add_argument("--source-only", action="store_true",
                    help="time the text source alone (no checks, no store)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "kern.log")
        written: dict[int, int] = {}
        lines = 0
        start = time.time() - args.seconds
        k = 0

        def when() -> float:  # the storm's own clock: slice k at start + k * 50 ms
            return start + k * 0.05

        with open(path, "wb") as fh:
            for data, xids in storm_slices(random.Random(18), seconds=args.seconds,
                                           rate=args.rate, burst_seconds=args.burst_seconds,
                                           burst_rate=args.burst_rate, now=when):
                fh.write(data)
                lines += data.count(b"\n")
                for g, n in xids.items():
                    written[g] = written.get(g, 0) + n
                k += 1
        if args.source_only:
            return _source_only(path, lines)
        node = SimulatedNode(load_profile("h100-sxm-8"))
        try:
            clock = Clock()
            store = Store.open(os.path.join(tmp, "state.db"), clock=clock)
            host = node.host()
            host.paths = dataclasses.replace(host.paths, kmsg=path)
            ctx = Context(host=host, profile=load_profile("h100-sxm-8").for_simulation(),
                          config=DEFAULT_CONFIG, clock=clock, store=store, one_shot=False)
            daemon = Daemon([Xid(), NvSwitch()], ctx)
            cpu0, wall0 = time.process_time(), time.perf_counter()
            daemon.open_kmsg()
            cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
            daemon.shutdown()
            counts: dict[int, int] = {}
            for (index, _uuid, code), n in store.xid_counts(kind="xid").items():
                if code == 13 and index is not None:
                    counts[index] = counts.get(index, 0) + n
            store.close()
        finally:
            node.close()
        size = os.path.getsize(path) / 2**20
    print(f"storm: {lines} lines ({size:.0f} MiB), {sum(written.values())} Xids; "
          f"load average {os.getloadavg()}")
    print(f"replay: {cpu:.2f} CPU-s, {wall:.2f} s wall = {lines / cpu:.0f} lines/CPU-s, "
          f"{lines / wall:.0f} lines/s wall")
    exact = counts == written
    print(f"exactly once per GPU: {'yes' if exact else 'NO'} (written {written}, "
          f"counted {counts})")
    return 0 if exact else 1


def _source_only(path: str, lines: int) -> int:
    src = KmsgFileSource(path)
    src.select([*Xid.kmsg_literals, *NvSwitch.kmsg_literals])
    cpu0 = time.process_time()
    records = 0
    while batch := src.read_available(max_records=BATCH_RECORDS):
        records += len(batch)
    cpu = time.process_time() - cpu0
    src.close()
    print(f"source alone: {lines} lines, {records} records parsed, {src.lines_skipped} "
          f"skipped; {cpu:.2f} CPU-s = {lines / cpu:.0f} lines/CPU-s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
