"""Benchmark: burn_in's achieved FLOP rate vs a bare ``torch.matmul`` loop.

Same device, matrix size and dtype, same run, same worker process: the check's own measuring
code (``checks.burn_in.BurnRun.turn``, the loop burn_in runs) and a bare loop (N matmuls, timed
by the same ``Device.compute_clock``) take turns, round after round, so load from elsewhere and clock drift
hit both alike. Printed per size: the median of the per-round ratios (burn_in / bare) and the
medians of each side. Target: ratio >= 0.95.

    python bench/bench_burn_in.py                      # CPU, 256 and 512, fp32
    python bench/bench_burn_in.py --device cuda --sizes 8192 --dtypes bf16 tf32 --seconds 2
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
from gpu_monitor.workers.pool import DeviceRef, Task, WorkerPool  # noqa: E402


def interleaved(ctx: Any) -> dict[str, Any]:
    import torch

    from checks.burn_in import BurnRun

    dev, a = ctx.device, ctx.args
    n, dtype, seconds = int(a["matrix_size"]), a["dtype"], float(a["seconds"])
    burn = BurnRun(dev, n, dtype, block=32)
    x, y, out = burn.x, burn.y, torch.empty_like(burn.out)  # the same inputs
    t0 = time.perf_counter()  # calibrate the bare loop's count to the turn length (untimed)
    k = 0
    while time.perf_counter() - t0 < min(0.2, seconds / 4):
        torch.matmul(x, y, out=out)
        k += 1
    dev.synchronize()
    count = max(1, int(k * seconds / max(time.perf_counter() - t0, 1e-9)))

    def bare_turn() -> float:  # timed by the clock burn_in uses (CPU time on a CPU device)
        t0 = dev.compute_clock()
        for _ in range(count):
            torch.matmul(x, y, out=out)
        return 2.0 * n ** 3 * count / (dev.compute_clock() - t0) / 1e12

    ours, bare = take_turns(int(a["rounds"]), lambda: burn.turn(seconds, check_every_s=1.0),
                            bare_turn)
    return {"ours": ours, "bare": bare}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--sizes", type=int, nargs="+", default=[256, 512])
    p.add_argument("--dtypes", nargs="+", default=["fp32"])
    p.add_argument("--seconds", type=float, default=0.3, help="per side per round")
    p.add_argument("--rounds", type=int, default=15)
    args = p.parse_args(argv)
    pool = WorkerPool(WorkerSettings(device_type=args.device))
    print(f"device={args.device} rounds={args.rounds} seconds/side/round={args.seconds:g}")
    print(f"{'dtype':<6} {'size':>6} {'burn_in':>10} {'bare':>10}  ratio (median of rounds)")
    worst = float("inf")
    for dtype in args.dtypes:
        for n in args.sizes:
            task = Task("bench.bench_burn_in:interleaved", (DeviceRef(0),),
                        {"matrix_size": n, "dtype": dtype, "seconds": args.seconds,
                         "rounds": args.rounds})
            (out,) = pool.run([task], timeout_s=4 * args.rounds * args.seconds + 120)
            if not out.ok:
                print(out.message, out.log_tail[-2000:], file=sys.stderr)
                return 1
            ours, bare = out.value["ours"], out.value["bare"]
            ratio = median_ratio(ours, bare)
            worst = min(worst, ratio)
            print(f"{dtype:<6} {n:>6} {statistics.median(ours):>10.4g} "
                  f"{statistics.median(bare):>10.4g}  {ratio:.3f}   TFLOP/s")
    print(f"worst ratio {worst:.3f} (target >= 0.95)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
