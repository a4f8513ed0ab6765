"""An event about a GPU finding names the pod holding the GPU ("your pod's GPU 3 had Xid 79")."""

from __future__ import annotations

from gpu_monitor.workloads.attribution import GpuIdentity, resolve
from gpu_monitor.workloads.kubelet import DeviceAssignment
from tests.remediate.remediate_helpers import NODE, events_for, remediator, xid


def _note(target: str) -> str:
    from gpu_monitor.workloads.attribution import holder_note

    snap = resolve([DeviceAssignment("ml", "trainer-0", "main", "nvidia.com/gpu", "GPU-d")],
                   [GpuIdentity(3, "GPU-d")], {}, ("nvidia.com/gpu",), ())
    return holder_note(snap, target)


def test_the_xid_event_names_the_pod_holding_the_gpu(fake, tmp_path):
    r = remediator(fake, tmp_path, workload_note=_note)
    r.on_results([xid(79, gpu=3)])
    r.tick()
    messages = [e["message"] for e in events_for(fake, NODE) if e["reason"] == "Xid79"]
    assert messages and messages[0].startswith(
        "xid gpu:3 (held by pod ml/trainer-0, container main): Xid79"), messages


def test_a_failing_attribution_never_stops_the_event(fake, tmp_path):
    def broken(target: str) -> str:
        raise RuntimeError("boom")

    r = remediator(fake, tmp_path, workload_note=broken)
    r.on_results([xid(79, gpu=3)])
    r.tick()
    messages = [e["message"] for e in events_for(fake, NODE) if e["reason"] == "Xid79"]
    assert messages and messages[0].startswith("xid gpu:3: Xid79"), messages


def test_no_note_for_a_gpu_nobody_holds_or_a_non_gpu_target():
    assert _note("gpu:0") == "" and _note("ib:mlx5_0:1") == "" and _note("node") == ""
