"""A real Prometheus scrapes the faulty golden node: it is offered OpenMetrics and gzip, takes
both, and stores every sample (the scrape a cluster's Prometheus makes, end to end).

Debian's ``prometheus`` package (the server beside promtool) is started on loopback with a
one-target config; the test waits for its first successful scrape through its HTTP API.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.parse
import urllib.request

import pytest

from gpu_monitor.exporter import Exporter
from tests.test_daemon_state_recovery import free_port
from tests.test_metrics_golden import serving
from tests.waiting import eventually


class RecordingExporter(Exporter):
    """The exporter, remembering the headers of each ``/metrics`` answer it made."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.answers: list[dict[str, str]] = []

    def render(self, accept: str = "", accept_encoding: str = ""):
        body, headers = super().render(accept, accept_encoding)
        self.answers.append(dict(headers))
        return body, headers


def api(port: int, path: str, **query: str) -> dict:
    url = f"http://127.0.0.1:{port}/api/v1/{path}?{urllib.parse.urlencode(query)}"
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.load(resp)["data"]


def test_prometheus_scrapes_openmetrics_gzipped_and_keeps_every_sample(tmp_path):
    exe = shutil.which("prometheus")
    if exe is None:
        pytest.skip("prometheus not installed (Debian package prometheus)")
    with serving("h100_faulty", tmp_path) as (registry, _url):
        exporter = RecordingExporter(registry, health=lambda: (True, ""))
        host, port = exporter.start("127.0.0.1:0")
        samples = sum(1 for line in exporter.render()[0].decode().splitlines()
                      if not line.startswith("#"))
        exporter.answers.clear()
        config = tmp_path / "prometheus.yml"
        config.write_text(
            "global: {scrape_interval: 2s, scrape_timeout: 2s}\n"
            "scrape_configs:\n"
            "  - job_name: gpu-monitor\n"
            f"    static_configs: [{{targets: ['{host}:{port}']}}]\n")
        web = free_port()
        log = (tmp_path / "prometheus.log").open("wb")
        prom = subprocess.Popen(
            [exe, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{web}"],
            stdout=log, stderr=subprocess.STDOUT)
        try:
            def scraped() -> list:
                if prom.poll() is not None:
                    raise AssertionError((tmp_path / "prometheus.log").read_text()[-2000:])
                try:
                    return api(web, "query", query='scrape_samples_scraped{job="gpu-monitor"}')[
                        "result"]
                except OSError:
                    return []

            result = eventually(scraped, timeout=120, interval=0.2,
                                what="Prometheus's first scrape")
            target = api(web, "targets")["activeTargets"][0]
            assert target["health"] == "up" and target["lastError"] == "", target
            assert float(result[0]["value"][1]) == samples
            xid = api(web, "query", query='gpu_monitor_xid_events_total{code="79",gpu="3"}')
            assert float(xid["result"][0]["value"][1]) >= 1
            answer = exporter.answers[0]
            assert answer["Content-Type"].startswith("application/openmetrics-text; version=1.0.0")
            assert answer["Content-Encoding"] == "gzip"
        finally:
            prom.terminate()
            prom.wait(timeout=30)
            log.close()
            exporter.stop()
