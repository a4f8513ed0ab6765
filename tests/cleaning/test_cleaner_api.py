"""The check between workloads on the wire: the real Cleaner, the real kubernetes client, the
fake apiserver with its kubelet, and a stand-in kube-scheduler that binds by priority
(tests/cleaning/kube_scheduler.py). Workloads arrive while the suite runs."""

from __future__ import annotations

import threading
from collections.abc import Callable

from gpu_monitor.cleaning import plan
from gpu_monitor.cleaning.hold import hold_name
from gpu_monitor.cleaning.loop import Cleaner
from gpu_monitor.model import Verdict
from tests.cleaning.conftest import NODE
from tests.kube.fake_apiserver import FakeApiServer
from tests.waiting import eventually


def wait_for(cond: Callable[[], object], what: str) -> None:
    eventually(cond, timeout=60.0, what=what)


def workload(kube, name: str, *, gpus: int = 8, priority: str = "training") -> None:
    kube.create_pod("team", {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "team"},
        "spec": {"priorityClassName": priority,
                 "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                     "nodeSelectorTerms": [{"matchExpressions": [
                         {"key": "kubernetes.io/hostname", "operator": "In",
                          "values": [NODE]}]}]}}},
                 "containers": [{"name": "train", "image": "train:1", "resources": {
                     "requests": {"nvidia.com/gpu": str(gpus)},
                     "limits": {"nvidia.com/gpu": str(gpus)}}}]}})


def node_of(fake: FakeApiServer, ns: str, name: str) -> str | None:
    pod = fake.pod(ns, name)
    return pod["spec"].get("nodeName") if pod else None


def running(fake: FakeApiServer, ns: str, name: str) -> bool:
    pod = fake.pod(ns, name)
    return bool(pod and (pod.get("status") or {}).get("phase") == "Running")


def finish(kube, name: str) -> None:
    kube.delete_pod("team", name)


