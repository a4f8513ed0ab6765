"""The remediator's lifecycle over SlurmDelivery with a real slurmctld: the same state
machine as on Kubernetes, its quarantine mirrored in the node's Slurm reason."""

from __future__ import annotations

from gpu_monitor.clock import Clock
from gpu_monitor.config import parse_config
from gpu_monitor.host_actuator import HostActuator
from gpu_monitor.model import Action, Result, RunOutcome, Status
from gpu_monitor.remediate.remediator import Remediator
from gpu_monitor.remediate.settings import Timing
from gpu_monitor.remediate.slurm.delivery import SlurmDelivery
from gpu_monitor.remediate.slurm.reason import parse_reason
from gpu_monitor.state import Store
from tests.slurm.cluster import EXTRA, PARTITION
from tests.waiting import eventually


def config():
    return parse_config({
        "daemon": {"backend": "slurm"},
        "checks": {"xid": {"remediation": {"Xid79": "drain"}}},
        "remediation": {"enabled": True, "dry_run": False, "hysteresis_polls": 1,
                        "hysteresis_s": 0,
                        "drain": {"timeout_s": 30},
                        "slurm": {"partitions": [PARTITION], "gres": None,
                                  "command_timeout_s": 5}},
    }, env={"NODE_NAME": "test"})


def xid79(status: Status = Status.FAILED) -> Result:
    if status is Status.OK:
        return Result(check="xid", status=status, target="gpu:3")
    return Result(check="xid", status=status, target="gpu:3", reason="Xid79",
                  message="Xid 79 on GPU 3", action=Action.REBOOT)


def observe(store: Store, rem: Remediator, result: Result) -> None:
    """What the daemon does with a check's run: store it, then hand it to the remediator."""
    store.record_run(RunOutcome("xid", (result,), result.observed_at, 0.01, True))
    rem.on_results([result])


def build(node: str, store: Store) -> Remediator:
    cfg = config()
    clock = Clock()
    delivery = SlurmDelivery.from_config(cfg, node, clock, store=store)
    return Remediator.from_config(store, cfg, node, delivery, HostActuator(), clock=clock,
                                  timing=Timing(breaker_retry_s=0.5))


def actions(store: Store) -> list[tuple[str, str]]:
    return [(a.action, a.result) for a in store.actions()]


def our_reason(slurm, node: str):
    rec = SlurmDelivery(node).tools.show_node(node)
    return parse_reason(rec.reason) if rec.drained else None


def test_a_failing_node_is_drained_with_its_reason_and_resumed_once_clean(slurm):
    node = EXTRA[6]
    store = Store.open(":memory:", Clock())
    rem = build(node, store)
    observe(store, rem, xid79())
    rem.tick()
    assert rem.last_error is None, rem.last_error
    ours = our_reason(slurm, node)
    assert ours is not None and ours.token == "Xid79" and ours.state == "quarantined"
    assert ours.detail == ("xid", "gpu:3")  # the check and target of the finding
    assert store.node_state().state == "quarantined"
    assert [a for a in actions(store) if a[0] in ("cordon", "quarantine")] == [
        ("cordon", "ok"), ("quarantine", "ok")]  # the claim's drain is the quarantine's cordon
    observe(store, rem, xid79(Status.OK))
    eventually(lambda: (rem.tick(), store.node_state().state == "healthy")[1], timeout=60,
               what="released once clean")
    assert our_reason(slurm, node) is None
    assert not SlurmDelivery(node).tools.show_node(node).drained


def test_slurmctld_down_the_step_is_retried_and_the_drain_happens_once_it_is_back(slurm):
    node = EXTRA[7]
    store = Store.open(":memory:", Clock())
    rem = build(node, store)
    rem.tick()  # the first read, while slurmctld is up
    slurm.stop_ctld()
    try:
        observe(store, rem, xid79())
        rem.tick()  # the claim cannot reach slurmctld: denied for now, nothing lost
        assert store.node_state().state == "suspect"
        assert rem.decision().quarantine  # the finding is still there
    finally:
        slurm.start_ctld()
    eventually(lambda: (rem.tick(), store.node_state().state == "quarantined")[1],
               timeout=120, what="quarantined once slurmctld is back")
    assert our_reason(slurm, node).state == "quarantined"
