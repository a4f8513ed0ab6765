"""A stateful, wire-level fake of the Kubernetes API server, for the remediation tests.

Why: no kube-apiserver can run here, and mocks at the client level would hide exactly the
mistakes that matter on a cluster (a merge patch that wipes kubelet's conditions, a taint list
that is atomic, a 429 from a PodDisruptionBudget, a conflict on a stale resourceVersion). So the
tests drive this server with the real `kubernetes` client and the real kubectl, over HTTP on
127.0.0.1, and the fake answers the way kube-apiserver 1.37 does: the same `Status` error bodies,
the same patch semantics (see fake_apiserver_patch.py), eviction ported from
`pkg/registry/core/pod/storage/eviction.go`, and the PDB arithmetic of the disruption controller.

Two small stand-ins for controllers run in a background thread, because without them a drain
can never finish: a "kubelet" that starts API-created pods and completes pod deletions once the
grace period has passed (tests can make a pod hang), and the node lifecycle controller's
`node.kubernetes.io/unschedulable` taint.

Tests steer it from Python (never over HTTP): seed objects (`add_node`, `add_pod`, `set_pdb`),
inject faults (`inject`, `inject_delay`, `drop_connections`, `stop`/`start` on the same port),
run a hook between two requests (`on_request`) and
read the request log (`requests`, `sequence`, `wait_for_request`).

Layout: this module holds the state and its semantics (storage, resourceVersions, CRUD, patch,
eviction, PDBs, the controllers, watch); fake_apiserver_api.py the fixed vocabulary (Status
errors, resources, selectors); fake_apiserver_patch.py the patch algorithms;
fake_apiserver_seed.py the seeding helpers; fake_apiserver_http.py routing, discovery and the
wire; fake_apiserver_kubectl.py the real-kubectl oracle.
"""

from __future__ import annotations

import base64
import calendar
import copy
import json
import random
import re
import string
import threading
import time
import traceback
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tests.kube.fake_apiserver_api import (
    APPLY_PATCH,
    BUILTIN_RESOURCES,
    EVICTION_BLOCKED,
    JSON_PATCH,
    LABEL_VALUE_RE,
    MERGE_PATCH,
    MIRROR_ANNOTATION,
    MULTIPLE_PDBS,
    NAME_RE,
    QUALIFIED_NAME_RE,
    SERVER_VERSION,
    STRATEGIC_MERGE_PATCH,
    UNSCHEDULABLE_TAINT,
    ApiError,
    Fault,
    PodRuntime,
    RecordedRequest,
    Resource,
    already_exists,
    bad_request,
    conflict,
    forbidden,
    from_view,
    invalid,
    match_label_selector,
    not_found,
    parse_field_selector,
    parse_label_selector,
    pod_ready,
    rfc3339,
    running_pod_status,
    scaled_value,
    status_body,
    status_details,
    to_view,
    too_many_requests,
)
from tests.kube.fake_apiserver_http import FakeHTTPServer, FakeRequestHandler, HttpFrontMixin
from tests.kube.fake_apiserver_patch import (
    PatchError,
    apply_json_patch,
    apply_merge_patch,
    apply_strategic_merge_patch,
    decode_json,
    json_equal,
)
from tests.kube.fake_apiserver_seed import SeedingMixin

__all__ = [
    "EVICTION_BLOCKED",
    "MIRROR_ANNOTATION",
    "MULTIPLE_PDBS",
    "SERVER_VERSION",
    "UNSCHEDULABLE_TAINT",
    "ApiError",
    "FakeApiServer",
    "Fault",
    "RecordedRequest",
    "Resource",
    "parse_field_selector",
    "parse_label_selector",
    "status_body",
]


@dataclass
class _Change:
    rv: int
    store_key: tuple[str, str]
    type: str
    obj: dict
    old: dict | None


# --------------------------------------------------------------------------------- the server


