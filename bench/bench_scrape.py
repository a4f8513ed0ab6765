"""/metrics scrape latency: gpu-monitor on a simulated 8-GPU node vs node_exporter, same run.

Both exporters run on this machine; each is scraped ``--n`` times alternately (so noise hits
both alike) and the p50/p99 latencies and their ratio are printed. node_exporter is Debian's
``prometheus-node-exporter`` (``apt-get install prometheus-node-exporter``). Target: gpu-monitor
p50 <= 1x node_exporter's.

    python bench/bench_scrape.py [--n 200]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(__file__))
from _util import free_port, percentile, start_daemon, summary  # noqa: E402


def timed_scrape(url: str) -> tuple[float, int]:
    t0 = time.perf_counter()
    with urllib.request.urlopen(url, timeout=10) as r:
        body = r.read()
    return time.perf_counter() - t0, len(body)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=200)
    args = ap.parse_args()
    exe = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")
    if exe is None:
        print("node_exporter not installed: apt-get install prometheus-node-exporter")
        return 2
    tmp = tempfile.mkdtemp(prefix="bench-scrape-")
    gm_port, ne_port = free_port(), free_port()
    gm = start_daemon(["--simulate", "h100-sxm-8", "--state", os.path.join(tmp, "s.db")],
                      gm_port)
    ne = subprocess.Popen([exe, f"--web.listen-address=127.0.0.1:{ne_port}"],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(15)  # let every passive check run at least once
        gm_url = f"http://127.0.0.1:{gm_port}/metrics"
        ne_url = f"http://127.0.0.1:{ne_port}/metrics"
        for _ in range(5):  # warm both
            timed_scrape(gm_url)
            timed_scrape(ne_url)
        gm_t, ne_t = [], []
        for _ in range(args.n):
            t, gm_size = timed_scrape(gm_url)
            gm_t.append(t)
            t, ne_size = timed_scrape(ne_url)
            ne_t.append(t)
    finally:
        gm.terminate()
        ne.terminate()
        gm.wait(timeout=20)
        ne.wait(timeout=20)
    print(f"gpu-monitor   ({gm_size / 1024:.0f} KiB): {summary(gm_t)}")
    print(f"node_exporter ({ne_size / 1024:.0f} KiB): {summary(ne_t)}")
    ratio = percentile(gm_t, 0.5) / percentile(ne_t, 0.5)
    print(f"ratio p50 gpu-monitor/node_exporter: {ratio:.2f}x (target <= 1x): "
          f"{'PASS' if ratio <= 1 else 'FAIL'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
