"""SlurmDelivery and its breaker against a real slurmctld and slurmd (conftest.py)."""

from __future__ import annotations

import re
import threading
from datetime import datetime, timezone

import pytest

from gpu_monitor.remediate.slurm.breaker import SlurmBreaker, SlurmBreakerSettings, our_drains
from gpu_monitor.remediate.slurm.delivery import SlurmDelivery, SlurmSettings
from gpu_monitor.remediate.slurm.reason import MAX_LEN, format_reason, parse_reason
from gpu_monitor.remediate.slurm.tools import SlurmError, SlurmTools
from tests.slurm.cluster import EXTRA, JOBS, PARTITION, REAL
from tests.waiting import eventually

NOW = datetime(2026, 12, 2, tzinfo=timezone.utc)


def delivery(node: str, **kw) -> SlurmDelivery:
    settings = SlurmSettings(partitions=(PARTITION,), gres=None, command_timeout_s=20.0, **kw)
    return SlurmDelivery(node, settings)


def reason_of(slurm, node: str) -> str:
    m = re.search(r" Reason=(.*) \[[^\]]+\]$", slurm.node_line(node).rstrip("\n"))
    return m.group(1) if m else ""


def test_slurmctld_keeps_our_longest_reason_verbatim(slurm):
    """The length slurmctld accepts, found by experiment: 22.05 keeps 100 000 characters
    verbatim, so MAX_LEN (ours, for the people reading sinfo -R) is never cut by Slurm."""
    tools = SlurmTools(20.0)
    longest = format_reason("Xid79", "reboot-required",
                            ("xid", *(f"gpu:{i}" for i in range(64))), "2026-12-02T15:00:39")
    assert len(longest) <= MAX_LEN and "+" in longest  # targets shortened, tail kept
    tools.drain(EXTRA[0], longest)
    assert tools.show_node(EXTRA[0]).reason == longest
    assert parse_reason(longest).state == "reboot-required"
    huge = "x" * 100_000
    tools.drain(EXTRA[1], huge)
    assert tools.show_node(EXTRA[1]).reason == huge


def test_quarantine_drains_with_our_reason_and_release_resumes(slurm):
    node = EXTRA[2]
    d = delivery(node)
    out = d.quarantine("Xid79", "quarantined", NOW)
    assert out.cordoned and not out.cordon_pre_existing
    rec = d.tools.show_node(node)
    assert rec.drained
    ours = parse_reason(rec.reason)
    assert ours is not None and ours.token == "Xid79" and ours.state == "quarantined"
    assert ours.since  # the first drain's Slurm time, kept across rewrites
    d.mirror_state("retesting")
    again = parse_reason(d.tools.show_node(node).reason)
    assert again.state == "retesting" and again.since == ours.since
    assert d.read().state == "retesting"
    # the retest passed: released. This node never registered: RESUME exits 1, yet clears
    assert d.release(NOW) is True
    rec = d.tools.show_node(node)
    assert not rec.drained and rec.reason == ""


def test_an_administrators_drain_is_never_undone(slurm):
    node = EXTRA[3]
    slurm.run("scontrol", "update", f"NodeName={node}", "State=DRAIN",
              "Reason=admin: fan replacement", check=True)
    d = delivery(node)
    out = d.quarantine("Xid79", "quarantined", NOW)
    assert out.cordon_pre_existing and not out.cordoned
    assert reason_of(slurm, node) == "admin: fan replacement"
    assert d.release(NOW) is False
    assert d.tools.show_node(node).drained
    assert reason_of(slurm, node) == "admin: fan replacement"
    assert not d.breaker.claim(node, "Xid79").status.slots  # theirs holds no slot of ours


def test_an_administrators_resume_of_our_drain_is_respected(slurm):
    node = EXTRA[4]
    d = delivery(node)
    d.quarantine("RowRemapFailure", "quarantined", NOW)
    slurm.run("scontrol", "update", f"NodeName={node}", "State=RESUME")  # rc 1: unregistered
    assert not d.tools.show_node(node).drained
    assert d.read().returned_by_human
    out = d.quarantine("RowRemapFailure", "quarantined", NOW)
    assert out.human_uncordoned and not out.cordoned
    assert not d.tools.show_node(node).drained  # not drained again
    assert d.release(NOW) is False


