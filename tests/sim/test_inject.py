import pytest

from gpu_monitor.sim import inject
from gpu_monitor.sim.faults import tools
from gpu_monitor.sim.faults.base import InjectError
from gpu_monitor.sim.inject import parse
from gpu_monitor.sim.spec import CLOCK_EVENT_HW_THERMAL, GpuSpec, IbPortSpec, NodeSpec, NvSwitchSpec


def spec():
    s = NodeSpec(profile="t")
    for i in range(8):
        s.gpus.append(GpuSpec(index=i, uuid=f"GPU-{i}", name="NVIDIA H100 80GB HBM3",
                              pci_bus_id=f"0000:{0x53 + 17 * i:02x}:00.0",
                              nvlink_up=[True] * 18))
    s.ib_ports.append(IbPortSpec("mlx5_0", 1, "0000:4f:00.0"))
    s.ib_ports.append(IbPortSpec("mlx5_1", 1, "0000:60:00.0"))
    s.nvswitches.append(NvSwitchSpec(0, "0000:05:00.0"))
    return s


def apply(text, s=None):
    s = s or spec()
    f = parse(text)
    inject.KINDS[f.kind].apply(s, f)
    return s


def test_parse_full_grammar():
    f = parse("port-down@ib:mlx5_0:1,after=10,for=30")
    assert (f.kind, f.target, f.after_s, f.for_s) == ("port-down", "ib:mlx5_0:1", 10.0, 30.0)
    assert f.ib == ("mlx5_0", 1)


@pytest.mark.parametrize(
    "text, needle",
    [
        ("xid", "KIND@TARGET"),
        ("bogus@gpu:1", "unknown fault kind"),
        ("xid@ib:mlx5_0:1,code=79", "gpu target"),
        ("xid@gpu:3,code=79,colour=red", "takes no 'colour'"),
        ("xid@gpu:3,code", "not key=value"),
        ("slow@gpu:1,after=5", "takes no 'after'"),
        ("port-down@ib:mlx5_0:1,for=-1", "for > 0"),
        ("missing@gpu:0,what=dcgmi", "node target"),
    ],
)
def test_parse_errors_say_what_is_wrong(text, needle):
    with pytest.raises(InjectError, match=needle):
        parse(text)


def test_every_documented_kind_exists_and_is_in_help():
    documented = ["gpu-missing", "xid", "sxid", "row-remap-pending", "row-remap-failure",
                  "remap-headroom", "ecc-uncorrectable", "pcie-downgrade", "aer", "nvlink-down",
                  "throttle", "hot", "power-limit", "port-down", "slow", "wrong-results", "sdc",
                  "dcgm-fail", "ib-bw", "nvml-error", "gpu-process", "missing", "sysfs",
                  "dcgm-output", "ib-bw-output"]
    assert sorted(documented) == sorted(inject.KINDS)
    text = inject.help_text()
    for k in documented:
        assert f"{k}@" in text


def test_gpu_missing_marks_gpu_and_logs_fallen_off_bus():
    s = apply("gpu-missing@gpu:7")
    assert s.gpu(7).missing
    assert "GPU has fallen off the bus" in s.kmsg_lines[-1].message
    assert "PCI:0000:" in s.kmsg_lines[-1].message


def test_xid_burst_spaced_in_time():
    s = apply("xid@gpu:3,code=13,count=3,every=2,after=1")
    assert [t.after_s for t in s.kmsg_lines] == [1.0, 3.0, 5.0]
    assert all(": 13, pid=" in t.message for t in s.kmsg_lines)


def test_sxid_fatal_marks_switch():
    s = apply("sxid@nvswitch:0,code=20034,fatal=1")
    assert s.nvswitch(0).fatal
    assert "SXid (PCI:0000:05:00.0): 20034, Fatal" in s.kmsg_lines[-1].message


@pytest.mark.parametrize(
    "text, field, value",
    [
        ("row-remap-pending@gpu:2", "remap_pending", True),
        ("row-remap-failure@gpu:2", "remap_failure", True),
        ("ecc-uncorrectable@gpu:5", "ecc_volatile_uncorrected", 1),
        ("wrong-results@gpu:6", "wrong_results", True),
        ("sdc@gpu:3", "sdc", True),
        ("slow@gpu:4,factor=3", "speed_factor", 3.0),
    ],
)
def test_gpu_field_faults(text, field, value):
    f = parse(text)
    s = apply(text)
    assert getattr(s.gpu(f.gpu_index), field) == value


def test_remap_headroom_histogram():
    s = apply("remap-headroom@gpu:1,low=5,none=1")
    assert s.gpu(1).histogram["low"] == 5 and s.gpu(1).histogram["none"] == 1


