"""The notice's API actions on the wire-level fake apiserver: an Event and the
``GPUMonitorFabricFault`` condition on each affected pod of this node, deletion when chosen,
and nothing written to a pod bound elsewhere."""

from __future__ import annotations

from gpu_monitor.failfast.pods import CONDITION_TYPE
from gpu_monitor.failfast.trigger import triggers_from
from tests.failfast.failfast_helpers import NODE, Rig, pods_snapshot
from tests.kube.client_helpers import kube_for


def conditions(pod: dict) -> dict:
    return {c["type"]: c for c in pod["status"].get("conditions") or []}


def pod_events(fake, name: str) -> list[dict]:
    return [e for e in fake.list("", "events")
            if e["involvedObject"].get("kind") == "Pod" and e["involvedObject"]["name"] == name]


def test_event_and_condition_on_the_affected_pods_of_this_node_only(crossing, tmp_path,
                                                                   fake_api):
    node, res = crossing
    fake_api.add_node(NODE)
    fake_api.add_node("elsewhere")
    fake_api.add_pod("ml", "trainer-0", node=NODE, gpus=1)
    fake_api.add_pod("ml", "stranger", node="elsewhere", gpus=1)  # stale attribution
    kube = kube_for(fake_api)
    r = Rig(tmp_path, node.clock, pods_snapshot({0: ("ml", "trainer-0"), 1: ("ml", "x")}),
            pair={"mlx5_0": [0, 1]}, kube=lambda: kube, actions=("event",))
    r.snap = pods_snapshot({0: ("ml", "trainer-0"), 1: ("ml", "stranger")})
    (t,) = triggers_from([res], on_xid=False)
    record = r.ff.handle(t)
    assert record["actions"]["event"]["ml/trainer-0"] == "ok"
    assert "is on node 'elsewhere'" in record["actions"]["event"]["ml/stranger"]
    pod = fake_api.pod("ml", "trainer-0")
    cond = conditions(pod)[CONDITION_TYPE]
    assert (cond["status"], cond["reason"]) == ("True", "PortDownExceededNcclTimeout")
    assert "Ready" in conditions(pod)  # the kubelet's conditions are kept
    (ev,) = pod_events(fake_api, "trainer-0")
    assert ev["reason"] == "GPUMonitorFailFast" and ev["type"] == "Warning"
    assert ev["involvedObject"]["uid"] == pod["metadata"]["uid"]
    assert "ib:mlx5_0:1" in ev["message"] and "gpu:0" in ev["message"]
    assert CONDITION_TYPE not in conditions(fake_api.pod("ml", "stranger"))
    assert pod_events(fake_api, "stranger") == []


def test_delete_removes_the_pod_so_its_job_restarts_it(crossing, tmp_path, fake_api):
    node, res = crossing
    fake_api.add_node(NODE)
    fake_api.add_pod("ml", "trainer-0", node=NODE, gpus=1)
    kube = kube_for(fake_api)
    r = Rig(tmp_path, node.clock, pods_snapshot({0: ("ml", "trainer-0")}), kube=lambda: kube,
            actions=("delete",))
    (t,) = triggers_from([res], on_xid=False)
    assert r.ff.handle(t)["actions"]["delete"] == {"ml/trainer-0": "ok"}
    from tests.waiting import eventually

    eventually(lambda: fake_api.pod("ml", "trainer-0") is None, timeout=60)
