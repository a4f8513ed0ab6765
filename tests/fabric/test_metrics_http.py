"""The fabric scheduler's HTTP endpoint over real HTTP: ``/metrics`` is prometheus_client's
own WSGI application (gpu_monitor/fabric/metrics.py ``serve_metrics``), so it negotiates
OpenMetrics and gzip as the daemon's exporter does; held here so that a change of server keeps
both. ``/healthz`` and ``/readyz`` beside it are what the Deployment's probes ask."""

from __future__ import annotations

import gzip
import threading

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from gpu_monitor.clock import FakeClock
from gpu_monitor.fabric.metrics import FabricCollector, serve_metrics
from tests.fabric.test_scheduler import make
from tests.test_exporter_formats import PROMETHEUS_2, get
from tests.waiting import eventually


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


def test_the_health_paths_answer_on_the_metrics_port_from_the_loops_state(fabric_api, template):
    """What the Deployment's probes see: /healthz fails only for a stalled loop, /readyz
    passes once the loop runs and, leading, its first round is done."""
    clock = FakeClock()
    sched = make(fabric_api, template, clock=clock, stall_after_s=60.0)
    server, thread = serve_metrics(sched, "127.0.0.1:0")
    base = f"http://127.0.0.1:{server.server_address[1]}"

    def answer(path):
        status, headers, body = get(base + path)
        assert headers["Content-Type"].startswith("text/plain")
        return status, body.decode().strip()

    try:
        assert answer("/healthz") == (200, "starting")
        assert answer("/readyz")[0] == 503
        sched.heartbeat = clock.monotonic()  # the loop has turned once
        assert answer("/readyz") == (503, "leading, the first round not done yet")
        sched.tick()
        assert answer("/readyz") == (200, "leader")
        assert answer("/healthz") == (200, "leader")
        clock.advance(61.0)  # and not since
        status, why = answer("/healthz")
        assert status == 503 and "has not turned for 61 s" in why
        assert answer("/readyz")[0] == 503
        assert get(base + "/metrics")[0] == 200
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def test_the_loop_beats_while_it_runs(fabric_api, template):
    sched = make(fabric_api, template)
    runner = threading.Thread(target=sched.run, daemon=True)
    runner.start()
    try:
        eventually(lambda: sched.readiness()[0], what="the running scheduler is ready")
        assert sched.health() == (True, "leader")
    finally:
        sched.stop()
        runner.join(timeout=30)
