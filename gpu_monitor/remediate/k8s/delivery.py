"""``KubeDelivery``: the remediator's node delivery (remediate/delivery.py) on Kubernetes.

Why: the lifecycle speaks of quarantines, releases, drains and notices; this module says what
each is on a cluster - our Node's conditions, Events, taint, cordon and records (node.py), the
Eviction-API drain (drain.py), the breaker ConfigMap (breaker.py) and the GPUHealthReports
naming this node (remediate/reports.py) - all through the shared client (gpu_monitor.kube),
built on first use, so constructing a delivery never imports ``kubernetes``.

``RBAC_RULES`` declares every (apiGroup, resource, verbs) the daemon's delivery uses; the
manifests in daemonset/ are tested against it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from gpu_monitor.clock import Clock
from gpu_monitor.kube.client import Kube
from gpu_monitor.kube.config import load_api_client
from gpu_monitor.kube.errors import KubeError
from gpu_monitor.remediate.bootstrap_gate import BOOTSTRAP_TAINT
from gpu_monitor.remediate.delivery import NodeFacts, QuarantineOutcome, Request
from gpu_monitor.remediate.k8s.breaker import BreakerSettings, ConfigMapBreaker
from gpu_monitor.remediate.k8s.drain import DrainPolicy, DrainReport, drain_node
from gpu_monitor.remediate.k8s.node import (
    ANNOTATIONS,
    LABEL_REPLACE,
    LABEL_STATE,
    NodeClient,
    NodeView,
)
from gpu_monitor.remediate.policy import ConditionWant
from gpu_monitor.remediate.reports import ReportSource

__all__ = ["RBAC_RULES", "KubeDelivery"]

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

_REQUESTS = {Request.RELEASE: ANNOTATIONS.RELEASE_REQUESTED,
             Request.RETEST: ANNOTATIONS.RETEST_REQUESTED}


def node_facts(view: NodeView | None) -> NodeFacts | None:
    """What our labels and annotations on ``view`` say, in the lifecycle's words."""
    if view is None:
        return None
    ann = view.annotations
    return NodeFacts(labels=view.labels, state=view.labels.get(LABEL_STATE),
                     replace_marked=view.labels.get(LABEL_REPLACE) == "true",
                     release_requested=ANNOTATIONS.RELEASE_REQUESTED in ann,
                     retest_requested=ANNOTATIONS.RETEST_REQUESTED in ann,
                     returned_by_human=ANNOTATIONS.UNCORDONED_MANUALLY in ann)


