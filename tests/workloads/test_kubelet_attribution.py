"""Attribution from a real gRPC pod-resources server on a unix socket: present, absent, slow,
and answering with devices this node does not have."""

from __future__ import annotations

import os
import tempfile
import threading

import pytest

from gpu_monitor.workloads.attribution import (
    DEFAULT_GPU_RESOURCES,
    GpuIdentity,
    Holder,
    Refresher,
    kubelet_reader,
)
from gpu_monitor.workloads.kubelet import KubeletUnavailable, list_assignments
from tests.waiting import eventually
from tests.workloads.kubelet_server import FakeKubelet, pod

GPUS = (GpuIdentity(0, "GPU-aaaaaaaa-0000-0000-0000-000000000000"),
        GpuIdentity(3, "GPU-dddddddd-0000-0000-0000-000000000003",
                    mig_uuids=("MIG-11111111-0000-0000-0000-000000000000",)))
RDMA = {"0000:3b:00.0": "mlx5_0"}
RDMA_RESOURCES = ("rdma/rdma_shared_device_a",)


@pytest.fixture
def socket_path():
    # A short path: unix socket paths are limited to about 108 bytes.
    with tempfile.TemporaryDirectory(prefix="pr") as tmp:
        yield os.path.join(tmp, "kubelet.sock")


def _reader(path: str, timeout_s: float = 5.0):
    return kubelet_reader(path, timeout_s, lambda: GPUS, lambda: RDMA, DEFAULT_GPU_RESOURCES,
                          RDMA_RESOURCES)


def test_list_maps_uuid_index_mig_and_rdma_forms_to_pods(socket_path):
    with FakeKubelet(socket_path) as kubelet:
        kubelet.pods = [
            pod("ml", "trainer-0", {"main": [("nvidia.com/gpu",
                                              ["GPU-dddddddd-0000-0000-0000-000000000003"]),
                                             ("rdma/rdma_shared_device_a", ["0000:3b:00.0"])]}),
            pod("ml", "by-index", {"c": [("nvidia.com/gpu", ["0"])]}),
            pod("dev", "mig-user", {"c": [("nvidia.com/mig-1g.10gb",
                                           ["MIG-11111111-0000-0000-0000-000000000000"])]}),
            pod("dev", "shared", {"c": [("nvidia.com/gpu",
                                         ["GPU-aaaaaaaa-0000-0000-0000-000000000000::2"])]}),
            pod("kube-system", "cpu-only", {"c": [("example.com/other", ["x"])]}),
        ]
        snap = _reader(socket_path)()
    assert snap.state == "ok" and snap.source == "kubelet"
    assert snap.holders_of_gpu(GPUS[1].uuid) == (Holder("ml", "trainer-0", "main"),
                                                 Holder("dev", "mig-user", "c"))
    assert snap.holders_of_gpu(GPUS[0].uuid) == (Holder("ml", "by-index", "c"),
                                                 Holder("dev", "shared", "c"))
    assert snap.holders_of_rdma(["mlx5_0", "mlx5_1"]) == (Holder("ml", "trainer-0", "main"),)
    assert snap.unknown_devices == ()


def test_devices_the_node_does_not_have_are_reported_not_guessed(socket_path):
    with FakeKubelet(socket_path) as kubelet:
        kubelet.pods = [pod("ml", "p", {"c": [("nvidia.com/gpu", ["GPU-ffff", "7"]),
                                              ("rdma/rdma_shared_device_a", ["0000:99:00.0"])]})]
        snap = _reader(socket_path)()
    assert snap.state == "ok"
    assert snap.gpus == {} and snap.rdma == {}
    assert snap.unknown_devices == ("nvidia.com/gpu=GPU-ffff", "nvidia.com/gpu=7",
                                    "rdma/rdma_shared_device_a=0000:99:00.0")


def test_absent_kubelet_is_unknown_naming_the_socket_never_a_crash(socket_path):
    with pytest.raises(KubeletUnavailable) as raised:
        list_assignments(socket_path, timeout_s=2.0)
    assert raised.value.reason == "unavailable"
    refresher = Refresher(_reader(socket_path, 2.0), refresh_s=60, source="kubelet")
    snap = refresher.refresh_once()
    assert snap.state == "unknown" and "unavailable" in snap.reason
    assert refresher.reads == {"unavailable": 1}


def test_slow_kubelet_times_out_and_last_good_mapping_goes_stale(socket_path):
    with FakeKubelet(socket_path) as kubelet:
        kubelet.pods = [pod("ml", "p", {"c": [("nvidia.com/gpu", [GPUS[0].uuid])]})]
        refresher = Refresher(_reader(socket_path, 0.3), refresh_s=60, source="kubelet")
        good = refresher.refresh_once()
        assert good.state == "ok"
        kubelet.release = threading.Event()  # from now on the kubelet hangs
        snap = refresher.refresh_once()
        kubelet.release.set()
    assert snap.state == "stale" and "timeout" in snap.reason
    assert snap.holders_of_gpu(GPUS[0].uuid) == (Holder("ml", "p", "c"),)
    assert snap.read_at == good.read_at
    assert refresher.reads == {"ok": 1, "timeout": 1}


def test_refresher_thread_picks_up_a_kubelet_that_comes_up_later(socket_path):
    refresher = Refresher(_reader(socket_path, 1.0), refresh_s=0.05, source="kubelet")
    refresher.start()
    try:
        eventually(lambda: refresher.reads.get("unavailable"), what="a failed read")
        with FakeKubelet(socket_path) as kubelet:
            kubelet.pods = [pod("ml", "late", {"c": [("nvidia.com/gpu", ["3"])]})]
            snap = eventually(lambda: (s := refresher.current()).state == "ok" and s,
                              what="a good read")
    finally:
        refresher.stop()
    assert snap.holders_of_gpu(GPUS[1].uuid) == (Holder("ml", "late", "c"),)


def test_a_crashing_reader_is_reported_not_raised():
    def broken():
        raise RuntimeError("boom")

    refresher = Refresher(broken, refresh_s=60, source="kubelet")
    snap = refresher.refresh_once()
    assert snap.state == "unknown" and "RuntimeError: boom" in snap.reason
    assert refresher.reads == {"error": 1}
