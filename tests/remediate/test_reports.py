"""Health reports about this node (GPUHealthReport objects, dropped files) and about others."""

from __future__ import annotations

import json
import threading
from datetime import datetime, timedelta, timezone

import pytest

from gpu_monitor.clock import FakeClock
from gpu_monitor.model import Action, Status
from gpu_monitor.remediate.reports import (
    GROUP,
    PLURAL,
    VERSION,
    ReportError,
    ReportSource,
    parse_report_file,
    report_object,
)
from gpu_monitor.state import Store
from tests.kube.client_helpers import kube_for
from tests.remediate.remediate_helpers import (
    NODE,
    FakeApiServer,
    Resets,
    our_conditions,
    remediator,
    writes_to,
)
from tests.waiting import eventually

OTHER = "gpu-node-2"
NS = "gpu-monitor"
T0 = datetime(2026, 5, 1, 12, 0, tzinfo=timezone.utc)


@pytest.fixture
def fake(cluster):
    return cluster(NODE, OTHER)


def create(fake, node, reason="SdcAlarm", labelled=None, at=None):
    kube = kube_for(fake)
    body = report_object(node, reason, "sdc-library", {"step": 1200, "ranks": [3]},
                         at or datetime.now(timezone.utc), NS)
    if labelled is not None:
        body["metadata"]["labels"]["gpu-monitor.io/node"] = labelled
    return kube.create_custom(GROUP, VERSION, NS, PLURAL, body)


def test_a_report_for_this_node_quarantines_it_and_one_for_another_node_is_ignored(
        fake, tmp_path):
    create(fake, NODE)
    create(fake, OTHER)
    create(fake, OTHER, labelled=NODE)  # mislabelled: spec.node decides
    resets = Resets()
    r = remediator(fake, tmp_path, resets=resets, retest=None)
    r.tick()
    node = fake.node(NODE)
    cond = our_conditions(node)["GPUHealthReported"]
    assert (cond["status"], cond["reason"]) == ("True", "SdcAlarm")
    assert node["spec"]["unschedulable"] is True  # SdcAlarm: quarantine, reset, retest
    assert resets.calls == [None]  # a node-wide report: every GPU
    assert r.store.health_report_counts() == {"SdcAlarm": 1}
    assert r.reports.ignored == 1
    assert writes_to(fake, f"/api/v1/nodes/{OTHER}") == []  # never a write to the other node
    assert writes_to(fake, f"/api/v1/nodes/{OTHER}/status") == []
    lst = [q for q in fake.requests if q.path.endswith("/gpuhealthreports")
           and q.method == "GET"][0]
    assert lst.params["labelSelector"] == f"gpu-monitor.io/node={NODE}"


def test_each_report_acts_once_across_restarts(fake, tmp_path):
    create(fake, NODE)
    store = Store.open(":memory:")
    src = ReportSource(NODE, store, FakeClock(datetime.now(timezone.utc)), kube=kube_for(fake),
                       namespace=NS)
    assert len(src.poll()) == 1
    again = ReportSource(NODE, store, FakeClock(datetime.now(timezone.utc)), kube=kube_for(fake),
                         namespace=NS)
    assert again.poll() == []
    create(fake, NODE, reason="FabricProbeFailed")
    got = again.poll()
    assert [(x.reason, x.action) for x in got] == [("FabricProbeFailed", Action.RESET_GPU)]


def test_an_old_report_is_recorded_but_not_acted_on(fake):
    create(fake, NODE, at=datetime.now(timezone.utc) - timedelta(days=3))
    store = Store.open(":memory:")
    src = ReportSource(NODE, store, FakeClock(datetime.now(timezone.utc)), kube=kube_for(fake),
                       namespace=NS)
    assert src.poll() == [] and store.health_report_counts() == {"SdcAlarm": 1}


def test_a_missing_crd_is_not_an_error(fake):
    kube = kube_for(fake)
    src = ReportSource(NODE, Store.open(":memory:"), FakeClock(T0), kube=kube,
                       namespace="no-such-namespace")
    fake.inject("GET", r"/apis/gpu-monitor\.io/.*", 404, times=1)
    assert src.poll() == []


# --- dropped files ----------------------------------------------------------------------------------


def sdc_report(nodes, now="2026-05-01T12:00:00.000000Z"):
    from gpu_monitor.sdc.report import build_report

    alarm = {"step": 1200, "check": "audit", "culprits": [0], "nonfinite": [],
             "verdicts": [], "suspects": None}
    rank_map = [{"rank": 0, "node": nodes[0], "gpu_uuid": "GPU-aaaa"}] + [
        {"rank": i, "node": n, "gpu_uuid": None} for i, n in enumerate(nodes[1:], 1)]
    report = build_report(alarm, rank_map, job="train-7", now=now)
    report["nodes"] = sorted(set(nodes))
    return report


FILES = [
    # (id, document, reports for NODE)
    ("the sdc library's report naming this node", sdc_report([NODE]), ["SdcAlarm"]),
    ("an sdc report naming only others", sdc_report([OTHER]), []),
    ("an sdc report naming both", sdc_report([OTHER, NODE]), ["SdcAlarm"]),
    ("a bare spec", {"node": NODE, "reason": "NvlinkProbeFailed", "source": "fabric-prober",
                     "observedTime": "2026-05-01T12:00:00Z", "evidence": {"link": 4}},
     ["NvlinkProbeFailed"]),
    ("a whole GPUHealthReport", report_object(NODE, "SdcAlarm", "x", {}, T0, NS), ["SdcAlarm"]),
    ("a reason that is not a token is made one", {"node": NODE, "reason": "sdc alarm!"},
     ["SdcAlarm"]),
]