class FakeApiServer(SeedingMixin, HttpFrontMixin):
    """The fake apiserver. Start with `start()` (or use as a context manager); `url` is its base."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        kubelet: bool = True,
        node_lifecycle_controller: bool = True,
        time_scale: float = 1.0,
        tick: float = 0.01,
        default_watch_timeout: float = 60.0,
        api_groups: tuple[str, ...] | None = None,
    ) -> None:
        """`api_groups` limits the named API groups served (core is always served), e.g. to
        mirror the cluster a wire trace was recorded against; None serves every built-in."""
        self.host, self.port = host, port
        self.kubelet_enabled = kubelet
        self.node_lifecycle_controller = node_lifecycle_controller
        self.time_scale = time_scale  # multiplies grace periods seen by the fake kubelet
        self.tick = tick
        self.default_watch_timeout = default_watch_timeout
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._resources: dict[tuple[str, str, str], Resource] = {}
        for r in BUILTIN_RESOURCES:
            if not r.group or api_groups is None or r.group in api_groups:
                self.register_resource(r)
        self._store: dict[tuple[str, str], dict[tuple[str, str], dict]] = {}
        self._rv = 1000
        self._changes: list[_Change] = []
        self._compacted_rv = 0
        self._pods: dict[tuple[str, str], PodRuntime] = {}
        self._pdb_overrides: dict[tuple[str, str], int] = {}
        self._pdb_stale: set[tuple[str, str]] = set()
        self._refreshing = False
        self._continues: dict[str, tuple[int, list[dict]]] = {}
        self._faults: list[Fault] = []
        self._log: list[RecordedRequest] = []
        self._seq = 0
        self._halt = threading.Event()
        self._httpd: FakeHTTPServer | None = None
        self._threads: list[threading.Thread] = []
        for ns in ("default", "kube-system", "kube-public", "kube-node-lease"):
            self.add_namespace(ns)

    # ---------------------------------------------------------------------------- lifecycle

    def start(self) -> FakeApiServer:
        """Serve (again, on the same port after a `stop()`: the state survives an outage)."""
        if self._httpd is not None:
            return self
        self._halt.clear()
        self._httpd = FakeHTTPServer((self.host, self.port), self)
        self.port = self._httpd.server_address[1]
        self._threads = [
            threading.Thread(
                target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
            ),
            threading.Thread(target=self._controller_loop, daemon=True),
        ]
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> None:
        """Go down: refuse connections and cut the open ones (watches included)."""
        httpd, self._httpd = self._httpd, None
        self._halt.set()
        with self._lock:
            self._changed.notify_all()
        if httpd is not None:
            httpd.shutdown()
            httpd.close_all()
            httpd.server_close()
        for t in self._threads:
            t.join(timeout=5)
        self._threads = []

    def __enter__(self) -> FakeApiServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        return self._httpd is not None

    # ---------------------------------------------------------------------------- resources

    def register_resource(self, res: Resource) -> Resource:
        """Serve another type (e.g. a CRD): generic CRUD, list, watch, patch for it."""
        self._resources[(res.group, res.version, res.plural)] = res
        return res

    def resource(self, group: str, plural: str) -> Resource:
        """A known type, served or not (an unserved built-in is still stored: PDBs still count)."""
        for r in (*self._resources.values(), *BUILTIN_RESOURCES):
            if r.group == group and r.plural == plural:
                return r
        raise KeyError(f"{plural}.{group}")

    def _resource_for(self, api_version: str, kind: str) -> Resource:
        for r in (*self._resources.values(), *BUILTIN_RESOURCES):
            if r.api_version == api_version and r.kind == kind:
                return r
        raise KeyError(f"{api_version} {kind}")

    # ------------------------------------------------------------------------- storage core

    def _bucket(self, res: Resource) -> dict[tuple[str, str], dict]:
        return self._store.setdefault(res.store_key, {})

    def _key(self, res: Resource, ns: str | None, name: str) -> tuple[str, str]:
        return (ns or "" if res.namespaced else "", name)

    def _write(self, res: Resource, obj: dict, event: str) -> dict:
        """Store `obj` (storage form) under a fresh resourceVersion and tell the watchers."""
        meta = obj["metadata"]
        key = self._key(res, meta.get("namespace"), meta["name"])
        bucket = self._bucket(res)
        old = bucket.get(key)
        self._rv += 1
        meta["resourceVersion"] = str(self._rv)
        bucket[key] = obj
        self._changes.append(
            _Change(self._rv, res.store_key, event, copy.deepcopy(obj), copy.deepcopy(old))
        )
        self._trim_history()
        self._changed.notify_all()
        self._after_write(res, obj)
        return obj

    def _delete_now(self, res: Resource, key: tuple[str, str]) -> dict:
        bucket = self._bucket(res)
        old = bucket.pop(key)
        self._rv += 1
        final = copy.deepcopy(old)
        final["metadata"]["resourceVersion"] = str(self._rv)
        self._changes.append(_Change(self._rv, res.store_key, "DELETED", final, old))
        self._trim_history()
        self._changed.notify_all()
        if res.store_key == ("", "pods"):
            rt = self._pods.pop(key, None)
            if rt is not None and rt.recreate:
                self._recreate_pod(old)
        self._after_write(res, final)
        return final

    def _after_write(self, res: Resource, obj: dict) -> None:
        if (
            res.store_key in (("", "pods"), ("policy", "poddisruptionbudgets"))
            and not self._refreshing
        ):
            self._refresh_pdbs(obj["metadata"].get("namespace", ""))

    def _new_meta(self, res: Resource, obj: dict, ns: str | None) -> None:
        meta = obj.setdefault("metadata", {})
        if res.namespaced:
            meta["namespace"] = ns
        else:
            meta.pop("namespace", None)
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = rfc3339()
        for k in ("deletionTimestamp", "deletionGracePeriodSeconds", "resourceVersion", "selfLink"):
            meta.pop(k, None)
        if res.generation:
            meta["generation"] = 1
        else:
            meta.pop("generation", None)

    def _insert(self, obj: dict) -> dict:
        """Seed an object directly (no admission, no defaults): the test helpers' back door."""
        with self._lock:
            res = self._resource_for(obj["apiVersion"], obj["kind"])
            meta = obj["metadata"]
            key = self._key(res, meta.get("namespace"), meta["name"])
            old = self._bucket(res).get(key)
            if old is None:
                self._new_meta(res, obj, meta.get("namespace"))
            else:
                for k in ("uid", "creationTimestamp", "generation"):
                    if k in old["metadata"] and (k != "generation" or k not in meta):
                        meta[k] = old["metadata"][k]
            self._write(res, obj, "ADDED" if old is None else "MODIFIED")
            return copy.deepcopy(obj)

    def get(self, group: str, plural: str, name: str, namespace: str | None = None) -> dict | None:
        """A deep copy of a stored object (storage form), or None."""
        with self._lock:
            res = self.resource(group, plural)
            obj = self._bucket(res).get(self._key(res, namespace, name))
            return copy.deepcopy(to_view(res, obj)) if obj is not None else None

    def list(self, group: str, plural: str, namespace: str | None = None) -> list[dict]:
        with self._lock:
            res = self.resource(group, plural)
            return [
                copy.deepcopy(to_view(res, o))
                for k, o in sorted(self._bucket(res).items())
                if namespace is None or k[0] == namespace
            ]

    def node(self, name: str) -> dict | None:
        return self.get("", "nodes", name)

    def pod(self, namespace: str, name: str) -> dict | None:
        return self.get("", "pods", name, namespace)

    @property
    def resource_version(self) -> int:
        return self._rv

    MAX_HISTORY = 5000

    def _trim_history(self) -> None:
        """Keep the watch history bounded, as etcd's compaction does: a watch from a
        resourceVersion older than what is kept gets 410 Gone."""
        if len(self._changes) > self.MAX_HISTORY:
            drop = len(self._changes) - self.MAX_HISTORY
            self._compacted_rv = self._changes[drop - 1].rv
            del self._changes[:drop]

    def compact(self) -> None:
        """Forget the watch history (etcd compaction): older resourceVersions now get 410 Gone."""
        with self._lock:
            self._compacted_rv = self._rv
            self._changes.clear()
            self._continues.clear()

    # ------------------------------------------------------------------------ fault injection

    def inject(
        self,
        method: str | None,
        path_regex: str,
        status: int = 500,
        times: int | None = 1,
        *,
        message: str | None = None,
        reason: str | None = None,
        retry_after: int = 0,
        body: dict | None = None,
        active: Callable[[], bool] | None = None,
    ) -> Fault:
        """Answer the next `times` requests whose method and path (no query; `re.fullmatch`)
        match with `status` and an apiserver-shaped Status body, without touching the state.
        `active()`, when given, is asked per request: an outage that ends when it says False
        (e.g. ``lambda: clock.monotonic() < end`` on a test's injected clock)."""
        f = Fault(
            "status",
            method,
            re.compile(path_regex),
            times,
            status=status,
            message=message,
            reason=reason,
            retry_after=retry_after,
            body=body,
            active=active,
        )
        with self._lock:
            self._faults.append(f)
        return f

    def inject_delay(
        self, method: str | None, path_regex: str, seconds: float, times: int | None = 1
    ) -> Fault:
        """Hold matching requests `seconds` before serving them (client timeouts, slow apiserver)."""
        f = Fault("delay", method, re.compile(path_regex), times, seconds=seconds)
        with self._lock:
            self._faults.append(f)
        return f

    def drop_connections(
        self, times: int | None = 1, method: str | None = None, path_regex: str = ".*"
    ) -> Fault:
        """Close the connection of matching requests without any answer (a TCP-level failure)."""
        f = Fault("drop", method, re.compile(path_regex), times)
        with self._lock:
            self._faults.append(f)
        return f

    def on_request(
        self,
        method: str | None,
        path_regex: str,
        fn: Callable[[RecordedRequest], None],
        times: int | None = 1,
        *,
        content_type: str | None = None,
    ) -> Fault:
        """Run `fn(request)` when a matching request arrives, before it is served: whatever
        `fn` writes (through the Python API or its own client) lands between the requests
        before and this one - a race window made deterministic. `content_type` narrows the
        match (e.g. only the strategic-merge PATCH of a node, not its JSON patch). `request`
        is the request as received (`status` 0: not answered yet)."""
        f = Fault(
            "hook", method, re.compile(path_regex), times, content_type=content_type, fn=fn
        )
        with self._lock:
            self._faults.append(f)
        return f

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()

    def _take_fault(
        self, kind: str, method: str, path: str, content_type: str | None = None
    ) -> Fault | None:
        with self._lock:
            for f in self._faults:
                if f.kind == kind and f.matches(method, path, content_type):
                    f.hits += 1
                    return f
        return None

    # ------------------------------------------------------------------------------ request log

    @property
    def requests(self) -> list[RecordedRequest]:
        with self._lock:
            return sorted(self._log, key=lambda r: r.seq)

    def sequence(self, *, with_query: bool = False) -> list[tuple[str, str, str | None]]:
        """(method, path[?query], content type) per request, in arrival order."""
        return [
            (r.method, f"{r.path}?{r.query}" if with_query and r.query else r.path, r.content_type)
            for r in self.requests
        ]

    def clear_requests(self) -> None:
        with self._lock:
            self._log.clear()

    def wait_for_request(
        self, method: str | None, path_regex: str, *, count: int = 1, timeout: float = 10.0
    ) -> RecordedRequest:
        """Block until `count` answered requests match (method, fullmatch of path); return the last."""
        pat = re.compile(path_regex)
        deadline = time.monotonic() + timeout
        with self._lock:
            while True:
                hits = [
                    r
                    for r in sorted(self._log, key=lambda r: r.seq)
                    if (method is None or r.method == method) and pat.fullmatch(r.path)
                ]
                if len(hits) >= count:
                    return hits[count - 1]
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no {count}x {method} {path_regex} within {timeout}s")
                self._changed.wait(min(left, 0.1))

    def _next_seq(self) -> int:
        with self._lock:
            self._seq += 1
            return self._seq

    def _record(self, rec: RecordedRequest) -> None:
        with self._lock:
            self._log.append(rec)
            self._changed.notify_all()

    # ------------------------------------------------------------------------------ controllers

    def _controller_loop(self) -> None:
        while not self._halt.wait(self.tick):
            with self._lock:
                try:
                    self._kubelet_tick()
                    self._node_lifecycle_tick()
                except Exception:  # a bug in the fake must not kill its controllers silently
                    traceback.print_exc()

    def _kubelet_tick(self) -> None:
        if not self.kubelet_enabled:
            return
        pods = self._bucket(self.resource("", "pods"))
        now = time.monotonic()
        for key, rt in list(self._pods.items()):
            pod = pods.get(key)
            if pod is None:
                continue
            if rt.delete_at is not None and now >= rt.delete_at and not rt.hang:
                self._finalize_pod(key)
            elif (
                rt.start
                and pod["spec"].get("nodeName")
                and not pod["metadata"].get("deletionTimestamp")
            ):
                rt.start = False
                pod = copy.deepcopy(pod)
                pod["status"] = running_pod_status(pod["spec"]["nodeName"])
                self._write(self.resource("", "pods"), pod, "MODIFIED")

    def _node_lifecycle_tick(self) -> None:
        if not self.node_lifecycle_controller:
            return
        res = self.resource("", "nodes")
        for node in list(self._bucket(res).values()):
            taints = node.get("spec", {}).get("taints") or []
            has = any(t.get("key") == UNSCHEDULABLE_TAINT for t in taints)
            want = bool(node.get("spec", {}).get("unschedulable"))
            if has != want:
                node = copy.deepcopy(node)
                if want:
                    new = [
                        *taints,
                        {
                            "key": UNSCHEDULABLE_TAINT,
                            "effect": "NoSchedule",
                            "timeAdded": rfc3339(),
                        },
                    ]
                else:
                    new = [t for t in taints if t.get("key") != UNSCHEDULABLE_TAINT]
                if new:
                    node["spec"]["taints"] = new
                else:
                    node["spec"].pop("taints", None)
                self._write(res, node, "MODIFIED")

    def _finalize_pod(self, key: tuple[str, str]) -> None:
        """The containers are gone: the pod object goes too, unless finalizers hold it."""
        res = self.resource("", "pods")
        pod = self._bucket(res)[key]
        rt = self._pods.get(key)
        if rt is not None:
            rt.delete_at = None
        if self._held_by_finalizers(res, pod) is None:
            self._delete_now(res, key)

    def _held_by_finalizers(self, res: Resource, obj: dict) -> dict | None:
        """An object with finalizers is not deleted: it is marked (a deletionTimestamp, once)
        and stays until they are gone. The object as it now stands, or None when nothing
        holds it."""
        if not obj["metadata"].get("finalizers"):
            return None
        if not obj["metadata"].get("deletionTimestamp"):
            obj = copy.deepcopy(obj)
            obj["metadata"]["deletionTimestamp"] = rfc3339()
            obj["metadata"]["deletionGracePeriodSeconds"] = 0
            self._write(res, obj, "MODIFIED")
        return obj

    def _recreate_pod(self, old: dict) -> None:
        pod = copy.deepcopy(old)
        for k in ("deletionTimestamp", "deletionGracePeriodSeconds"):
            pod["metadata"].pop(k, None)
        pod["metadata"]["uid"] = str(uuid.uuid4())
        pod["status"] = running_pod_status(pod["spec"].get("nodeName"))
        res = self.resource("", "pods")
        self._new_meta(res, pod, pod["metadata"]["namespace"])
        self._write(res, pod, "ADDED")
        ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        self._pods[(ns, name)] = PodRuntime(uid=pod["metadata"]["uid"], recreate=True)

    # ----------------------------------------------------------------------- PDB (controller)

    def _matching_pdbs(self, pod: dict) -> list[dict]:
        ns = pod["metadata"].get("namespace", "")
        res = self.resource("policy", "poddisruptionbudgets")
        return [
            p
            for (pns, _), p in sorted(self._bucket(res).items())
            if pns == ns
            and match_label_selector(
                p.get("spec", {}).get("selector"), pod["metadata"].get("labels")
            )
        ]

    def _pdb_status(self, pdb: dict) -> dict:
        ns, name = pdb["metadata"]["namespace"], pdb["metadata"]["name"]
        spec = pdb.get("spec", {})
        old = pdb.get("status") or {}
        pods = [
            p
            for (pns, _), p in sorted(self._bucket(self.resource("", "pods")).items())
            if pns == ns and match_label_selector(spec.get("selector"), p["metadata"].get("labels"))
        ]
        live = {p["metadata"]["name"]: p for p in pods}
        now = time.time()
        disrupted = {
            n: t
            for n, t in (old.get("disruptedPods") or {}).items()
            if n in live
            and not live[n]["metadata"].get("deletionTimestamp")
            and calendar.timegm(time.strptime(t, "%Y-%m-%dT%H:%M:%SZ")) + 120 > now
        }
        healthy = sum(
            1
            for p in pods
            if pod_ready(p)
            and not p["metadata"].get("deletionTimestamp")
            and p["metadata"]["name"] not in disrupted
        )
        expected = len(pods)
        if spec.get("minAvailable") is not None:
            desired = scaled_value(spec["minAvailable"], expected)
        elif spec.get("maxUnavailable") is not None:
            desired = max(0, expected - scaled_value(spec["maxUnavailable"], expected))
        else:
            desired = 0
        allowed = self._pdb_overrides.get((ns, name), max(0, healthy - desired))
        gen = pdb["metadata"].get("generation", 1)
        cond_status = "True" if allowed > 0 else "False"
        old_cond = next(
            (c for c in old.get("conditions") or [] if c.get("type") == "DisruptionAllowed"), None
        )
        status: dict[str, Any] = {
            "observedGeneration": gen - 1 if (ns, name) in self._pdb_stale else gen,
            "disruptionsAllowed": allowed,
            "currentHealthy": healthy,
            "desiredHealthy": desired,
            "expectedPods": expected,
            "conditions": [
                {
                    "type": "DisruptionAllowed",
                    "status": cond_status,
                    "reason": "SufficientPods" if allowed > 0 else "InsufficientPods",
                    "message": "",
                    "observedGeneration": gen,
                    "lastTransitionTime": old_cond["lastTransitionTime"]
                    if old_cond and old_cond.get("status") == cond_status
                    else rfc3339(),
                }
            ],
        }
        if disrupted:
            status["disruptedPods"] = disrupted
        return status

    def _refresh_pdbs(self, ns: str, force: bool = False) -> None:
        """The disruption controller: recompute the status of the PDBs in `ns` when it changed."""
        res = self.resource("policy", "poddisruptionbudgets")
        self._refreshing = True
        try:
            for (pns, _), pdb in list(self._bucket(res).items()):
                if pns != ns:
                    continue
                status = self._pdb_status(pdb)
                if force or not json_equal(status, pdb.get("status") or {}):
                    new = copy.deepcopy(pdb)
                    new["status"] = status
                    self._write(res, new, "MODIFIED")
        finally:
            self._refreshing = False

    # ------------------------------------------------------------------------------ operations

    def _get_obj(self, res: Resource, ns: str | None, name: str) -> dict:
        obj = self._bucket(res).get(self._key(res, ns, name))
        if obj is None:
            raise not_found(res, name)
        return obj

    def _check_namespace(self, res: Resource, ns: str | None, name: str) -> None:
        if not res.namespaced:
            return
        nsobj = self._bucket(self.resource("", "namespaces")).get(("", ns or ""))
        if nsobj is None:
            raise not_found(self.resource("", "namespaces"), ns or "")
        if nsobj.get("status", {}).get("phase") == "Terminating":
            raise forbidden(
                res.qualified,
                name,
                f"unable to create new content in namespace {ns} because it is being terminated",
                status_details(
                    res,
                    name,
                    causes=[
                        {
                            "reason": "NamespaceTerminating",
                            "field": "metadata.namespace",
                            "message": f"namespace {ns} is being terminated",
                        }
                    ],
                ),
            )

    def create(self, res: Resource, ns: str | None, body: Any, dry: bool = False) -> dict:
        if not isinstance(body, dict):
            raise bad_request("the body of the request was not a JSON object")
        obj = from_view(res, copy.deepcopy(body))
        if res.builtin:
            obj.setdefault(
                "apiVersion", from_view(res, {"apiVersion": res.api_version})["apiVersion"]
            )
            obj.setdefault("kind", res.kind)
        elif "kind" not in obj or "apiVersion" not in obj:
            raise bad_request(f"Object 'Kind' is missing in '{json.dumps(body)}'")
        want = from_view(res, {"apiVersion": res.api_version, "kind": res.kind})
        if (obj["apiVersion"], obj["kind"]) != (want["apiVersion"], want["kind"]):
            raise bad_request(
                f"the API version in the data ({body.get('apiVersion')}) does not match the expected API version ({res.api_version})"
            )
        meta = obj.setdefault("metadata", {})
        if res.namespaced and meta.get("namespace") not in (None, "", ns):
            raise bad_request(
                "the namespace of the provided object does not match the namespace sent on the request"
            )
        if not meta.get("name"):
            if not meta.get("generateName"):
                raise invalid(
                    res,
                    "",
                    [
                        (
                            "FieldValueRequired",
                            "metadata.name",
                            "Required value: name or generateName is required",
                        )
                    ],
                )
            meta["name"] = meta["generateName"] + "".join(
                random.choices(string.ascii_lowercase + string.digits, k=5)
            )
        name = meta["name"]
        if len(name) > 253 or not NAME_RE.match(name):
            raise invalid(
                res,
                name,
                [
                    (
                        "FieldValueInvalid",
                        "metadata.name",
                        f"Invalid value: \"{name}\": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character",
                    )
                ],
            )
        self._check_namespace(res, ns, name)
        key = self._key(res, ns, name)
        if key in self._bucket(res):
            raise already_exists(res, name)
        self._new_meta(res, obj, ns)
        if res.store_key == ("", "pods"):
            obj["status"] = {"phase": "Pending", "qosClass": "BestEffort"}
            obj.setdefault("spec", {}).setdefault("terminationGracePeriodSeconds", 30)
        elif res.status and res.gr != ("", "nodes") and res.gr != ("", "namespaces"):
            obj.pop("status", None)
        self._validate(res, obj)
        if dry:
            return to_view(res, obj)
        self._write(res, obj, "ADDED")
        if res.store_key == ("", "pods"):
            self._pods[key] = PodRuntime(uid=meta["uid"], start=True)
        return to_view(res, copy.deepcopy(obj))

    def update(
        self,
        res: Resource,
        ns: str | None,
        name: str,
        body: Any,
        sub: str | None,
        dry: bool = False,
    ) -> dict:
        if not isinstance(body, dict):
            raise bad_request("the body of the request was not a JSON object")
        current = self._get_obj(res, ns, name)
        new = from_view(res, copy.deepcopy(body))
        meta = new.setdefault("metadata", {})
        if meta.get("name", name) != name:
            raise bad_request(
                f"the name of the object ({meta.get('name')}) does not match the name on the URL ({name})"
            )
        rv = meta.get("resourceVersion") or ""
        if not rv and not res.builtin:
            raise invalid(
                res,
                name,
                [
                    (
                        "FieldValueInvalid",
                        "metadata.resourceVersion",
                        "Invalid value: 0x0: must be specified for an update",
                    )
                ],
            )
        if rv and rv != current["metadata"]["resourceVersion"]:
            raise conflict(res, name)
        new.setdefault("apiVersion", current["apiVersion"])
        new.setdefault("kind", current["kind"])
        return self._finish_update(res, current, new, sub, dry)

    def patch(
        self,
        res: Resource,
        ns: str | None,
        name: str,
        raw: bytes,
        ctype: str | None,
        sub: str | None,
        dry: bool = False,
    ) -> dict:
        kind = (ctype or "").split(";")[0].strip().lower()
        accepted = [JSON_PATCH, MERGE_PATCH, APPLY_PATCH] + (
            [STRATEGIC_MERGE_PATCH] if res.builtin else []
        )
        if kind not in (JSON_PATCH, MERGE_PATCH) and not (
            kind == STRATEGIC_MERGE_PATCH and res.builtin
        ):
            raise ApiError(
                415,
                "UnsupportedMediaType",
                "the body of the request was in an unknown format - accepted media types include: "
                + ", ".join(accepted),
            )
        current = self._get_obj(res, ns, name)
        view = to_view(res, copy.deepcopy(current))
        try:
            doc = decode_json(raw)
            if kind == JSON_PATCH:
                patched = apply_json_patch(view, doc)
            elif kind == MERGE_PATCH:
                if not isinstance(doc, dict):
                    raise PatchError("Invalid JSON Patch", bad_request=True)
                patched = apply_merge_patch(view, doc)
            else:
                patched = apply_strategic_merge_patch(view, doc)
        except PatchError as exc:
            if exc.bad_request:
                raise bad_request(str(exc)) from None
            raise ApiError(
                422,
                "Invalid",
                "the server rejected our request due to an error in our request",
                {"causes": [{"reason": "UnexpectedServerResponse", "message": str(exc)}]},
            ) from None
        if not isinstance(patched, dict):
            raise bad_request("the patched document is not an object")
        new = from_view(res, patched)
        meta = new.setdefault("metadata", {})
        if meta.get("uid") not in (None, current["metadata"]["uid"]):
            raise conflict(
                res,
                name,
                f"Precondition failed: UID in precondition: {meta['uid']}, "
                f"UID in object meta: {current['metadata']['uid']}",
            )
        if meta.get("resourceVersion") not in (None, "", current["metadata"]["resourceVersion"]):
            raise conflict(res, name)
        if meta.get("name") != name:
            raise bad_request(
                f"the name of the object ({meta.get('name')}) does not match the name on the URL ({name})"
            )
        return self._finish_update(res, current, new, sub, dry)

    def _finish_update(
        self, res: Resource, current: dict, new: dict, sub: str | None, dry: bool
    ) -> dict:
        """The status split, system metadata, validation, no-op detection, commit."""
        meta = new.setdefault("metadata", {})
        if sub == "status":
            merged = copy.deepcopy(current)
            merged["status"] = new.get("status", {})
            new = merged
        else:
            if res.status and "status" in current:
                new["status"] = copy.deepcopy(current["status"])
            elif res.status:
                new.pop("status", None)
            for k in (
                "uid",
                "creationTimestamp",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "namespace",
            ):
                if k in current["metadata"]:
                    meta[k] = current["metadata"][k]
                else:
                    meta.pop(k, None)
            if res.generation:
                spec_changed = not json_equal(
                    {k: v for k, v in new.items() if k not in ("metadata", "status")},
                    {k: v for k, v in current.items() if k not in ("metadata", "status")},
                )
                meta["generation"] = current["metadata"].get("generation", 1) + (
                    1 if spec_changed else 0
                )
        new["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        self._validate(res, new)
        if json_equal(new, current) or dry:
            return to_view(res, copy.deepcopy(new))
        if new["metadata"].get("deletionTimestamp") and not new["metadata"].get("finalizers"):
            key = self._key(res, new["metadata"].get("namespace"), new["metadata"]["name"])
            pending_pod = (
                res.store_key == ("", "pods") and self._pods.get(key, PodRuntime("")).delete_at
            )
            if not pending_pod:
                self._write(res, new, "MODIFIED")
                return to_view(res, self._delete_now(res, key))
        self._write(res, new, "MODIFIED")
        return to_view(res, copy.deepcopy(new))

    def _validate(self, res: Resource, obj: dict) -> None:
        name = obj["metadata"].get("name", "")
        causes: list[tuple[str, str, str]] = []
        for k, v in (obj["metadata"].get("labels") or {}).items():
            if not QUALIFIED_NAME_RE.match(k):
                causes.append(
                    (
                        "FieldValueInvalid",
                        "metadata.labels",
                        f"Invalid value: \"{k}\": name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character",
                    )
                )
            if not isinstance(v, str) or len(v) > 63 or not LABEL_VALUE_RE.match(v):
                causes.append(
                    (
                        "FieldValueInvalid",
                        "metadata.labels",
                        f"Invalid value: \"{v}\": a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character",
                    )
                )
        if res.store_key == ("", "nodes"):
            seen: set[tuple[str, str]] = set()
            for i, t in enumerate((obj.get("spec") or {}).get("taints") or []):
                p = f"spec.taints[{i}]"
                key, eff, val = t.get("key", ""), t.get("effect", ""), t.get("value", "")
                if not key or not QUALIFIED_NAME_RE.match(key) or len(key.split("/")[-1]) > 63:
                    causes.append(
                        (
                            "FieldValueInvalid",
                            f"{p}.key",
                            f"Invalid value: \"{key}\": name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character",
                        )
                    )
                if eff not in ("NoSchedule", "PreferNoSchedule", "NoExecute"):
                    causes.append(
                        (
                            "FieldValueNotSupported",
                            f"{p}.effect",
                            f'Unsupported value: "{eff}": supported values: "NoSchedule", "PreferNoSchedule", "NoExecute"',
                        )
                    )
                if val and (len(val) > 63 or not LABEL_VALUE_RE.match(val)):
                    causes.append(
                        (
                            "FieldValueInvalid",
                            f"{p}.value",
                            f'Invalid value: "{val}": a valid label must be an empty string or consist of alphanumeric characters',
                        )
                    )
                if (key, eff) in seen:
                    causes.append(
                        (
                            "FieldValueDuplicate",
                            p,
                            f'Duplicate value: "{key}:{eff}": taints must be unique by key and effect pair',
                        )
                    )
                seen.add((key, eff))
        if res.store_key == ("", "events"):
            causes += self._event_causes(obj, res)
        if causes:
            raise invalid(res, name, causes)

    @staticmethod
    def _event_causes(ev: dict, res: Resource) -> list[tuple[str, str, str]]:
        """legacyValidateEvent: where a Node's events may live, and what new-style events need."""
        causes = []
        ns = ev["metadata"].get("namespace", "")
        inv = (ev.get("involvedObject") or {}).get("namespace", "")
        bad = (
            "FieldValueInvalid",
            "involvedObject.namespace",
            f'Invalid value: "{inv}": does not match event.namespace',
        )
        if not ev.get("eventTime"):
            if (not inv and ns not in ("", "default")) or (inv and inv != ns):
                causes.append(bad)
        else:
            if not inv and ns not in ("default", "kube-system"):
                causes.append(bad)
            rc_field = "reportingController" if res.storage else "reportingComponent"
            for fld, val in (
                (rc_field, ev.get("reportingComponent")),
                ("reportingInstance", ev.get("reportingInstance")),
                ("action", ev.get("action")),
                ("reason", ev.get("reason")),
            ):
                if not val:
                    causes.append(("FieldValueRequired", fld, "Required value"))
            if ev.get("type") not in ("Normal", "Warning"):
                causes.append(
                    (
                        "FieldValueInvalid",
                        "type",
                        f'Invalid value: "{ev.get("type", "")}": has invalid value: {ev.get("type", "")}',
                    )
                )
        return causes

    def delete(
        self, res: Resource, ns: str | None, name: str, options: dict, dry: bool = False
    ) -> tuple[int, dict]:
        obj = self._get_obj(res, ns, name)
        key = self._key(res, ns, name)
        pre = options.get("preconditions") or {}
        if pre.get("uid") and pre["uid"] != obj["metadata"]["uid"]:
            raise conflict(
                res,
                name,
                f"Precondition failed: UID in precondition: {pre['uid']}, UID in object meta: {obj['metadata']['uid']}",
            )
        if (
            pre.get("resourceVersion")
            and pre["resourceVersion"] != obj["metadata"]["resourceVersion"]
        ):
            raise conflict(
                res,
                name,
                f"Precondition failed: ResourceVersion in precondition: {pre['resourceVersion']}, ResourceVersion in object meta: {obj['metadata']['resourceVersion']}",
            )
        if dry:
            return 200, to_view(res, copy.deepcopy(obj))
        if res.store_key == ("", "pods"):
            return 200, self._delete_pod(key, options)
        held = self._held_by_finalizers(res, obj)
        if held is not None:
            return 200, to_view(res, copy.deepcopy(held))
        gone = self._delete_now(res, key)
        return 200, status_body(
            None, None, None, status_details(res, name, uid=gone["metadata"]["uid"]), ok=True
        )

    def _delete_pod(self, key: tuple[str, str], options: dict) -> dict:
        """Graceful pod deletion (pod strategy CheckGracefulDelete) handed to the fake kubelet."""
        res = self.resource("", "pods")
        pod = copy.deepcopy(self._bucket(res)[key])
        spec, meta = pod.get("spec", {}), pod["metadata"]
        grace = options.get("gracePeriodSeconds")
        if grace is None:
            grace = spec.get("terminationGracePeriodSeconds", 30)
        if not spec.get("nodeName") or pod.get("status", {}).get("phase") in (
            "Succeeded",
            "Failed",
        ):
            grace = 0
        grace = max(0, int(grace))
        if meta.get("deletionTimestamp") and meta.get("deletionGracePeriodSeconds", 0) <= grace:
            return pod  # already terminating with an equal or shorter grace: nothing changes
        if grace == 0 and not meta.get("finalizers"):
            return self._delete_now(res, key)
        meta["deletionTimestamp"] = rfc3339(time.time() + grace)
        meta["deletionGracePeriodSeconds"] = grace
        self._write(res, pod, "MODIFIED")
        rt = self._pods.setdefault(key, PodRuntime(uid=meta["uid"]))
        stop = grace if rt.stop_after is None else min(grace, rt.stop_after)
        rt.delete_at = time.monotonic() + stop * self.time_scale
        return copy.deepcopy(pod)

    def evict(self, ns: str, name: str, body: Any, dry: bool = False) -> dict:
        """POST pods/{name}/eviction — a port of eviction.go (policy/v1)."""
        pods = self.resource("", "pods")
        if not isinstance(body, dict):
            raise bad_request("the body of the request was not a JSON object")
        if body.get("kind") not in (None, "Eviction") or body.get("apiVersion") not in (
            None,
            "policy/v1",
            "policy/v1beta1",
        ):
            raise bad_request(
                f"the API version in the data ({body.get('apiVersion')}) does not match the expected API version (policy/v1)"
            )
        if (body.get("metadata") or {}).get("name") != name:
            raise bad_request("name in URL does not match name in Eviction object")
        self._check_namespace(pods, ns, name)
        options = body.get("deleteOptions") or {}
        pod = self._get_obj(pods, ns, name)
        key = (ns, name)
        phase = pod.get("status", {}).get("phase")
        if phase in ("Succeeded", "Failed", "Pending") or pod["metadata"].get("deletionTimestamp"):
            if not dry:
                self._delete_pod(key, options)
            return self._eviction_ok()
        pdbs = self._matching_pdbs(pod)
        if len(pdbs) > 1:
            raise ApiError(500, None, MULTIPLE_PDBS)
        if pdbs:
            self._refresh_pdbs(ns)
            pdb = self._matching_pdbs(pod)[0]
            st, pdb_name = pdb.get("status") or {}, pdb["metadata"]["name"]
            unhealthy_ok = not pod_ready(pod) and (
                pdb["spec"].get("unhealthyPodEvictionPolicy") == "AlwaysAllow"
                or (
                    st.get("currentHealthy", 0) >= st.get("desiredHealthy", 0)
                    and st.get("desiredHealthy", 0) > 0
                )
            )
            if not unhealthy_ok:
                if st.get("observedGeneration", 0) < pdb["metadata"].get("generation", 1):
                    raise too_many_requests(
                        EVICTION_BLOCKED,
                        10,
                        [
                            {
                                "reason": "DisruptionBudget",
                                "message": f"The disruption budget {pdb_name} is still being processed by the server.",
                            }
                        ],
                    )
                allowed = st.get("disruptionsAllowed", 0)
                if allowed < 0:
                    raise forbidden(
                        "poddisruptionbudget.policy",
                        pdb_name,
                        "pdb disruptions allowed is negative",
                        {"name": pdb_name, "group": "policy", "kind": "poddisruptionbudget"},
                    )
                if allowed == 0:
                    raise too_many_requests(
                        EVICTION_BLOCKED,
                        0,
                        [
                            {
                                "reason": "DisruptionBudget",
                                "message": f"The disruption budget {pdb_name} needs {st.get('desiredHealthy', 0)} "
                                f"healthy pods and has {st.get('currentHealthy', 0)} currently",
                            }
                        ],
                    )
                if dry:
                    return self._eviction_ok()
                pkey = (ns, pdb_name)
                if pkey in self._pdb_overrides:
                    self._pdb_overrides[pkey] -= 1
                new_pdb = copy.deepcopy(pdb)
                new_pdb["status"] = {
                    **st,
                    "disruptionsAllowed": allowed - 1,
                    "disruptedPods": {**(st.get("disruptedPods") or {}), name: rfc3339()},
                }
                self._refreshing = True
                try:
                    self._write(
                        self.resource("policy", "poddisruptionbudgets"), new_pdb, "MODIFIED"
                    )
                finally:
                    self._refreshing = False
        if dry:
            return self._eviction_ok()
        marked = copy.deepcopy(pod)
        conds = [
            c
            for c in marked["status"].get("conditions") or []
            if c.get("type") != "DisruptionTarget"
        ]
        conds.append(
            {
                "type": "DisruptionTarget",
                "status": "True",
                "reason": "EvictionByEvictionAPI",
                "message": "Eviction API: evicting",
                "lastProbeTime": None,
                "lastTransitionTime": rfc3339(),
            }
        )
        marked["status"]["conditions"] = conds
        self._write(pods, marked, "MODIFIED")
        self._delete_pod(key, options)
        return self._eviction_ok()

    @staticmethod
    def _eviction_ok() -> dict:
        return status_body(201, None, None, ok=True)

    def list_objects(self, res: Resource, ns: str | None, q: dict[str, str]) -> dict:
        """LIST with label/field selectors and limit/continue paging over a consistent snapshot."""
        list_meta: dict[str, Any] = {}
        token = q.get("continue")
        limit = int(q.get("limit") or 0)
        if token:
            snap = self._continues.get(token)
            if snap is None:
                try:
                    rv = json.loads(base64.b64decode(token))["rv"]
                except (ValueError, KeyError, TypeError):
                    raise bad_request(f"continue key is not valid: {token}") from None
                raise ApiError(
                    410,
                    "Expired",
                    f"The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue token in this response to retrieve the remainder of the results. Continuing with the provided token results in an inconsistent list - objects that were created, modified, or deleted between the time the first chunk was returned and now may show up in the list. (rv {rv})",
                )
            list_rv, items = snap
        else:
            lsel = parse_label_selector(q.get("labelSelector", ""))
            fsel = parse_field_selector(res, q.get("fieldSelector", ""))
            list_rv = self._rv
            items = [
                copy.deepcopy(o)
                for k, o in sorted(self._bucket(res).items())
                if (ns is None or k[0] == ns)
                and lsel(o["metadata"].get("labels") or {})
                and fsel(o)
            ]
        page, rest = (items[:limit], items[limit:]) if limit > 0 else (items, [])
        list_meta["resourceVersion"] = str(list_rv)
        if rest:
            last = page[-1]["metadata"]
            start = f"{last.get('namespace', '')}/{last['name']}\x00"
            tok = base64.b64encode(
                json.dumps(
                    {
                        "v": "meta.k8s.io/v1",
                        "rv": list_rv,
                        "start": start,
                        "n": uuid.uuid4().hex[:8],
                    }
                ).encode()
            ).decode()
            self._continues[tok] = (list_rv, rest)
            list_meta["continue"] = tok
            if not q.get("labelSelector") and not q.get("fieldSelector") and not token:
                list_meta["remainingItemCount"] = len(rest)
        out_items = []
        for o in page:
            v = to_view(res, o)
            if res.builtin:
                v = {k: val for k, val in v.items() if k not in ("apiVersion", "kind")}
            out_items.append(v)
        return {
            "kind": f"{res.kind}List",
            "apiVersion": res.api_version,
            "metadata": list_meta,
            "items": out_items,
        }

    # ----------------------------------------------------------------------------------- watch

    def _watch(
        self, h: FakeRequestHandler, res: Resource, ns: str | None, q: dict[str, str]
    ) -> None:
        lsel = parse_label_selector(q.get("labelSelector", ""))
        fsel = parse_field_selector(res, q.get("fieldSelector", ""))
        timeout = float(q.get("timeoutSeconds") or self.default_watch_timeout)
        deadline = time.monotonic() + timeout
        rv_param = q.get("resourceVersion", "")

        def matches(o: dict | None) -> bool:
            return (
                o is not None
                and (ns is None or o["metadata"].get("namespace", "") == ns)
                and lsel(o["metadata"].get("labels") or {})
                and fsel(o)
            )

        with self._lock:
            initial: list[tuple[str, dict]] = []
            if rv_param in ("", "0"):
                initial = [
                    ("ADDED", copy.deepcopy(o))
                    for k, o in sorted(self._bucket(res).items())
                    if matches(o)
                ]
                cursor = self._rv
            else:
                cursor = int(rv_param)
                if cursor < self._compacted_rv:
                    initial = [
                        (
                            "ERROR",
                            status_body(
                                410,
                                "Expired",
                                f"too old resource version: {cursor} ({self._compacted_rv})",
                            ),
                        )
                    ]
                    deadline = 0.0
        h.start_stream(200)
        try:
            for typ, obj in initial:
                h.write_chunk(self._event_line(res, typ, obj))
            while time.monotonic() < deadline and not self._halt.is_set():
                with self._lock:
                    batch = [
                        c for c in self._changes if c.rv > cursor and c.store_key == res.store_key
                    ]
                    if not batch:
                        self._changed.wait(min(0.2, max(0.0, deadline - time.monotonic())))
                        continue
                    cursor = batch[-1].rv
                for c in batch:
                    now_in, was_in = matches(c.obj) and c.type != "DELETED", matches(c.old)
                    if c.type == "DELETED" and was_in:
                        typ = "DELETED"
                    elif now_in and was_in:
                        typ = "MODIFIED"
                    elif now_in:
                        typ = "ADDED"
                    elif was_in:
                        typ = "DELETED"
                    else:
                        continue
                    h.write_chunk(self._event_line(res, typ, c.obj))
            h.end_stream()
        except OSError:
            h.close_connection = True

    @staticmethod
    def _event_line(res: Resource, typ: str, obj: dict) -> bytes:
        payload = obj if typ == "ERROR" else to_view(res, obj)
        return (json.dumps({"type": typ, "object": payload}, separators=(",", ":")) + "\n").encode()
