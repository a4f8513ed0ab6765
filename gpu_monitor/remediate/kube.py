"""The Kubernetes wire: the only module that imports ``kubernetes`` (lazily, inside functions).

Why one module: every request gpu-monitor makes to the API server goes through ``Kube`` (raw
JSON in and out, errors mapped to ``KubeError``, transient failures retried, writes
rate-limited), and every change to our own Node goes through ``NodeClient``, which knows the
semantics that matter on a real cluster (research/k8s_remediation.md, SPEC-REMEDIATION.md):

1. **Taints are an atomic list.** Our taint is added, re-valued and removed with a JSON patch
   that starts with a ``test`` of ``metadata.resourceVersion`` (a 422 means someone else wrote
   the node: re-read, recompute, retry), never with a patch carrying the whole list.
2. **Ownership is recorded before acting, atomically with the act.** The quarantine record
   (reason, time, whether the node was already cordoned, the taint we applied) is written in
   the same guarded JSON patch as the taint; the cordon is kubectl's strategic-merge patch
   ``{"spec":{"unschedulable":true}}`` carrying our ``cordoned-at`` annotation in the same
   request, and the ``metadata.resourceVersion`` it was decided on, which the API server
   enforces as a precondition (409 Conflict: re-read, decide again). So an operator's cordon
   that lands between our record and our cordon stays theirs (a cordon without our
   ``cordoned-at`` is someone else's, whenever it appeared: the record says pre-existing), our
   uncordon is conditional the same way, and a human's uncordon or untaint afterwards is
   detected, recorded and respected.
3. **Conditions merge by type.** ``PATCH nodes/<n>/status`` as a strategic-merge patch touches
   only our condition types (kubelet's ``Ready`` survives). ``lastTransitionTime`` moves only
   when status or reason changes; ``lastHeartbeatTime`` on every write; a write happens only on
   a change or when the heartbeat is due; at start the existing conditions are read back, never
   reset.
4. **Writes are rate-limited** (token bucket) and **only on change**; Events are deduplicated
   and delivered from a bounded queue that never holds up the node's steps (events.py).
5. **Transient failures are retried** (connection refused/reset, timeouts, 429/5xx on
   idempotent requests) with backoff and jitter until a deadline, then ``KubeUnavailable``.
   Evictions are never retried on an HTTP status here: 429/500/403 mean something specific to
   the drain (drain.py decides).

``RBAC_RULES`` declares every (apiGroup, resource, verbs) this module may use; the manifests in
daemonset/ are tested against it.
"""

from __future__ import annotations

import json
import logging
import random
import secrets
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from gpu_monitor.clock import Clock
from gpu_monitor.model import iso, parse_iso
from gpu_monitor.remediate.events import CAPACITY as EVENT_QUEUE_CAPACITY
from gpu_monitor.remediate.events import Attempt, Delivery, EventQueue

log = logging.getLogger(__name__)

__all__ = [
    "ANNOTATIONS",
    "COMPONENT",
    "DEFAULT_NAMESPACE",
    "GPU_NODE_SELECTOR",
    "LABEL_REPLACE",
    "LABEL_STATE",
    "METADATA_LIST_ACCEPT",
    "RBAC_RULES",
    "Kube",
    "KubeConfigError",
    "KubeError",
    "KubeThrottled",
    "KubeUnavailable",
    "NodeClient",
    "NodeView",
    "RateLimiter",
    "kubeconfig_factory",
    "load_api_client",
]

COMPONENT = "gpu-monitor"
DEFAULT_NAMESPACE = "gpu-monitor"
EVENT_NAMESPACE = "default"  # where kubelet and node-problem-detector put a Node's events
GPU_NODE_SELECTOR = "nvidia.com/gpu.present=true"
METADATA_LIST_ACCEPT = ("application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,"
                        "application/json")
HEARTBEAT_S = 300.0  # node-problem-detector's default condition heartbeat
EVENT_TIMEOUT = (5.0, 10.0)  # connect, read: one Event attempt (the queue retries)

PREFIX = "gpu-monitor.io/"
LABEL_STATE = PREFIX + "state"
LABEL_REPLACE = PREFIX + "replace"
LABEL_EXCLUDE = PREFIX + "exclude"


class ANNOTATIONS:
    """Annotation keys recording what gpu-monitor did to the node (docs/remediation.md)."""

    REASON = PREFIX + "quarantine-reason"
    SINCE = PREFIX + "quarantined-at"
    PRE_EXISTING = PREFIX + "cordon-pre-existing"  # "true": a human cordoned it first
    CORDONED = PREFIX + "cordoned-at"  # present: the cordon is ours
    TAINT = PREFIX + "taint"  # the taint we applied, key=value:effect
    UNCORDONED_MANUALLY = PREFIX + "uncordoned-manually"
    UNTAINTED_MANUALLY = PREFIX + "untainted-manually"
    DRAIN = PREFIX + "drain"  # pending | succeeded | failed: <why>
    RELEASE_REQUESTED = PREFIX + "release-requested"  # set by `quarantine release`
    RETEST_REQUESTED = PREFIX + "retest-requested"  # set by `quarantine retest`

    OWNED = (REASON, SINCE, PRE_EXISTING, CORDONED, TAINT, UNCORDONED_MANUALLY,
             UNTAINTED_MANUALLY, DRAIN)


