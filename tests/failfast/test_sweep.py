"""The notice sweep (gpu_monitor/failfast/sweep.py): a notice file goes once its workload is
gone, and only then; files the daemon did not write, and any file while the attribution is not
fresh, stay."""

from __future__ import annotations

import json
import os
from dataclasses import replace

from gpu_monitor.failfast.trigger import triggers_from
from tests.failfast.failfast_helpers import Rig, pods_snapshot, processes_snapshot


def test_a_pods_notice_goes_when_the_pod_no_longer_holds_a_device_here(crossing, tmp_path):
    node, res = crossing
    r = Rig(tmp_path, node.clock, pods_snapshot({0: ("ml", "trainer-0")}), actions=("file",))
    (t,) = triggers_from([res], on_xid=False)
    assert r.ff.handle(t)["result"] == "notified"
    path = os.path.join(r.notice_dir, "ml", "trainer-0.json")
    foreign = os.path.join(r.notice_dir, "ml", "by-hand.json")  # not the daemon's
    with open(foreign, "w") as fh:
        json.dump({"key": "something else", "pod": "by-hand", "namespace": "ml"}, fh)
    with open(os.path.join(r.notice_dir, "ml", ".notice-x.tmp"), "w") as fh:
        fh.write("{")  # a write in progress
    # The pod still holds its GPU (restarted in place, or not yet gone): kept.
    assert r.ff.sweep() == 0 and os.path.exists(path)
    # The pod is gone, but the attribution is stale: nothing is removed on a guess.
    r.snap = replace(pods_snapshot({}), state="stale")
    assert r.ff.sweep() == 0 and os.path.exists(path)
    # Gone, and the attribution is fresh: removed; the foreign file stays.
    r.snap = pods_snapshot({3: ("ml", "another")})
    assert r.ff.sweep() == 1
    assert not os.path.exists(path) and os.path.exists(foreign)
    assert r.ff.sweep() == 0


def test_a_processs_notice_goes_when_the_process_is_gone(crossing, tmp_path):
    node, res = crossing
    alive = {4242}
    r = Rig(tmp_path, node.clock, processes_snapshot({0: 4242}), actions=("file",),
            pid_alive=lambda pid: pid in alive)
    (t,) = triggers_from([res], on_xid=False)
    assert r.ff.handle(t)["result"] == "notified"
    path = os.path.join(r.notice_dir, "pid-4242.json")
    assert r.ff.sweep() == 0 and os.path.exists(path)
    alive.clear()
    assert r.ff.sweep() == 1 and not os.path.exists(path)


def test_in_dry_run_or_without_the_file_action_nothing_is_swept(crossing, tmp_path):
    node, _res = crossing
    os.makedirs(tmp_path / "notices")
    stray = tmp_path / "notices" / "pid-1.json"
    stray.write_text(json.dumps({"key": "k", "pid": 1}))
    for kw in ({"dry_run": True, "actions": ("file",)}, {"actions": ("event",)}):
        r = Rig(tmp_path, node.clock, pods_snapshot({}), pid_alive=lambda pid: False, **kw)
        r.store.set_kv("failfast", "k", {"result": "notified"})
        assert r.ff.sweep() == 0 and stray.exists()
