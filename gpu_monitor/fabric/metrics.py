"""The fabric scheduler's own HTTP endpoint: ``/metrics`` (leader, probes, busbw per group and
node pair), ``/healthz`` and ``/readyz`` for the kubelet's probes, on one port (9426).

The metrics are prometheus_client's own WSGI application (OpenMetrics and gzip negotiated as
for any exporter); the two health paths answer 200 or 503 with the reason in the body
(``FabricScheduler.health`` / ``readiness``), as the daemon's exporter does on 9425.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from gpu_monitor.fabric.plan import KINDS, OUTCOMES
from gpu_monitor.model import parse_iso

if TYPE_CHECKING:
    from gpu_monitor.fabric.scheduler import FabricScheduler


def fabric_metric_docs() -> tuple[Any, ...]:
    from gpu_monitor.metric_families import MetricDoc

    return (
        MetricDoc("gpu_monitor_fabric_leader", "gauge", (),
                  "1 when this fabric-scheduler replica holds the lease."),
        MetricDoc("gpu_monitor_fabric_group_busbw_gb_per_s", "gauge", ("group", "op"),
                  "Bus bandwidth at the largest size of the last probe of each group."),
        MetricDoc("gpu_monitor_fabric_group_small_latency_p95_seconds", "gauge",
                  ("group", "op"), "Worst small-message p95 latency of the last group probe."),
        MetricDoc("gpu_monitor_fabric_pair_busbw_gb_per_s", "gauge", ("node_a", "node_b", "op"),
                  "Bus bandwidth at the largest size of the last probe of each node pair."),
        MetricDoc("gpu_monitor_fabric_pair_small_latency_p95_seconds", "gauge",
                  ("node_a", "node_b", "op"),
                  "Worst small-message p95 latency of the last probe of each node pair."),
        MetricDoc("gpu_monitor_fabric_last_probe_timestamp_seconds", "gauge", ("node",),
                  "When each node last completed a fabric probe (Unix time)."),
        MetricDoc("gpu_monitor_fabric_last_active_check_timestamp_seconds", "gauge", ("node",),
                  "When each node last completed the idle-time active checks (Unix time)."),
        MetricDoc("gpu_monitor_fabric_probes_total", "counter", ("kind", "outcome"),
                  "Probes finished, by kind (group, bisect, active-check) and outcome (pass, "
                  "fail, unknown, abandoned)."),
        MetricDoc("gpu_monitor_fabric_probes_in_flight", "gauge", ("kind",),
                  "Probe Jobs running now."),
        MetricDoc("gpu_monitor_fabric_bisections_in_progress", "gauge", (),
                  "Failed groups being bisected."),
        MetricDoc("gpu_monitor_fabric_reports_total", "counter", (),
                  "GPUHealthReports filed for nodes a bisection named."),
        MetricDoc("gpu_monitor_fabric_idle_nodes", "gauge", (),
                  "GPU nodes eligible and idle long enough to be probed now."),
    )


class FabricCollector:
    """A prometheus_client collector reading the scheduler's snapshot at scrape time."""

    def __init__(self, scheduler: FabricScheduler):
        self.scheduler = scheduler

    def collect(self) -> Iterable[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        docs = {d.name: d.help for d in fabric_metric_docs()}
        snap = self.scheduler.snapshot()

        def gauge(name: str, labels: Sequence[str] = ()) -> Any:
            return GaugeMetricFamily(name, docs[name], labels=list(labels))

        g = gauge("gpu_monitor_fabric_leader")
        g.add_metric([], 1.0 if snap["leader"] else 0.0)
        yield g
        bw = gauge("gpu_monitor_fabric_group_busbw_gb_per_s", ("group", "op"))
        lat = gauge("gpu_monitor_fabric_group_small_latency_p95_seconds", ("group", "op"))
        for group, ops in sorted(snap["groups"].items()):
            for op, v in sorted(ops.items()):
                if v.get("busbw_gb_per_s") is not None:
                    bw.add_metric([group, op], float(v["busbw_gb_per_s"]))
                if v.get("small_p95_s") is not None:
                    lat.add_metric([group, op], float(v["small_p95_s"]))
        yield bw
        yield lat
        bw = gauge("gpu_monitor_fabric_pair_busbw_gb_per_s", ("node_a", "node_b", "op"))
        lat = gauge("gpu_monitor_fabric_pair_small_latency_p95_seconds",
                    ("node_a", "node_b", "op"))
        for (a, b), ops in sorted(snap["pairs"].items()):
            for op, v in sorted(ops.items()):
                if v.get("busbw_gb_per_s") is not None:
                    bw.add_metric([a, b, op], float(v["busbw_gb_per_s"]))
                if v.get("small_p95_s") is not None:
                    lat.add_metric([a, b, op], float(v["small_p95_s"]))
        yield bw
        yield lat
        for name, key in (("gpu_monitor_fabric_last_probe_timestamp_seconds", "last_probe"),
                          ("gpu_monitor_fabric_last_active_check_timestamp_seconds",
                           "last_check")):
            g = gauge(name, ("node",))
            for node, rec in sorted(snap["records"].items()):
                if rec.get(key):
                    g.add_metric([node], parse_iso(rec[key]).timestamp())
            yield g
        c = CounterMetricFamily("gpu_monitor_fabric_probes_total",
                                docs["gpu_monitor_fabric_probes_total"],
                                labels=["kind", "outcome"])
        for kind in KINDS:
            for outcome in OUTCOMES:
                c.add_metric([kind, outcome], float(snap["counts"].get((kind, outcome), 0)))
        yield c
        g = gauge("gpu_monitor_fabric_probes_in_flight", ("kind",))
        for kind in KINDS:
            g.add_metric([kind], float(snap["in_flight"].get(kind, 0)))
        yield g
        g = gauge("gpu_monitor_fabric_bisections_in_progress")
        g.add_metric([], float(snap["bisections"]))
        yield g
        yield CounterMetricFamily("gpu_monitor_fabric_reports_total",
                                  docs["gpu_monitor_fabric_reports_total"],
                                  value=float(snap["reports"]))
        g = gauge("gpu_monitor_fabric_idle_nodes")
        g.add_metric([], float(snap["idle_nodes"]))
        yield g


HEALTH_PATHS = ("/healthz", "/readyz")


def make_app(scheduler: FabricScheduler, registry: Any) -> Any:
    """The WSGI application: the two health paths, everything else prometheus_client's."""
    from prometheus_client import make_wsgi_app

    metrics_app = make_wsgi_app(registry)

    def app(environ: dict[str, Any], start_response: Any) -> Any:
        path = environ.get("PATH_INFO") or "/"
        if path not in HEALTH_PATHS:
            return metrics_app(environ, start_response)
        ok, why = scheduler.health() if path == "/healthz" else scheduler.readiness()
        body = f"{why}\n".encode()
        start_response("200 OK" if ok else "503 Service Unavailable",
                       [("Content-Type", "text/plain; charset=utf-8"),
                        ("Content-Length", str(len(body)))])
        return [body]

    return app


def serve_metrics(scheduler: FabricScheduler, listen: str) -> Any:
    """Serve ``/metrics``, ``/healthz`` and ``/readyz`` on ``listen`` (``host:port``) from a
    daemon thread; returns (server, thread)."""
    import threading
    from socketserver import ThreadingMixIn
    from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

    from prometheus_client import CollectorRegistry

    class Server(ThreadingMixIn, WSGIServer):
        daemon_threads = True

    class QuietHandler(WSGIRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            """Scrapes and probes every few seconds are not worth a log line each."""

    host, _, port = listen.rpartition(":")
    registry = CollectorRegistry(auto_describe=False)
    registry.register(FabricCollector(scheduler))  # type: ignore[arg-type]
    server = make_server(host or "0.0.0.0", int(port), make_app(scheduler, registry), Server,
                         handler_class=QuietHandler)
    thread = threading.Thread(target=server.serve_forever, name="fabric-http", daemon=True)
    thread.start()
    return server, thread
