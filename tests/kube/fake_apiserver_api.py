"""The API machinery the fake apiserver shares: Status errors, the resource table, selectors.

Why apart from the server: these are the apiserver's fixed vocabulary (error bodies exactly as
kube-apiserver writes them, the resources and field-selector labels it serves, the selector
syntax), with no state; the stateful server (fake_apiserver.py) and its HTTP front use them.
"""

from __future__ import annotations

import json
import math
import random
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

SERVER_VERSION = {
    "major": "1",
    "minor": "37",
    "gitVersion": "v1.37.1",
    "gitCommit": "0000000000000000000000000000000000000000",
    "gitTreeState": "clean",
    "buildDate": "2026-01-01T00:00:00Z",
    "goVersion": "go1.25.0",
    "compiler": "gc",
    "platform": "linux/amd64",
}

JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"

UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
EVICTION_BLOCKED = "Cannot evict pod as it would violate the pod's disruption budget."
MULTIPLE_PDBS = "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support."


def rfc3339(t: float | None = None) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() if t is None else t))


# ------------------------------------------------------------------------------------ errors


class ApiError(Exception):
    """An error answer, carrying the `Status` body the apiserver would write."""

    def __init__(
        self,
        code: int,
        reason: str | None,
        message: str,
        details: dict | None = None,
        retry_after: int = 0,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.retry_after = retry_after
        if retry_after:
            details = {**(details or {}), "retryAfterSeconds": retry_after}
        self.body = status_body(code, reason, message, details)


def status_body(
    code: int | None,
    reason: str | None,
    message: str | None,
    details: dict | None = None,
    *,
    ok: bool = False,
) -> dict:
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success" if ok else "Failure",
    }
    if message:
        body["message"] = message
    if reason:
        body["reason"] = reason
    if details:
        body["details"] = details
    if code is not None:  # a store's own success Status (a delete) carries no code
        body["code"] = code
    return body


def status_details(res: Resource | None, name: str = "", **extra: Any) -> dict:
    d: dict[str, Any] = {}
    if name:
        d["name"] = name
    if res is not None:
        if res.group:
            d["group"] = res.group
        d["kind"] = res.plural
    d.update(extra)
    return d


def not_found(res: Resource, name: str) -> ApiError:
    return ApiError(
        404, "NotFound", f'{res.qualified} "{name}" not found', status_details(res, name)
    )


def already_exists(res: Resource, name: str) -> ApiError:
    return ApiError(
        409, "AlreadyExists", f'{res.qualified} "{name}" already exists', status_details(res, name)
    )


def conflict(res: Resource, name: str, why: str | None = None) -> ApiError:
    why = (
        why
        or "the object has been modified; please apply your changes to the latest version and try again"
    )
    return ApiError(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {res.qualified} "{name}": {why}',
        status_details(res, name),
    )


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


def forbidden(qualified: str, name: str, why: str, details: dict | None = None) -> ApiError:
    return ApiError(403, "Forbidden", f'{qualified} "{name}" is forbidden: {why}', details)


def invalid(res: Resource, name: str, causes: list[tuple[str, str, str]]) -> ApiError:
    """causes: (reason, field, body) as field.Error renders them, e.g. ("FieldValueInvalid", ...)."""
    parts = [f"{f}: {b}" for _, f, b in causes]
    joined = parts[0] if len(parts) == 1 else "[" + ", ".join(parts) + "]"
    details: dict[str, Any] = {"name": name}
    if res.group:
        details["group"] = res.group
    details["kind"] = res.kind
    details["causes"] = [{"reason": r, "message": b, "field": f} for r, f, b in causes]
    return ApiError(422, "Invalid", f'{res.kind} "{name}" is invalid: {joined}', details)


def too_many_requests(
    message: str, retry_after: int = 0, causes: list[dict] | None = None
) -> ApiError:
    return ApiError(
        429, "TooManyRequests", message, {"causes": causes} if causes else None, retry_after
    )


def internal_error(message: str) -> ApiError:
    return ApiError(
        500,
        "InternalError",
        f"Internal error occurred: {message}",
        {"causes": [{"message": message}]},
    )


REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "Conflict",
    410: "Expired",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}


# ----------------------------------------------------------------------------------- resources