class Suite:
    """The suite, handed in: it blocks until told the verdict, and records what it saw."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.release = threading.Event()
        self.verdict = Verdict.HEALTHY
        self.runs = 0
        self.held_throughout: list[bool] = []

    def __call__(self, budget_s: float, still_held: Callable[[], bool]) -> Verdict:
        self.runs += 1
        self.started.set()
        held = [still_held()]
        while not self.release.wait(0.02):
            pass
        held.append(still_held())
        self.held_throughout.append(all(held))
        self.release.clear()
        self.started.clear()
        return self.verdict


def tick_through_a_run(c: Cleaner, suite: Suite) -> None:
    """One tick that runs the suite, let through once it has started."""
    t = threading.Thread(target=c.tick)
    t.start()
    assert suite.started.wait(60)
    suite.release.set()
    t.join(60)
    assert not t.is_alive()


def cleaner(kube, store, suite: Suite, *, quarantined: Callable[[], bool] = lambda: False,
            retry_after_s: float = 900.0) -> Cleaner:
    return Cleaner(lambda: kube, NODE, store, run_suite=suite, quarantined=quarantined,
                   retry_after_s=retry_after_s)


def test_the_hold_binds_first_and_workloads_arriving_during_the_suite_wait(
        fake_api, kube, node, scheduler, store) -> None:
    suite = Suite()
    c = cleaner(kube, store, suite)
    workload(kube, "train-0")
    wait_for(lambda: running(fake_api, "team", "train-0"), "the first workload running")
    # In use: the hold is created behind it and waits.
    assert c.tick().state == plan.STATE_IN_USE
    assert node_of(fake_api, "gpu-monitor", hold_name(NODE)) is None
    # The next workload is already pending when the first one ends.
    workload(kube, "train-1")
    finish(kube, "train-0")
    wait_for(lambda: fake_api.pod("team", "train-0") is None, "the first workload gone")
    wait_for(lambda: running(fake_api, "gpu-monitor", hold_name(NODE)), "the hold running")
    assert node_of(fake_api, "team", "train-1") is None, "a workload beat the hold"

    result: list[plan.Step | None] = []
    t = threading.Thread(target=lambda: result.append(c.tick()))
    t.start()
    assert suite.started.wait(60)
    # Pods arrive while the suite runs: one of the same priority, one small, one higher.
    workload(kube, "train-2")
    workload(kube, "small", gpus=1)
    workload(kube, "urgent", priority="training")
    scheduler.schedule_once()
    for name in ("train-1", "train-2", "small", "urgent"):
        assert node_of(fake_api, "team", name) is None, f"{name} bound during the suite"
    suite.release.set()
    t.join(60)
    assert result[0] is not None and result[0].state == plan.STATE_CLEAN
    assert suite.held_throughout == [True]
    # Released: the hold is gone and the waiting workload gets the node.
    wait_for(lambda: fake_api.pod("gpu-monitor", hold_name(NODE)) is None, "the hold deleted")
    wait_for(lambda: node_of(fake_api, "team", "train-1") == NODE, "train-1 bound")
    assert c.memory().dirty is False and c.counts.released == 1
    # Busy again: dirty, and a new hold waits behind it.
    wait_for(lambda: running(fake_api, "team", "train-1"), "train-1 running")
    assert c.tick().state == plan.STATE_IN_USE
    assert fake_api.pod("gpu-monitor", hold_name(NODE)) is not None
    assert c.memory().dirty is True


def test_a_workload_that_binds_before_the_hold_exists_is_counted_missed(
        fake_api, kube, node, scheduler, store) -> None:
    # The race that remains: the node frees while no hold is queued (here: the daemon was
    # down while train-0 ran and ended), and a pending workload takes it first.
    suite = Suite()
    c = cleaner(kube, store, suite)
    scheduler.paused.set()
    c.tick()  # idle and dirty (a fresh node): the hold is created...
    kube.delete_pod("gpu-monitor", hold_name(NODE))  # ...and lost, say, to a person
    wait_for(lambda: fake_api.pod("gpu-monitor", hold_name(NODE)) is None, "hold gone")
    workload(kube, "train-9")
    scheduler.paused.clear()
    wait_for(lambda: running(fake_api, "team", "train-9"), "train-9 running")
    step = c.tick()
    assert (step.state, step.missed_now, c.memory().missed) == (plan.STATE_IN_USE, 1, 1)
    assert suite.runs == 0  # never beside the workload


def test_a_fail_keeps_the_node_held_until_quarantine_and_the_memory_survives_a_restart(
        fake_api, kube, node, scheduler, store) -> None:
    suite = Suite()
    suite.verdict = Verdict.UNHEALTHY
    quarantined = threading.Event()
    c = cleaner(kube, store, suite, quarantined=quarantined.is_set)
    c.tick()  # a fresh node is dirty: hold
    wait_for(lambda: running(fake_api, "gpu-monitor", hold_name(NODE)), "the hold running")
    workload(kube, "train-0")
    tick_through_a_run(c, suite)
    assert c.counts.state == plan.STATE_FAILED
    # A restarted daemon remembers: no rerun, still held, the workload still waits.
    c2 = cleaner(kube, store, suite, quarantined=quarantined.is_set)
    assert c2.tick().state == plan.STATE_FAILED and suite.runs == 1
    assert node_of(fake_api, "team", "train-0") is None
    # Quarantine takes over (its own taint and drain hold the node): the hold is given back.
    quarantined.set()
    assert c2.tick().actions == (plan.DeleteHold(plan.QUARANTINED),)
    wait_for(lambda: fake_api.pod("gpu-monitor", hold_name(NODE)) is None, "hold gone")


def test_an_unknown_suite_is_no_pass_the_node_stays_held_and_it_is_retried(
        fake_api, kube, node, scheduler, store) -> None:
    suite = Suite()
    suite.verdict = Verdict.UNKNOWN
    c = cleaner(kube, store, suite, retry_after_s=0.0)
    c.tick()
    wait_for(lambda: running(fake_api, "gpu-monitor", hold_name(NODE)), "the hold running")
    for attempt in (1, 2):
        tick_through_a_run(c, suite)
        assert (c.counts.state, c.memory().attempts) == (plan.STATE_RETRYING, attempt)
        assert running(fake_api, "gpu-monitor", hold_name(NODE))
    suite.verdict = Verdict.HEALTHY
    tick_through_a_run(c, suite)
    assert c.counts.state == plan.STATE_CLEAN
    wait_for(lambda: fake_api.pod("gpu-monitor", hold_name(NODE)) is None, "the hold deleted")


def test_a_crashing_suite_is_unknown_and_never_takes_the_loop_down(
        fake_api, kube, node, scheduler, store) -> None:
    def boom(budget_s: float, still_held: Callable[[], bool]) -> Verdict:
        raise RuntimeError("worker exploded")

    c = Cleaner(lambda: kube, NODE, store, run_suite=boom, quarantined=lambda: False)
    c.tick()
    wait_for(lambda: running(fake_api, "gpu-monitor", hold_name(NODE)), "the hold running")
    step = c.tick()
    assert step is not None and step.state == plan.STATE_RETRYING
    assert "worker exploded" in c.counts.last_error
    assert running(fake_api, "gpu-monitor", hold_name(NODE))


def test_a_failed_node_no_quarantine_takes_goes_back_to_work_and_is_cleaned_after_it(
        fake_api, kube, node, scheduler, store) -> None:
    """Remediation off, in dry-run or behind a tripped breaker: the cleaner does not keep the
    node out of service on its own; the waiting workload gets it, and its end is cleaned."""
    suite = Suite()
    suite.verdict = Verdict.UNHEALTHY
    c = cleaner(kube, store, suite, retry_after_s=0.0)
    c.tick()
    wait_for(lambda: running(fake_api, "gpu-monitor", hold_name(NODE)), "the hold running")
    workload(kube, "train-0")
    tick_through_a_run(c, suite)
    assert c.counts.state == plan.STATE_FAILED
    assert c.tick().actions == (plan.DeleteHold(plan.GIVEN_BACK),)
    assert (c.counts.state, c.memory().given_back, c.memory().dirty) == (
        plan.STATE_UNCLEAN, 1, True)
    wait_for(lambda: running(fake_api, "team", "train-0"), "train-0 gets the node")
    assert c.tick().state == plan.STATE_IN_USE  # and the hold queues behind it again
    wait_for(lambda: fake_api.pod("gpu-monitor", hold_name(NODE)) is not None, "a new hold")
    finish(kube, "train-0")
    wait_for(lambda: running(fake_api, "gpu-monitor", hold_name(NODE)), "the hold running")
    suite.verdict = Verdict.HEALTHY
    tick_through_a_run(c, suite)
    assert c.counts.state == plan.STATE_CLEAN and suite.runs == 2