class KubeDelivery:
    """Our Node's writes on Kubernetes, behind ``remediate.delivery.NodeDelivery``.

    ``kube_factory``: returns a ``kubernetes.client.ApiClient`` or a ready ``Kube`` (None: the
    in-cluster config, else the kubeconfig); called on first use."""

    errors: tuple[type[BaseException], ...] = (KubeError,)

    def __init__(self, kube_factory: Callable[[], Any] | None, node: str,
                 clock: Clock | None = None, *, taint_key: str | None = None,
                 namespace: str = "gpu-monitor", breaker: BreakerSettings | None = None,
                 drain: DrainPolicy | None = None):
        self.kube_factory = kube_factory
        self.node_name = node
        self.clock = clock or Clock()
        self.taint_key = taint_key
        self.namespace = namespace
        self.breaker_settings = breaker or BreakerSettings(namespace=namespace)
        self.drain_policy = drain or DrainPolicy()
        self._kube: Any = None
        self._node: NodeClient | None = None
        self._breaker: ConfigMapBreaker | None = None
        self._dropped: Callable[[str, str], None] | None = None
        self._lock = threading.Lock()

    @classmethod
    def from_config(cls, config: Any, node: str, clock: Clock | None = None,
                    kube_factory: Callable[[], Any] | None = None, *,
                    namespace: str = "gpu-monitor", drain: DrainPolicy | None = None
                    ) -> KubeDelivery:
        rem = config.remediation
        return cls(kube_factory, node, clock, taint_key=rem.taint_key, namespace=namespace,
                   breaker=BreakerSettings.from_config(rem.breaker, namespace),
                   drain=drain or DrainPolicy.from_config(rem.drain))

    # --- the client, built on first use ----------------------------------------------------------

    @property
    def kube(self) -> Any:
        with self._lock:
            if self._kube is None:
                made = self.kube_factory() if self.kube_factory else None
                if made is None:
                    made = load_api_client()
                self._kube = made if isinstance(made, Kube) else Kube(made, self.clock)
            return self._kube

    @property
    def node(self) -> NodeClient:
        if self._node is None:
            kw = {"taint_key": self.taint_key} if self.taint_key else {}
            self._node = NodeClient(self.kube, self.node_name,
                                    on_event_dropped=self._event_dropped, **kw)
        return self._node

    @property
    def breaker(self) -> ConfigMapBreaker:
        if self._breaker is None:
            self._breaker = ConfigMapBreaker(self.kube, self.breaker_settings, self.clock)
        return self._breaker

    @property
    def drain_timeout_s(self) -> float:
        return self.drain_policy.timeout_s

    def _event_dropped(self, body: Mapping[str, Any], why: str) -> None:
        if self._dropped is not None:
            self._dropped(str(body.get("reason", "")), why)

    def on_event_dropped(self, listener: Callable[[str, str], None]) -> None:
        self._dropped = listener

    # --- reading ---------------------------------------------------------------------------------

    @property
    def _view(self) -> NodeView | None:
        return self._node.view if self._node is not None else None

    def facts(self) -> NodeFacts | None:
        return node_facts(self._view)

    def read(self) -> NodeFacts:
        facts = node_facts(self.node.read())
        assert facts is not None
        return facts

    # --- conditions and Events -------------------------------------------------------------------

    def load_conditions(self, types: Iterable[str]) -> None:
        self.node.load_conditions(types, self._view)

    def publish_conditions(self, wants: Sequence[ConditionWant], now: datetime, *,
                           force: bool = False) -> bool:
        return self.node.sync_conditions(wants, now, force=force)

    def event(self, reason: str, message: str, *, warning: bool = False) -> bool:
        return self.node.event(reason, message, type="Warning" if warning else "Normal")

    def event_delivered(self, reason: str, message: str) -> bool:
        return self._node is not None and self._node.event_delivered(reason, message)

    def flush_events(self) -> None:
        if self._node is not None:
            self._node.flush_events()

    # --- the quarantine --------------------------------------------------------------------------

    def mirror_state(self, state: str) -> None:
        view = self._view
        current = view.labels.get(LABEL_STATE) if view is not None else None
        if current == state or (state == "healthy" and current is None and view is not None):
            return  # no label means healthy: a fleet restart writes nothing to healthy nodes
        self.node.set_state_label(state)

    def quarantine(self, reason: str, state: str, now: datetime) -> QuarantineOutcome:
        return self.node.ensure_quarantined(reason, state, now, view=self._view)

    def quarantine_text(self, reason: str) -> str:
        return f"cordoned and tainted {self.node.taint_text(reason)}"

    def drain(self, remaining_s: float, cancel: threading.Event,
              on_outcome: Callable[[str], None]) -> DrainReport:
        return drain_node(self.kube, self.node_name, self.drain_policy, self.clock,
                          remaining_s=remaining_s, cancel=cancel, on_outcome=on_outcome)

    def record_drain(self, status: str) -> None:
        view = self._view
        state = view.labels.get(LABEL_STATE, "quarantined") if view else "quarantined"
        self.node.set_state_label(state, annotations={ANNOTATIONS.DRAIN: status})

    def mark_replace(self) -> None:
        view = self._view
        if view is None or view.labels.get(LABEL_REPLACE) != "true":
            self.node.set_state_label("replace", extra={LABEL_REPLACE: "true"})

    def release(self, now: datetime) -> bool:
        return self.node.release()[1]

    def clear_request(self, request: str) -> None:
        self.node.clear_request(_REQUESTS[request])

    def incoming_reports(self, store: Any, drop_dir: str | None) -> ReportSource:
        return ReportSource(self.node_name, store, self.clock, kube=self.kube,
                            namespace=self.namespace, drop_dir=drop_dir)

    # --- the bootstrap gate ----------------------------------------------------------------------

    def bootstrap_held(self) -> bool:
        return self.node.read().taint(BOOTSTRAP_TAINT) is not None

    def lift_bootstrap_hold(self) -> None:
        self.node.remove_taint(BOOTSTRAP_TAINT, self._view)
