"""One rank of a two-process gloo training loop that uses gpu_monitor.jobs.watch_notice (run by
tests/failfast/test_jobs.py and bench/bench_failfast.py as its own interpreter).

argv: rank, rendezvous port, notice path, progress file."""

from __future__ import annotations

import sys

from gpu_monitor.jobs import watch_notice


def main() -> None:
    rank, port, notice, progress = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
    watch_notice(notice, on_notice=lambda n: print(f"rank {rank}: notice {n.get('reason')}",
                                                   flush=True))
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2)
    grad = torch.ones(4096)
    step = 0
    while True:  # a training step: an all-reduce of the gradients, forever
        dist.all_reduce(grad)
        grad.fill_(1.0)
        step += 1
        if step == 5:
            with open(progress, "w") as fh:
                fh.write(str(step))


if __name__ == "__main__":
    main()
