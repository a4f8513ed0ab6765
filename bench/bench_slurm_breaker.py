"""What the Slurm breaker's claim costs against a real slurmctld (tests/slurm/cluster.py: a
munged, slurmctld and slurmd started in a temporary directory, 20 nodes without a slurmd in
partition ``gpu``): one node read (``scontrol show node -o``), one claim alone (its drain, the
settle past Slurm's 1 s reason time, the re-read), and 20 claims at once (budget 2), side by
side in one run, with how many ended drained.

Usage: python bench/bench_slurm_breaker.py [--rounds N]
Prints per-operation figures (median, p95) and the ratio of the storm's wall time to one claim.
"""

from __future__ import annotations

import argparse
import os
import threading
import time

from bench._util import percentile
from gpu_monitor.remediate.slurm.breaker import SlurmBreaker, SlurmBreakerSettings, our_drains
from gpu_monitor.remediate.slurm.tools import SlurmTools
from tests.slurm.cluster import EXTRA, PARTITION, SlurmCluster

SETTINGS = SlurmBreakerSettings(partitions=(PARTITION,), gres=None)


def _claim(node: str, start: threading.Barrier, granted: list[str]) -> None:
    breaker = SlurmBreaker(SlurmTools(60.0), SETTINGS)
    start.wait()
    if breaker.claim(node, "Xid79").granted:
        granted.append(node)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    cluster = SlurmCluster().start()
    try:
        os.environ["SLURM_CONF"] = str(cluster.conf)
        tools = SlurmTools(60.0)
        reads, alone, storms, kept = [], [], [], []
        for _ in range(args.rounds):
            t = time.perf_counter()
            tools.show_nodes()
            reads.append(time.perf_counter() - t)

            t = time.perf_counter()
            assert SlurmBreaker(tools, SETTINGS).claim(EXTRA[0], "Xid79").granted
            alone.append(time.perf_counter() - t)
            cluster.reset_all()

            start = threading.Barrier(len(EXTRA))
            granted: list[str] = []

            threads = [threading.Thread(target=_claim, args=(n, start, granted)) for n in EXTRA]
            t = time.perf_counter()
            for th in threads:
                th.start()
            for th in threads:
                th.join()
            storms.append(time.perf_counter() - t)
            drained = our_drains(tools.show_nodes(), (PARTITION,))
            kept.append((len(granted), len(drained)))
            cluster.reset_all()
        for name, xs in (("node read (21 nodes)", reads), ("claim alone", alone),
                         ("20 claims at once", storms)):
            print(f"{name:<22} median {percentile(xs, 0.5) * 1000:8.1f} ms   "
                  f"p95 {percentile(xs, 0.95) * 1000:8.1f} ms")
        print(f"storm / one claim: {percentile(storms, 0.5) / percentile(alone, 0.5):.2f}x; "
              f"settle {SETTINGS.settle_s:g} s of each claim")
        print("granted, drained after each storm (budget 2):", kept)
    finally:
        cluster.stop()


if __name__ == "__main__":
    main()
