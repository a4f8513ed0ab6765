"""The issue-18 kernel-log storm, one definition for the benches that replay it.

``storm_slices`` yields the storm a slice (``SLICE_S``) at a time: dmesg -T lines, 99%
ordinary kernel lines of up to 4 KiB (some with bytes that are not UTF-8), 1% Xid 13 lines over
the 8 simulated GPUs, plus ``burst_rate`` extra Xid lines a second for ``burst_seconds`` in the
middle. bench_kmsg_storm.py appends it paced against the real daemon; bench_kmsg_follower.py
writes it whole and replays it through the follower alone.
"""

from __future__ import annotations

import argparse
import math
import random
import time
from collections.abc import Callable, Iterator

GPU_PCI = ("53", "64", "75", "86", "97", "a8", "b9", "ca")  # the h100-sxm-8 simulation's GPUs
XID = "NVRM: Xid (PCI:0000:{pci}:00): 13, pid={pid}, name=python, Graphics Exception: ESR 0x{n:x}"
SLICE_S = 0.05


def add_storm_args(ap: argparse.ArgumentParser) -> None:
    """The storm's shape on a bench's command line (the issue-18 mix by default)."""
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--rate", type=int, default=20500)
    ap.add_argument("--burst-seconds", type=float, default=5.0)
    ap.add_argument("--burst-rate", type=int, default=2000)


def stamp(t: float) -> bytes:
    return time.strftime("[%a %b %e %H:%M:%S %Y] ", time.gmtime(t)).encode()


def ordinary(rng: random.Random, i: int) -> bytes:
    size = int(math.exp(rng.uniform(3.7, 8.3)))  # log-uniform 40 B .. 4 KiB
    body = f"mlx5_core 0000:3b:00.0: port {i % 4} module event, cable {i} ".encode()
    body += b"x" * max(0, size - len(body))
    if i % 50 == 7:
        body = body[:30] + b"\xff\xfe bad bytes" + body[30:]
    return body


def storm_slices(rng: random.Random, *, seconds: float, rate: int, burst_seconds: float,
                 burst_rate: int, now: Callable[[], float] = time.time
                 ) -> Iterator[tuple[bytes, dict[int, int]]]:
    """Each slice of the storm: (its lines, newline-terminated; Xids in it per GPU index).
    ``now`` gives each slice's timestamp when the slice is made."""
    pool = [ordinary(rng, i) for i in range(4096)]  # generating each line would pace a writer
    burst_from = (seconds - burst_seconds) / 2
    lines = 0
    for k in range(math.ceil(seconds / SLICE_S)):
        elapsed = k * SLICE_S
        n = int(rate * SLICE_S)
        extra = (int(burst_rate * SLICE_S)
                 if burst_from <= elapsed < burst_from + burst_seconds else 0)
        pre = stamp(now())
        xids = dict.fromkeys(range(len(GPU_PCI)), 0)
        chunk = []
        for j in range(n + extra):
            i = lines + j
            if j >= n or i % 100 == 0:
                g = (i // 100 + j) % len(GPU_PCI)
                xids[g] += 1
                chunk.append(pre + XID.format(pci=GPU_PCI[g], pid=i, n=i).encode())
            else:
                chunk.append(pre + pool[i % 4096])
        lines += n + extra
        yield b"\n".join(chunk) + b"\n", xids
