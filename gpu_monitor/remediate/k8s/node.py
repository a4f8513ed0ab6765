"""Our own Node on Kubernetes: every change gpu-monitor makes to it, and its Events.

Why apart: these writes carry the semantics that matter on a real cluster
(research/k8s_remediation.md, SPEC-REMEDIATION.md); the requests themselves go through the
shared client (gpu_monitor.kube), and the remediator reaches this module only through its
Kubernetes delivery (delivery.py here):

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
4. **Writes happen only on change**, rate-limited by the client; Events are deduplicated and
   delivered from a bounded queue that never holds up the node's steps (remediate/events.py).
"""

from __future__ import annotations

import logging
import secrets
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from gpu_monitor.clock import Clock
from gpu_monitor.kube.client import COMPONENT, Kube
from gpu_monitor.kube.errors import KubeError, KubeThrottled
from gpu_monitor.model import iso
from gpu_monitor.remediate.delivery import QuarantineOutcome
from gpu_monitor.remediate.events import CAPACITY as EVENT_QUEUE_CAPACITY
from gpu_monitor.remediate.events import Attempt, Delivery, EventQueue

log = logging.getLogger(__name__)

__all__ = [
    "ANNOTATIONS",
    "LABEL_REPLACE",
    "LABEL_STATE",
    "PREFIX",
    "NodeClient",
    "NodeView",
]

EVENT_NAMESPACE = "default"  # where kubelet and node-problem-detector put a Node's events
HEARTBEAT_S = 300.0  # node-problem-detector's default condition heartbeat

PREFIX = "gpu-monitor.io/"
LABEL_STATE = PREFIX + "state"
LABEL_REPLACE = PREFIX + "replace"


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
        if value is None:
            return self._untaint_ops(view, self.taint_key)
        i = view.taint_index(self.taint_key)
        want = {"key": self.taint_key, "value": value, "effect": "NoSchedule"}
        if i is None:
            if not view.taints:
                return [{"op": "add", "path": "/spec/taints", "value": [want]}]
            return [{"op": "add", "path": "/spec/taints/-", "value": want}]
        if view.taints[i].get("value") == value:
            return []
        return [{"op": "test", "path": f"/spec/taints/{i}", "value": view.taints[i]},
                {"op": "replace", "path": f"/spec/taints/{i}", "value": want}]

    @staticmethod
    def _untaint_ops(view: NodeView, key: str) -> list[dict]:
        """Ops that remove the NoSchedule taint ``key``, behind a ``test`` of that entry."""
        i = view.taint_index(key)
        if i is None:
            return []
        return [{"op": "test", "path": f"/spec/taints/{i}", "value": view.taints[i]},
                {"op": "remove", "path": f"/spec/taints/{i}"}]

    def remove_taint(self, key: str, view: NodeView | None = None) -> NodeView:
        """Remove another NoSchedule taint of gpu-monitor's (the bootstrap taint), guarded as
        our own is: someone else's taints in the list are never touched."""
        return self._guarded(lambda v: self._untaint_ops(v, key), view)

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
        return QuarantineOutcome(pre, cordoned, flags["tainted"],
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

    def release(self, *, state: str = "healthy") -> tuple[NodeView, bool]:
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
