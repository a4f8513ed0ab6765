"""Benchmark: the fabric probe's busbw at its largest size vs a bare torch.distributed loop.

Same processes, same backend (gloo on CPU, NCCL on CUDA), same size and dtype (fp32), same run:
each round every rank runs the probe's own timed loop (``gpu_monitor.fabric.probe_rank.ProbeRank
.timed``: each collective timed on its own, busbw from the slowest rank's mean, as the probe
reports it) and a bare loop (N back-to-back collectives, one synchronise, the slowest rank's
wall time), alternating which goes first, for all-reduce and all-gather. Printed per op: the
median of the per-round ratios (probe / bare) and each side's median busbw. Target: >= 0.9.

    python bench/bench_fabric_probe.py                        # 4 CPU ranks, 16 MiB (CPU cap)
    torchrun --nproc-per-node 8 bench/bench_fabric_probe.py --device cuda --bytes 2147483648
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from datetime import timedelta

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]  # _util; the repo (run from a checkout)
from _util import free_port  # noqa: E402

from gpu_monitor.fabric.probe_rank import ProbeRank  # noqa: E402
from gpu_monitor.fabric.probe_settings import CPU_MAX_BYTES  # noqa: E402
from gpu_monitor.nccl import bus_factor  # noqa: E402


def rank_main(a: argparse.Namespace) -> int:
    import torch
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if a.device == "cuda":
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
        backend = "nccl"
    else:
        torch.set_num_threads(1)
        device = torch.device("cpu")
        backend = "gloo"
    size = min(a.bytes, CPU_MAX_BYTES) if a.device == "cpu" else a.bytes
    kw = {"device_id": device} if backend == "nccl" else {}
    dist.init_process_group(backend, rank=rank, world_size=world,
                            timeout=timedelta(seconds=600), **kw)
    me = ProbeRank(device, rank, world, size)
    out: dict[str, dict[str, list[float]]] = {}
    for op in a.ops.split(","):
        count, nbytes = ProbeRank.counts(op, size, world)
        assert me.verify(op, count) == 0, f"{op}: wrong data before the benchmark"
        ours, bare = [], []
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        out_buf = torch.zeros(count * world if op == "all_gather" else count, device=device)
        in_buf = torch.zeros(count, device=device)

        def bare_once(op=op, out_buf=out_buf, in_buf=in_buf, gather=gather) -> None:
            if op == "all_reduce":
                dist.all_reduce(out_buf)
            else:
                gather(out_buf, in_buf)

        for r in range(a.rounds):
            for side in ((0, 1) if r % 2 == 0 else (1, 0)):
                if side == 0:
                    ours.append(statistics.fmean(me.timed(op, count, a.warmup, a.iterations)))
                else:
                    for _ in range(a.warmup):
                        bare_once()
                    me.now()
                    t0 = time.perf_counter()
                    for _ in range(a.iterations):
                        bare_once()
                    me.now()
                    bare.append((time.perf_counter() - t0) / a.iterations)
        out[op] = {"ours_s": ours, "bare_s": bare, "bytes": [float(nbytes)]}
    gathered: list = [None] * world
    dist.all_gather_object(gathered, out)
    dist.destroy_process_group()
    if rank != 0:
        return 0
    report = {"world_size": world, "backend": backend, "device": a.device, "ops": {}}
    for op in out:
        nbytes = out[op]["bytes"][0]
        factor = bus_factor(op, world)
        ratios, ours_bw, bare_bw = [], [], []
        for k in range(a.rounds):
            t_ours = max(g[op]["ours_s"][k] for g in gathered)  # the slowest rank, as reported
            t_bare = max(g[op]["bare_s"][k] for g in gathered)
            ob, bb = nbytes / t_ours / 1e9 * factor, nbytes / t_bare / 1e9 * factor
            ours_bw.append(ob)
            bare_bw.append(bb)
            ratios.append(ob / bb)
        report["ops"][op] = {
            "bytes": int(nbytes),
            "probe_busbw_gb_per_s": statistics.median(ours_bw),
            "bare_busbw_gb_per_s": statistics.median(bare_bw),
            "ratio_median": statistics.median(ratios),
            "ratios": [round(r, 4) for r in ratios],
            "target": 0.9,
            "pass": statistics.median(ratios) >= 0.9,
        }
    print(json.dumps(report, indent=2))
    return 0 if all(v["pass"] for v in report["ops"].values()) else 1


def launch(a: argparse.Namespace, argv: list[str]) -> int:
    port = free_port()
    procs = []
    for r in range(a.world):
        env = {**os.environ, "RANK": str(r), "WORLD_SIZE": str(a.world),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "LOCAL_RANK": str(r)}
        procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__), "--rank",
                                       *argv], env=env))
    codes = [p.wait() for p in procs]
    return codes[0] if codes[0] else max(codes)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--world", type=int, default=4, help="ranks to start (without torchrun)")
    p.add_argument("--bytes", type=int, default=16 * 1024 * 1024,
                   help="message size (the probe's largest; capped at 16 MiB on CPU)")
    p.add_argument("--iterations", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--ops", default="all_reduce,all_gather")
    p.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.rank or "RANK" in os.environ:
        return rank_main(a)
    return launch(a, [x for x in argv if x != "--rank"])


if __name__ == "__main__":
    sys.exit(main())
