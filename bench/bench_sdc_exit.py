"""How often a training job that got an SDC alarm dies at exit instead of exiting cleanly.

Why: a job that raised an alarm must exit with the alarm's message and status, not with a signal
that makes the launcher (torchrun) report a generic failure and hides the alarm. Issue 17 saw
``terminate called without an active exception`` (SIGABRT) on one non-zero rank in 3 of about 22
alarm runs of 6 gloo processes: gloo's worker threads may still hold async work (and its
tensors) when the interpreter is torn down.

Each run forks ``--procs`` processes from this one (torch is imported once, so a run costs the
training, not the imports); every process trains a small MLP under ``train`` with a NaN in rank
``--culprit``'s forward at step 3, gets the alarm, and leaves the way the quick start in
docs/sdc.md does (``raise SystemExit``: a normal interpreter exit, atexit handlers and C++
destructors included, no ``destroy_process_group``). A run is an *alarm run* when every rank saw
the alarm; it *aborted* when any rank died of a signal. The table: runs, alarm runs, aborted runs
and the abort rate, with the exit status of every aborted rank.

Usage: PYTHONPATH=$PWD python bench/bench_sdc_exit.py [--runs 50] [--procs 6] [--per-node 2]
       [--destroy]  (call destroy_process_group before leaving: what the script can do itself)
       [--report DIR]  (rank 0 writes the report before leaving, as the quick start does)
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _util import free_port  # noqa: E402

ALARM_EXIT = 3  # a rank that saw the alarm leaves with this status


def _rank(rank: int, world: int, port: int, per_node: int, culprit: int, destroy: bool,
          report: str | None) -> None:
    """One training process; never returns (raises SystemExit like a training script)."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    from gpu_monitor.sdc import Schedule, attach, rank_map, train, write_report

    torch.set_num_threads(1)
    os.environ["NODE_NAME"] = f"node{rank // per_node}"
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=60))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 256), nn.Tanh(), nn.Linear(256, 256), nn.Tanh(),
                          nn.Linear(256, 8))
    ddp = DDP(model, bucket_cap_mb=0.1)  # several buckets, as a real model has
    stats = attach(ddp)
    where = rank_map()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def batch(step, r):
        g = torch.Generator().manual_seed(1000 * step + r)
        return torch.randn(16, 32, generator=g), torch.randint(0, 8, (16,), generator=g), step

    def compute_loss(m, b):
        out = m(b[0])
        if isinstance(m, DDP) and rank == culprit and b[2] == 3:  # the rank's own step 3
            out = out.clone()
            out.view(-1)[0] = float("nan")
        return nn.functional.cross_entropy(out, b[1])

    sched = Schedule(audit_every=5, check_every=5, ckpt_every=0, peer_offset=per_node)
    alarm = train(ddp, stats, opt, (batch(s, rank) for s in range(10)), compute_loss, batch,
                  None, sched)
    if alarm is not None and report and rank == 0:  # as the quick start does, before leaving
        write_report(alarm, where, path=report)
    if destroy:
        dist.destroy_process_group()
    if alarm is None:
        raise SystemExit(0)
    raise SystemExit(ALARM_EXIT)


def one_run(procs: int, per_node: int, culprit: int, destroy: bool,
            report: str | None) -> list[int]:
    """Fork the ranks of one run; every rank's wait status decoded (signal: negative)."""
    port = free_port()
    pids = []
    for r in range(procs):
        pid = os.fork()
        if pid == 0:
            os.environ.pop("SDC_BENCH_PARENT", None)
            try:
                _rank(r, procs, port, per_node, culprit, destroy, report)
            except SystemExit:
                raise
            except BaseException:  # a crash inside training: report it as status 1
                import traceback

                traceback.print_exc()
                raise SystemExit(1) from None
        pids.append(pid)
    codes = []
    for pid in pids:
        _, status = os.waitpid(pid, 0)
        codes.append(-os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status))
    return codes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--procs", type=int, default=6)
    ap.add_argument("--per-node", type=int, default=2)
    ap.add_argument("--culprit", type=int, default=3)
    ap.add_argument("--destroy", action="store_true")
    ap.add_argument("--report", metavar="DIR",
                    help="rank 0 writes the alarm's report there before leaving (the quick start)")
    args = ap.parse_args()
    import torch  # noqa: F401 - imported once here; the forked ranks inherit it

    from gpu_monitor.sdc import train  # noqa: F401 - (not "import gpu_monitor.sdc.train": see __init__)

    t0 = time.perf_counter()
    alarm_runs = aborted = 0
    statuses: list[list[int]] = []
    for i in range(args.runs):
        codes = one_run(args.procs, args.per_node, args.culprit, args.destroy, args.report)
        if all(c == ALARM_EXIT or c < 0 for c in codes) and ALARM_EXIT in codes:
            alarm_runs += 1
        if any(c < 0 for c in codes):
            aborted += 1
            statuses.append(codes)
        print(f"run {i}: {'ABORT' if any(c < 0 for c in codes) else 'ok'} {codes}", flush=True)
    wall = time.perf_counter() - t0
    names = {-int(s): s.name for s in signal.Signals}
    print(f"runs {args.runs}  procs {args.procs}  destroy_process_group {args.destroy}")
    print(f"alarm runs {alarm_runs}  aborted runs {aborted}  abort rate "
          f"{aborted / max(1, args.runs):.1%}  ({wall:.0f} s)")
    for codes in statuses:
        print("  exit status per rank:", [names.get(c, c) for c in codes])


if __name__ == "__main__":
    main()