#: Every (apiGroup, resource, verbs) gpu-monitor needs; "" is the core group. The breaker
#: ConfigMap's get/update should be limited with resourceNames in the manifests
#: (``gpu-monitor-breaker``); pods ``delete`` is used only with drain.force_delete.
RBAC_RULES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("", "nodes", ("get", "list", "patch")),
    ("", "nodes/status", ("patch",)),
    ("", "pods", ("get", "list", "delete")),
    ("", "pods/eviction", ("create",)),
    ("", "events", ("create",)),
    ("", "configmaps", ("get", "update")),
    ("gpu-monitor.io", "gpuhealthreports", ("get", "list", "watch", "create")),
)


# --- errors and the client -----------------------------------------------------------------------


class KubeError(Exception):
    """An answer from the API server that is not a success."""

    def __init__(self, status: int, reason: str = "", message: str = "",
                 body: Mapping[str, Any] | None = None, retry_after: float = 0.0):
        super().__init__(f"{status} {reason}: {message}".strip())
        self.status = status
        self.reason = reason
        self.message = message
        self.body = dict(body or {})
        self.retry_after = retry_after

    @property
    def causes(self) -> list[Mapping[str, Any]]:
        return list((self.body.get("details") or {}).get("causes") or [])

    def has_cause(self, reason: str) -> bool:
        return any(c.get("reason") == reason for c in self.causes)


class KubeUnavailable(KubeError):
    """The API server could not be reached (or kept failing) until the retry deadline."""

    def __init__(self, message: str, retry_after: float = 0.0):
        super().__init__(0, "Unavailable", message, retry_after=retry_after)


class KubeThrottled(KubeUnavailable):
    """A write that asked not to wait found no rate-limiter token free (nothing was sent)."""


class KubeConfigError(ValueError):
    """A kubeconfig (``--kubeconfig`` / ``--context``) that cannot be used; says why."""


def load_api_client(kubeconfig: str | None = None, context: str | None = None):
    """A ``kubernetes.client.ApiClient``: in-cluster config first (the DaemonSet), else the
    kubeconfig (an operator's workstation)."""
    from kubernetes import client, config

    if kubeconfig is None:
        try:
            config.load_incluster_config()
            return client.ApiClient()
        except config.ConfigException:
            pass
    cfg = client.Configuration()
    config.load_kube_config(config_file=kubeconfig, context=context,
                            client_configuration=cfg)
    return client.ApiClient(cfg)


def kubeconfig_factory(kubeconfig: str | None, context: str | None = None
                       ) -> Callable[[], Any]:
    """A factory of ``ApiClient``s for the daemon's ``--kubeconfig``/``--context`` (a daemon
    outside a cluster), checked now so a bad file fails the start instead of the first
    remediation tick. ``kubeconfig`` None: ``$KUBECONFIG``, else ``~/.kube/config`` (the
    client's own default). Raises KubeConfigError saying what is wrong; never anything else."""
    import os
    from urllib.parse import urlsplit

    from kubernetes import client, config

    if kubeconfig is not None and not os.path.isfile(kubeconfig):
        why = "is a directory" if os.path.isdir(kubeconfig) else "no such file"
        raise KubeConfigError(f"{kubeconfig}: {why}")
    cfg = client.Configuration()
    try:
        config.load_kube_config(config_file=kubeconfig, context=context,
                                client_configuration=cfg, persist_config=False)
        if kubeconfig is not None:
            _check_user(kubeconfig, context)
    except KubeConfigError:
        raise
    except Exception as exc:  # noqa: BLE001 - the client raises many kinds on a bad file
        text = " ".join(str(exc).split())[:300] or type(exc).__name__
        if isinstance(exc, (TypeError, AttributeError, KeyError, ValueError)):
            text = f"not a kubeconfig (a YAML map of clusters, contexts, users): {text}"
        raise KubeConfigError(f"{kubeconfig or 'the default kubeconfig'}: {text}") from None
    url = urlsplit(cfg.host or "")
    if url.scheme not in ("http", "https") or not url.netloc:
        raise KubeConfigError(f"{kubeconfig or 'the default kubeconfig'}: the server of "
                              f"context {context or '(current)'} is "
                              f"{repr(cfg.host) if cfg.host else 'missing'}, not an http(s) URL")
    return lambda: client.ApiClient(cfg)


def _check_user(path: str, context: str | None) -> None:
    """The user the context names must exist (the Python client would go on anonymously;
    kubectl's config validation refuses it: 'user "x" was not found for context "y"')."""
    import yaml

    with open(path, encoding="utf-8", errors="replace") as fh:
        doc = yaml.safe_load(fh)
    name = context or doc.get("current-context")
    ctx = next((c.get("context") or {} for c in doc.get("contexts") or []
                if isinstance(c, dict) and c.get("name") == name), {})
    user = ctx.get("user") if isinstance(ctx, dict) else None
    users = {u.get("name") for u in doc.get("users") or [] if isinstance(u, dict)}
    if user and user not in users:
        raise KubeConfigError(f'{path}: user "{user}" was not found for context "{name}"')


