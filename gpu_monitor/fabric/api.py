"""The fabric scheduler's Kubernetes calls: nodes, pods, Jobs, its Lease, record and reports.

Why apart: the one place the scheduler talks to the API server (through the shared client,
``gpu_monitor.kube.client.Kube``, with its retries, rate limits and error mapping), so the
scheduler's logic can be read, and its RBAC (``scheduler.RBAC_*``) checked, against a short
list of calls. It never imports ``kubernetes`` itself.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

log = logging.getLogger(__name__)

ACTIVE_PODS = "status.phase!=Succeeded,status.phase!=Failed"


class FabricApi:
    """The few endpoints the scheduler uses, through ``gpu_monitor.kube.client.Kube`` (raw
    JSON, retries, rate-limited writes, ``KubeError``)."""

    def __init__(self, kube: Any):
        self.kube = kube
        self.core = kube.core
        self.batch = kube.batch
        self.coord = kube.coordination

    def _items(self, fn: Callable[..., Any], *args: Any, **kw: Any) -> list[dict]:
        return self.kube.list_pages(fn, *args, **kw)[0]

    def list_nodes(self, selector: str | None) -> list[dict]:
        return self.list_nodes_rv(selector)[0]

    def list_nodes_rv(self, selector: str | None) -> tuple[list[dict], str]:
        kw = {"label_selector": selector} if selector else {}
        return self.kube.list_pages(self.core.list_node, **kw)

    def watch_nodes(self, selector: str | None, **kw: Any) -> Iterator[tuple[str, dict]]:
        return self.kube.watch(self.core.list_node, label_selector=selector, bookmarks=True,
                               **kw)

    def list_active_pods(self) -> list[dict]:
        return self.list_active_pods_rv()[0]

    def list_active_pods_rv(self) -> tuple[list[dict], str]:
        return self.kube.list_pages(self.core.list_pod_for_all_namespaces,
                              field_selector=ACTIVE_PODS)

    def watch_active_pods(self, **kw: Any) -> Iterator[tuple[str, dict]]:
        # A pod that stops matching (it finished) arrives as DELETED, as the server promises.
        return self.kube.watch(self.core.list_pod_for_all_namespaces, field_selector=ACTIVE_PODS,
                               bookmarks=True, **kw)

    def list_pods(self, namespace: str, selector: str) -> list[dict]:
        return self._items(self.core.list_namespaced_pod, namespace, label_selector=selector)

    def list_jobs(self, namespace: str, selector: str) -> list[dict]:
        return self._items(self.batch.list_namespaced_job, namespace, label_selector=selector)

    def create_job(self, namespace: str, body: dict) -> dict:
        return self.kube.call(self.batch.create_namespaced_job, namespace, body, write=True,
                              retry_statuses=frozenset({429, 503}))

    def delete_job(self, namespace: str, name: str) -> None:
        self.kube.call_or_none(self.batch.delete_namespaced_job, name, namespace,
                         propagation_policy="Background", write=True)

    def get_lease(self, namespace: str, name: str) -> dict | None:
        return self.kube.call_or_none(self.coord.read_namespaced_lease, name, namespace,
                                deadline_s=2.0)

    def create_lease(self, namespace: str, body: dict) -> dict:
        return self.kube.call(self.coord.create_namespaced_lease, namespace, body, write=True,
                              retry_statuses=frozenset(), deadline_s=2.0)

    def replace_lease(self, namespace: str, name: str, body: dict) -> dict:
        return self.kube.call(self.coord.replace_namespaced_lease, name, namespace, body,
                              write=True, retry_statuses=frozenset(), deadline_s=2.0)

    def get_configmap(self, namespace: str, name: str) -> dict | None:
        return self.kube.get_configmap(namespace, name)

    def create_configmap(self, namespace: str, body: dict) -> dict:
        return self.kube.call(self.core.create_namespaced_config_map, namespace, body,
                              write=True, retry_statuses=frozenset({429, 503}))

    def replace_configmap(self, namespace: str, name: str, body: dict) -> dict:
        return self.kube.call(self.core.replace_namespaced_config_map, name, namespace, body,
                              write=True, retry_statuses=frozenset({429, 503}))

    def create_report(self, namespace: str, body: dict) -> dict:
        from gpu_monitor.remediate.reports import GROUP, PLURAL, VERSION

        return self.kube.create_custom(GROUP, VERSION, namespace, PLURAL, body)

    def watch(self, kind: str, namespace: str, selector: str, stop: threading.Event,
              on_event: Callable[[], None], timeout_s: int = 300) -> None:
        """Call ``on_event`` on every change to our Jobs or pods until ``stop`` (restarting
        the stream as needed). The loop re-lists; the watch only makes it prompt."""
        fn = self.batch.list_namespaced_job if kind == "jobs" else self.core.list_namespaced_pod
        while not stop.is_set():
            handles: list[Any] = []
            try:
                for _ in self.kube.watch(fn, namespace, label_selector=selector,
                                         timeout_s=timeout_s, started=handles.append):
                    on_event()
                    if stop.is_set():
                        handles[-1].stop()
                        return
            except Exception as exc:  # noqa: BLE001 - the watch must survive anything
                log.debug("watch of %s ended: %s", kind, exc)
                stop.wait(1.0)
