"""Draining our node through the Eviction API, with kubectl's semantics and a remediator's filters.

Why its own module: the drain is the one long-running, failure-rich step of a quarantine, and
its rules come straight from ``kubectl drain`` (kubernetes/kubectl ``pkg/drain``) and the
eviction handler (``eviction.go``), as SPEC-REMEDIATION.md lists them:

1. Pods are listed by ``spec.nodeName`` (limit 500, following ``continue``).
2. **Never evicted:** DaemonSet pods; mirror (static) pods, silently. Terminal pods may go.
   Where kubectl refuses the whole drain (emptyDir data, pods without a controller) a
   remediator needs a policy: ``delete_emptydir_data`` / ``evict_unmanaged`` evict them, else
   they are skipped and reported. Optionally only pods requesting GPUs are evicted, and system
   namespaces can be skipped.
3. Each pod gets a policy/v1 Eviction (empty deleteOptions: the pod's own grace period), at
   most ``parallelism`` at once. Answers: 2xx -> wait for deletion; 404 -> already gone;
   **429** -> a PodDisruptionBudget blocks it now: sleep max(Retry-After, backoff with jitter),
   GET the pod (gone or a new UID = done), retry; 403 ``NamespaceTerminating`` -> wait if the pod
   is already terminating, else retry; **500** (several PDBs), other 403s, anything else -> that
   pod fails, without retry.
4. **One global deadline** for the whole node (``timeout_s``, counted from when the drain first
   started, across restarts of the daemon).
5. Waiting for deletion: GET every ``poll_s`` until 404 or a pod with another UID (a
   StatefulSet recreated the name). A pod still terminating at the deadline fails the drain;
   only with ``force_delete`` is it deleted with grace 0 (UID-guarded).
6. A failed drain leaves the node cordoned and tainted; the caller records ``drain-failed``.

The requests go through the shared client (gpu_monitor.kube); the lifecycle reaches the drain
through the Kubernetes delivery (delivery.py here).
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from gpu_monitor.clock import Clock
from gpu_monitor.kube.errors import KubeError

log = logging.getLogger(__name__)

__all__ = [
    "DrainPolicy",
    "DrainReport",
    "PodOutcome",
    "drain_node",
    "requests_gpu",
    "select_pods",
]

MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
GPU_RESOURCE_PREFIXES = ("nvidia.com/gpu", "nvidia.com/mig-")


@dataclass(frozen=True)
class DrainPolicy:
    timeout_s: float = 900.0
    gpu_pods_only: bool = True
    delete_emptydir_data: bool = True
    evict_unmanaged: bool = True
    force_delete: bool = False
    skip_namespaces: tuple[str, ...] = ()
    parallelism: int = 8
    poll_s: float = 1.0  # kubectl's waitForDelete interval
    retry_base_s: float = 5.0  # kubectl's fixed EvictErrorRetryDelay; ours backs off from it
    retry_max_s: float = 60.0
    grace_period_s: int | None = None  # None: each pod's terminationGracePeriodSeconds

    @classmethod
    def from_config(cls, drain: Any, **overrides: Any) -> DrainPolicy:
        return cls(timeout_s=float(drain.timeout_s), gpu_pods_only=bool(drain.gpu_pods_only),
                   delete_emptydir_data=bool(drain.delete_emptydir_data),
                   force_delete=bool(drain.force_delete),
                   evict_unmanaged=bool(getattr(drain, "evict_unmanaged", True)), **overrides)


@dataclass(frozen=True)
class PodOutcome:
    namespace: str
    name: str
    result: str  # evicted | gone | skipped | failed | timeout | force_deleted
    detail: str = ""
    blocked: int = 0  # 429 answers it got before the end

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class DrainReport:
    outcomes: tuple[PodOutcome, ...] = ()
    duration_s: float = 0.0
    cancelled: bool = False

    @property
    def ok(self) -> bool:
        return not self.cancelled and not any(
            o.result in ("failed", "timeout") for o in self.outcomes)

    def with_result(self, *results: str) -> list[PodOutcome]:
        return [o for o in self.outcomes if o.result in results]

    def summary(self) -> str:
        counts: dict[str, int] = {}
        for o in self.outcomes:
            counts[o.result] = counts.get(o.result, 0) + 1
        text = ", ".join(f"{n} {r}" for r, n in sorted(counts.items())) or "no pods"
        bad = self.with_result("failed", "timeout")
        if bad:
            text += "; " + "; ".join(f"{o.ref}: {o.detail}" for o in bad[:5])
        return text


# --- selection (pure) ------------------------------------------------------------------------------


def _controller(pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for ref in (pod.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("controller"):
            return ref
    return None


def requests_gpu(pod: Mapping[str, Any]) -> bool:
    spec = pod.get("spec") or {}
    for c in [*(spec.get("containers") or []), *(spec.get("initContainers") or [])]:
        res = c.get("resources") or {}
        for section in ("limits", "requests"):
            for name, qty in (res.get(section) or {}).items():
                if name.startswith(GPU_RESOURCE_PREFIXES) and str(qty) not in ("0", ""):
                    return True
    return False


def select_pods(pods: Iterable[Mapping[str, Any]], policy: DrainPolicy
                ) -> tuple[list[Mapping[str, Any]], list[PodOutcome]]:
    """(pods to evict, skipped with why) - kubectl's filters in kubectl's order, but a remediator
    filters instead of refusing the whole drain."""
    evict: list[Mapping[str, Any]] = []
    skipped: list[PodOutcome] = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        ns, name = meta.get("namespace", ""), meta.get("name", "")
        phase = (pod.get("status") or {}).get("phase")
        terminal = phase in ("Succeeded", "Failed")
        ctrl = _controller(pod)

        def skip(why: str) -> None:
            skipped.append(PodOutcome(ns, name, "skipped", why))  # noqa: B023

        if ctrl is not None and ctrl.get("kind") == "DaemonSet" and not terminal:
            skip("DaemonSet-managed pod: never evicted")
            continue
        if MIRROR_ANNOTATION in (meta.get("annotations") or {}):
            skip("mirror (static) pod: cannot be evicted through the API")
            continue
        if ns in policy.skip_namespaces:
            skip(f"namespace {ns} is skipped")
            continue
        if policy.gpu_pods_only and not requests_gpu(pod):
            skip("requests no GPU (drain.gpu_pods_only)")
            continue
        if not terminal:
            vols = (pod.get("spec") or {}).get("volumes") or []
            if any("emptyDir" in v for v in vols) and not policy.delete_emptydir_data:
                skip("uses emptyDir data (drain.delete_emptydir_data is off)")
                continue
            if ctrl is None and not policy.evict_unmanaged:
                skip("declares no controller (evict_unmanaged is off)")
                continue
        evict.append(pod)
    return evict, skipped


# --- the drain -------------------------------------------------------------------------------------


@dataclass
class _Run:
    kube: Any
    policy: DrainPolicy
    clock: Clock
    deadline: float  # monotonic
    cancel: threading.Event
    on_outcome: Callable[[str], None] | None
    rng: random.Random = field(default_factory=random.Random)

    def remaining(self) -> float:
        return self.deadline - self.clock.monotonic()

    def count(self, result: str) -> None:
        if self.on_outcome is not None:
            try:
                self.on_outcome(result)
            except Exception:  # noqa: BLE001 - metrics must not break a drain
                log.debug("drain outcome callback failed", exc_info=True)

    def pause(self, seconds: float) -> None:
        seconds = max(0.0, min(seconds, self.remaining()))
        if seconds:
            self.clock.wait(self.cancel, seconds)

    def backoff(self, attempt: int, retry_after: float) -> float:
        base = min(self.policy.retry_max_s, self.policy.retry_base_s * 2 ** max(0, attempt - 1))
        return max(retry_after, base * self.rng.uniform(0.8, 1.2))

    def gone(self, ns: str, name: str, uid: str) -> bool:
        pod = self.kube.get_pod(ns, name)
        return pod is None or (pod.get("metadata") or {}).get("uid") != uid

    def evict(self, pod: Mapping[str, Any]) -> PodOutcome:
        meta = pod.get("metadata") or {}
        ns, name, uid = meta.get("namespace", ""), meta.get("name", ""), meta.get("uid", "")
        blocked = 0
        attempt = 0
        while True:
            if self.cancel.is_set():
                return PodOutcome(ns, name, "failed", "drain cancelled", blocked)
            if self.remaining() <= 0:
                self.count("timeout")
                return PodOutcome(ns, name, "timeout",
                                  f"global timeout reached ({blocked} refusals by a "
                                  "PodDisruptionBudget)" if blocked else "global timeout reached",
                                  blocked)
            try:
                self.kube.evict(ns, name, self.policy.grace_period_s)
            except KubeError as err:
                if err.status == 404:
                    self.count("gone")
                    return PodOutcome(ns, name, "gone", "already gone", blocked)
                if err.status == 429:
                    blocked += 1
                    attempt += 1
                    self.count("blocked")
                    log.info("eviction of %s/%s refused (will retry): %s", ns, name,
                             err.message or err.reason)
                    self.pause(self.backoff(attempt, err.retry_after))
                    try:
                        if self.gone(ns, name, uid):
                            self.count("gone")
                            return PodOutcome(ns, name, "gone", "deleted while blocked", blocked)
                    except KubeError as get_err:
                        self.count("failed")
                        return PodOutcome(ns, name, "failed", f"cannot read pod: {get_err}",
                                          blocked)
                    continue
                if err.status == 403 and err.has_cause("NamespaceTerminating"):
                    current = self.kube.get_pod(ns, name)
                    if current is None:
                        self.count("gone")
                        return PodOutcome(ns, name, "gone", "already gone", blocked)
                    if (current.get("metadata") or {}).get("deletionTimestamp"):
                        return self.wait(ns, name, uid, blocked)
                    attempt += 1
                    self.pause(self.backoff(attempt, 0.0))
                    continue
                self.count("failed")
                return PodOutcome(ns, name, "failed",
                                  f"error when evicting: {err.status} {err.message or err.reason}",
                                  blocked)
            self.count("evicted")
            return self.wait(ns, name, uid, blocked)

    def wait(self, ns: str, name: str, uid: str, blocked: int) -> PodOutcome:
        while True:
            try:
                if self.gone(ns, name, uid):
                    return PodOutcome(ns, name, "evicted", "", blocked)
            except KubeError as err:
                return PodOutcome(ns, name, "failed", f"waiting for deletion: {err}", blocked)
            if self.cancel.is_set():
                return PodOutcome(ns, name, "failed", "drain cancelled", blocked)
            if self.remaining() <= 0:
                if self.policy.force_delete:
                    return self.force(ns, name, uid, blocked)
                self.count("stuck")
                return PodOutcome(ns, name, "timeout",
                                  "still terminating at the drain deadline (force_delete is off)",
                                  blocked)
            self.pause(self.policy.poll_s)

    def force(self, ns: str, name: str, uid: str, blocked: int) -> PodOutcome:
        try:
            self.kube.delete_pod(ns, name, grace_period_s=0, uid=uid)
        except KubeError as err:
            if err.status in (404, 409):  # gone, or the name now belongs to a new pod
                return PodOutcome(ns, name, "evicted", "", blocked)
            self.count("failed")
            return PodOutcome(ns, name, "failed", f"force delete failed: {err}", blocked)
        self.count("force_deleted")
        log.warning("pod %s/%s force-deleted after the drain deadline (drain.force_delete)",
                    ns, name)
        return PodOutcome(ns, name, "force_deleted", "stuck terminating past the deadline",
                          blocked)


def drain_node(kube: Any, node: str, policy: DrainPolicy, clock: Clock | None = None, *,
               remaining_s: float | None = None, cancel: threading.Event | None = None,
               on_outcome: Callable[[str], None] | None = None,
               pods: Sequence[Mapping[str, Any]] | None = None) -> DrainReport:
    """Drain ``node``. ``remaining_s``: what is left of the global deadline (a resumed drain);
    ``on_outcome(result)``: called per eviction result for metrics (evicted, gone, blocked,
    failed, timeout, stuck, force_deleted)."""
    clock = clock or Clock()
    cancel = cancel or threading.Event()
    start = clock.monotonic()
    budget = policy.timeout_s if remaining_s is None else max(0.0, remaining_s)
    run = _Run(kube, policy, clock, start + budget, cancel, on_outcome)
    listed = list(pods) if pods is not None else kube.list_pods_on_node(node)
    evict, skipped = select_pods(listed, policy)
    for s in skipped:
        log.info("drain %s: skipping %s: %s", node, s.ref, s.detail)
    outcomes: list[PodOutcome] = list(skipped)
    if evict:
        workers = max(1, min(policy.parallelism, len(evict)))
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="evict") as pool:
            outcomes += list(pool.map(run.evict, evict))
    return DrainReport(tuple(outcomes), clock.monotonic() - start, cancel.is_set())
