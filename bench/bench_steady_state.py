"""Steady-state cost of the daemon on a simulated 8-GPU node at default intervals.

Starts ``gpu-monitor daemon --simulate h100-sxm-8`` as a subprocess, lets it settle, then for
``--minutes`` (default 5) scrapes /metrics every 15 s (as Prometheus would) and samples the
process: CPU seconds per minute (user+system, all threads), peak RSS (VmHWM), and whether torch
was ever loaded (its shared objects in /proc/<pid>/maps). Targets: <= 0.6 CPU-s/min,
<= 80 MiB, torch never imported.

The simulated node's own ticker runs inside the daemon process and is counted too (it is idle
when no fault is scheduled), so the figure is an upper bound for the daemon on real hardware.

    python bench/bench_steady_state.py [--minutes 5]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import psutil

sys.path.insert(0, os.path.dirname(__file__))
from _util import free_port, scrape, start_daemon  # noqa: E402


def vm_hwm_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def torch_loaded(pid: int) -> bool:
    with open(f"/proc/{pid}/maps") as fh:
        return any("torch" in line for line in fh)


def kube_loaded(pid: int) -> bool | str:
    """Whether the kubernetes client is loaded, from the process's mapped files: the client is
    pure Python, but it pulls in PyYAML's C extension (``_yaml``). "unknown" when the map
    cannot be read."""
    try:
        with open(f"/proc/{pid}/maps") as fh:
            maps = fh.read()
    except OSError:
        return "unknown"
    return "_yaml" in maps or "kubernetes" in maps


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--minutes", type=float, default=5.0)
    ap.add_argument("--settle", type=float, default=20.0)
    ap.add_argument("--config", help="daemon config file (e.g. remediation enabled, so the "
                                     "kubernetes client is loaded as in production)")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="bench-steady-")
    port = free_port()
    extra = ["--config", args.config] if args.config else []
    proc = start_daemon(["--simulate", "h100-sxm-8", "--state", os.path.join(tmp, "state.db"),
                         *extra], port)
    p = psutil.Process(proc.pid)
    try:
        time.sleep(args.settle)
        scrape(port)
        c0 = p.cpu_times()
        t0 = time.monotonic()
        end = t0 + args.minutes * 60
        scrapes = 0
        while time.monotonic() < end:
            scrape(port)
            scrapes += 1
            time.sleep(max(0.0, min(15.0, end - time.monotonic())))
        c1 = p.cpu_times()
        elapsed_min = (time.monotonic() - t0) / 60
        cpu = (c1.user - c0.user) + (c1.system - c0.system)
        hwm = vm_hwm_mib(proc.pid)
        torch = torch_loaded(proc.pid)
        proc_pid = proc.pid
        kube = kube_loaded(proc_pid)
        threads = p.num_threads()
    finally:
        proc.terminate()
        proc.wait(timeout=20)
    per_min = cpu / elapsed_min
    print(f"window {elapsed_min:.2f} min, {scrapes} scrapes, {threads} threads, "
          f"kubernetes client loaded: {kube}")
    print(f"CPU: {per_min:.3f} CPU-s/min (target <= 0.6): {'PASS' if per_min <= 0.6 else 'FAIL'}")
    verdict = "ERROR (not measured)" if hwm != hwm else ("PASS" if hwm <= 80 else "FAIL")
    print(f"peak RSS (VmHWM): {hwm:.1f} MiB (target <= 80): {verdict}")
    print(f"torch imported: {torch} (target False): {'PASS' if not torch else 'FAIL'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
