"""/metrics in every format a scraper asks for, scraped over real HTTP from the golden nodes.

The exporter (gpu_monitor/exporter.py) keeps its own lean renderers only because they are
faster; these tests hold them byte-equal to prometheus_client's output for the same registry
and the same ``Accept`` header, on the healthy golden node and the faulty one, in the text
format and in OpenMetrics, plain and gzipped. The exposition is also read by the parsers that
will read it in production: promtool for the text format, Prometheus's OpenMetrics parser
(promtool's backfill) and prometheus_client's strict one for OpenMetrics.
"""

from __future__ import annotations

import gzip
import http.client
import shutil
import subprocess
from urllib.parse import urlsplit

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import choose_encoder
from prometheus_client.openmetrics import exposition as openmetrics
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from gpu_monitor.exporter import Exporter, lean_openmetrics, lean_text
from tests.test_metrics_golden import serving

# The Accept headers real scrapers send, and the corner cases of prometheus_client's
# negotiation (which ours is held to).
PROMETHEUS_2 = ("application/openmetrics-text;version=1.0.0,"
                "application/openmetrics-text;version=0.0.1;q=0.75,"
                "text/plain;version=0.0.4;q=0.5,*/*;q=0.1")
PROMETHEUS_3 = ("application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.5,"
                "application/openmetrics-text;version=0.0.1;q=0.4,"
                "text/plain;version=1.0.0;escaping=allow-utf-8;q=0.3,"
                "text/plain;version=0.0.4;q=0.2,*/*;q=0.1")
PROTOBUF_FIRST = ("application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;"
                  "encoding=delimited;q=0.6," + PROMETHEUS_3)
ACCEPT = {
    "none": "",
    "curl": "*/*",
    "browser": "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8",
    "prometheus-2": PROMETHEUS_2,
    "prometheus-3": PROMETHEUS_3,
    "protobuf-first": PROTOBUF_FIRST,
    "openmetrics-no-version": "application/openmetrics-text",
    "openmetrics-0.0.1-only": "application/openmetrics-text;version=0.0.1",
    "text-1.0.0": "text/plain;version=1.0.0;escaping=underscores",
    "openmetrics-dots": "application/openmetrics-text;version=1.0.0;escaping=dots",
}
OPENMETRICS = "application/openmetrics-text"


def get(url: str, accept: str = "", encoding: str = "") -> tuple[int, dict[str, str], bytes]:
    """One GET over a fresh connection: status, headers, the body as sent (not decoded)."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    headers = {k: v for k, v in (("Accept", accept), ("Accept-Encoding", encoding)) if v}
    try:
        conn.request("GET", parts.path, headers=headers)
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), resp.read()
    finally:
        conn.close()


@pytest.fixture(scope="module", params=["h100_healthy", "h100_faulty"])
def golden(request, tmp_path_factory):
    """The golden node's registry and its ``/metrics`` URL, served by the real exporter."""
    with serving(request.param, tmp_path_factory.mktemp(request.param)) as served:
        yield served


@pytest.mark.parametrize("gzipped", [False, True], ids=["plain", "gzip"])
@pytest.mark.parametrize("scraper", sorted(ACCEPT))
def test_served_body_and_content_type_are_prometheus_clients(golden, scraper, gzipped):
    registry, url = golden
    accept = ACCEPT[scraper]
    status, headers, body = get(url, accept, "gzip" if gzipped else "")
    assert status == 200
    encoder, content_type = choose_encoder(accept)
    assert headers["Content-Type"] == content_type
    assert headers.get("Content-Encoding") == ("gzip" if gzipped else None)
    assert int(headers["Content-Length"]) == len(body)
    if gzipped:
        body = gzip.decompress(body)
    assert body == encoder(registry)
    assert body.endswith(b"# EOF\n") == content_type.startswith(OPENMETRICS)


def test_prometheus_gets_openmetrics_and_curl_gets_text_0_0_4(golden):
    _registry, url = golden
    _, headers, body = get(url, PROMETHEUS_2, "gzip")
    assert headers["Content-Type"].startswith(
        "application/openmetrics-text; version=1.0.0; charset=utf-8")
    assert gzip.decompress(body).endswith(b"# EOF\n")
    assert "Accept-Encoding" in headers["Vary"]
    _, headers, body = get(url, "*/*")
    assert headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    assert b"# EOF" not in body


