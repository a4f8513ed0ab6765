"""The daemon's HTTP endpoint: ``/metrics``, ``/healthz``, ``/readyz``.

``/metrics`` speaks what a scraper asks for, as prometheus_client's own handler does (so
Prometheus, curl and a browser each get what they expect from dcgm-exporter or node_exporter):

1. **The format follows ``Accept``**, negotiated by prometheus_client's ``choose_encoder``
   itself: ``application/openmetrics-text; version=1.0.0`` (Prometheus's first choice) gets
   OpenMetrics, ending in ``# EOF``; anything else the text format 0.0.4 (or 1.0.0 when asked
   for). The Content-Type is the one prometheus_client sends for the same header.
2. **gzip when the scraper accepts it** (``Accept-Encoding: gzip``, as Prometheus always sends):
   a faulty 8-GPU node's ~212 KB become ~13 KB. Level 6, the default of Go's gzip writer that
   promhttp (behind node_exporter and dcgm-exporter) has used, rather than prometheus_client's
   9: a fifth of level 9's time for 7 % more bytes.
3. **The body is byte-equal to prometheus_client's** for the same registry and header. The lean
   renderers below exist only because they are faster (bench/bench_exposition.py) and are held
   to that by tests/test_exporter_formats.py on the golden nodes in both formats; anything they
   do not reproduce (exemplars, native histograms, ``_created`` samples in the text format,
   name escaping other than identity) is rendered by prometheus_client instead.

A private ``CollectorRegistry`` holds only our collectors (no process/platform defaults whose
values would make golden files non-deterministic); every scrape builds the exposition afresh
from the store. ``/healthz`` answers 200 while the daemon's loops are alive and 503 with the
reason when one has stalled (the liveness probe restarts the pod); ``/readyz`` answers 200 once
the kernel-log replay is done.
"""

from __future__ import annotations

import gzip
import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder, gzip_accepted
from prometheus_client.utils import floatToGoString

log = logging.getLogger(__name__)

#: Go's ``gzip.DefaultCompression`` (guarantee 2).
GZIP_LEVEL = 6

# Family type -> (sample-name suffix of the HELP/TYPE lines, type word) in the text format.
_TYPE_SUFFIX = {"counter": ("_total", "counter"), "info": ("_info", "gauge"),
                "stateset": ("", "gauge"), "gaugehistogram": ("", "histogram"),
                "unknown": ("", "untyped")}
# Name escapings under which a legacy metric or label name is written unchanged.
_IDENTITY_ESCAPINGS = frozenset({"underscores", "allow-utf-8", "values"})
# Samples the text format moves into families of their own (the reference does; we do not).
_OM_ONLY_SUFFIXES = ("_created", "_gsum", "_gcount")


class _Unsupported(Exception):
    """A family the lean renderers do not reproduce byte for byte; the reference renders."""


def _escape_value(v: str) -> str:
    if "\\" in v or '"' in v or "\n" in v:
        v = v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return v


def _sample_line(sample: Any) -> str:
    if sample.exemplar is not None or getattr(sample, "native_histogram", None) is not None:
        raise _Unsupported(sample.name)
    labels = sample.labels
    value = floatToGoString(sample.value)
    if labels:
        body = ",".join(f'{k}="{_escape_value(v)}"' for k, v in sorted(labels.items()))
        return f"{sample.name}{{{body}}} {value}\n"
    return f"{sample.name} {value}\n"


def lean_text(families: list[Any]) -> bytes:
    """The text format (0.0.4) of collected ``families``, as prometheus_client's
    ``generate_latest`` writes it, without validating and escaping every label name of every
    sample again: ours are a fixed, tested vocabulary, and that work is over half of the
    reference's rendering time. Raises ``_Unsupported`` for what it does not reproduce."""
    out: list[str] = []
    append = out.append
    for family in families:
        suffix, mtype = _TYPE_SUFFIX.get(family.type, ("", family.type))
        name = family.name + suffix
        doc = family.documentation.replace("\\", "\\\\").replace("\n", "\\n")
        append(f"# HELP {name} {doc}\n# TYPE {name} {mtype}\n")
        for sample in family.samples:
            if sample.timestamp is not None or sample.name.endswith(_OM_ONLY_SUFFIXES):
                raise _Unsupported(sample.name)
            append(_sample_line(sample))
    return "".join(out).encode()


