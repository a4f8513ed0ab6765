"""The fail-fast notifier (gpu_monitor/failfast/notifier.py) on a real rdma_ports crossing:
who is told, once, what the notice says, dry-run, unknowns, signals and the counts."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from gpu_monitor.failfast.metrics import failfast_collector
from gpu_monitor.failfast.trigger import triggers_from
from gpu_monitor.model import Result, Status
from gpu_monitor.workloads.attribution import Snapshot
from tests.failfast.failfast_helpers import (
    PORT,
    Rig,
    crossing_result,
    new_rig,
    pods_snapshot,
    processes_snapshot,
)
from tests.waiting import eventually


def read_json(path: str) -> dict:
    with open(path) as fh:
        return json.load(fh)


def counts(rig: Rig) -> dict:
    return {k: v for k, v in rig.ff.book.counts().items() if v}


def test_the_crossing_result_is_a_trigger_keyed_by_port_and_outage_start(crossing):
    rig, res = crossing
    (t,) = triggers_from([res], on_xid=False)
    start = res.details["longest_outage_start"]
    assert [list(o) for o in res.details["outages_over_tolerance"]] == [[start, None]]
    assert t.key == f"{PORT}@{start:.6f}"
    assert (t.device, t.gpus, t.ended_at) == ("mlx5_0", None, None)
    assert t.crossed_at == pytest.approx(start + res.details["nccl_tolerance_s"])
    assert t.crossed_at <= rig.clock.now().timestamp()


def test_a_second_outage_notifies_on_its_own_crossing_while_a_longer_one_fails_the_port(
        tmp_path):
    """The window still holds a longer outage (the port keeps failing for it): the second
    outage's crossing is a trigger of its own, at its own instant."""
    rig = new_rig()
    try:
        crossing_result(rig)  # the first outage: t=10 s for 20 s
        rig.run_to(60)  # back up since t=30
        next(p for p in rig.node.spec.ib_ports if p.device == "mlx5_0").outages.append(
            (rig.elapsed + 1, 20.0))
        rig.advance(1)
        rig.sync()
        rig.poll()  # down again
        second = rig.clock.now().timestamp()
        rig.advance(rig.check.wake_at() - second)  # the daemon polls at the asked instant
        rig.sync()
        res = rig.poll()[PORT]
        assert res.details["longest_outage_start"] != pytest.approx(second, abs=1)  # the first one's
        keys = [t.key for t in triggers_from([res], on_xid=False)]
        assert keys[-1] == f"{PORT}@{second:.6f}" and len(keys) == 2
    finally:
        rig.close()


def test_the_pods_on_the_ports_gpu_get_one_notice_file_each_once(crossing, tmp_path):
    node, res = crossing
    r = Rig(tmp_path, node.clock, pods_snapshot({0: ("ml", "trainer-0"), 1: ("ml", "other")}),
            actions=("file",))
    (t,) = triggers_from([res], on_xid=False)
    record = r.ff.handle(t)
    assert record["result"] == "notified" and record["gpus"] == [0]
    assert record["workloads"] == ["ml/trainer-0"]  # gpu 1's pod is on mlx5_1, not told
    path = os.path.join(r.notice_dir, "ml", "trainer-0.json")
    notice = read_json(path)
    assert notice["reason"] == "PortDownExceededNcclTimeout"
    assert (notice["port"], notice["gpus"], notice["pod"], notice["namespace"]) == (
        PORT, [0], "trainer-0", "ml")
    assert notice["outage_start"] and notice["crossed_at"] and notice["containers"] == ["main"]
    assert not os.path.exists(os.path.join(r.notice_dir, "ml", "other.json"))
    assert [n for n in os.listdir(os.path.join(r.notice_dir, "ml")) if n.startswith(".")] == []
    # Once: the same outage's later results (it stays failed for the window) do nothing ...
    os.unlink(path)
    assert r.ff.handle(t) is None
    # ... nor does a restarted daemon on the same store.
    again = r.restarted(tmp_path, node.clock)
    assert again.ff.handle(t) is None
    assert not os.path.exists(path)
    assert counts(r) == {("notice", "notified"): 1, ("file", "ok"): 1}