def test_pcie_downgrade_and_refuses_no_op():
    s = apply("pcie-downgrade@gpu:1,gen=3,width=8")
    assert (s.gpu(1).pcie_gen_current, s.gpu(1).pcie_width_current) == (3, 8)
    with pytest.raises(InjectError, match="below the maximum"):
        apply("pcie-downgrade@gpu:1,gen=5,width=16")


def test_aer_kinds():
    s = apply("aer@gpu:0,kind=fatal")
    assert s.gpu(0).aer_fatal == 1
    with pytest.raises(InjectError, match="one of"):
        apply("aer@gpu:0,kind=weird")


def test_nvlink_down_range_checked():
    assert apply("nvlink-down@gpu:0,link=4").gpu(0).nvlink_up[4] is False
    with pytest.raises(InjectError, match="out of range"):
        apply("nvlink-down@gpu:0,link=40")


def test_throttle_sets_clock_event_bit():
    s = apply("throttle@gpu:5,event=hw_thermal_slowdown")
    assert s.gpu(5).clock_event_reasons & CLOCK_EVENT_HW_THERMAL


def test_hot_port_down_ib_bw_dcgm_process_nvml_error():
    s = spec()
    for text in ("hot@gpu:3,core=85,memory=105", "port-down@ib:mlx5_0:1,after=10,for=30",
                 "ib-bw@ib:mlx5_1:1,gbit=100", "dcgm-fail@gpu:2,test=memtest",
                 "gpu-process@gpu:0,pid=1234", "nvml-error@gpu:2,call=nvmlDeviceGetTemperature,error=Unknown",
                 "nvml-error@gpu:4,error=GpuIsLost"):
        apply(text, s)
    assert (s.gpu(3).temperature_core_c, s.gpu(3).temperature_memory_c) == (85, 105)
    assert s.ib_port("mlx5_0", 1).outages == [(10.0, 30.0)]
    assert s.ib_port("mlx5_1", 1).loopback_gbit == 100.0
    assert s.gpu(2).dcgm_failures == ["memtest"]
    assert s.gpu(0).processes[0][0] == 1234
    assert s.gpu(2).nvml_errors == {"nvmlDeviceGetTemperature": "Unknown"}
    assert s.gpu(4).lost


def test_nvml_error_at_the_node_fails_a_call_for_every_gpu_and_calls_that_name_none():
    s = spec()
    for text in ("nvml-error@node,call=nvmlDeviceGetCount,error=Unknown",
                 "nvml-error@node,call=nvmlInit,error=DriverNotLoaded",
                 "nvml-error@node,call=nvmlDeviceGetTemperature,error=InsufficientPower",
                 "nvml-error@gpu:1,call=NVML_FI_DEV_MEMORY_TEMP,error=NotReady"):
        apply(text, s)
    assert s.nvml_errors == {"nvmlDeviceGetCount": "Unknown", "nvmlInit": "DriverNotLoaded",
                             "nvmlDeviceGetTemperature": "InsufficientPower"}
    assert s.gpu(1).nvml_errors == {"NVML_FI_DEV_MEMORY_TEMP": "NotReady"}


@pytest.mark.parametrize("error", tools.NVML_ERRORS)
def test_nvml_error_takes_every_error_pynvml_can_raise(error):
    s = apply(f"nvml-error@gpu:0,call=nvmlDeviceGetUUID,error={error}")
    assert s.gpu(0).nvml_errors == {"nvmlDeviceGetUUID": error}


# What each kind refuses because it would inject nothing (or the wrong thing): (text, what the
# error must say). test_a_fault_that_cannot_be_injected_is_refused_saying_why runs them all.
NVML_ERROR_REFUSALS = [
    ("nvml-error@gpu:2,call=nvmlDeviceGetCount,error=Unknown", "nvml-error@node,call="),
    ("nvml-error@gpu:2,call=nvmlInit", "names no GPU"),
    ("nvml-error@gpu:2,call=nvmlDeviceGetTemprature", "not a per-GPU NVML function"),
    ("nvml-error@node,call=nvmlFooBar", "not an NVML function"),
    ("nvml-error@node", "call=NAME is required at node"),
    ("nvml-error@gpu:2,call=nvmlDeviceGetUUID,error=Bogus", "expected one of"),
    ("nvml-error@nvswitch:0,call=nvmlDeviceGetUUID", "gpu or node target"),
]
TARGETS_THAT_DO_NOT_EXIST = [("xid@gpu:9,code=79", "no gpu:9"),
                             ("port-down@ib:mlx5_9:1", "no ib:mlx5_9:1")]
MISSING_NAMES_WHAT_IT_CAN_TAKE_AWAY = [("missing@node,what=nvidia-smi", "expected one of dcgmi"),
                                       ("missing@node", "missing what=")]


