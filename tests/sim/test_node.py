"""Every --inject kind reaches the lowest boundary it should, read back by the real readers."""

import json

import pytest

from gpu_monitor.hw.kmsg.files import KmsgFileSource
from gpu_monitor.hw.nvml import NvmlError
from gpu_monitor.profiles import load_profile
from gpu_monitor.sim.inject import parse
from gpu_monitor.sim.node import SimulatedNode
from gpu_monitor.sim.spec import CLOCK_EVENT_HW_SLOWDOWN


@pytest.fixture
def node_with(request):
    made = []

    def make(*faults, profile="h100-sxm-8"):
        node = SimulatedNode(load_profile(profile), [parse(f) for f in faults])
        made.append(node)
        return node, node.host()

    yield make
    for n in made:
        n.close()


def kmsg_messages(host):
    src = KmsgFileSource(host.paths.kmsg_path)
    try:
        return [r for r in src.read_available() if hasattr(r, "message")]
    finally:
        src.close()


def sim_state(host):
    with open(host.worker.fault_file) as fh:
        return json.load(fh)


def test_healthy_node_renders_profile(node_with):
    node, host = node_with()
    assert host.nvml.count() == 8
    assert len(host.sysfs.nvidia_gpus()) == 8
    assert len(host.sysfs.nvidia_switches()) == 4
    assert len(host.sysfs.infiniband_ports()) == 8
    assert all(host.nvml.nvlink_states(0, 18))


def test_gpu_missing_reaches_nvml_not_sysfs(node_with):
    _, host = node_with("gpu-missing@gpu:7")
    assert host.nvml.count() == 7
    assert len(host.sysfs.nvidia_gpus()) == 8
    assert any("fallen off the bus" in r.message for r in kmsg_messages(host))


@pytest.mark.parametrize("fault, needle", [
    ("xid@gpu:3,code=79", "NVRM: Xid (PCI:0000:86:00): 79,"),
    ("sxid@nvswitch:0,code=20034,fatal=1", "SXid (PCI:0000:05:00.0): 20034, Fatal"),
    ("row-remap-pending@gpu:2", ": 63,"),
])
def test_kernel_log_faults_reach_the_kmsg_file_as_records(node_with, fault, needle):
    _, host = node_with(fault)
    records = kmsg_messages(host)
    hit = [r for r in records if needle in r.message]
    assert hit and hit[0].source_format == "kmsg" and hit[0].seq is not None


def test_nvml_field_faults(node_with):
    _, host = node_with("row-remap-pending@gpu:2", "row-remap-failure@gpu:3",
                        "remap-headroom@gpu:1,low=8,none=1", "ecc-uncorrectable@gpu:5",
                        "nvlink-down@gpu:0,link=4", "throttle@gpu:5,event=hw_slowdown",
                        "hot@gpu:3,core=88,memory=98")
    nvml = host.nvml
    assert nvml.remapped_rows(2).pending and nvml.remapped_rows(3).failure
    h = nvml.remap_histogram(1)
    assert (h.low, h.none) == (8, 1)
    assert nvml.ecc(5).volatile_uncorrected == 1
    assert nvml.nvlink_states(0, 18)[4] is False
    assert nvml.clock_event_reasons(5) & CLOCK_EVENT_HW_SLOWDOWN
    t = nvml.temperatures(3)
    assert (t.core_c, t.memory_c) == (88, 98)


def test_pcie_downgrade_reaches_nvml_and_sysfs(node_with):
    node, host = node_with("pcie-downgrade@gpu:1,gen=3,width=8")
    link = host.nvml.pcie_link(1)
    assert (link.gen, link.max_gen, link.width, link.max_width) == (3, 5, 8, 16)
    dev = host.sysfs.pci_device(node.spec.gpu(1).pci_bus_id)
    assert (dev.current_link_gen, dev.current_link_width) == (3, 8)
    assert dev.speed_downgraded and dev.width_downgraded


@pytest.mark.parametrize("kind, attr", [("fatal", "aer_fatal"), ("nonfatal", "aer_nonfatal"),
                                        ("correctable", "aer_correctable")])
def test_aer_reaches_sysfs(node_with, kind, attr):
    node, host = node_with(f"aer@gpu:0,kind={kind},count=2")
    dev = host.sysfs.pci_device(node.spec.gpu(0).pci_bus_id)
    assert getattr(dev, attr).total == 2


def test_port_down_unfolds_over_time_in_sysfs(node_with):
    node, host = node_with("port-down@ib:mlx5_0:1,after=10,for=30")

    def port():
        return host.sysfs.infiniband_port("mlx5_0", 1)

    assert port().active
    node.advance(10.0)
    p = port()
    assert not p.active and p.counter("link_downed") == 1
    node.advance(39.9)
    assert not port().active
    node.advance(40.0)
    assert port().active and port().counter("link_downed") == 1


def test_timed_nvml_fault_applies_and_reverts(node_with):
    node, host = node_with("nvlink-down@gpu:1,link=2,after=5,for=5")
    assert host.nvml.nvlink_states(1, 18)[2] is True
    node.advance(5)
    assert host.nvml.nvlink_states(1, 18)[2] is False
    node.advance(10)
    assert host.nvml.nvlink_states(1, 18)[2] is True


def test_xid_burst_appears_over_time(node_with):
    node, host = node_with("xid@gpu:1,code=13,count=3,every=10,after=1")
    assert not [r for r in kmsg_messages(host) if "Xid" in r.message]
    node.advance(11.5)
    assert len([r for r in kmsg_messages(host) if "Xid" in r.message]) == 2


def test_worker_seam_faults_reach_the_state_file(node_with):
    _, host = node_with("slow@gpu:4,factor=3", "wrong-results@gpu:6", "sdc@gpu:3",
                        "dcgm-fail@gpu:2,test=memory", "ib-bw@ib:mlx5_1:1,gbit=100")
    st = sim_state(host)
    gpus = {g["index"]: g for g in st["gpus"]}
    assert gpus[4]["speed_factor"] == 3.0 and gpus[6]["wrong_results"] and gpus[3]["sdc"]
    assert gpus[2]["dcgm_failures"] == ["memory"]
    ports = {(p["device"], p["port"]): p for p in st["ib_ports"]}
    assert ports[("mlx5_1", 1)]["loopback_gbit"] == 100.0
    assert host.worker.device_type == "cpu"


def test_nvml_error_reaches_the_reader_as_its_kind(node_with):
    _, host = node_with("nvml-error@gpu:2,call=nvmlDeviceGetTemperature,error=Unknown")
    with pytest.raises(NvmlError) as err:
        host.nvml.temperatures(2)
    assert err.value.kind == "unknown" and err.value.gpu_index == 2
    host.nvml.temperatures(1)  # other GPUs unaffected


def test_gpu_process_reaches_nvml_and_procfs(node_with):
    _, host = node_with("gpu-process@gpu:0,pid=1234")
    assert [p.pid for p in host.nvml.processes(0)] == [1234]
    holders = host.procfs.processes_with_open("nvidia")
    assert [h.pid for h in holders] == [1234]
    assert [h.pid for h in host.gpu_holders()] == [1234]


def test_cpu_only_profile_has_no_gpu_and_no_nvml(node_with):
    _, host = node_with(profile="cpu-only")
    assert not host.nvml.available()
    assert host.sysfs.nvidia_gpus() == []
    assert host.unmet({"gpu"})


def test_simulated_node_removes_its_tree_on_close():
    import os

    node = SimulatedNode(load_profile("a100-sxm-8"))
    root = node.root
    host = node.host()
    host.close()
    assert not os.path.exists(root)