def _running_job(slurm, *options: str) -> str:
    """A real ``sleep 300`` batch job on the real slurmd, once squeue says it runs."""
    job = slurm.run("sbatch", "--parsable", *options, "-p", JOBS, "-w", REAL,
                    f"--output={slurm.dir}/job-%j.out", "--wrap", "sleep 300", check=True
                    ).stdout.strip().split(";")[0]
    eventually(lambda: slurm.run("squeue", "-h", "-j", job, "-o", "%T").stdout.strip()
               == "RUNNING", timeout=90, what=f"job {job} running on {REAL}")
    return job


def test_requeue_policy_requeues_a_real_job(slurm):
    job = _running_job(slurm, "--requeue")
    d = SlurmDelivery(REAL, SlurmSettings(partitions=(JOBS,), gres=None, command_timeout_s=20.0,
                                          requeue_on=("Xid79",), drain_poll_s=0.5))
    d.quarantine("Xid79", "quarantined", NOW)
    outcomes: list[str] = []
    report = d.drain(120.0, threading.Event(), outcomes.append)
    assert report.ok, report.summary()
    assert report.requeued == (job,) and outcomes == ["requeued"]
    assert d.tools.jobs_on(REAL) == []
    restarts = slurm.run("scontrol", "show", "job", job, "-o", check=True).stdout
    assert re.search(r"\bRestarts=1\b", restarts), restarts
    assert d.release(NOW) is True


def test_without_the_policy_drain_lets_jobs_finish(slurm):
    job = _running_job(slurm)
    d = SlurmDelivery(REAL, SlurmSettings(partitions=(JOBS,), gres=None, command_timeout_s=20.0,
                                          requeue_on=("Xid79",), drain_poll_s=0.2))
    d.quarantine("RowRemapFailure", "quarantined", NOW)
    report = d.drain(1.0, threading.Event(), lambda _r: None)
    assert not report.ok and report.left == (job,) and report.requeued == ()
    assert d.tools.jobs_on(REAL) == [job]  # still running: DRAIN lets it finish


def test_breaker_with_20_nodes_failing_at_once_keeps_at_most_2(slurm):
    settings = SlurmBreakerSettings(budget_fraction=0.10, max_nodes=20,
                                    partitions=(PARTITION,), gres=None)
    claims = {}
    start = threading.Barrier(len(EXTRA))

    def claim(node: str) -> None:
        breaker = SlurmBreaker(SlurmTools(60.0), settings)
        start.wait()
        claims[node] = breaker.claim(node, "Xid79")

    threads = [threading.Thread(target=claim, args=(n,)) for n in EXTRA]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert len(claims) == 20
    assert not [c for c in claims.values() if c.why == "error"], claims
    granted = sorted(n for n, c in claims.items() if c.granted)
    held = our_drains(SlurmTools(20.0).show_nodes(), (PARTITION,))
    assert sorted(n for _t, n, _tok in held) == granted  # every kept drain was granted
    assert 1 <= len(granted) <= 2, (granted, held)
    assert all(c.status.budget == 2 for c in claims.values())
    denied = [c for c in claims.values() if not c.granted]
    assert all(c.why == "full" for c in denied)


def test_slurmctld_down_is_an_error_and_the_drain_happens_once_it_is_back(slurm):
    node = EXTRA[5]
    d = SlurmDelivery(node, SlurmSettings(partitions=(PARTITION,), gres=None,
                                          command_timeout_s=5.0))
    slurm.stop_ctld()
    try:
        with pytest.raises(SlurmError):
            d.quarantine("Xid79", "quarantined", NOW)
        assert d.breaker.claim(node, "Xid79").why == "error"
    finally:
        slurm.start_ctld()
    eventually(lambda: d.breaker.claim(node, "Xid79").granted, timeout=120,
               what="claim granted after slurmctld came back")
    assert d.quarantine("Xid79", "quarantined", NOW).tainted
    assert parse_reason(d.tools.show_node(node).reason).state == "quarantined"


def test_a_claim_cut_off_after_its_drain_is_decided_by_the_next_claim(slurm):
    """The node drained with state:claim and nothing else (slurmctld went away before the
    re-read): with the budget already full, the next claim gives the drain back."""
    settings = SlurmBreakerSettings(partitions=(PARTITION,), gres=None)
    tools = SlurmTools(20.0)
    for holder in EXTRA[10:12]:  # the budget of 2, held
        tools.drain(holder, format_reason("Xid48", "quarantined", (), "2026-01-01T00:00:00"))
    node = EXTRA[12]
    tools.drain(node, format_reason("Xid79", "claim"))
    claim = SlurmBreaker(tools, settings).claim(node, "Xid79")
    assert not claim.granted and claim.why == "full"
    assert not tools.show_node(node).drained
    assert sorted(claim.status.slots) == list(EXTRA[10:12])