@pytest.mark.parametrize("text,owner,rel,shape,content", [
    ("sysfs@ib:mlx5_0:1,file=rate,value=banana", "ib:mlx5_0:1", "rate", "text", "banana"),
    ("sysfs@gpu:1,file=max_link_width,value=-16", "pci:0000:64:00.0", "max_link_width", "text",
     "-16"),
    ("sysfs@nvswitch:0,file=aer_dev_fatal,shape=missing", "pci:0000:05:00.0", "aer_dev_fatal",
     "missing", ""),
    ("sysfs@pcie:0000:4F:00.0,file=current_link_width,shape=dir", "pci:0000:4f:00.0",
     "current_link_width", "dir", ""),
    ("sysfs@ib:mlx5_1:1,file=counters/link_downed,shape=binary", "ib:mlx5_1:1",
     "counters/link_downed", "binary", ""),
    ("sysfs@ib:mlx5_1:1,file=rate,value=4: ACTIVE=x", "ib:mlx5_1:1", "rate", "text",
     "4: ACTIVE=x"),
])
def test_sysfs_fault_names_the_file_of_its_owner(text, owner, rel, shape, content):
    from gpu_monitor.sim.spec import SysfsOverride

    assert apply(text).sysfs_overrides == {(owner, rel): SysfsOverride(shape, content)}


SYSFS_REFUSALS = [
    ("sysfs@gpu:0,value=1", "file= must name a file"),
    ("sysfs@gpu:0,file=../../etc/passwd,value=1", "file= must name a file"),
    ("sysfs@gpu:0,file=/rate,value=1", "file= must name a file"),
    ("sysfs@gpu:0,file=rate", "shape=text needs value"),
    ("sysfs@gpu:0,file=rate,shape=purple", "expected one of"),
    ("sysfs@pcie:0000:99:00.0,file=class,shape=empty", "no PCI function 0000:99:00.0"),
    ("sysfs@ib:mlx5_9:1,file=rate,shape=empty", "no ib:mlx5_9:1"),
    ("sysfs@node,file=rate,shape=empty", "needs a sysfs target"),
]


@pytest.mark.parametrize("what, field", [("dcgmi", "dcgmi_installed"),
                                         ("nv-hostengine", "dcgm_available"),
                                         ("ib_write_bw", "perftest_available"),
                                         ("torch", "torch_available")])
def test_missing_takes_one_tool_or_runtime_away(what, field):
    s = apply(f"missing@node,what={what}")
    assert getattr(s, field) is False
    flags = ("dcgmi_installed", "dcgm_available", "perftest_available", "torch_available")
    assert all(getattr(s, f) for f in flags if f != field)


def test_dcgm_output_and_ib_bw_output_faults_land_in_the_spec(tmp_path):
    recorded = tmp_path / "out.json"
    recorded.write_text("{}")
    s = apply("dcgm-output@node,format=text,exit=3,lines=9,drop=2,status=Banana")
    s = apply(f"dcgm-output@node,drop=5,file={recorded}", s)
    assert s.dcgm_output == {"format": "text", "exit": 3, "lines": 9, "drop": [2, 5],
                             "status": "Banana", "file": str(recorded)}
    s = apply("ib-bw-output@ib:mlx5_1:1,cut=mid-row,exit=1")
    assert s.ib_port("mlx5_1", 1).perftest_output == {"cut": "mid-row", "exit": 1}
    assert apply("ib-bw@ib:mlx5_0:1,gbit=nan").ib_port("mlx5_0", 1).loopback_gbit != 0


OUTPUT_REFUSALS = [
    ("dcgm-output@node", "give at least one of"),
    ("dcgm-output@gpu:0,exit=1", "needs a node target"),
    ("dcgm-output@node,exit=300", "not an exit status"),
    ("dcgm-output@node,drop=9", "no gpu:9"),
    ("dcgm-output@node,format=xml", "expected one of"),
    ("dcgm-output@node,file=/nonexistent/out.json", "does not exist"),
    ("ib-bw-output@ib:mlx5_0:1", "give cut="),
    ("ib-bw-output@ib:mlx5_0:1,cut=sideways", "expected one of"),
    ("ib-bw-output@ib:mlx5_7:1,exit=1", "no ib:mlx5_7:1"),
]


@pytest.mark.parametrize("text, needle", [*NVML_ERROR_REFUSALS, *TARGETS_THAT_DO_NOT_EXIST,
                                          *MISSING_NAMES_WHAT_IT_CAN_TAKE_AWAY, *SYSFS_REFUSALS,
                                          *OUTPUT_REFUSALS])
def test_a_fault_that_cannot_be_injected_is_refused_saying_why(text, needle):
    with pytest.raises(InjectError, match=needle):
        apply(text)