def test_a_port_that_serves_no_gpu_notifies_nobody(crossing, tmp_path):
    node, res = crossing
    r = Rig(tmp_path, node.clock, pods_snapshot({0: ("ml", "trainer-0")}),
            pair={"mlx5_0": []})
    (t,) = triggers_from([res], on_xid=False)
    record = r.ff.handle(t)
    assert (record["result"], record["why"]) == ("nobody", "the port serves no GPU")
    assert not os.path.exists(r.notice_dir)
    assert r.ff.book.seen(t.key)["result"] == "nobody"


def test_dry_run_records_would_notify_and_does_nothing(crossing, tmp_path):
    node, res = crossing
    r = Rig(tmp_path, node.clock, pods_snapshot({0: ("ml", "trainer-0")}), dry_run=True,
            actions=("file", "signal", "event", "delete"))
    (t,) = triggers_from([res], on_xid=False)
    record = r.ff.handle(t)
    assert record["result"] == "would_notify"
    assert record["actions"] == {a: {"ml/trainer-0": "dry_run"}
                                 for a in ("file", "signal", "event", "delete")}
    assert not os.path.exists(r.notice_dir)
    assert counts(r)[("notice", "would_notify")] == 1


def test_unknown_attribution_or_pairing_is_unknown_and_retried_never_nobody(crossing,
                                                                          tmp_path):
    node, res = crossing
    r = Rig(tmp_path, node.clock, Snapshot(state="unknown", source="kubelet",
                                           reason="unavailable: no socket"))
    (t,) = triggers_from([res], on_xid=False)
    assert r.ff.handle(t) is None and r.ff.book.seen(t.key) is None
    r.snap = pods_snapshot({0: ("ml", "trainer-0")})
    r.pair = OSError("sysfs gone")
    assert r.ff.handle(t) is None and r.ff.book.seen(t.key) is None
    assert counts(r) == {("notice", "unknown"): 1}  # once per outage, not per retry
    r.pair = {"mlx5_0": [0]}
    assert r.ff.handle(t)["result"] == "notified"


def test_an_outage_that_ended_long_ago_is_stale_and_notifies_nobody(tmp_path):
    from gpu_monitor.clock import FakeClock

    clock = FakeClock()
    now = clock.now().timestamp()
    res = Result(check="rdma_ports", status=Status.FAILED, target=PORT,
                 reason="PortDownExceededNcclTimeout", message="was down",
                 details={"outages_over_tolerance": [[now - 100, now - 90]],
                          "nccl_tolerance_s": 7.516})
    r = Rig(tmp_path, clock, pods_snapshot({0: ("ml", "trainer-0")}))
    (t,) = triggers_from([res], on_xid=False)
    assert r.ff.handle(t)["result"] == "stale"
    assert not os.path.exists(r.notice_dir)


def test_off_kubernetes_the_holder_process_gets_its_signal_and_a_notice_file(crossing,
                                                                           tmp_path):
    node, res = crossing
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        r = Rig(tmp_path, node.clock, processes_snapshot({0: proc.pid}),
                actions=("signal", "file"))
        (t,) = triggers_from([res], on_xid=False)
        record = r.ff.handle(t)
        assert record["actions"]["signal"] == {f"pid {proc.pid}": "ok"}
        assert proc.wait(timeout=60) == -signal.SIGTERM
        notice = read_json(os.path.join(r.notice_dir, f"pid-{proc.pid}.json"))
        assert notice["pid"] == proc.pid
    finally:
        proc.kill()
        proc.wait()