@dataclass(frozen=True)
class Resource:
    """One served resource type; `builtin=False` marks a custom resource (no SMP, typed lists)."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True
    status: bool = False  # has a /status subresource (main writes then keep status)
    generation: bool = False  # metadata.generation follows spec changes
    builtin: bool = True
    short_names: tuple[str, ...] = ()
    fields: tuple[str, ...] = ()  # field-selector labels beyond metadata.name/namespace
    storage: tuple[str, str] | None = None  # (group, plural) this is another view of

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def gr(self) -> tuple[str, str]:
        return (self.group, self.plural)

    @property
    def store_key(self) -> tuple[str, str]:
        return self.storage or self.gr

    @property
    def qualified(self) -> str:
        return f"{self.plural}.{self.group}" if self.group else self.plural


_POD_FIELDS = (
    "spec.nodeName",
    "spec.restartPolicy",
    "spec.schedulerName",
    "spec.serviceAccountName",
    "spec.hostNetwork",
    "status.phase",
    "status.podIP",
    "status.nominatedNodeName",
)
_EVENT_FIELDS = tuple(
    f"involvedObject.{f}"
    for f in ("kind", "namespace", "name", "uid", "apiVersion", "resourceVersion", "fieldPath")
) + ("reason", "reportingComponent", "source", "type")
_EVENTS_V1_FIELD_MAP = {
    **{
        f"regarding.{f}": f"involvedObject.{f}"
        for f in ("kind", "namespace", "name", "uid", "apiVersion", "resourceVersion", "fieldPath")
    },
    "reportingController": "reportingComponent",
}

BUILTIN_RESOURCES: tuple[Resource, ...] = (
    Resource(
        "",
        "v1",
        "namespaces",
        "Namespace",
        namespaced=False,
        status=True,
        short_names=("ns",),
        fields=("status.phase",),
    ),
    Resource(
        "",
        "v1",
        "nodes",
        "Node",
        namespaced=False,
        status=True,
        short_names=("no",),
        fields=("spec.unschedulable",),
    ),
    Resource(
        "",
        "v1",
        "pods",
        "Pod",
        status=True,
        generation=True,
        short_names=("po",),
        fields=_POD_FIELDS,
    ),
    Resource("", "v1", "configmaps", "ConfigMap", short_names=("cm",)),
    Resource("", "v1", "events", "Event", short_names=("ev",), fields=_EVENT_FIELDS),
    Resource(
        "apps", "v1", "daemonsets", "DaemonSet", status=True, generation=True, short_names=("ds",)
    ),
    Resource(
        "apps",
        "v1",
        "deployments",
        "Deployment",
        status=True,
        generation=True,
        short_names=("deploy",),
    ),
    Resource(
        "apps", "v1", "replicasets", "ReplicaSet", status=True, generation=True, short_names=("rs",)
    ),
    Resource(
        "apps",
        "v1",
        "statefulsets",
        "StatefulSet",
        status=True,
        generation=True,
        short_names=("sts",),
    ),
    Resource(
        "policy",
        "v1",
        "poddisruptionbudgets",
        "PodDisruptionBudget",
        status=True,
        generation=True,
        short_names=("pdb",),
    ),
    Resource("coordination.k8s.io", "v1", "leases", "Lease"),
    Resource(
        "batch", "v1", "jobs", "Job", status=True, generation=True, fields=("status.successful",)
    ),
    Resource(
        "events.k8s.io",
        "v1",
        "events",
        "Event",
        short_names=("ev",),
        storage=("", "events"),
        fields=tuple(_EVENTS_V1_FIELD_MAP) + ("reason", "type"),
    ),
    Resource(
        "gpu-monitor.io",
        "v1alpha1",
        "gpuhealthreports",
        "GPUHealthReport",
        status=True,
        generation=True,
        builtin=False,
        short_names=("ghr",),
    ),
)

_CORE_TO_EVENTS_V1 = {
    "involvedObject": "regarding",
    "message": "note",
    "reportingComponent": "reportingController",
    "source": "deprecatedSource",
    "firstTimestamp": "deprecatedFirstTimestamp",
    "lastTimestamp": "deprecatedLastTimestamp",
    "count": "deprecatedCount",
}
_EVENTS_V1_TO_CORE = {v: k for k, v in _CORE_TO_EVENTS_V1.items()}


def to_view(res: Resource, obj: dict) -> dict:
    """Storage form → the form served at `res` (only events.k8s.io differs from storage)."""
    if res.storage is None:
        return obj
    out = {_CORE_TO_EVENTS_V1.get(k, k): v for k, v in obj.items()}
    out["apiVersion"], out["kind"] = res.api_version, res.kind
    return out


def from_view(res: Resource, obj: dict) -> dict:
    if res.storage is None:
        return obj
    out = {_EVENTS_V1_TO_CORE.get(k, k): v for k, v in obj.items()}
    out["apiVersion"], out["kind"] = "v1", "Event"
    return out


# ----------------------------------------------------------------------------------- selectors

_KEY = r"[A-Za-z0-9][-A-Za-z0-9_./]*"
_SEL_SET = re.compile(rf"^\s*({_KEY})\s+(in|notin)\s*\(([^)]*)\)\s*$")
_SEL_EQ = re.compile(rf"^\s*({_KEY})\s*(==|=|!=)\s*([-A-Za-z0-9_.]*)\s*$")
_SEL_CMP = re.compile(rf"^\s*({_KEY})\s*(>|<)\s*(-?\d+)\s*$")
_SEL_EXISTS = re.compile(rf"^\s*(!?)\s*({_KEY})\s*$")

Predicate = Callable[[dict], bool]


def _split_terms(selector: str) -> list[str]:
    terms, depth, cur = [], 0, ""
    for ch in selector:
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            terms.append(cur)
            cur = ""
        else:
            cur += ch
    terms.append(cur)
    return [t for t in terms if t.strip()]


def parse_label_selector(selector: str) -> Callable[[dict], bool]:
    """The `labelSelector` query syntax → predicate over a labels dict; 400 on a syntax error."""
    checks: list[Callable[[dict], bool]] = []
    for term in _split_terms(selector or ""):
        if m := _SEL_SET.match(term):
            key, op, vals = (
                m.group(1),
                m.group(2),
                {v.strip() for v in m.group(3).split(",") if v.strip()},
            )
            if op == "in":
                checks.append(lambda lb, k=key, vs=vals: lb.get(k) in vs)
            else:
                checks.append(lambda lb, k=key, vs=vals: lb.get(k) not in vs)
        elif m := _SEL_EQ.match(term):
            key, op, val = m.groups()
            if op == "!=":
                checks.append(lambda lb, k=key, v=val: lb.get(k) != v)
            else:
                checks.append(lambda lb, k=key, v=val: k in lb and lb[k] == v)
        elif m := _SEL_CMP.match(term):
            key, op, num = m.group(1), m.group(2), int(m.group(3))

            def cmp(lb: dict, k: str = key, o: str = op, n: int = num) -> bool:
                try:
                    v = int(lb[k])
                except (KeyError, ValueError):
                    return False
                return v > n if o == ">" else v < n

            checks.append(cmp)
        elif m := _SEL_EXISTS.match(term):
            neg, key = m.groups()
            checks.append(lambda lb, k=key, n=bool(neg): (k in lb) != n)
        else:
            raise bad_request(f"unable to parse requirement: {term.strip()!r}")
    return lambda labels: all(c(labels or {}) for c in checks)


def match_label_selector(sel: dict | None, labels: dict | None) -> bool:
    """A metav1.LabelSelector object; nil or empty matches nothing (eviction.go's rule)."""
    if not sel or (not sel.get("matchLabels") and not sel.get("matchExpressions")):
        return False
    labels = labels or {}
    for k, v in (sel.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for e in sel.get("matchExpressions") or []:
        k, op, vals = e.get("key"), e.get("operator"), e.get("values") or []
        if (
            (op == "In" and labels.get(k) not in vals)
            or (op == "NotIn" and k in labels and labels[k] in vals)
            or (op == "Exists" and k not in labels)
            or (op == "DoesNotExist" and k in labels)
        ):
            return False
    return True


def _field_value(obj: dict, label: str) -> str:
    cur: Any = obj
    for part in label.split("."):
        cur = cur.get(part) if isinstance(cur, dict) else None
    if isinstance(cur, bool):
        return "true" if cur else "false"
    if cur is None:
        return ""
    if isinstance(cur, dict) and label == "source":  # core Event: source.component
        return cur.get("component", "")
    return str(cur)


def parse_field_selector(res: Resource, selector: str) -> Predicate:
    """`fieldSelector` for `res`; unsupported labels are a 400 exactly like the apiserver's."""
    checks: list[Predicate] = []
    allowed = {"metadata.name", "metadata.namespace", *res.fields}
    for term in _split_terms(selector or ""):
        m = re.match(r"^\s*([A-Za-z0-9_.]+)\s*(==|=|!=)\s*(.*?)\s*$", term)
        if not m:
            raise bad_request(f"invalid selector: '{selector}'; can't understand '{term}'")
        label, op, val = m.groups()
        if label not in allowed:
            raise bad_request(
                f'"{label}" is not a known field selector: only "{", ".join(sorted(allowed))}"'
                if not res.builtin
                else f"field label not supported: {label}"
            )
        path = _EVENTS_V1_FIELD_MAP.get(label, label) if res.storage else label
        if op == "!=":
            checks.append(lambda o, p=path, v=val: _field_value(o, p) != v)
        else:
            checks.append(lambda o, p=path, v=val: _field_value(o, p) == v)
    return lambda obj: all(c(obj) for c in checks)


# ------------------------------------------------------------------------------ request log


@dataclass(frozen=True)
class RecordedRequest:
    """One request as it reached the server; `status` 0 means the connection was dropped."""

    seq: int
    method: str
    path: str
    query: str
    content_type: str | None
    body: str
    status: int

    @property
    def params(self) -> dict[str, str]:
        return {k: v[0] for k, v in parse_qs(self.query, keep_blank_values=True).items()}

    @property
    def json(self) -> Any:
        return json.loads(self.body) if self.body else None


@dataclass
class Fault:
    """An injected fault; `times=None` is forever. `hits` counts the requests it caught.

    `active` (optional) gates it on a predicate evaluated per request, e.g. an outage that
    lasts until a test clock passes a time; `content_type` (optional) narrows it to requests
    of that Content-Type (media type only); `fn` is a hook's action."""

    kind: str  # "status" | "delay" | "drop" | "hook"
    method: str | None
    path: re.Pattern
    times: int | None
    status: int = 500
    message: str | None = None
    reason: str | None = None
    retry_after: int = 0
    body: dict | None = None
    seconds: float = 0.0
    hits: int = 0
    active: Callable[[], bool] | None = None
    content_type: str | None = None
    fn: Callable[[RecordedRequest], None] | None = None

    def matches(self, method: str, path: str, content_type: str | None = None) -> bool:
        if self.times is not None and self.hits >= self.times:
            return False
        if self.content_type is not None and (
            (content_type or "").split(";")[0].strip().lower() != self.content_type.lower()
        ):
            return False
        if not (self.method in (None, "*") or self.method == method) or not self.path.fullmatch(
            path
        ):
            return False
        return self.active is None or bool(self.active())


NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
QUALIFIED_NAME_RE = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
LABEL_VALUE_RE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def scaled_value(value: Any, total: int) -> int:
    if isinstance(value, str) and value.endswith("%"):
        return math.ceil(total * int(value[:-1]) / 100)
    return int(value)


def pod_ready(pod: dict) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (pod.get("status") or {}).get("conditions") or []
    )


def running_pod_status(node: str | None) -> dict:
    now = rfc3339()
    conds = [
        {"type": t, "status": "True", "lastProbeTime": None, "lastTransitionTime": now}
        for t in (
            "PodReadyToStartContainers",
            "Initialized",
            "Ready",
            "ContainersReady",
            "PodScheduled",
        )
    ]
    return {
        "phase": "Running",
        "conditions": conds,
        "hostIP": "10.0.0.1" if node else None,
        "podIP": f"10.244.{random.randint(0, 254)}.{random.randint(1, 254)}",
        "startTime": now,
        "qosClass": "BestEffort",
    }


@dataclass
class PodRuntime:
    """What the fake kubelet knows about one pod (never served)."""

    uid: str
    delete_at: float | None = None  # monotonic time the containers have stopped
    stop_after: float | None = None  # seconds the process takes to exit after SIGTERM
    hang: bool = False
    recreate: bool = False
    start: bool = False  # created through the API: the kubelet should start it
