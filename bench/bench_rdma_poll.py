"""How much one rdma_ports poll costs (it runs every second in the daemon).

Builds the simulated 8-port H100 node, then times, per poll of 8 ports:

- ``check.poll``: the steady-state daemon poll (fast reads, in-memory window, no store writes);
- ``check.poll`` while one port is down (one interval open, one store write per poll);
- ``run_check``: the same poll through the runner, whose requirement gate (``infiniband``)
  currently walks every port's counters through ``SysfsReader.infiniband_ports()``;
- ``SysfsReader.infiniband_ports()`` alone, for comparison.

Usage: python bench/bench_rdma_poll.py [--polls N]. Prints microseconds per poll and ratios.
Real sysfs is slower per file than a tmpfs tree, but the ratios carry over.
"""

from __future__ import annotations

import argparse
import time

from checks.rdma_ports import RdmaPorts
from gpu_monitor.check import Context
from gpu_monitor.clock import FakeClock
from gpu_monitor.config import DEFAULT_CONFIG
from gpu_monitor.profiles import load_profile
from gpu_monitor.runner import run_check
from gpu_monitor.sim.inject import parse
from gpu_monitor.sim.node import SimulatedNode
from gpu_monitor.state import Store


def _per_poll_us(fn, clock: FakeClock, polls: int) -> float:
    fn()  # warm up: discovery, history load
    clock.advance(1)
    t0 = time.perf_counter()
    for _ in range(polls):
        fn()
        clock.advance(1)
    return (time.perf_counter() - t0) / polls * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--polls", type=int, default=2000)
    args = ap.parse_args()
    profile = load_profile("h100-sxm-8")
    node = SimulatedNode(profile, [parse("port-down@ib:mlx5_3:1,after=0,for=1e9")])
    healthy = SimulatedNode(profile)
    try:
        rows = []
        for label, sim in (("steady state, 8 ports up", healthy),
                           ("one port down (1 store write/poll)", node)):
            clock = FakeClock()
            store = Store.open(":memory:", clock)
            ctx = Context(host=sim.host(), profile=profile, config=DEFAULT_CONFIG, clock=clock,
                          store=store, one_shot=False)
            check = RdmaPorts()
            rows.append((f"check.poll, {label}",
                         _per_poll_us(lambda c=check, x=ctx: c.poll(x), clock, args.polls)))
        clock = FakeClock()
        ctx = Context(host=healthy.host(), profile=profile, config=DEFAULT_CONFIG, clock=clock,
                      store=Store.open(":memory:", clock), one_shot=False)
        check = RdmaPorts()
        rows.append(("run_check(poll) incl. requirement gate",
                     _per_poll_us(lambda: run_check(check, ctx, method="poll"), clock,
                                  max(1, args.polls // 4))))
        reader = healthy.host().sysfs
        rows.append(("SysfsReader.infiniband_ports() alone",
                     _per_poll_us(reader.infiniband_ports, clock, max(1, args.polls // 4))))
        base = rows[0][1]
        print(f"rdma_ports poll cost, 8 ports, {args.polls} polls")
        for label, us in rows:
            print(f"  {label:<58} {us:9.1f} us/poll  ({us / base:5.2f}x)")
        print(f"  at 1 Hz the steady-state poll costs {base * 60 / 1e6:.4f} CPU-s/min")
    finally:
        node.close()
        healthy.close()


if __name__ == "__main__":
    main()