def test_a_pods_processes_come_from_nvml_and_its_cgroup(crossing, tmp_path):
    """A configured signal (SIGUSR1) reaches the NVML holder and every process of the pod's
    cgroup (a systemd-driver tree on disk)."""
    node, res = crossing
    uid = "1f0e8c3a-5b7d-4e2a-9c11-0123456789ab"
    procs = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
             for _ in range(2)]
    try:
        scope = (tmp_path / "cg" / "kubepods.slice" / "kubepods-burstable.slice"
                 / f"kubepods-burstable-pod{uid.replace('-', '_')}.slice"
                 / "cri-containerd-abc.scope")
        scope.mkdir(parents=True)
        (scope / "cgroup.procs").write_text(f"{procs[1].pid}\n")
        from gpu_monitor.hw.cgroup import pod_pids

        class Pods:  # the Kube calls PodWriter.read makes
            def get_pod(self, ns, name):
                return {"metadata": {"name": name, "namespace": ns, "uid": uid},
                        "spec": {"nodeName": "gpu-node-1"}}

        r = Rig(tmp_path, node.clock, pods_snapshot({0: ("ml", "trainer-0")}),
                actions=("signal",), signal="SIGUSR1", kube=Pods,
                gpu_pids=lambda gpus: [procs[0].pid] if gpus == [0] else [],
                pod_pids=lambda u: pod_pids(str(tmp_path / "cg"), u))
        (t,) = triggers_from([res], on_xid=False)
        record = r.ff.handle(t)
        assert record["actions"]["signal"] == {f"pid {p.pid}": "ok" for p in procs}
        for p in procs:
            assert p.wait(timeout=60) == -signal.SIGUSR1
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_a_failing_action_is_recorded_and_the_others_still_run(crossing, tmp_path):
    node, res = crossing
    r = Rig(tmp_path, node.clock, pods_snapshot({0: ("ml", "trainer-0")}),
            actions=("event", "file"), kube=None)
    (t,) = triggers_from([res], on_xid=False)
    record = r.ff.handle(t)
    assert record["actions"]["event"]["ml/trainer-0"].startswith("error: RuntimeError: no "
                                                                  "Kubernetes client")
    assert record["actions"]["file"] == {"ml/trainer-0": "ok"}
    assert counts(r) == {("notice", "notified"): 1, ("file", "ok"): 1, ("event", "error"): 1}


def test_a_fatal_xid_notifies_its_gpus_holders_only_when_configured(tmp_path):
    from gpu_monitor.clock import FakeClock

    clock = FakeClock()
    xid = Result(check="xid", status=Status.FAILED, target="gpu:3", reason="Xid79",
                 message="Xid79 on gpu:3", details={"gpu_index": 3, "seq": 812,
                                                    "boot_id": "b1",
                                                    "event_time": clock.now().isoformat()})
    reopened = Result(check="xid", status=Status.FAILED, target="gpu:3", reason="Xid79",
                      message="still open", details={"open": True, "code": 79})
    assert triggers_from([xid], on_xid=False) == []
    (t,) = triggers_from([xid, reopened], on_xid=True)
    assert (t.key, t.gpus) == ("gpu:3@b1:812", (3,))
    r = Rig(tmp_path, clock, pods_snapshot({3: ("ml", "trainer-3")}), on_xid=True)
    assert r.ff.handle(t)["workloads"] == ["ml/trainer-3"]


def test_the_thread_takes_results_and_the_metric_counts_them(crossing, tmp_path):
    node, res = crossing
    r = Rig(tmp_path, node.clock, pods_snapshot({0: ("ml", "trainer-0")}))
    r.ff.start()
    try:
        r.ff.on_results([res, res])  # twice: one notice
        path = os.path.join(r.notice_dir, "ml", "trainer-0.json")
        eventually(lambda: os.path.exists(path), timeout=60)
        eventually(lambda: r.ff.book.seen(next(iter(r.ff.book.notices())))["result"]
                   == "notified", timeout=60)
    finally:
        r.ff.stop()
    fam = list(failfast_collector(r.store, r.ff.actions)())[0]
    samples = {(s.labels["action"], s.labels["result"]): s.value for s in fam.samples
               if s.name.endswith("_total")}
    assert samples[("notice", "notified")] == 1.0
    assert samples[("file", "ok")] == 1.0
    assert samples[("event", "error")] == 1.0  # no client in this test
    assert samples[("notice", "nobody")] == 0.0


def test_an_outage_every_action_failed_for_is_counted_as_an_error(crossing, tmp_path):
    node, res = crossing
    r = Rig(tmp_path, node.clock, pods_snapshot({0: ("ml", "trainer-0")}), actions=("event",))
    (t,) = triggers_from([res], on_xid=False)
    assert r.ff.handle(t)["result"] == "error"
    assert counts(r) == {("notice", "error"): 1, ("event", "error"): 1}
