"""The HTTP front of the fake apiserver: URL routing, discovery, fault injection, the wire.

Why apart from the state: this is what kubectl and the Python client see first (discovery
documents, paths, methods, Content-Types, chunked watch streams, dropped connections), kept
separate from the semantics of the objects behind it (fake_apiserver.py).
"""

from __future__ import annotations

import base64
import copy
import json
import socket
import threading
import traceback
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, unquote, urlsplit

from tests.kube.fake_apiserver_api import (
    REASONS,
    SERVER_VERSION,
    ApiError,
    Fault,
    RecordedRequest,
    bad_request,
    internal_error,
    parse_field_selector,
    parse_label_selector,
    to_view,
)
from tests.kube.fake_apiserver_patch import PatchError, decode_json

if TYPE_CHECKING:
    from tests.kube.fake_apiserver import FakeApiServer


class HttpFrontMixin:
    """Routing and discovery for FakeApiServer (whose operations do the work)."""

    # ----------------------------------------------------------------------------------- discovery

    def _groups(self) -> dict[str, list[str]]:
        groups: dict[str, list[str]] = {}
        for g, v, _p in self._resources:
            if g and v not in groups.setdefault(g, []):
                groups[g].append(v)
        return groups

    def _api_group(self, g: str) -> dict:
        vs = self._groups()[g]
        gvs = [{"groupVersion": f"{g}/{v}", "version": v} for v in vs]
        return {"name": g, "versions": gvs, "preferredVersion": gvs[0]}

    def _resource_list(self, group: str, version: str) -> dict:
        verbs = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]
        out = []
        for (g, v, _p), r in sorted(self._resources.items()):
            if (g, v) != (group, version):
                continue
            entry: dict[str, Any] = {
                "name": r.plural,
                "singularName": r.kind.lower(),
                "namespaced": r.namespaced,
                "kind": r.kind,
                "verbs": verbs,
            }
            if r.short_names:
                entry["shortNames"] = list(r.short_names)
            entry["storageVersionHash"] = base64.b64encode(f"{r.qualified}".encode()).decode()[:11]
            out.append(entry)
            if r.status:
                out.append(
                    {
                        "name": f"{r.plural}/status",
                        "singularName": "",
                        "namespaced": r.namespaced,
                        "kind": r.kind,
                        "verbs": ["get", "patch", "update"],
                    }
                )
            if r.gr == ("", "pods"):
                out.append(
                    {
                        "name": "pods/eviction",
                        "singularName": "",
                        "namespaced": True,
                        "group": "policy",
                        "version": "v1",
                        "kind": "Eviction",
                        "verbs": ["create"],
                    }
                )
        gv = f"{group}/{version}" if group else version
        return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": out}

    # ------------------------------------------------------------------------------------ HTTP

    def _handle(self, h: FakeRequestHandler) -> None:
        seq = self._next_seq()
        split = urlsplit(h.path)
        path, query = split.path, split.query
        q = {k: v[0] for k, v in parse_qs(query, keep_blank_values=True).items()}
        raw = h.read_body()
        ctype = h.headers.get("Content-Type")
        h.recorder = lambda status: self._record(
            RecordedRequest(
                seq, h.command, path, query, ctype, raw.decode("utf-8", "replace"), status
            )
        )
        hook = self._take_fault("hook", h.command, path, ctype)
        if hook is not None and hook.fn is not None:
            hook.fn(
                RecordedRequest(
                    seq, h.command, path, query, ctype, raw.decode("utf-8", "replace"), 0
                )
            )
        if self._take_fault("drop", h.command, path):
            h.close_connection = True
            h.recorder(0)
            return
        delay = self._take_fault("delay", h.command, path)
        if delay is not None and self._halt.wait(delay.seconds):
            h.close_connection = True
            h.recorder(0)
            return
        try:
            fault = self._take_fault("status", h.command, path)
            if fault is not None:
                raise self._fault_error(fault, path)
            code, body, extra = self._route(h, h.command, path, q, raw, ctype)
            if code:
                h.send_json(code, body, extra)
        except ApiError as e:
            h.send_json(
                e.code, e.body, {"Retry-After": str(e.retry_after)} if e.retry_after else None
            )
        except Exception as e:  # the fake's own bugs surface as 500s with a traceback
            traceback.print_exc()
            err = internal_error(f"fake apiserver bug: {e!r}")
            h.send_json(err.code, err.body)
        finally:
            if h.recorder is not None:  # nothing was answered (the client went away mid-stream)
                h.recorder(0)

    @staticmethod
    def _fault_error(f: Fault, path: str) -> ApiError:
        if f.body is not None:
            err = ApiError(f.status, None, "")
            err.body = f.body
            err.retry_after = f.retry_after
            return err
        reason = f.reason or REASONS.get(f.status, "Unknown")
        name = path.rstrip("/").split("/")[-1]
        default = {
            409: f'Operation cannot be fulfilled on object "{name}": the object has been modified; please apply your changes to the latest version and try again',
            422: "the server rejected our request due to an error in our request",
            429: "Too many requests, please try again later.",
            500: "Internal error occurred: injected fault",
            503: "the server is currently unable to handle the request",
            504: "Timeout: request did not complete within requested timeout",
        }.get(
            f.status,
            f"the server responded with the status code {f.status} but did not return more information",
        )
        return ApiError(f.status, reason, f.message or default, None, f.retry_after)

    def _route(
        self,
        h: FakeRequestHandler,
        method: str,
        path: str,
        q: dict[str, str],
        raw: bytes,
        ctype: str | None,
    ) -> tuple[int, Any, dict | None]:
        parts = [unquote(p) for p in path.strip("/").split("/")] if path.strip("/") else []
        if path in ("/healthz", "/readyz", "/livez"):
            h.send_text(200, "ok")
            return 0, None, None
        if path == "/version":
            return 200, SERVER_VERSION, None
        if path in ("/api/", "/apis/"):  # the Python client's CoreApi/ApisApi use the slash
            path = path[:-1]
        if path == "/api":
            return (
                200,
                {
                    "kind": "APIVersions",
                    "versions": ["v1"],
                    "serverAddressByClientCIDRs": [
                        {"clientCIDR": "0.0.0.0/0", "serverAddress": f"{self.host}:{self.port}"}
                    ],
                },
                None,
            )
        if path == "/apis":
            return (
                200,
                {
                    "kind": "APIGroupList",
                    "apiVersion": "v1",
                    "groups": [self._api_group(g) for g in self._groups()],
                },
                None,
            )
        if parts[:1] == ["api"] and len(parts) >= 2 and parts[1] == "v1":
            group, version, rest = "", "v1", parts[2:]
        elif parts[:1] == ["apis"] and len(parts) == 2 and parts[1] in self._groups():
            return 200, {"kind": "APIGroup", "apiVersion": "v1", **self._api_group(parts[1])}, None
        elif (
            parts[:1] == ["apis"]
            and len(parts) >= 3
            and parts[2] in self._groups().get(parts[1], [])
        ):
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            h.send_text(404, "404 page not found\n")
            return 0, None, None
        if not rest:
            return 200, self._resource_list(group, version), None
        ns = None
        if (
            rest[0] == "namespaces"
            and len(rest) >= 3
            and not (group == "" and rest[2] in ("status", "finalize"))
        ):
            ns, rest = rest[1], rest[2:]
        res = self._resources.get((group, version, rest[0]))
        if res is None or len(rest) > 3 or (ns is not None and not res.namespaced):
            raise ApiError(404, "NotFound", "the server could not find the requested resource", {})
        name = rest[1] if len(rest) > 1 else None
        sub = rest[2] if len(rest) > 2 else None
        if name is not None and res.namespaced and ns is None:
            raise ApiError(404, "NotFound", "the server could not find the requested resource", {})
        dry = q.get("dryRun") == "All"
        not_allowed = ApiError(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
            {},
        )
        with self._lock:
            if name is None:
                if method == "GET" and q.get("watch") in ("true", "1"):
                    pass  # streamed below, outside the lock
                elif method == "GET":
                    return 200, self.list_objects(res, ns, q), None
                elif method == "POST" and (ns is not None or not res.namespaced):
                    return 201, self.create(res, ns, decode_body(raw), dry), None
                elif method == "DELETE":
                    lsel = parse_label_selector(q.get("labelSelector", ""))
                    fsel = parse_field_selector(res, q.get("fieldSelector", ""))
                    doomed = [
                        o
                        for k, o in sorted(self._bucket(res).items())
                        if (ns is None or k[0] == ns)
                        and lsel(o["metadata"].get("labels") or {})
                        and fsel(o)
                    ]
                    opts = _delete_options(raw, q)
                    items = []
                    for o in doomed:  # the answer lists what was deleted, as the store does
                        self.delete(res, ns, o["metadata"]["name"], opts, dry)
                        v = to_view(res, copy.deepcopy(o))
                        drop = ("apiVersion", "kind") if res.builtin else ()
                        items.append({k: x for k, x in v.items() if k not in drop})
                    return (
                        200,
                        {
                            "kind": f"{res.kind}List",
                            "apiVersion": res.api_version,
                            "metadata": {"resourceVersion": str(self._rv)},
                            "items": items,
                        },
                        None,
                    )
                else:
                    raise not_allowed
            elif sub is None:
                if method == "GET":
                    return 200, to_view(res, copy.deepcopy(self._get_obj(res, ns, name))), None
                if method == "PUT":
                    return 200, self.update(res, ns, name, decode_body(raw), None, dry), None
                if method == "PATCH":
                    return 200, self.patch(res, ns, name, raw, ctype, None, dry), None
                if method == "DELETE":
                    code, body = self.delete(res, ns, name, _delete_options(raw, q), dry)
                    return code, body, None
                raise not_allowed
            elif sub == "status" and res.status:
                if method == "GET":
                    return 200, to_view(res, copy.deepcopy(self._get_obj(res, ns, name))), None
                if method == "PUT":
                    return 200, self.update(res, ns, name, decode_body(raw), "status", dry), None
                if method == "PATCH":
                    return 200, self.patch(res, ns, name, raw, ctype, "status", dry), None
                raise not_allowed
            elif sub == "eviction" and res.gr == ("", "pods"):
                if method != "POST":
                    raise not_allowed
                return 201, self.evict(ns or "", name, decode_body(raw), dry), None
            else:
                raise ApiError(
                    404, "NotFound", "the server could not find the requested resource", {}
                )
        self._watch(h, res, ns, q)
        return 0, None, None


