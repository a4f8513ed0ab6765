"""Shared helpers for the benchmark scripts (free ports, percentiles, a daemon subprocess, the
check-against-a-bare-loop turns)."""

from __future__ import annotations

import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def percentile(values, q: float) -> float:
    data = sorted(values)
    if not data:
        return float("nan")
    k = (len(data) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(data) - 1)
    return data[lo] + (data[hi] - data[lo]) * (k - lo)


def summary(values) -> str:
    return (f"n={len(values)} p50={percentile(values, 0.5) * 1e3:.2f} ms "
            f"p99={percentile(values, 0.99) * 1e3:.2f} ms "
            f"mean={statistics.fmean(values) * 1e3:.2f} ms")


def start_daemon(args: list[str], port: int, env=None) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "gpu_monitor", "daemon", "--listen", f"127.0.0.1:{port}",
           "--log-level", "warning", *args]
    env = {**os.environ, **(env or {})}
    # ``python -m`` puts the working directory first on sys.path, before $PYTHONPATH: a daemon
    # meant to run another checkout's code (PYTHONPATH=<tree>, --tree) starts in that tree, or
    # it would run this checkout's whatever the variable says.
    tree = env.get("PYTHONPATH", "").split(os.pathsep)[0]
    proc = subprocess.Popen(cmd, env=env, cwd=tree if tree and os.path.isdir(tree) else None)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as r:
                if r.status == 200:
                    return proc
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("daemon did not become ready")


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return r.read().decode()


def take_turns(rounds: int, ours: Callable[[], float],
               bare: Callable[[], float]) -> tuple[list[float], list[float]]:
    """The check's own measuring code and a bare loop each take one turn a round, alternating
    which goes first, so load from elsewhere and clock drift hit both alike. Returns each
    side's measurements, one a round."""
    mine: list[float] = []
    theirs: list[float] = []
    for r in range(rounds):
        for side in ((0, 1) if r % 2 == 0 else (1, 0)):  # alternate who goes first
            if side == 0:
                mine.append(ours())
            else:
                theirs.append(bare())
    return mine, theirs


def median_ratio(ours: list[float], bare: list[float]) -> float:
    """The median of the per-round ratios ours / bare."""
    return statistics.median(o / b for o, b in zip(ours, bare, strict=True))
