"""The daemon's HTTP endpoint: ``/metrics`` (Prometheus text format), ``/healthz``, ``/readyz``.

A private ``CollectorRegistry`` holds only our collectors (no process/platform defaults whose
values would make golden files non-deterministic); every scrape builds the exposition afresh
from the store. ``/healthz`` answers 200 while the daemon's loops are alive and 503 with the
reason when one has stalled (the liveness probe restarts the pod); ``/readyz`` answers 200 once
the kernel-log replay is done.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.utils import floatToGoString

log = logging.getLogger(__name__)


_TYPE_SUFFIX = {"counter": ("_total", "counter"), "info": ("_info", "gauge"),
                "stateset": ("", "gauge"), "unknown": ("", "untyped")}


def _escape_value(v: str) -> str:
    if "\\" in v or '"' in v or "\n" in v:
        v = v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return v


def render_text(registry: CollectorRegistry) -> bytes:
    """The Prometheus text format (0.0.4) of ``registry``'s families.

    Equivalent to prometheus_client's ``generate_latest`` for the families we produce (same
    names, suffixes, label order and number formatting, so golden files do not change), but
    without re-validating every label name of every sample: our label names are a fixed,
    tested vocabulary, and that validation was 60% of a scrape's cost.
    """
    out: list[str] = []
    append = out.append
    for family in registry.collect():
        suffix, mtype = _TYPE_SUFFIX.get(family.type, ("", family.type))
        name = family.name + suffix
        doc = family.documentation.replace("\\", "\\\\").replace("\n", "\\n")
        append(f"# HELP {name} {doc}\n# TYPE {name} {mtype}\n")
        for sample in family.samples:
            if sample.name.endswith("_created"):
                continue
            labels = sample.labels
            if labels:
                body = ",".join(f'{k}="{_escape_value(v)}"' for k, v in sorted(labels.items()))
                append(f"{sample.name}{{{body}}} {floatToGoString(sample.value)}\n")
            else:
                append(f"{sample.name} {floatToGoString(sample.value)}\n")
    return "".join(out).encode()


def parse_listen(text: str) -> tuple[str, int]:
    """``0.0.0.0:9425`` / ``:9425`` / ``[::1]:9425`` -> (host, port)."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"listen address must be HOST:PORT, got {text!r}")
    host = host.strip("[]") or "0.0.0.0"
    return host, int(port)


class Exporter:
    def __init__(self, registry: CollectorRegistry, health: Callable[[], tuple[bool, str]],
                 ready: Callable[[], bool] = lambda: True):
        self.registry = registry
        self.health = health
        self.ready = ready
        self.server: ThreadingHTTPServer | None = None
        self.thread: threading.Thread | None = None

    def render(self) -> bytes:
        return render_text(self.registry)

    def start(self, listen: str) -> tuple[str, int]:
        host, port = parse_listen(listen)
        exporter = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - http.server API
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    try:
                        body = exporter.render()
                    except Exception as exc:  # noqa: BLE001 - a scrape error must not kill us
                        log.error("scrape failed: %s", exc, exc_info=True)
                        self._send(500, f"scrape failed: {exc}\n".encode(), "text/plain")
                        return
                    self._send(200, body, CONTENT_TYPE_LATEST)
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

            def _send(self, code: int, body: bytes, ctype: str) -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
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
