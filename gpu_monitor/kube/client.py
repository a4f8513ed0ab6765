"""``Kube``: every request gpu-monitor makes to the API server, on one call path.

Why one path: the remediator, the breaker, the drain, the GPUHealthReport watch, the fabric
scheduler and the operator CLIs all talk to the API server, and on a real cluster each request
must behave the same (research/k8s_remediation.md, SPEC-REMEDIATION.md):

1. **Raw JSON in and out.** Answers are decoded dicts, never the client's model classes (a
   watch of every pod in a cluster must not build one object per event).
2. **Errors carry meaning**: any non-2xx is a ``KubeError`` with the status, the Status body
   and Retry-After (errors.py); callers branch on ``status``, never on message text.
3. **Writes are rate-limited** (a token bucket, ratelimit.py; client-go's default qps 5,
   burst 10): a write waits for a token, or - for Events, which must never delay the node's
   own writes - is refused with ``KubeThrottled`` when none is free now.
4. **Transient failures are retried** (connection refused/reset, timeouts, 429/5xx on
   idempotent requests) with backoff and jitter until a deadline, then ``KubeUnavailable``.
   Evictions are never retried on an HTTP status here: 429/500/403 mean something specific to
   the drain (remediate/k8s/drain.py decides).
5. **Lists are paged** as kubectl pages them (limit 500, ``continue``), and the resourceVersion
   of the snapshot comes back with the items, so a watch can start where the list ended.

This package is the only one that imports ``kubernetes``, and only inside functions: importing
it loads nothing heavy.
"""

from __future__ import annotations

import json
import logging
import random
import threading
from collections.abc import Callable, Iterator
from typing import Any

from gpu_monitor.clock import Clock
from gpu_monitor.kube.errors import (
    KubeError,
    KubeThrottled,
    KubeUnavailable,
    error_from,
    is_transport,
)
from gpu_monitor.kube.ratelimit import RateLimiter

log = logging.getLogger(__name__)

__all__ = ["COMPONENT", "GPU_NODE_SELECTOR", "METADATA_LIST_ACCEPT", "RETRY_STATUSES", "Kube"]

COMPONENT = "gpu-monitor"
GPU_NODE_SELECTOR = "nvidia.com/gpu.present=true"
METADATA_LIST_ACCEPT = ("application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,"
                        "application/json")
EVENT_TIMEOUT = (5.0, 10.0)  # connect, read: one Event attempt (the queue retries)

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
        self.batch = client.BatchV1Api(api_client)  # the fabric scheduler's Jobs
        self.coordination = client.CoordinationV1Api(api_client)  # and its Lease
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
                err = error_from(exc)
                if err.status not in retry_statuses and err.status != 0:
                    raise err from None
                why = f"{err.status} {err.reason}".strip()
                retry_after = err.retry_after
            except Exception as exc:  # noqa: BLE001 - classified just below
                if not is_transport(exc):
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

    def create_pod(self, namespace: str, body: dict) -> dict:
        return self.call(self.core.create_namespaced_pod, namespace, body, write=True)

    def get_pod(self, namespace: str, name: str) -> dict | None:
        return self.call_or_none(self.core.read_namespaced_pod, name, namespace)

    def patch_pod_status(self, namespace: str, name: str, body: Any) -> dict:
        """A strategic-merge patch of the pod's ``status`` subresource (``pods/status``)."""
        return self.call(self.core.patch_namespaced_pod_status, name, namespace, body,
                         write=True)

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
            raise error_from(exc) from None


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

