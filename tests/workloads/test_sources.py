"""Choosing the attribution source, and the NVML processes fallback off Kubernetes."""

from __future__ import annotations

from gpu_monitor.hw.nvml_reader import NvmlReader
from gpu_monitor.profiles import load_profile
from gpu_monitor.sim.fake_nvml import FakeNvml
from gpu_monitor.sim.node import build_spec
from gpu_monitor.workloads.attribution import Holder
from gpu_monitor.workloads.sources import choose_source, make_refresher


def test_auto_is_the_kubelet_only_where_its_socket_exists():
    assert choose_source("auto", "/k.sock", exists=lambda p: True) == "kubelet"
    assert choose_source("auto", "/k.sock", exists=lambda p: False) == "nvml"
    assert choose_source("kubelet", "/k.sock", exists=lambda p: False) == "kubelet"
    assert choose_source("off", "/k.sock") == "off"


def test_off_kubernetes_nvml_processes_are_the_holders():
    spec = build_spec(load_profile("h100-sxm-8"))
    spec.gpus[3].processes.append((4242, 1 << 30, "python"))
    nvml = NvmlReader(FakeNvml(spec))
    nvml.start()
    refresher = make_refresher("auto", "/nonexistent/kubelet.sock", 30, 2, ("nvidia.com/gpu",),
                               (), nvml)
    assert make_refresher("off", "/x", 30, 2, (), (), nvml) is None
    snap = refresher.refresh_once()
    assert snap.state == "ok" and snap.source == "nvml"
    held = snap.holders_of_gpu(spec.gpus[3].uuid)
    assert [h.pid for h in held] == [4242] and held[0].pod == ""
    assert snap.holders_of_gpu(spec.gpus[0].uuid) == ()
    assert isinstance(held[0], Holder)
