"""Shared helpers for the benchmark scripts (free ports, percentiles, a daemon subprocess)."""

from __future__ import annotations

import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request


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
    proc = subprocess.Popen(cmd, env={**os.environ, **(env or {})})
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