def lean_openmetrics(families: list[Any]) -> bytes:
    """OpenMetrics 1.0.0 of collected ``families``, as prometheus_client's OpenMetrics
    ``generate_latest`` writes it (family names without the counter's ``_total``, ``# UNIT``,
    quotes escaped in help texts, ``# EOF``), at a fifth of its cost. Raises ``_Unsupported``
    for what it does not reproduce."""
    out: list[str] = []
    append = out.append
    for family in families:
        name = family.name
        doc = _escape_value(family.documentation)
        append(f"# HELP {name} {doc}\n# TYPE {name} {family.type}\n")
        if family.unit:
            append(f"# UNIT {name} {family.unit}\n")
        for sample in family.samples:
            if sample.timestamp is not None:
                raise _Unsupported(sample.name)
            append(_sample_line(sample))
    append("# EOF\n")
    return "".join(out).encode()


def render(registry: Any, accept: str) -> tuple[bytes, str]:
    """The exposition of ``registry`` for a scraper sending ``Accept: accept``, and its
    Content-Type: prometheus_client's choice of format, and its bytes (guarantees 1 and 3)."""
    encoder, content_type = choose_encoder(accept)
    mime, *params = (p.strip() for p in content_type.split(";"))
    options = dict(p.split("=", 1) for p in params)
    if options.get("escaping", "underscores") in _IDENTITY_ESCAPINGS:
        lean = lean_openmetrics if mime == "application/openmetrics-text" else lean_text
        families = list(registry.collect())
        try:
            return lean(families), content_type
        except _Unsupported:
            return encoder(_Collected(families)), content_type
    return encoder(registry), content_type


class _Collected:
    """Families already collected, handed to the reference renderer without collecting twice."""

    def __init__(self, families: list[Any]):
        self.families = families

    def collect(self) -> list[Any]:
        return self.families


def parse_listen(text: str) -> tuple[str, int]:
    """``0.0.0.0:9425`` / ``:9425`` / ``[::1]:9425`` -> (host, port)."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"listen address must be HOST:PORT, got {text!r}")
    host = host.strip("[]") or "0.0.0.0"
    return host, int(port)


class Exporter:
    """The HTTP server in a thread of the daemon: ``start`` binds and serves, ``stop`` ends."""

    def __init__(self, registry: CollectorRegistry, health: Callable[[], tuple[bool, str]],
                 ready: Callable[[], bool] = lambda: True):
        self.registry = registry
        self.health = health
        self.ready = ready
        self.server: ThreadingHTTPServer | None = None
        self.thread: threading.Thread | None = None

    def render(self, accept: str = "", accept_encoding: str = "") -> tuple[bytes, dict[str, str]]:
        """The ``/metrics`` body and its headers for a request's ``Accept`` and
        ``Accept-Encoding`` (guarantees 1-3)."""
        body, content_type = render(self.registry, accept)
        headers = {"Content-Type": content_type, "Vary": "Accept, Accept-Encoding"}
        if gzip_accepted(accept_encoding):
            body = gzip.compress(body, compresslevel=GZIP_LEVEL)
            headers["Content-Encoding"] = "gzip"
        return body, headers

    def start(self, listen: str) -> tuple[str, int]:
        host, port = parse_listen(listen)
        exporter = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - http.server API
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    try:
                        body, headers = exporter.render(self.headers.get("Accept", ""),
                                                        self.headers.get("Accept-Encoding", ""))
                    except Exception as exc:  # noqa: BLE001 - a scrape error must not kill us
                        log.error("scrape failed: %s", exc, exc_info=True)
                        self._send(500, f"scrape failed: {exc}\n".encode(), "text/plain")
                        return
                    self._send(200, body, headers.pop("Content-Type"), headers)
                elif path == "/healthz":
                    ok, why = exporter.health()
                    self._send(200 if ok else 503, (why or "ok").encode() + b"\n", "text/plain")
                elif path == "/readyz":
                    ok = exporter.ready()
                    self._send(200 if ok else 503, b"ready\n" if ok else b"replaying\n",
                               "text/plain")
                elif path == "/":
                    self._send(200, b"gpu-monitor: /metrics /healthz /readyz\n", "text/plain")
                else:
                    self._send(404, b"not found\n", "text/plain")

            def _send(self, code: int, body: bytes, ctype: str,
                      extra: dict[str, str] | None = None) -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                for key, value in (extra or {}).items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, fmt, *args):  # quiet: scrapes every 15 s are not news
                log.debug("http %s", fmt % args)

        self.server = ThreadingHTTPServer((host, port), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, name="exporter",
                                       daemon=True)
        self.thread.start()
        bound = self.server.server_address
        log.info("serving /metrics on %s:%d", bound[0], bound[1])
        return bound[0], bound[1]

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None
