"""What the SDC checks cost a DDP training step (gloo, CPU processes).

Four processes train an MLP of about 20 M parameters. Each process holds three identical models:
one wrapped in plain DDP (the baseline loop: forward, backward, clip, step), one whose DDP runs
the stock all-reduce as a Python communication hook (what any comm hook costs), and one wrapped
in DDP with ``attach`` and driven by ``train`` with no audit, no weight check and no checkpoint (so
the cost is check 1: the per-bucket local norms, the norm all-gather and the reduced-gradient
all-reduce). The three alternate step by step in the same run (``--block``), so machine noise hits
both alike; medians are reported. Step time is taken between successive batch requests, which
excludes ``train``'s one-time set-up. CPU time per step (rank 0) is reported too: on a shared
machine it moves far less with other users' load than wall time does.

Then, on the checked model: one weight check (``find_divergent_ranks`` over all parameters), a
step with a loss-only audit and a step with a deterministic audit.

Targets (issue 6): checks without audit <= +5% (published: +7.4% on 32 H100).

Usage: python bench/bench_ddp_overhead.py [--procs 4] [--rounds 100] [--block 1] [--batch 32]

Fewer than ~100 rounds are not worth reading on a shared 2-core machine: with 30, the median
overhead of the very same code moved between -1 % and +11 % from run to run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from datetime import timedelta

sys.path.insert(0, os.path.dirname(__file__))
from _util import free_port  # noqa: E402

WIDTHS = [1024, 2048, 2048, 2048, 2048, 2048, 1024]  # ~21 M parameters



def _model():
    import torch
    from torch import nn

    torch.manual_seed(0)
    layers: list = []
    for a, b in zip(WIDTHS[:-1], WIDTHS[1:], strict=True):
        layers += [nn.Linear(a, b), nn.GELU()]
    return nn.Sequential(*layers[:-1])


def _batch(step: int, rank: int, size: int):
    import torch

    g = torch.Generator().manual_seed(step * 1009 + rank)
    return torch.randn(size, WIDTHS[0], generator=g), torch.randn(size, WIDTHS[-1], generator=g)


def _loss(model, batch):
    x, y = batch
    return (model(x) - y).pow(2).mean()


def _worker(rank: int, world: int, port: int, args, out_path: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from gpu_monitor.sdc import Schedule, attach, find_divergent_ranks, train

    torch.set_num_threads(1)
    os.environ["NODE_NAME"] = f"node{rank}"  # one "GPU" per node: any peer offset is legal
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=300))
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    plain, hooked, checked = DDP(_model()), DDP(_model()), DDP(_model())
    hooked.register_comm_hook(None, default_hooks.allreduce_hook)
    stats = attach(checked)
    opt_p = torch.optim.SGD(plain.parameters(), lr=1e-3)
    opt_h = torch.optim.SGD(hooked.parameters(), lr=1e-3)
    opt_c = torch.optim.SGD(checked.parameters(), lr=1e-3)
    rebuild = lambda s, r: _batch(s, r, args.batch)  # noqa: E731
    cpu_p: list[float] = []
    cpu_c: list[list[float]] = []
    cpu_h: list[float] = []

    def plain_steps(first: int, n: int, model=plain, opt=opt_p, cpu=None) -> list[float]:
        times = []
        for s in range(first, first + n):
            t0, c0 = time.perf_counter(), time.process_time()
            opt.zero_grad(set_to_none=True)
            _loss(model, rebuild(s, rank)).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            times.append(time.perf_counter() - t0)
            (cpu_p if cpu is None else cpu).append(time.process_time() - c0)
        return times

    def checked_steps(first: int, n: int, sched) -> list[float]:
        stamps = []
        cstamps = []

        def batches():
            for s in range(first, first + n + 1):
                stamps.append(time.perf_counter())
                cstamps.append(time.process_time())
                if s < first + n:
                    yield rebuild(s, rank)

        alarm = train(checked, stats, opt_c, batches(), _loss, rebuild, None, sched,
                      start_step=first)
        assert alarm is None, alarm
        cpu_c.append([b - a for a, b in zip(cstamps[:-1], cstamps[1:], strict=True)])
        return [b - a for a, b in zip(stamps[:-1], stamps[1:], strict=True)]

    no_audit = Schedule(audit_every=0, check_every=0, ckpt_every=0, check_on_checkpoint=False,
                        peer_offset=1)
    plain_steps(0, 2)
    plain_steps(0, 2, hooked, opt_h, cpu_h)
    checked_steps(0, 2, no_audit)
    cpu_p.clear()
    cpu_c.clear()
    cpu_h.clear()
    t_plain: list[float] = []
    t_hooked: list[float] = []
    t_checked: list[float] = []
    step = 10
    for _ in range(args.rounds):
        t_plain += plain_steps(step, args.block)
        t_hooked += plain_steps(step, args.block, hooked, opt_h, cpu_h)
        t_checked += checked_steps(step, args.block, no_audit)
        step += args.block

    cpu_plain, cpu_checked = list(cpu_p), [x for block in cpu_c for x in block]
    dist.barrier()
    t_weights = []
    for _ in range(3):
        t0 = time.perf_counter()
        res = find_divergent_ranks(list(checked.parameters()))
        t_weights.append(time.perf_counter() - t0)
        assert not res["diverged"]

    def audit_steps(deterministic: bool) -> tuple[list[float], list[float]]:
        """Audit steps, each right after a plain step (the adjacent yardstick)."""
        nonlocal step
        sched = Schedule(audit_every=1, deterministic_audits=deterministic, check_every=0,
                         ckpt_every=0, check_on_checkpoint=False, peer_offset=1)
        audits, plains = [], []
        for _ in range(args.audits):
            plains += plain_steps(step, 1)
            audits += checked_steps(step, 1, sched)
            step += 1
        return audits, plains

    t_loss_audit, p_loss_audit = audit_steps(False)
    t_det_audit, p_det_audit = audit_steps(True)
    n_params = sum(p.numel() for p in checked.parameters())
    if rank == 0:
        with open(out_path, "w") as f:
            f.write(repr({
                "params": n_params, "plain": t_plain, "checked": t_checked,
                "hooked": t_hooked, "cpu_hooked": list(cpu_h),
                "cpu_plain": cpu_plain, "cpu_checked": cpu_checked,
                "weights": t_weights, "loss_audit": t_loss_audit, "det_audit": t_det_audit,
                "loss_audit_plain": p_loss_audit, "det_audit_plain": p_det_audit,
            }))
    dist.barrier()  # gloo aborts a process whose peer tears the group down under it
    dist.destroy_process_group()


def main() -> None:
    import tempfile

    import torch.multiprocessing as mp

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--procs", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--block", type=int, default=1)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--audits", type=int, default=4, help="audit steps of each kind")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "result")
        t0 = time.perf_counter()
        mp.spawn(_worker, args=(args.procs, free_port(), args, out), nprocs=args.procs)
        with open(out) as f:
            r = eval(f.read())  # noqa: S307 - our own repr of floats and ints
    med_p, med_c = statistics.median(r["plain"]), statistics.median(r["checked"])
    ratios = sorted(c / p for c, p in zip(r["checked"], r["plain"], strict=True))
    paired = statistics.median(ratios) - 1
    q1, _, q3 = statistics.quantiles(ratios, n=4)
    mean_p, mean_c = statistics.fmean(r["plain"]), statistics.fmean(r["checked"])
    print(f"gloo, {args.procs} processes on {os.cpu_count()} CPUs, MLP of "
          f"{r['params'] / 1e6:.1f} M parameters, batch {args.batch}, "
          f"{len(r['plain'])} steps each, interleaved in blocks of {args.block}")
    print(f"  plain DDP step        median {med_p * 1e3:8.1f} ms   mean {mean_p * 1e3:8.1f} ms")
    med_h = statistics.median(r["hooked"])
    print(f"  DDP + Python hook     median {med_h * 1e3:8.1f} ms   "
          f"({100 * (med_h / med_p - 1):+.1f} %: the stock all-reduce as a Python comm hook)")
    print(f"  checks, no audit      median {med_c * 1e3:8.1f} ms   mean {mean_c * 1e3:8.1f} ms")
    print(f"  overhead              median {100 * (med_c / med_p - 1):+6.1f} %   "
          f"mean {100 * (mean_c / mean_p - 1):+6.1f} %   "
          f"paired {100 * paired:+6.1f} %   (target <= +5 %)")
    print(f"  paired step ratios    quartiles {100 * (q1 - 1):+.1f} % .. {100 * (q3 - 1):+.1f} %")
    cp, cc = statistics.median(r["cpu_plain"]), statistics.median(r["cpu_checked"])
    ch = statistics.median(r["cpu_hooked"])
    print(f"  CPU time per step     plain {cp * 1e3:.1f} ms, Python hook {ch * 1e3:.1f} ms, "
          f"checked {cc * 1e3:.1f} ms ({100 * (cc / cp - 1):+.1f} % vs plain, "
          f"{100 * (cc / ch - 1):+.1f} % vs hook; rank 0)")
    print(f"  one weight check      {min(r['weights']) * 1e3:8.1f} ms (best of 3)")
    for key, label in (("loss_audit", "loss-only audit step "), ("det_audit", "deterministic audit  ")):
        ratio = statistics.median(a / p for a, p in zip(r[key], r[key + "_plain"], strict=True))
        print(f"  {label} {statistics.median(r[key]) * 1e3:8.1f} ms "
              f"({ratio:.2f}x the plain step run just before it, median)")
    print(f"  wall time {time.perf_counter() - t0:.0f} s")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