def _delete_options(raw: bytes, q: dict[str, str]) -> dict:
    """DeleteOptions come in the body (kubectl) or as query parameters (the Python client)."""
    opts = decode_body(raw) or {}
    if not isinstance(opts, dict):
        raise bad_request("the body of the request was not a DeleteOptions object")
    if q.get("gracePeriodSeconds"):
        opts["gracePeriodSeconds"] = int(q["gracePeriodSeconds"])
    if q.get("propagationPolicy"):
        opts["propagationPolicy"] = q["propagationPolicy"]
    return opts


def decode_body(raw: bytes) -> Any:
    try:
        return decode_json(raw)
    except PatchError as exc:
        raise bad_request(f"the object provided is unrecognized: {exc}") from None


# ------------------------------------------------------------------------------ HTTP plumbing


class FakeHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, addr: tuple[str, int], fake: FakeApiServer) -> None:
        self.fake = fake
        self._conns: set[socket.socket] = set()
        self._conns_lock = threading.Lock()
        super().__init__(addr, FakeRequestHandler)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._conns_lock:
            self._conns.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self._conns_lock:
            self._conns.discard(request)
        super().shutdown_request(request)

    def close_all(self) -> None:
        with self._conns_lock:
            conns, self._conns = list(self._conns), set()
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class FakeRequestHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # The real apiserver sets TCP_NODELAY; without it every keep-alive request waits ~40 ms on
    # the client's delayed ACK (headers and body are written separately).
    disable_nagle_algorithm = True
    server_version = "fake-kube-apiserver/1.37"
    server: FakeHTTPServer
    recorder: Callable[[int], None] | None = None

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _dispatch(self) -> None:
        self.recorder = None
        self.server.fake._handle(self)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _dispatch

    def read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            data = b""
            while True:
                size = int(self.rfile.readline().strip() or b"0", 16)
                if size == 0:
                    self.rfile.readline()
                    return data
                data += self.rfile.read(size)
                self.rfile.readline()
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    def _mark(self, status: int) -> None:
        if self.recorder is not None:
            self.recorder(status)
            self.recorder = None

    def send_json(self, code: int, obj: Any, headers: dict | None = None) -> None:
        data = json.dumps(obj, separators=(",", ":")).encode()
        self._mark(code)
        try:
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Cache-Control", "no-cache, private")
            self.send_header("Content-Length", str(len(data)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)
        except OSError:
            self.close_connection = True

    def send_text(self, code: int, text: str) -> None:
        data = text.encode()
        self._mark(code)
        try:
            self.send_response(code)
            self.send_header("Content-Type", "text/plain; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except OSError:
            self.close_connection = True

    def start_stream(self, code: int) -> None:
        self._mark(code)
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Cache-Control", "no-cache, private")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.wfile.flush()

    def write_chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def end_stream(self) -> None:
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()