class RateLimiter:
    """A token bucket (client-go's default for controllers is qps 5, burst 10)."""

    def __init__(self, qps: float, burst: int, clock: Clock):
        self.qps = float(qps)
        self.burst = max(1, int(burst))
        self.clock = clock
        self._tokens = float(self.burst)
        self._last = clock.monotonic()
        self._lock = threading.Lock()

    def try_acquire(self, keep: int = 0) -> bool:
        """Take one token only if one is free now and ``keep`` more stay for writes that wait;
        never sleeps (Events use it: they must not delay the node's own writes)."""
        if self.qps <= 0:
            return True
        with self._lock:
            now = self.clock.monotonic()
            self._tokens = min(self.burst, self._tokens + (now - self._last) * self.qps)
            self._last = now
            if self._tokens < 1.0 + keep:
                return False
            self._tokens -= 1.0
            return True

    def acquire(self) -> float:
        """Take one token, sleeping until one is available; returns the seconds waited."""
        if self.qps <= 0:
            return 0.0
        with self._lock:
            now = self.clock.monotonic()
            self._tokens = min(self.burst, self._tokens + (now - self._last) * self.qps)
            self._last = now
            self._tokens -= 1.0
            wait = 0.0 if self._tokens >= 0 else -self._tokens / self.qps
        if wait:
            self.clock.sleep(wait)
        return wait


def _error_from(exc: Exception) -> KubeError:
    status = int(getattr(exc, "status", 0) or 0)
    raw = getattr(exc, "body", None)
    body: dict[str, Any] = {}
    if raw:
        try:
            body = json.loads(raw if isinstance(raw, str) else raw.decode("utf-8", "replace"))
        except (ValueError, AttributeError):
            body = {"message": str(raw)[:500]}
    headers = getattr(exc, "headers", None) or {}
    retry = 0.0
    try:
        retry = float(headers.get("Retry-After") or 0)
    except (TypeError, ValueError, AttributeError):
        retry = 0.0
    retry = retry or float((body.get("details") or {}).get("retryAfterSeconds") or 0)
    return KubeError(status, str(body.get("reason") or getattr(exc, "reason", "") or ""),
                     str(body.get("message") or ""), body, retry)


def _is_transport(exc: BaseException) -> bool:
    try:
        import urllib3
    except ImportError:  # pragma: no cover
        return isinstance(exc, OSError)
    return isinstance(exc, (urllib3.exceptions.HTTPError, OSError))


RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})