@pytest.mark.parametrize("doc,want", [c[1:] for c in FILES], ids=[c[0] for c in FILES])
def test_report_files(doc, want):
    got = parse_report_file(json.dumps(doc), NODE, "r.json", T0)
    assert [x.reason for x in got] == want
    for x in got:
        res = x.result()
        assert res.status is Status.FAILED and res.check == "health_report"


BAD = [
    ("not JSON", "{"),
    ("not an object", "[1]"),
    ("no node", json.dumps({"reason": "SdcAlarm"})),
    ("bad time", json.dumps({"node": NODE, "observedTime": "yesterday"})),
]


@pytest.mark.parametrize("text", [c[1] for c in BAD], ids=[c[0] for c in BAD])
def test_malformed_report_files_raise_a_report_error(text):
    with pytest.raises(ReportError):
        parse_report_file(text, NODE, "r.json", T0)


def test_drop_directory_feeds_the_policy_and_skips_junk(fake, tmp_path):
    from gpu_monitor.model import iso

    drop = tmp_path / "reports"
    drop.mkdir()
    (drop / "sdc-1.json").write_text(json.dumps(sdc_report([NODE], iso(datetime.now(
        timezone.utc)))))
    (drop / "junk.json").write_text("{")
    (drop / ".sdc-tmp.json").write_text(json.dumps(sdc_report([NODE])))  # in-flight write
    (drop / "notes.txt").write_text("hello")
    r = remediator(fake, tmp_path / "r", resets=Resets(), retest=None, report_dir=str(drop))
    r.tick()
    assert r.store.health_report_counts() == {"SdcAlarm": 1}
    assert fake.node(NODE)["spec"]["unschedulable"] is True
    r.tick()
    assert r.store.health_report_counts() == {"SdcAlarm": 1}


# --- a missing CRD ----------------------------------------------------------------------------------


def until(predicate, timeout: float = 30.0):
    """Wait (real time, generous) for a condition another thread brings about."""
    eventually(predicate, timeout, interval=0.01)


def test_a_missing_crd_warns_once_backs_off_and_recovers_when_it_appears(tmp_path, caplog):
    import logging

    from gpu_monitor.remediate.reports import CRD_RETRY_MAX_S

    server = FakeApiServer(api_groups=()).start()  # no gpu-monitor.io group: the CRD is absent
    server.add_node(NODE, gpus=8)
    server.add_namespace(NS)
    clock = FakeClock(T0)
    src = ReportSource(NODE, Store.open(":memory:"), clock, kube=kube_for(server, clock),
                       namespace=NS)
    lists = f"/apis/{GROUP}/{VERSION}/namespaces/{NS}/{PLURAL}"
    got = []
    caplog.set_level(logging.INFO, logger="gpu_monitor.remediate")
    start = clock.monotonic()
    src.start_watch(got.extend)
    try:
        until(lambda: clock.monotonic() - start >= 3600)  # an hour on the injected clock
        tries = [q for q in server.requests if q.path == lists]
        elapsed = clock.monotonic() - start  # read after counting: the thread goes on
        assert all(q.status == 404 for q in tries) and len(tries) >= 3
        # between tries: 5 s doubling to 10 min, -20 % jitter at most
        waited = sum(min(CRD_RETRY_MAX_S, 5.0 * 2 ** k) * 0.8 for k in range(len(tries) - 1))
        assert waited <= elapsed
        warned = [x for x in caplog.records if "CRD is not served" in x.getMessage()]
        assert len(warned) == 1 and warned[0].levelno == logging.WARNING
        assert src.crd_missing

        server.register_resource(server.resource(GROUP, PLURAL))  # the CRD is installed
        until(lambda: any(q.params.get("watch") == "true" for q in server.requests
                          if q.path == lists))
        assert not src.crd_missing
        assert any("CRD is served now" in x.getMessage() for x in caplog.records)
        kube_for(server).create_custom(GROUP, VERSION, NS, PLURAL, report_object(
            NODE, "SdcAlarm", "sdc-library", {}, clock.now(), NS))
        until(lambda: got)
        assert [x.reason for x in got] == ["SdcAlarm"]
        assert len([x for x in caplog.records if "CRD is not served" in x.getMessage()]) == 1
    finally:
        src.stop()
        server.stop()


def test_watch_of_reports_runs_in_its_own_thread(cluster, tmp_path):
    fake = cluster(NODE, breaker=False)
    got = threading.Event()
    fake.add_namespace("gpu-monitor")
    r = remediator(fake, tmp_path)
    src = r.reports
    results = []

    def deliver(batch):
        results.extend(batch)
        got.set()

    src.start_watch(deliver)
    try:
        kube = kube_for(fake)
        kube.create_custom("gpu-monitor.io", "v1alpha1", "gpu-monitor", "gpuhealthreports",
                           report_object(NODE, "SdcAlarm", "sdc-library", {"step": 7},
                                         r.clock.now(), "gpu-monitor"))
        assert got.wait(10)
    finally:
        src.stop()
    assert [(x.check, x.reason) for x in results] == [("health_report", "SdcAlarm")]