def test_gzip_shrinks_a_scrape_more_than_tenfold(golden):
    _registry, url = golden
    _, _, plain = get(url)
    _, _, packed = get(url, "", "gzip;q=1.0, identity;q=0.5")
    assert len(packed) * 10 < len(plain)


@pytest.mark.parametrize("render, reference", [
    (lean_text, generate_latest),
    (lean_openmetrics, openmetrics.generate_latest),
], ids=["text", "openmetrics"])
def test_lean_renderers_themselves_match_without_falling_back(golden, render, reference):
    """The HTTP test above would also pass if the lean path always fell back to the reference:
    the lean renderers must reproduce the golden nodes on their own (else drop them)."""
    registry, _url = golden
    assert render(list(registry.collect())) == reference(registry)


class Escapes:
    """Families whose help texts and label values need every escape, of every type we use."""

    def collect(self):
        from prometheus_client.core import InfoMetricFamily

        c = CounterMetricFamily("esc_events", 'Quoted "x", a back\\slash\nand a newline.',
                                labels=["message"])
        c.add_metric(['say "hi"\\n\nthere'], 2)
        yield c
        g = GaugeMetricFamily("esc_size_bytes", "Has a unit.", labels=["k"], unit="bytes")
        g.add_metric(["\\"], float("inf"))
        g.add_metric(["nan"], float("nan"))
        yield g
        i = InfoMetricFamily("esc_build", "Build.")
        i.add_metric([], {"version": "1.2"})
        yield i


@pytest.mark.parametrize("render, reference", [
    (lean_text, generate_latest),
    (lean_openmetrics, openmetrics.generate_latest),
], ids=["text", "openmetrics"])
def test_lean_renderers_escape_help_and_label_values_as_prometheus_client(render, reference):
    registry = CollectorRegistry(auto_describe=False)
    registry.register(Escapes())  # type: ignore[arg-type]
    assert render(list(registry.collect())) == reference(registry)


def test_families_the_lean_renderers_do_not_reproduce_are_rendered_by_prometheus_client():
    class Odd:
        def collect(self):
            c = CounterMetricFamily("odd_events", "With a creation time.", labels=["k"],
                                    created=1700000000.0)
            c.add_metric(["a"], 3, created=1700000000.0)
            yield c
            g = GaugeMetricFamily("odd_stamped", "With a timestamp.", unit="seconds")
            g.add_metric([], 1.5, timestamp=1700000001.0)
            yield g

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Odd())  # type: ignore[arg-type]
    exporter = Exporter(registry, health=lambda: (True, ""))
    host, port = exporter.start("127.0.0.1:0")
    try:
        for accept in ("", PROMETHEUS_2):
            encoder, _ = choose_encoder(accept)
            _, _, body = get(f"http://{host}:{port}/metrics", accept)
            assert body == encoder(registry)
    finally:
        exporter.stop()


def test_text_format_passes_promtool(golden):
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (Debian package prometheus)")
    _registry, url = golden
    _, _, body = get(url, "text/plain;version=0.0.4")
    out = subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True,
                         timeout=60)
    assert out.returncode == 0 and not out.stdout.strip() and not out.stderr.strip(), (
        out.stdout.decode() + out.stderr.decode())


def test_openmetrics_passes_prometheus_openmetrics_parser(golden, tmp_path):
    """``promtool check metrics`` reads only the text format (it stops at ``# TYPE ... info``);
    Prometheus's OpenMetrics parser is reached through promtool's backfill, which wants a
    timestamp on every sample: each is stamped, nothing else changes, and every series of
    the text format must come through."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (Debian package prometheus)")
    _registry, url = golden
    _, _, body = get(url, PROMETHEUS_2)
    lines = body.decode().splitlines()
    stamped = tmp_path / "scrape.om"
    stamped.write_text("".join(line + "\n" if line.startswith("#") else f"{line} 1700000000\n"
                               for line in lines))
    out = subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", str(stamped),
                          str(tmp_path / "blocks")], capture_output=True, timeout=120, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    _, _, text = get(url)
    series = sum(1 for line in text.decode().splitlines() if not line.startswith("#"))
    assert f" {series} " in out.stdout.splitlines()[-1]  # NUM SERIES of the block written


def test_openmetrics_passes_prometheus_clients_strict_parser(golden):
    _registry, url = golden
    _, _, body = get(url, PROMETHEUS_3)
    families = list(text_string_to_metric_families(body.decode()))
    _, _, text = get(url)
    assert len(families) == text.count(b"# TYPE ")
