"""Benchmark: nccl_allreduce's busbw at its largest size vs a bare ``all_reduce`` loop.

Same world size, size, dtype (fp32) and backend (gloo on CPU, NCCL on CUDA), same run, same
processes: each round every rank runs the check's own timed loop
(``checks.nccl_allreduce.AllReduceRank.timed``, busbw from the slowest rank's mean iteration,
as the check reports it) and a bare loop (N back-to-back all-reduces, one synchronise, the
slowest rank's wall time), alternating which goes first. Printed: the median of the per-round
ratios and each side's median busbw. Target: >= 0.9.

    python bench/bench_nccl.py                          # 2 CPU ranks, 8 MiB
    python bench/bench_nccl.py --device cuda --world 8 --bytes 2147483648
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench._util import median_ratio, take_turns  # noqa: E402
from gpu_monitor.host import WorkerSettings  # noqa: E402
from gpu_monitor.nccl import ALL_REDUCE, bus_factor  # noqa: E402
from gpu_monitor.workers.pool import DeviceRef, Task, WorkerPool  # noqa: E402


def interleaved(ctx: Any) -> dict[str, Any]:
    import torch.distributed as dist

    from checks.nccl_allreduce import AllReduceRank

    dev, a = ctx.device, ctx.args
    count, iters, warmup = int(a["bytes"]) // 4, int(a["iterations"]), int(a["warmup"])
    dev.init_process_group(ctx.rank, ctx.world_size, ctx.rendezvous, ctx.timeout_s)
    me = AllReduceRank(dev, ctx.rank, ctx.world_size, count)
    assert me.verify(count) == 0
    buf = me.work[:count].clone().fill_(1.0)

    def bare_turn() -> float:
        for _ in range(warmup):
            dist.all_reduce(buf)
        dev.synchronize()
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(buf)
        dev.synchronize()
        return (time.perf_counter() - t0) / iters

    ours, bare = take_turns(int(a["rounds"]),
                            lambda: sum(me.timed(count, warmup, iters)) / iters, bare_turn)
    dist.destroy_process_group()
    return {"ours_s": ours, "bare_s": bare}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--bytes", type=int, default=8 << 20)
    p.add_argument("--iterations", type=int, default=20)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--rounds", type=int, default=9)
    args = p.parse_args(argv)
    pool = WorkerPool(WorkerSettings(device_type=args.device))
    task_args = {"bytes": args.bytes, "iterations": args.iterations, "warmup": args.warmup,
                 "rounds": args.rounds}
    outs = pool.run([Task("bench.bench_nccl:interleaved", (DeviceRef(i),), task_args)
                     for i in range(args.world)], timeout_s=1200, gang=True)
    bad = [o for o in outs if not o.ok]
    if bad:
        print(bad[0].message, bad[0].log_tail[-2000:], file=sys.stderr)
        return 1

    def busbw(seconds: float) -> float:
        return args.bytes / seconds / 1e9 * bus_factor(ALL_REDUCE, args.world)

    # Per round, the slowest rank's time, as both the check and nccl-tests report it.
    ours = [busbw(max(ts)) for ts in zip(*(o.value["ours_s"] for o in outs), strict=True)]
    bare = [busbw(max(ts)) for ts in zip(*(o.value["bare_s"] for o in outs), strict=True)]
    ratio = median_ratio(ours, bare)
    print(f"device={args.device} world={args.world} bytes={args.bytes} "
          f"iterations={args.iterations} rounds={args.rounds}")
    print(f"busbw GB/s (median)  nccl_allreduce {statistics.median(ours):.4g}  "
          f"bare {statistics.median(bare):.4g}")
    print(f"ratio (median of rounds) {ratio:.3f} (target >= 0.9)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