class Kube:
    """Raw-JSON access to the few API endpoints gpu-monitor uses, through the real client.

    ``api_client``: a ``kubernetes.client.ApiClient`` (tests point one at the fake apiserver).
    """

    def __init__(self, api_client: Any, clock: Clock | None = None, *, qps: float = 5.0,
                 burst: int = 10, retry_deadline_s: float = 30.0,
                 request_timeout: tuple[float, float] = (5.0, 30.0),
                 field_manager: str = COMPONENT):
        from kubernetes import client

        self.api_client = api_client
        self.clock = clock or Clock()
        self.core = client.CoreV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.limiter = RateLimiter(qps, burst, self.clock)
        self.retry_deadline_s = retry_deadline_s
        self.request_timeout = request_timeout
        self.field_manager = field_manager
        self.writes = 0  # requests that change something (for tests and the bench)

    def close(self) -> None:
        try:
            self.api_client.close()
        except Exception:  # noqa: BLE001
            pass

    # --- the one call path ----------------------------------------------------------------------

    def call(self, fn: Callable[..., Any], *args: Any, write: bool = False,
             retry_statuses: frozenset[int] = RETRY_STATUSES, deadline_s: float | None = None,
             wait_for_token: bool = True, **kwargs: Any) -> Any:
        """Call a generated API method; the decoded JSON body (None when empty).

        Transport errors and ``retry_statuses`` are retried with exponential backoff and
        jitter (at least any Retry-After) until ``deadline_s`` (0: one attempt); other errors
        raise KubeError. A write takes a rate-limiter token first, waiting for one unless
        ``wait_for_token`` is False (then KubeThrottled when none is free, nothing sent).
        """
        from kubernetes.client.exceptions import ApiException

        kwargs.setdefault("_preload_content", False)
        kwargs.setdefault("_request_timeout", self.request_timeout)
        budget = self.retry_deadline_s if deadline_s is None else deadline_s
        start = self.clock.monotonic()
        attempt = 0
        while True:
            if write and wait_for_token:
                self.limiter.acquire()
            elif write and not self.limiter.try_acquire(keep=2):
                raise KubeThrottled(f"{getattr(fn, '__name__', 'request')}: no write token free")
            try:
                resp = fn(*args, **kwargs)
                if write:
                    self.writes += 1
                data = resp.data if hasattr(resp, "data") else resp
                if not data:
                    return None
                return json.loads(data)
            except ApiException as exc:
                err = _error_from(exc)
                if err.status not in retry_statuses and err.status != 0:
                    raise err from None
                why = f"{err.status} {err.reason}".strip()
                retry_after = err.retry_after
            except Exception as exc:  # noqa: BLE001 - classified just below
                if not _is_transport(exc):
                    raise
                why = f"{type(exc).__name__}: {exc}"[:300]
                retry_after = 0.0
            attempt += 1
            elapsed = self.clock.monotonic() - start
            delay = max(retry_after, min(5.0, 0.1 * 2 ** (attempt - 1)) * random.uniform(0.8, 1.2))
            if elapsed + delay > budget:
                raise KubeUnavailable(f"{getattr(fn, '__name__', 'request')}: {why} "
                                      f"(gave up after {attempt} attempts, {elapsed:.1f} s)",
                                      retry_after)
            log.debug("kubernetes %s failed (%s); retry %d in %.2f s",
                      getattr(fn, "__name__", "request"), why, attempt, delay)
            self.clock.sleep(delay)

    # --- nodes ---------------------------------------------------------------------------------

    def call_or_none(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``call``, with 404 Not Found as None (a read or delete of something that may be gone)."""
        try:
            return self.call(fn, *args, **kwargs)
        except KubeError as err:
            if err.status == 404:
                return None
            raise

    def list_pages(self, fn: Callable[..., Any], *args: Any,
                   **kwargs: Any) -> tuple[list[dict], str]:
        """Every item of a list call, paged as kubectl pages (limit 500, continue), and the
        resourceVersion of the snapshot the pages come from."""
        items: list[dict] = []
        cont = None
        rv = ""
        while True:
            page = self.call(fn, *args, limit=500, **({"_continue": cont} if cont else {}),
                             **kwargs) or {}
            items += page.get("items") or []
            meta = page.get("metadata") or {}
            rv = rv or str(meta.get("resourceVersion") or "")
            cont = meta.get("continue")
            if not cont:
                return items, rv

    def get_node(self, name: str) -> dict:
        return self.call(self.core.read_node, name)

    def patch_node(self, name: str, body: Any, *, status: bool = False) -> dict:
        """A dict body is a strategic-merge patch, a list body a JSON patch (the client picks
        the Content-Type)."""
        fn = self.core.patch_node_status if status else self.core.patch_node
        return self.call(fn, name, body, write=True)

    def count_gpu_nodes(self, selector: str = GPU_NODE_SELECTOR) -> int:
        """GPU nodes in the cluster, from a metadata-only list (PartialObjectMetadataList)."""
        items, _ = self.list_pages(self.core.list_node, label_selector=selector,
                                   _headers={"Accept": METADATA_LIST_ACCEPT})
        return len(items)

    # --- pods ----------------------------------------------------------------------------------

    def list_pods_on_node(self, node: str) -> list[dict]:
        """All pods bound to ``node`` (kubectl's list: fieldSelector, limit 500, continue)."""
        return self.list_pages(self.core.list_pod_for_all_namespaces,
                               field_selector=f"spec.nodeName={node}")[0]

    def get_pod(self, namespace: str, name: str) -> dict | None:
        return self.call_or_none(self.core.read_namespaced_pod, name, namespace)

    def evict(self, namespace: str, name: str, grace_period_s: int | None = None) -> None:
        """POST a policy/v1 Eviction (as kubectl: Content-Type application/json, empty
        deleteOptions unless a grace period is given). Raises KubeError on any non-2xx."""
        from kubernetes import client

        opts = client.V1DeleteOptions(grace_period_seconds=grace_period_s)
        body = client.V1Eviction(api_version="policy/v1", kind="Eviction",
                                 metadata=client.V1ObjectMeta(name=name, namespace=namespace),
                                 delete_options=opts)
        self.call(self.core.create_namespaced_pod_eviction, name, namespace, body, write=True,
                  retry_statuses=frozenset(), _headers={"Content-Type": "application/json"})

    def delete_pod(self, namespace: str, name: str, *, grace_period_s: int = 0,
                   uid: str | None = None) -> None:
        """Force-delete (grace 0), guarded by the pod's UID so a recreated pod is spared."""
        from kubernetes import client

        pre = client.V1Preconditions(uid=uid) if uid else None
        body = client.V1DeleteOptions(grace_period_seconds=grace_period_s, preconditions=pre)
        self.call(self.core.delete_namespaced_pod, name, namespace, body=body, write=True)

    # --- events, config maps, custom resources ---------------------------------------------------

    def create_event(self, namespace: str, body: dict, *, once: bool = False) -> dict:
        """POST a core/v1 Event. ``once``: a single attempt with a short timeout that takes a
        write token only if one is free (the Event queue retries; see events.py)."""
        if once:
            return self.call(self.core.create_namespaced_event, namespace, body, write=True,
                             deadline_s=0.0, wait_for_token=False,
                             _request_timeout=EVENT_TIMEOUT)
        return self.call(self.core.create_namespaced_event, namespace, body, write=True)

    def get_configmap(self, namespace: str, name: str) -> dict | None:
        return self.call_or_none(self.core.read_namespaced_config_map, name, namespace)

    def replace_configmap(self, namespace: str, name: str, body: dict) -> dict:
        """PUT with ``metadata.resourceVersion``: a 409 Conflict (raised, not retried) means
        someone else wrote it since it was read (compare-and-swap)."""
        return self.call(self.core.replace_namespaced_config_map, name, namespace, body,
                         write=True, retry_statuses=RETRY_STATUSES - {500})

    def list_custom(self, group: str, version: str, namespace: str, plural: str, *,
                    label_selector: str | None = None) -> dict:
        kw: dict[str, Any] = {}
        if label_selector:
            kw["label_selector"] = label_selector
        return self.call(self.custom.list_namespaced_custom_object, group, version, namespace,
                         plural, **kw) or {}

    def create_custom(self, group: str, version: str, namespace: str, plural: str,
                      body: dict) -> dict:
        return self.call(self.custom.create_namespaced_custom_object, group, version, namespace,
                         plural, body, write=True, retry_statuses=RETRY_STATUSES - {500})

    def watch_custom(self, group: str, version: str, namespace: str, plural: str, *,
                     label_selector: str | None = None, resource_version: str | None = None,
                     timeout_s: int = 300, stop: threading.Event | None = None,
                     started: Callable[[Any], None] | None = None,
                     ) -> Iterator[tuple[str, dict]]:
        """(event type, raw object) from a watch of custom objects (see ``watch``)."""
        return self.watch(self.custom.list_namespaced_custom_object, group, version, namespace,
                          plural, label_selector=label_selector,
                          resource_version=resource_version, timeout_s=timeout_s, stop=stop,
                          started=started)

    def watch(self, fn: Callable[..., Any], *args: Any, label_selector: str | None = None,
              field_selector: str | None = None, resource_version: str | None = None,
              timeout_s: int = 300, stop: threading.Event | None = None,
              started: Callable[[Any], None] | None = None, bookmarks: bool = False,
              ) -> Iterator[tuple[str, dict]]:
        """(event type, raw object) from a watch on the list call ``fn``; ends at the server's
        timeout, or raises KubeError (410 Gone: list again). Objects stay plain dicts (no model
        classes: a watch of every pod in a cluster must not build one per event).
        ``started(handle)`` receives a handle whose ``stop()`` ends the stream from another
        thread. ``bookmarks``: ask for BOOKMARK events (they carry only a resourceVersion)."""
        from kubernetes import watch
        from kubernetes.client.exceptions import ApiException

        w = watch.Watch(return_type="object")
        if started is not None:
            started(_WatchHandle(w))
        kw: dict[str, Any] = {"timeout_seconds": timeout_s,
                              "_request_timeout": (self.request_timeout[0], timeout_s + 30)}
        if label_selector:
            kw["label_selector"] = label_selector
        if field_selector:
            kw["field_selector"] = field_selector
        if resource_version:
            kw["resource_version"] = resource_version
        if bookmarks:
            kw["allow_watch_bookmarks"] = True
        try:
            for ev in w.stream(fn, *args, **kw):
                if stop is not None and stop.is_set():
                    w.stop()
                    return
                obj = ev.get("raw_object") or ev.get("object") or {}
                if ev.get("type") == "ERROR":
                    raise KubeError(int(obj.get("code") or 500), str(obj.get("reason") or ""),
                                    str(obj.get("message") or ""), obj)
                yield ev["type"], obj
        except ApiException as exc:
            raise _error_from(exc) from None


class _WatchHandle:
    """Stops a watch from another thread: flag it and close its response under the reader."""

    def __init__(self, w: Any):
        self._w = w

    def stop(self) -> None:
        self._w.stop()
        resp = getattr(self._w, "_resp", None)
        if resp is not None:
            try:
                resp.close()
            except Exception:  # noqa: BLE001
                pass


# --- our node ------------------------------------------------------------------------------------


def _ptr(key: str) -> str:
    """A JSON-pointer token (RFC 6901) for a label/annotation key with a slash."""
    return key.replace("~", "~0").replace("/", "~1")


@dataclass(frozen=True)
class NodeView:
    """The parts of our Node remediation reads."""

    name: str
    uid: str
    resource_version: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    unschedulable: bool
    taints: tuple[Mapping[str, Any], ...]
    conditions: tuple[Mapping[str, Any], ...]

    @classmethod
    def of(cls, obj: Mapping[str, Any]) -> NodeView:
        meta = obj.get("metadata") or {}
        spec = obj.get("spec") or {}
        return cls(name=meta.get("name", ""), uid=meta.get("uid", ""),
                   resource_version=str(meta.get("resourceVersion", "")),
                   labels=dict(meta.get("labels") or {}),
                   annotations=dict(meta.get("annotations") or {}),
                   unschedulable=bool(spec.get("unschedulable")),
                   taints=tuple(spec.get("taints") or ()),
                   conditions=tuple((obj.get("status") or {}).get("conditions") or ()))

    def taint(self, key: str) -> Mapping[str, Any] | None:
        for t in self.taints:
            if t.get("key") == key and t.get("effect") == "NoSchedule":
                return t
        return None

    def taint_index(self, key: str) -> int | None:
        for i, t in enumerate(self.taints):
            if t.get("key") == key and t.get("effect") == "NoSchedule":
                return i
        return None

    @property
    def cordoned_by_us(self) -> bool:
        return ANNOTATIONS.CORDONED in self.annotations

    @property
    def quarantine_recorded(self) -> bool:
        return ANNOTATIONS.SINCE in self.annotations


@dataclass
class _Cond:
    status: str
    reason: str
    message: str
    transition: str


@dataclass(frozen=True)
class QuarantineOutcome:
    """What ``ensure_quarantined`` found and did."""

    node: NodeView
    cordon_pre_existing: bool
    cordoned: bool  # we cordoned it in this call
    tainted: bool  # we added or re-valued the taint in this call
    human_uncordoned: bool
    human_untainted: bool


@dataclass
class NodeClient:
    """Every change gpu-monitor makes to its own Node, plus that node's Events.

    ``on_event_dropped(body, why)``: told about each Event given up on (``dropped``: the
    queue was full; ``refused``: the API server refused it for good)."""

    kube: Kube
    node: str
    taint_key: str = PREFIX + "unhealthy"
    component: str = COMPONENT
    event_repeat_s: float = 600.0  # an identical Event is not sent again within this time
    event_capacity: int = EVENT_QUEUE_CAPACITY  # Events waiting while the Events API fails
    on_event_dropped: Callable[[Mapping[str, Any], str], None] | None = None
    heartbeat_s: float = HEARTBEAT_S
    conflict_retries: int = 10
    view: NodeView | None = None  # the node as of our last read or write
    _conds: dict[str, _Cond] | None = None
    _last_cond_write: float | None = None
    _events: EventQueue | None = None
    _uid: str = ""
    _lock: threading.RLock = field(default_factory=threading.RLock)

    @property
    def clock(self) -> Clock:
        return self.kube.clock

    @property
    def events(self) -> EventQueue:
        """The queue of this node's Events not yet delivered (events.py)."""
        if self._events is None:
            self._events = EventQueue(self._send_event, self.clock,
                                      capacity=self.event_capacity,
                                      repeat_s=self.event_repeat_s,
                                      on_drop=self.on_event_dropped)
        return self._events

    def read(self) -> NodeView:
        return self._seen(self.kube.get_node(self.node))

    def _seen(self, obj: Mapping[str, Any]) -> NodeView:
        view = NodeView.of(obj)
        self._uid = view.uid or self._uid
        self.view = view
        return view

    # --- guarded JSON patches --------------------------------------------------------------------

    def _guarded(self, build: Callable[[NodeView], list[dict] | None],
                 view: NodeView | None = None) -> NodeView:
        """Apply the JSON patch ``build(view)`` behind a ``test`` of the resourceVersion;
        on 422 (someone wrote the node meanwhile) re-read and rebuild. None/[] = nothing to do."""
        for _ in range(self.conflict_retries):
            view = view or self.read()
            ops = build(view)
            if not ops:
                return view
            patch = [{"op": "test", "path": "/metadata/resourceVersion",
                      "value": view.resource_version}, *ops]
            try:
                return self._seen(self.kube.patch_node(self.node, patch))
            except KubeError as err:
                if err.status not in (409, 422):
                    raise
                log.debug("node %s changed under us (%s); re-reading", self.node, err.status)
                view = None
        raise KubeError(409, "Conflict", f"node {self.node} kept changing; gave up after "
                                         f"{self.conflict_retries} attempts")

    def _guarded_merge(self, build: Callable[[NodeView], dict | None],
                       view: NodeView | None = None) -> tuple[NodeView, bool]:
        """Apply the strategic-merge patch ``build(view)`` only to the node as ``view`` saw it:
        the patch carries that ``metadata.resourceVersion``, which the API server takes as a
        precondition (409 Conflict when the node changed since). On 409 re-read and rebuild,
        so the decision is made again on what is there now. None = nothing to do.
        (view, whether a patch was applied)."""
        for _ in range(self.conflict_retries):
            view = view or self.read()
            body = build(view)
            if not body:
                return view, False
            meta = dict(body.get("metadata") or {})
            meta["resourceVersion"] = view.resource_version
            try:
                return self._seen(self.kube.patch_node(self.node,
                                                       {**body, "metadata": meta})), True
            except KubeError as err:
                if err.status != 409:
                    raise
                log.debug("node %s changed since it was read (409); re-reading", self.node)
                view = None
        raise KubeError(409, "Conflict", f"node {self.node} kept changing; gave up after "
                                         f"{self.conflict_retries} attempts")

    @staticmethod
    def _map_ops(view_map: Mapping[str, str], root: str, set_: Mapping[str, str | None],
                 ) -> list[dict]:
        ops: list[dict] = []
        current = dict(view_map)
        if not current and any(v is not None for v in set_.values()):
            ops.append({"op": "add", "path": f"/metadata/{root}", "value": {}})
        for key, value in set_.items():
            if value is None:
                if key in current:
                    ops.append({"op": "remove", "path": f"/metadata/{root}/{_ptr(key)}"})
            elif current.get(key) != value:
                ops.append({"op": "add", "path": f"/metadata/{root}/{_ptr(key)}", "value": value})
        return ops

    def _taint_ops(self, view: NodeView, value: str | None) -> list[dict]:
        """Ops that make our NoSchedule taint carry ``value`` (None: remove it)."""
        i = view.taint_index(self.taint_key)
        if value is None:
            if i is None:
                return []
            return [{"op": "test", "path": f"/spec/taints/{i}", "value": view.taints[i]},
                    {"op": "remove", "path": f"/spec/taints/{i}"}]
        want = {"key": self.taint_key, "value": value, "effect": "NoSchedule"}
        if i is None:
            if not view.taints:
                return [{"op": "add", "path": "/spec/taints", "value": [want]}]
            return [{"op": "add", "path": "/spec/taints/-", "value": want}]
        if view.taints[i].get("value") == value:
            return []
        return [{"op": "test", "path": f"/spec/taints/{i}", "value": view.taints[i]},
                {"op": "replace", "path": f"/spec/taints/{i}", "value": want}]

    def taint_text(self, value: str) -> str:
        return f"{self.taint_key}={value}:NoSchedule"

    # --- quarantine ----------------------------------------------------------------------------

    def ensure_quarantined(self, reason: str, state: str, now: datetime, *,
                           cordon: bool = True, extra_labels: Mapping[str, str | None] = (),
                           view: NodeView | None = None) -> QuarantineOutcome:
        """Make the node quarantined for ``reason``, idempotently (safe to repeat after a
        crash): the ownership record + taint + state label in one guarded JSON patch, then the
        cordon as kubectl sends it. A human's uncordon/untaint since our own is respected."""
        flags = {"human_uncordoned": False, "human_untainted": False, "tainted": False}

        def build(view: NodeView) -> list[dict]:
            ann = view.annotations
            updates: dict[str, str | None] = {}
            if not view.quarantine_recorded:
                updates[ANNOTATIONS.SINCE] = iso(now)
                updates[ANNOTATIONS.PRE_EXISTING] = "true" if view.unschedulable else "false"
                updates[ANNOTATIONS.DRAIN] = "pending"
            elif view.unschedulable and not view.cordoned_by_us \
                    and ann.get(ANNOTATIONS.PRE_EXISTING) != "true":
                # cordoned after our record, but not by us (an operator between our record and
                # our cordon, or while we were down): it is theirs, as a pre-existing one is
                updates[ANNOTATIONS.PRE_EXISTING] = "true"
            if ann.get(ANNOTATIONS.REASON) != reason:
                updates[ANNOTATIONS.REASON] = reason
            if view.cordoned_by_us and not view.unschedulable \
                    and ANNOTATIONS.UNCORDONED_MANUALLY not in ann:
                updates[ANNOTATIONS.UNCORDONED_MANUALLY] = iso(now)
                flags["human_uncordoned"] = True
            ours = view.taint(self.taint_key)
            untainted = ANNOTATIONS.UNTAINTED_MANUALLY in ann
            taint_ops: list[dict] = []
            if ANNOTATIONS.TAINT in ann and ours is None and not untainted:
                updates[ANNOTATIONS.UNTAINTED_MANUALLY] = iso(now)
                flags["human_untainted"] = True
                untainted = True
            if not untainted:
                taint_ops = self._taint_ops(view, reason)
                if taint_ops or ann.get(ANNOTATIONS.TAINT) != self.taint_text(reason):
                    updates[ANNOTATIONS.TAINT] = self.taint_text(reason)
            flags["tainted"] = bool(taint_ops)
            labels = {LABEL_STATE: state, **dict(extra_labels)}
            return (self._map_ops(ann, "annotations", updates)
                    + self._map_ops(view.labels, "labels", labels) + taint_ops)

        view = self._guarded(build, view)
        cordoned = False
        if cordon:
            stamp = iso(now)

            def cordon_body(v: NodeView) -> dict | None:
                ann = v.annotations
                if v.unschedulable or ann.get(ANNOTATIONS.PRE_EXISTING) == "true" \
                        or ANNOTATIONS.UNCORDONED_MANUALLY in ann:
                    return None
                return self._cordon_body(stamp)

            tried = cordon_body(view) is not None
            view, _ = self._guarded_merge(cordon_body, view)
            # ours if our stamp is on it (also when a retry of a cordon that landed hit 409)
            cordoned = tried and view.unschedulable \
                and view.annotations.get(ANNOTATIONS.CORDONED) == stamp
            if view.unschedulable and not view.cordoned_by_us \
                    and view.annotations.get(ANNOTATIONS.PRE_EXISTING) != "true":
                view = self._guarded(build, view)  # someone else's cordon won the race
        pre = view.annotations.get(ANNOTATIONS.PRE_EXISTING) == "true"
        return QuarantineOutcome(view, pre, cordoned, flags["tainted"],
                                 flags["human_uncordoned"], flags["human_untainted"])

    @staticmethod
    def _cordon_body(stamp: str) -> dict:
        return {"metadata": {"annotations": {ANNOTATIONS.CORDONED: stamp}},
                "spec": {"unschedulable": True}}

    def cordon(self, now: datetime, view: NodeView | None = None) -> NodeView:
        """kubectl's cordon patch, plus our ``cordoned-at`` annotation in the same request,
        conditional on the resourceVersion of ``view`` (default: the last one seen, else a
        fresh read). A node found cordoned - before, or by someone else meanwhile - is left
        as it is: ``cordoned_by_us`` on the returned view says whose the cordon is."""
        stamp = iso(now)
        return self._guarded_merge(
            lambda v: None if v.unschedulable else self._cordon_body(stamp),
            view or self.view)[0]

    def set_state_label(self, state: str, *, extra: Mapping[str, str | None] = (),
                        annotations: Mapping[str, str | None] = (), fresh: bool = False
                        ) -> NodeView:
        """Labels/annotations only (maps merge per key: a strategic-merge patch is safe, so the
        last known view is enough to tell what changes; ``fresh`` re-reads first)."""
        view = self.read() if fresh or self.view is None else self.view
        labels = {LABEL_STATE: state, **dict(extra)}
        ann = dict(annotations)
        labels = {k: v for k, v in labels.items() if view.labels.get(k) != v}
        ann = {k: v for k, v in ann.items() if view.annotations.get(k) != v}
        if not labels and not ann:
            return view
        meta: dict[str, Any] = {}
        if labels:
            meta["labels"] = labels
        if ann:
            meta["annotations"] = ann
        return self._seen(self.kube.patch_node(self.node, {"metadata": meta}))

    def release(self, now: datetime, *, state: str = "healthy") -> tuple[NodeView, bool]:
        """Return to service: uncordon only our own cordon (never a pre-existing one or one a
        human took over), then remove only our taint and our records. (view, uncordoned)."""
        def uncordon_body(v: NodeView) -> dict | None:
            ann = v.annotations
            if not (v.cordoned_by_us and v.unschedulable) \
                    or ann.get(ANNOTATIONS.PRE_EXISTING) == "true" \
                    or ANNOTATIONS.UNCORDONED_MANUALLY in ann:
                return None
            return {"metadata": {"annotations": {ANNOTATIONS.CORDONED: None}},
                    "spec": {"unschedulable": None}}

        view, uncordoned = self._guarded_merge(uncordon_body, self.read())

        def build(v: NodeView) -> list[dict]:
            drop = {k: None for k in (*ANNOTATIONS.OWNED, ANNOTATIONS.RELEASE_REQUESTED,
                                      ANNOTATIONS.RETEST_REQUESTED)}
            return (self._taint_ops(v, None) + self._map_ops(v.annotations, "annotations", drop)
                    + self._map_ops(v.labels, "labels", {LABEL_STATE: state, LABEL_REPLACE: None}))

        return self._guarded(build, view), uncordoned

    def clear_request(self, key: str) -> None:
        self._guarded(lambda v: self._map_ops(v.annotations, "annotations", {key: None}))

    # --- conditions ----------------------------------------------------------------------------

    def load_conditions(self, types: Iterable[str], view: NodeView | None = None) -> None:
        """Read back our conditions at start-up (their transition times are kept)."""
        view = view or self.read()
        wanted = set(types)
        with self._lock:
            self._conds = {}
            for c in view.conditions:
                if c.get("type") in wanted:
                    self._conds[c["type"]] = _Cond(str(c.get("status", "")),
                                                   str(c.get("reason", "")),
                                                   str(c.get("message", "")),
                                                   str(c.get("lastTransitionTime") or ""))

    def conditions_known(self) -> bool:
        return self._conds is not None

    def sync_conditions(self, wants: Sequence[Any], now: datetime, *,
                        force: bool = False) -> bool:
        """Write our conditions when one changed or the heartbeat is due; True if written.

        ``wants``: objects with ``type``, ``status``, ``reason``, ``message``.
        """
        with self._lock:
            if self._conds is None:
                self.load_conditions([w.type for w in wants])
            assert self._conds is not None
            mono = self.clock.monotonic()
            due = (force or self._last_cond_write is None
                   or mono - self._last_cond_write >= self.heartbeat_s)
            changed = False
            new: dict[str, _Cond] = dict(self._conds)
            for w in wants:
                old = self._conds.get(w.type)
                if old is None or old.status != w.status or old.reason != w.reason:
                    new[w.type] = _Cond(w.status, w.reason, w.message, iso(now))
                    changed = True
                elif old.message != w.message:
                    new[w.type] = _Cond(w.status, w.reason, w.message, old.transition or iso(now))
                    changed = True
            if not changed and not due:
                return False
            stamp = iso(now)
            body = {"status": {"conditions": [
                {"type": t, "status": c.status, "reason": c.reason, "message": c.message,
                 "lastHeartbeatTime": stamp, "lastTransitionTime": c.transition or stamp}
                for t, c in sorted(new.items()) if t in {w.type for w in wants}]}}
            if not body["status"]["conditions"]:
                return False
            self._seen(self.kube.patch_node(self.node, body, status=True))
            self._conds = new
            self._last_cond_write = mono
            return True

    # --- events --------------------------------------------------------------------------------

    def event(self, reason: str, message: str, *, type: str = "Normal",
              now: datetime | None = None) -> bool:
        """Queue an Event about our Node (involvedObject = the Node) and try to deliver what
        waits, without waiting (events.py). False when deduplicated: identical to one sent
        within ``event_repeat_s``, or to one still waiting (merged into it)."""
        stamp = iso(now or self.clock.now())
        message = message[:1024]
        body = {
            "apiVersion": "v1", "kind": "Event",
            # our own name (client-go's is <object>.<hex>): a retry of a POST whose answer was
            # lost is a 409 AlreadyExists, not a second Event
            "metadata": {"name": f"{self.node[:236]}.{secrets.token_hex(8)}",
                         "namespace": EVENT_NAMESPACE},
            "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": self.node,
                               "uid": self._uid or self.node},
            "reason": reason, "message": message, "type": type,
            "source": {"component": self.component, "host": self.node},
            "reportingComponent": self.component, "reportingInstance": self.node,
            "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1,
        }
        queued = self.events.put((reason, message), body, stamp)
        self.events.flush()
        return queued

    def event_delivered(self, reason: str, message: str) -> bool:
        """Whether the Event (reason, message) queued by ``event`` has been accepted."""
        return self._events is not None and self.events.was_sent((reason, message[:1024]))

    def flush_events(self) -> int:
        """Deliver waiting Events (one attempt each, never waiting); the number delivered."""
        return self.events.flush() if self._events is not None else 0

    def _send_event(self, body: Mapping[str, Any]) -> Attempt:
        involved = body.get("involvedObject") or {}
        if self._uid and involved.get("uid") == self.node:  # queued before the first read
            body = {**body, "involvedObject": {**involved, "uid": self._uid}}
        try:
            self.kube.create_event(EVENT_NAMESPACE, dict(body), once=True)
        except KubeThrottled as err:
            return Attempt(Delivery.LATER, str(err))
        except KubeError as err:
            if err.status == 409:  # AlreadyExists: an earlier attempt landed
                return Attempt(Delivery.SENT, str(err))
            if err.status in (0, 429) or err.status >= 500:
                return Attempt(Delivery.RETRY, str(err), err.retry_after)
            return Attempt(Delivery.REFUSED, str(err))
        return Attempt(Delivery.SENT)


def parse_time(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        return parse_iso(text)
    except ValueError:
        return None

