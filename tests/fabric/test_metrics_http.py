"""The fabric scheduler's ``/metrics`` over real HTTP: it is prometheus_client's own server
(gpu_monitor/fabric/metrics.py ``serve_metrics``), so it negotiates OpenMetrics and gzip as
the daemon's exporter does; held here so that a change of server keeps both."""

from __future__ import annotations

import gzip

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from gpu_monitor.fabric.metrics import FabricCollector, serve_metrics
from tests.fabric.test_scheduler import make
from tests.test_exporter_formats import PROMETHEUS_2, get


def test_scheduler_metrics_negotiate_openmetrics_and_gzip(fabric_api, template):
    sched = make(fabric_api, template)
    server, thread = serve_metrics(sched, "127.0.0.1:0")
    registry = CollectorRegistry(auto_describe=False)
    registry.register(FabricCollector(sched))  # type: ignore[arg-type]
    url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
    try:
        for accept, gzipped in (("", False), ("*/*", True), (PROMETHEUS_2, True),
                                (PROMETHEUS_2, False)):
            status, headers, body = get(url, accept, "gzip" if gzipped else "")
            assert status == 200
            encoder, content_type = choose_encoder(accept)
            assert headers["Content-Type"] == content_type
            assert headers.get("Content-Encoding") == ("gzip" if gzipped else None)
            body = gzip.decompress(body) if gzipped else body
            assert body == encoder(registry)
            assert body.endswith(b"# EOF\n") == (accept == PROMETHEUS_2)
            assert b"gpu_monitor_fabric_leader 1.0" in body
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
