"""/metrics rendering of a faulty 8-GPU node: our lean renderers vs prometheus_client's, same run.

The node is the golden faulty H100 node of the tests (tests/test_metrics_golden.py: XIDs, an
SXid, an RDMA outage, AER, throttling, heat, an NVLink down, a pending row remap). Each pair
is measured in alternating turns (bench/_util.take_turns), so load from elsewhere hits both
alike; the ratio printed is the median of the per-round ratios ours / prometheus_client's.

1. render only, from one collected snapshot: the renderer's own cost, per format;
2. a scrape's body as served: collect from the store + render + gzip, for the header
   Prometheus sends (OpenMetrics) and for curl's (text 0.0.4); prometheus_client's side is
   what its handler does (``choose_encoder``'s encoder, ``gzip.compress`` at its level 9);
3. over HTTP: our exporter and prometheus_client's ``start_http_server`` on the same
   registry, scraped as Prometheus does (``Accept`` and ``Accept-Encoding: gzip``).

    python bench/bench_exposition.py [--rounds 200]

Target: every ratio <= 1 (else the lean renderers are not worth keeping: see exporter.py).
"""

from __future__ import annotations

import argparse
import gzip
import http.client
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from _util import median_ratio, take_turns  # noqa: E402
from prometheus_client import start_http_server  # noqa: E402
from prometheus_client.exposition import choose_encoder, generate_latest  # noqa: E402
from prometheus_client.openmetrics import exposition as openmetrics  # noqa: E402

from gpu_monitor.exporter import Exporter, lean_openmetrics, lean_text  # noqa: E402
from tests.test_exporter_formats import PROMETHEUS_2  # noqa: E402
from tests.test_metrics_golden import serving  # noqa: E402


def timed(fn: Callable[[], object]) -> Callable[[], float]:
    def run() -> float:
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0
    return run


def row(label: str, rounds: int, ours: Callable[[], object], theirs: Callable[[], object]) -> None:
    mine, ref = take_turns(rounds, timed(ours), timed(theirs))
    ratio = median_ratio(mine, ref)
    print(f"{label:<44} ours {statistics.median(mine) * 1e3:7.2f} ms   "
          f"prometheus_client {statistics.median(ref) * 1e3:7.2f} ms   ratio {ratio:.2f}x "
          f"{'PASS' if ratio <= 1 else 'FAIL'}")


def scraper(host: str, port: int, accept: str) -> Callable[[], bytes]:
    def scrape() -> bytes:
        conn = http.client.HTTPConnection(host, port, timeout=30)
        try:
            conn.request("GET", "/metrics",
                         headers={"Accept": accept, "Accept-Encoding": "gzip"})
            return conn.getresponse().read()
        finally:
            conn.close()
    return scrape


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=200)
    args = ap.parse_args()
    n = args.rounds
    with serving("h100_faulty", Path(tempfile.mkdtemp(prefix="bench-exposition-"))) as (
            registry, url):
        families = list(registry.collect())

        class Snapshot:
            def collect(self):
                return families

        snap = Snapshot()
        text, om = generate_latest(snap), openmetrics.generate_latest(snap)
        print(f"faulty 8-GPU node: {len(families)} families, "
              f"{sum(len(f.samples) for f in families)} samples")
        print(f"text 0.0.4: {len(text)} B plain, {len(gzip.compress(text, 6))} B gzip -6, "
              f"{len(gzip.compress(text, 9))} B gzip -9; OpenMetrics: {len(om)} B plain, "
              f"{len(gzip.compress(om, 6))} B gzip -6")
        print("1. render only (one collected snapshot)")
        row("   text 0.0.4", n, lambda: lean_text(families), lambda: generate_latest(snap))
        row("   OpenMetrics 1.0.0", n, lambda: lean_openmetrics(families),
            lambda: openmetrics.generate_latest(snap))
        print("2. a scrape's body: collect + render + gzip")
        exporter = Exporter(registry, health=lambda: (True, ""))
        for label, accept in (("   Prometheus (OpenMetrics, gzip)", PROMETHEUS_2),
                              ("   curl (text 0.0.4, gzip)", "*/*")):
            encoder, _ = choose_encoder(accept)
            row(label, n, lambda a=accept: exporter.render(a, "gzip"),
                lambda e=encoder: gzip.compress(e(registry)))
        print("3. over HTTP, as Prometheus scrapes")
        server, _thread = start_http_server(0, addr="127.0.0.1", registry=registry)
        try:
            host, port = url.split("/")[2].split(":")
            ours = scraper(host, int(port), PROMETHEUS_2)
            theirs = scraper("127.0.0.1", server.server_address[1], PROMETHEUS_2)
            assert gzip.decompress(ours()) == gzip.decompress(theirs())
            row("   GET /metrics (OpenMetrics, gzip)", n, ours, theirs)
        finally:
            server.shutdown()
            server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
