"""How fast ``gpu_monitor.sdc.fingerprints`` is: it runs on the training step's path.

On one 256 MiB fp32 tensor (64 Mi elements), in the same run and interleaved (a shared machine's
noise hits every contender alike), the minimum over ``--repeats`` of:

- ``fingerprints([t])``: all three columns (plain sum, weighted sum, mixer sum);
- the naive form of the two linear columns only: each 16 Mi-element chunk widened to int64,
  multiplied by an ``arange`` of its positions, plain and weighted sums;
- ``t.sum()``: a floating-point reduction, the memory-bandwidth yardstick.

Targets (issue 6): CPU >= 2x the naive form; GPU >= 0.5x the throughput of ``sum``.
Also times 2,000 small tensors (a model's LayerNorms and biases), where packing matters.

Usage: python bench/bench_fingerprints.py [--device cpu|cuda] [--repeats N] [--threads N]
"""

from __future__ import annotations

import argparse
import time

import torch

from gpu_monitor.sdc import fingerprints

NAIVE_CHUNK = 16 * 1024 * 1024


def naive(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    bits = t.reshape(-1).view(torch.int32)
    s0 = torch.zeros((), dtype=torch.int64, device=t.device)
    s1 = torch.zeros((), dtype=torch.int64, device=t.device)
    for start in range(0, bits.numel(), NAIVE_CHUNK):
        w = bits[start : start + NAIVE_CHUNK].to(torch.int64)
        pos = torch.arange(start + 1, start + 1 + w.numel(), dtype=torch.int64, device=t.device)
        s0 += w.sum()
        s1 += (w * pos).sum()
    return s0, s1


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def best_of(fns: dict, repeats: int, device: str) -> dict[str, float]:
    best = {k: float("inf") for k in fns}
    for fn in fns.values():  # warm-up: caches, allocator, position tables
        fn()
    for _ in range(repeats):
        for name, fn in fns.items():
            _sync(device)
            t0 = time.perf_counter()
            fn()
            _sync(device)
            best[name] = min(best[name], time.perf_counter() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--mib", type=int, default=256)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    dev = args.device
    n = args.mib * 1024 * 1024 // 4
    t = torch.randn(n, generator=torch.Generator().manual_seed(0)).to(dev)

    row = fingerprints([t])[0]
    s0, s1 = naive(t)
    assert [int(row[0]), int(row[1])] == [int(s0), int(s1)], "naive form disagrees"

    best = best_of(
        {"fingerprints": lambda: fingerprints([t]), "naive": lambda: naive(t), "sum": t.sum},
        args.repeats,
        dev,
    )
    gib = t.numel() * 4 / 2**30
    print(f"device {dev}, torch {torch.__version__}, threads {torch.get_num_threads()}, "
          f"tensor {args.mib} MiB fp32, best of {args.repeats}")
    for name, s in best.items():
        print(f"  {name:13s} {s * 1e3:9.1f} ms  {gib / s:7.2f} GiB/s")
    print(f"  fingerprints vs naive: {best['naive'] / best['fingerprints']:.2f}x faster "
          f"(target >= 2x on CPU)")
    print(f"  fingerprints vs sum:   {best['sum'] / best['fingerprints']:.3f}x sum's throughput "
          f"(target >= 0.5x on GPU)")

    small = [torch.randn(256, device=dev) for _ in range(2000)]
    per = best_of({"small": lambda: fingerprints(small)}, args.repeats, dev)["small"]
    print(f"  2000 tensors of 256 elements: {per * 1e3:.1f} ms in all")


if __name__ == "__main__":
    main()
