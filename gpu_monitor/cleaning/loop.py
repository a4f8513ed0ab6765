"""The cleaner's loop: read the node, decide (plan.step), keep the memory, act.

One ``tick`` is one pass; the daemon calls it on an interval from its own thread. The memory
is written to the store before the actions it leads to, so a daemon killed anywhere resumes:
the hold has one fixed name per node (a repeated create is a 409, a repeated delete a 404),
and a suite cut off by the kill simply runs again.

The suite is handed in (``run_suite(budget_s, still_held) -> Verdict``): the daemon runs its
bootstrap checks with the invasive-check guard; ``still_held`` re-reads the hold so the suite
can stop between checks the moment the hold is gone (deleted by a person, evicted by the node's
lifecycle): its GPUs may then be a workload's, and an unfinished suite is ``unknown``, never a
pass.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from gpu_monitor.cleaning import plan
from gpu_monitor.cleaning.hold import HoldSpec, build_hold_pod, hold_name, node_view
from gpu_monitor.clock import Clock
from gpu_monitor.fabric.pods import node_gpus
from gpu_monitor.kube.errors import KubeError
from gpu_monitor.model import Verdict

log = logging.getLogger(__name__)

KV_NAMESPACE = "cleaning"
KV_KEY = "memory"


class Memories(Protocol):
    def get_kv(self, namespace: str, key: str, default: Any = None) -> Any: ...
    def set_kv(self, namespace: str, key: str, value: Any) -> None: ...


@dataclass
class Counts:
    """What the metrics export (gpu_monitor_cleaning_*)."""

    state: str = plan.STATE_OFF
    runs: dict[str, int] = field(default_factory=dict)      # verdict -> suite runs
    released: int = 0
    errors: int = 0
    last_error: str = ""


class Cleaner:
    def __init__(self, kube: Callable[[], Any], node: str, store: Memories, *,
                 run_suite: Callable[[float, Callable[[], bool]], Verdict],
                 quarantined: Callable[[], bool],
                 provisioning: Callable[[], tuple[bool, datetime | None]] = lambda: (False, None),
                 spec: HoldSpec | None = None,
                 budget_s: float = 1800.0, retry_after_s: float = 900.0,
                 max_attempts: int = 3,
                 clock: Clock | None = None) -> None:
        self.kube = kube  # the API client (gpu_monitor.kube.Kube), made on first use
        self.node = node
        self.store = store
        self.run_suite = run_suite
        self.quarantined = quarantined
        self.provisioning = provisioning  # (the bootstrap gate is still closed, when it passed)
        self.spec = spec or HoldSpec()
        self.budget_s = budget_s
        self.retry_after_s = retry_after_s
        self.max_attempts = max_attempts
        self.clock = clock or Clock()
        self.counts = Counts()
        self._failing = ""  # the error the passes fail with now ("" when they do not)

    # --- memory ------------------------------------------------------------------------------

    def memory(self) -> plan.Memory:
        """The stored memory; a fresh one (dirty: the safe side) when none is stored or the
        stored one cannot be read."""
        data = self.store.get_kv(KV_NAMESPACE, KV_KEY)
        if not isinstance(data, dict):
            return plan.Memory()
        try:
            return plan.Memory.from_json(data)
        except (TypeError, ValueError) as exc:
            log.warning("cleaning: the stored memory cannot be read (%s); starting dirty", exc)
            return plan.Memory()

    def _keep(self, mem: plan.Memory) -> None:
        self.store.set_kv(KV_NAMESPACE, KV_KEY, mem.to_json())

    @property
    def api(self) -> Any:
        return self.kube()

    # --- reading -----------------------------------------------------------------------------

    def _hold(self) -> dict | None:
        return self.api.get_pod(self.spec.namespace, hold_name(self.node))

    def view(self) -> plan.NodeView:
        pods = self.api.list_pods_on_node(self.node)
        closed, passed_at = self.provisioning()
        return node_view(self.node, pods, self._hold(), quarantined=self.quarantined(),
                         resource=self.spec.resource, provisioning=closed,
                         provisioned_at=passed_at)

    def still_held(self) -> bool:
        """The hold is bound here, running, not being deleted, and no workload shares the node."""
        try:
            v = self.view()
        except KubeError:
            return False
        h = v.hold
        return bool(h and h.bound and h.running and not h.deleting and not v.workloads)

    # --- one pass ----------------------------------------------------------------------------

    def tick(self) -> plan.Step | None:
        """One pass. An API error (or no API client to be had) is counted and logged; the
        memory is left as it was, and the next pass tries again. Never raises."""
        try:
            step = self._tick()
        except KubeError as err:
            self._error(str(err))
        except Exception as exc:  # noqa: BLE001 - the loop outlives any one pass
            self._error(f"{type(exc).__name__}: {exc}", exc)
        else:
            if self._failing:
                log.info("cleaning: the API answers again on %s", self.node)
                self._failing = ""
            return step
        return None

    def _error(self, text: str, exc: BaseException | None = None) -> None:
        """Count every failed pass; log an error when it is new (its traceback at debug), not
        every pass of a daemon that cannot reach its API server."""
        self.counts.errors += 1
        self.counts.last_error = text[:300]
        if text != self._failing:
            self._failing = text
            log.warning("cleaning: passes on %s fail: %s (logged once while it lasts; each "
                        "counted in gpu_monitor_cleaning_api_errors_total)", self.node, text)
            if exc is not None:
                log.debug("cleaning: the failed pass", exc_info=exc)

    def _tick(self) -> plan.Step:
        mem = self.memory()
        step = plan.step(self.view(), mem, self.clock.now())
        self._keep(step.memory)
        self.counts.state = step.state
        if step.missed_now:
            log.warning("cleaning: %d workload(s) started on %s before it was cleaned",
                        step.missed_now, self.node)
        for action in step.actions:
            if isinstance(action, plan.CreateHold):
                self._create_hold()
            elif isinstance(action, plan.DeleteHold):
                self._delete_hold(action.why)
            elif isinstance(action, plan.RunSuite):
                step = self._run(step.memory, action.attempt)
        return step

    def _create_hold(self) -> None:
        node = self.api.get_node(self.node)
        gpus = node_gpus(node, self.spec.resource)
        if gpus <= 0:
            log.info("cleaning: %s has no allocatable %s; no hold", self.node, self.spec.resource)
            return
        try:
            self.api.create_pod(self.spec.namespace, build_hold_pod(self.node, gpus, self.spec))
        except KubeError as err:
            if err.status != 409:  # already there: an earlier pass made it
                raise
        log.info("cleaning: hold for %d GPU(s) of %s created", gpus, self.node)

    def _delete_hold(self, why: str) -> None:
        pod = self._hold()
        if pod is None:
            return
        uid = (pod.get("metadata") or {}).get("uid")
        try:
            self.api.delete_pod(self.spec.namespace, hold_name(self.node), uid=uid)
        except KubeError as err:
            if err.status not in (404, 409):  # gone, or a new one with another UID: spared
                raise
        if why == plan.RELEASED:
            self.counts.released += 1
        log.info("cleaning: hold on %s deleted (%s)", self.node, why)

    def _run(self, mem: plan.Memory, attempt: int) -> plan.Step:
        if not self.still_held():
            # Between the read and now the hold went, or a workload appeared: not our GPUs.
            return plan.Step(plan.STATE_WAITING, (), mem)
        log.info("cleaning: running the suite on %s (attempt %d, budget %.0f s)",
                 self.node, attempt, self.budget_s)
        try:
            verdict = self.run_suite(self.budget_s, self.still_held)
        except Exception as exc:  # noqa: BLE001 - a crashed suite is no pass, and no daemon crash
            log.exception("cleaning: the suite crashed on %s", self.node)
            self.counts.last_error = f"suite: {type(exc).__name__}: {exc}"[:300]
            verdict = Verdict.UNKNOWN
        self.counts.runs[verdict.value] = self.counts.runs.get(verdict.value, 0) + 1
        done = plan.after_suite(mem, verdict, self.clock.now(), retry_after_s=self.retry_after_s,
                                max_attempts=self.max_attempts)
        self._keep(done.memory)  # the pass is recorded before the node is released
        self.counts.state = done.state
        for action in done.actions:
            if isinstance(action, plan.DeleteHold):
                self._delete_hold(action.why)
        return done
