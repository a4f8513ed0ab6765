"""Scan throughput of ``gpu-monitor check xid --kmsg FILE`` vs ``grep -c 'NVRM: Xid'``.

Builds a synthetic dmesg-format log (default 1 GiB) with one Xid line per 10,000 lines, then
times grep and gpu-monitor on the same file in the same run (file cache warmed first).
Target: gpu-monitor >= 0.25x grep's throughput.

    python bench/bench_scan.py [--size-mib 1024] [--keep PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

FILLER = ("[{t:12.6f}] mlx5_core 0000:4f:00.0: mlx5_port_module_event:1131:(pid 0): "
          "Port module event: module 0, Cable plugged {i}\n")
XID = ("[{t:12.6f}] NVRM: Xid (PCI:0000:{bus:02x}:00): 13, pid=2187, name=python, "
       "Graphics SM Warp Exception on (GPC 0, TPC 0, SM 0): Out Of Range Address\n")
BUSES = (0x53, 0x64, 0x75, 0x86, 0x97, 0xA8, 0xB9, 0xCA)


def build(path: str, size: int) -> int:
    xids = 0
    written = 0
    i = 0
    with open(path, "w") as fh:
        chunk = []
        while written < size:
            t = i * 0.001
            if i % 10_000 == 9_999:
                line = XID.format(t=t, bus=BUSES[xids % 8])
                xids += 1
            else:
                line = FILLER.format(t=t, i=i)
            chunk.append(line)
            written += len(line)
            i += 1
            if len(chunk) >= 10_000:
                fh.write("".join(chunk))
                chunk.clear()
        fh.write("".join(chunk))
    return xids


def timed(cmd: list[str]) -> tuple[float, str]:
    t0 = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    return time.perf_counter() - t0, out.stdout


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--keep", help="reuse/keep the log at this path")
    args = ap.parse_args()
    path = args.keep or os.path.join(tempfile.mkdtemp(prefix="bench-scan-"), "dmesg.log")
    size = args.size_mib * 1024 * 1024
    if not (os.path.exists(path) and os.path.getsize(path) >= size):
        xids = build(path, size)
    else:
        xids = None
    subprocess.run(["cat", path], stdout=subprocess.DEVNULL, check=True)  # warm the cache
    t_grep, out = timed(["grep", "-c", "NVRM: Xid", path])
    grep_count = int(out.strip())
    state = os.path.join(os.path.dirname(path), "state.db")
    t_gm, out = timed([sys.executable, "-m", "gpu_monitor", "check", "xid", "--kmsg", path,
                       "--profile", "cpu-only", "--state", state, "--path.sysfs",
                       os.path.dirname(path), "--path.procfs", os.path.dirname(path),
                       "--output", "json", "--log-level", "error"])
    report = json.loads(out)
    found = sum(1 for r in report["results"] if r["reason"].startswith("Xid"))
    mib = os.path.getsize(path) / 2**20
    print(f"log: {mib:.0f} MiB, {grep_count} Xid lines" + (f" (built {xids})" if xids else ""))
    print(f"grep -c        : {t_grep:7.2f} s  {mib / t_grep:8.1f} MiB/s")
    print(f"gpu-monitor    : {t_gm:7.2f} s  {mib / t_gm:8.1f} MiB/s  ({found} Xid results)")
    ratio = t_grep / t_gm
    if found != grep_count:
        # A scan that missed lines is not a measurement of the scan.
        print(f"ERROR: gpu-monitor reported {found} Xid results, grep counted {grep_count}")
        return 1
    print(f"ratio gpu-monitor/grep throughput: {ratio:.2f}x (target >= 0.25x): "
          f"{'PASS' if ratio >= 0.25 else 'FAIL'}")
    if not args.keep:
        os.remove(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
