"""The fake pynvml: real pynvml's names, values, shapes and error semantics over a live NodeSpec."""

from __future__ import annotations

import ctypes
import inspect
import threading
import types

import pytest

from gpu_monitor.sim import fake_nvml
from gpu_monitor.sim.fake_nvml import FakeNvml, error_class, fake_pynvml_module
from gpu_monitor.sim.spec import GpuSpec, NodeSpec

H100 = "NVIDIA H100 80GB HBM3"


def make_spec(n: int = 4, name: str = H100, **gpu_fields) -> NodeSpec:
    gpus = [
        GpuSpec(index=i, uuid=f"GPU-{i:08x}-1111-2222-3333-444455556666", name=name,
                pci_bus_id=f"0000:{0x18 + 0x10 * i:02x}:00.0", nvlink_up=[True] * 18,
                **gpu_fields)
        for i in range(n)
    ]
    return NodeSpec(profile="h100-sxm-8", gpus=gpus)


@pytest.fixture
def spec() -> NodeSpec:
    return make_spec()


@pytest.fixture
def nvml(spec: NodeSpec) -> FakeNvml:
    fake = FakeNvml(spec)
    fake.nvmlInit()
    return fake


def h(nvml: FakeNvml, index: int):
    return nvml.nvmlDeviceGetHandleByIndex(index)


# Every per-device function with arguments that are valid on a healthy H100.
DEVICE_CALLS = [
    ("nvmlDeviceGetIndex", ()),
    ("nvmlDeviceGetName", ()),
    ("nvmlDeviceGetUUID", ()),
    ("nvmlDeviceGetSerial", ()),
    ("nvmlDeviceGetPciInfo", ()),
    ("nvmlDeviceGetPciInfo_v3", ()),
    ("nvmlDeviceGetNumaNodeId", ()),
    ("nvmlDeviceGetMemoryInfo", ()),
    ("nvmlDeviceGetEccMode", ()),
    ("nvmlDeviceGetTotalEccErrors", (1, 0)),
    ("nvmlDeviceGetRemappedRows", ()),
    ("nvmlDeviceGetRowRemapperHistogram", ()),
    ("nvmlDeviceGetCurrentClocksEventReasons", ()),
    ("nvmlDeviceGetCurrentClocksThrottleReasons", ()),
    ("nvmlDeviceGetViolationStatus", (1,)),
    ("nvmlDeviceGetTemperature", (0,)),
    ("nvmlDeviceGetTemperatureThreshold", (1,)),
    ("nvmlDeviceGetFieldValues", ([82],)),
    ("nvmlDeviceGetPowerUsage", ()),
    ("nvmlDeviceGetEnforcedPowerLimit", ()),
    ("nvmlDeviceGetClockInfo", (1,)),
    ("nvmlDeviceGetMaxClockInfo", (1,)),
    ("nvmlDeviceGetNvLinkState", (0,)),
    ("nvmlDeviceGetNvLinkErrorCounter", (0, 0)),
    ("nvmlDeviceGetCurrPcieLinkGeneration", ()),
    ("nvmlDeviceGetCurrPcieLinkWidth", ()),
    ("nvmlDeviceGetMaxPcieLinkGeneration", ()),
    ("nvmlDeviceGetMaxPcieLinkWidth", ()),
    ("nvmlDeviceGetPcieReplayCounter", ()),
    ("nvmlDeviceGetGpuFabricInfo", (fake_nvml.c_nvmlGpuFabricInfo_t(),)),
    ("nvmlDeviceGetGpuFabricInfoV", (fake_nvml.c_nvmlGpuFabricInfoV_t(),)),
    ("nvmlDeviceGetMigMode", ()),
    ("nvmlDeviceGetComputeRunningProcesses", ()),
    ("nvmlDeviceGetComputeRunningProcesses_v3", ()),
    ("nvmlDeviceGetComputeRunningProcesses_v2", ()),
    ("nvmlDeviceGetGraphicsRunningProcesses", ()),
    ("nvmlDeviceGetGraphicsRunningProcesses_v3", ()),
    ("nvmlDeviceGetGraphicsRunningProcesses_v2", ()),
]


# --- init, shutdown, library ------------------------------------------------------------------


def test_calls_before_init_raise_uninitialized(spec):
    fake = FakeNvml(spec)
    with pytest.raises(fake.NVMLError_Uninitialized):
        fake.nvmlDeviceGetCount()
    with pytest.raises(fake.NVMLError_Uninitialized):
        fake.nvmlShutdown()


def test_init_is_reference_counted_like_nvml(spec):
    fake = FakeNvml(spec)
    fake.nvmlInit()
    fake.nvmlInitWithFlags(0)
    fake.nvmlShutdown()
    assert fake.nvmlDeviceGetCount() == 4
    fake.nvmlShutdown()
    with pytest.raises(fake.NVMLError_Uninitialized):
        fake.nvmlDeviceGetCount()


def test_missing_library_makes_init_raise_library_not_found(spec):
    spec.nvml_library_missing = True
    fake = FakeNvml(spec)
    with pytest.raises(fake.NVMLError_LibraryNotFound) as info:
        fake.nvmlInit()
    assert info.value.value == 12
    assert str(info.value) == "NVML Shared Library Not Found"


def test_system_errors_make_init_raise_driver_not_loaded(spec):
    fake = FakeNvml(spec, system_errors={"nvmlInit": "DriverNotLoaded"})
    with pytest.raises(fake.NVMLError_DriverNotLoaded):
        fake.nvmlInit()
    fake.system_errors.clear()
    fake.nvmlInit()
    assert fake.nvmlDeviceGetCount() == 4


def test_system_error_on_count(nvml):
    nvml.system_errors["nvmlDeviceGetCount"] = "Unknown"
    with pytest.raises(nvml.NVMLError_Unknown):
        nvml.nvmlDeviceGetCount()


def test_system_queries_render_the_spec(nvml, spec):
    assert nvml.nvmlSystemGetDriverVersion() == "550.90.07"
    assert nvml.nvmlSystemGetCudaDriverVersion() == 12040
    assert nvml.nvmlSystemGetCudaDriverVersion_v2() == 12040
    assert nvml.nvmlSystemGetNVMLVersion() == "12.550.90.07"
    spec.driver_version = "570.124.06"
    assert nvml.nvmlSystemGetDriverVersion() == "570.124.06"


# --- exceptions -------------------------------------------------------------------------------


def test_nvmlerror_with_a_code_builds_the_matching_subclass():
    err = fake_nvml.NVMLError(15)
    assert type(err) is fake_nvml.NVMLError_GpuIsLost
    assert err.value == 15
    assert isinstance(err, fake_nvml.NVMLError)
    assert str(err) == "GPU is lost"
    assert fake_nvml.NVMLError_NotSupported().value == 3
    assert fake_nvml.NVMLError_NotSupported() == fake_nvml.NVMLError(3)
    assert fake_nvml.NVMLError(12345).value == 12345
    assert type(fake_nvml.NVMLError(12345)) is fake_nvml.NVMLError


def test_exception_classes_are_reachable_as_module_and_object_attributes(nvml):
    assert nvml.NVMLError_GpuIsLost is fake_nvml.NVMLError_GpuIsLost
    assert nvml.nvmlExceptionClass(3) is fake_nvml.NVMLError_NotSupported
    with pytest.raises(ValueError):
        nvml.nvmlExceptionClass(4242)
    assert nvml.nvmlErrorString(15) == "GPU is lost"


@pytest.mark.parametrize("spelling", ["GpuIsLost", "NVMLError_GpuIsLost", "GPU_IS_LOST",
                                      "NVML_ERROR_GPU_IS_LOST", "gpuislost"])
def test_error_names_resolve_in_every_spelling(spelling):
    assert error_class(spelling) is fake_nvml.NVMLError_GpuIsLost


def test_unknown_error_name_is_refused_loudly():
    with pytest.raises(ValueError, match="unknown NVML error name"):
        error_class("Exploded")


# --- enumeration and identity ------------------------------------------------------------------


def test_missing_gpu_is_not_enumerated_and_later_indices_shift(nvml, spec):
    spec.gpus[1].missing = True
    assert nvml.nvmlDeviceGetCount() == 3
    assert nvml.nvmlDeviceGetUUID(h(nvml, 1)) == spec.gpus[2].uuid
    assert nvml.nvmlDeviceGetIndex(h(nvml, 1)) == 1
    with pytest.raises(nvml.NVMLError_InvalidArgument):
        h(nvml, 3)


def test_handle_stays_bound_to_its_gpu_and_dies_when_the_gpu_goes_missing(nvml, spec):
    handle = h(nvml, 2)
    spec.gpus[2].missing = True
    with pytest.raises(nvml.NVMLError_GpuIsLost):
        nvml.nvmlDeviceGetName(handle)


def test_handle_by_uuid_and_by_pci_bus_id(nvml, spec):
    assert nvml.nvmlDeviceGetHandleByUUID(spec.gpus[3].uuid) == h(nvml, 3)
    assert nvml.nvmlDeviceGetHandleByUUID(spec.gpus[3].uuid.encode()) == h(nvml, 3)
    assert nvml.nvmlDeviceGetHandleByPciBusId("00000000:28:00.0") == h(nvml, 1)
    assert nvml.nvmlDeviceGetHandleByPciBusId(b"0000:28:00.0") == h(nvml, 1)
    with pytest.raises(nvml.NVMLError_NotFound):
        nvml.nvmlDeviceGetHandleByUUID("GPU-nope")
    with pytest.raises(nvml.NVMLError_NotFound):
        nvml.nvmlDeviceGetHandleByPciBusId("0000:99:00.0")
    with pytest.raises(nvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceGetHandleByPciBusId("not a bus id")


def test_foreign_handle_is_an_invalid_argument(nvml):
    with pytest.raises(nvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceGetName(object())


def test_pci_info_spells_bus_ids_like_nvml(nvml):
    info = nvml.nvmlDeviceGetPciInfo(h(nvml, 1))
    assert info.busId == b"00000000:28:00.0"
    assert info.busIdLegacy == b"0000:28:00.0"
    assert (info.domain, info.bus, info.device) == (0, 0x28, 0)
    assert info.pciDeviceId == 0x233010DE


def test_pci_info_upper_cases_hex_digits():
    spec = make_spec(1)
    spec.gpus[0].pci_bus_id = "0000:bb:00.0"
    fake = FakeNvml(spec)
    fake.nvmlInit()
    assert fake.nvmlDeviceGetPciInfo(h(fake, 0)).busId == b"00000000:BB:00.0"


def test_memory_info_v1_and_v2(nvml, spec):
    spec.gpus[0].processes.append((77, 2 << 30, "python"))
    mem = nvml.nvmlDeviceGetMemoryInfo(h(nvml, 0))
    assert (mem.total, mem.used, mem.free) == (80 << 30, 2 << 30, 78 << 30)
    mem2 = nvml.nvmlDeviceGetMemoryInfo(h(nvml, 0), nvml.nvmlMemory_v2)
    assert (mem2.total, mem2.reserved, mem2.used) == (80 << 30, 0, 2 << 30)
    with pytest.raises(nvml.NVMLError_ArgumentVersionMismatch):
        nvml.nvmlDeviceGetMemoryInfo(h(nvml, 0), 7)


# --- fault semantics -------------------------------------------------------------------------


@pytest.mark.parametrize(("call", "args"), DEVICE_CALLS, ids=[c for c, _ in DEVICE_CALLS])
def test_every_device_call_works_when_healthy_and_raises_gpu_is_lost_when_lost(nvml, spec,
                                                                               call, args):
    handle = h(nvml, 0)
    getattr(nvml, call)(handle, *args)
    spec.gpus[0].lost = True
    with pytest.raises(nvml.NVMLError_GpuIsLost):
        getattr(nvml, call)(handle, *args)


@pytest.mark.parametrize(("call", "args"), DEVICE_CALLS, ids=[c for c, _ in DEVICE_CALLS])
def test_injected_error_hits_that_call_on_that_gpu_only(nvml, spec, call, args):
    spec.gpus[1].nvml_errors[call] = "Timeout"
    with pytest.raises(nvml.NVMLError_Timeout):
        getattr(nvml, call)(h(nvml, 1), *args)
    getattr(nvml, call)(h(nvml, 0), *args)


def test_every_per_gpu_function_is_one_the_fault_tests_exercise():
    handle_lookups = {"nvmlDeviceGetHandleByIndex", "nvmlDeviceGetHandleByUUID",
                      "nvmlDeviceGetHandleByPciBusId"}
    pre_ampere = {"nvmlDeviceGetRetiredPages", "nvmlDeviceGetRetiredPagesPendingStatus"}
    assert fake_nvml.DEVICE_FUNCTIONS - handle_lookups - pre_ampere == {
        c for c, _ in DEVICE_CALLS}


@pytest.mark.parametrize(("call", "args"), DEVICE_CALLS, ids=[c for c, _ in DEVICE_CALLS])
def test_a_node_level_error_hits_that_call_on_every_gpu(nvml, spec, call, args):
    spec.nvml_errors[call] = "InsufficientPower"
    for i in range(len(spec.gpus)):
        with pytest.raises(nvml.NVMLError_InsufficientPower):
            getattr(nvml, call)(h(nvml, i), *args)


@pytest.mark.parametrize("call", ["nvmlDeviceGetCount", "nvmlSystemGetDriverVersion",
                                  "nvmlSystemGetCudaDriverVersion", "nvmlSystemGetNVMLVersion"])
def test_a_node_level_error_hits_a_call_that_names_no_gpu(nvml, spec, call):
    spec.nvml_errors[call] = "Unknown"
    with pytest.raises(nvml.NVMLError_Unknown):
        getattr(nvml, call)()


@pytest.mark.parametrize("call", ["nvmlInit", "nvmlInitWithFlags"])
def test_a_node_level_init_error_fails_init(spec, call):
    spec.nvml_errors[call] = "DriverNotLoaded"
    with pytest.raises(fake_nvml.NVMLError_DriverNotLoaded):
        FakeNvml(spec).nvmlInit()


def test_lost_gpu_is_enumerated_but_its_handle_raises_gpu_is_lost(nvml, spec):
    spec.gpus[2].lost = True
    assert nvml.nvmlDeviceGetCount() == 4
    with pytest.raises(nvml.NVMLError_GpuIsLost):
        h(nvml, 2)


def test_injected_handle_error(nvml, spec):
    spec.gpus[0].nvml_errors["nvmlDeviceGetHandleByIndex"] = "NoPermission"
    with pytest.raises(nvml.NVMLError_NoPermission):
        h(nvml, 0)


def test_spec_is_read_live(nvml, spec):
    handle = h(nvml, 0)
    assert nvml.nvmlDeviceGetRemappedRows(handle) == (0, 0, 0, 0)
    spec.gpus[0].remapped_unc = 2
    spec.gpus[0].remap_pending = True
    assert nvml.nvmlDeviceGetRemappedRows(handle) == (0, 2, 1, 0)


def test_none_in_the_spec_reads_as_not_supported(nvml, spec):
    spec.gpus[0].serial = None
    with pytest.raises(nvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetSerial(h(nvml, 0))


# --- memory health ---------------------------------------------------------------------------


def test_ecc_counters_by_type_and_counter(nvml, spec):
    g = spec.gpus[0]
    g.ecc_volatile_uncorrected, g.ecc_volatile_corrected = 1, 2
    g.ecc_aggregate_uncorrected, g.ecc_aggregate_corrected = 3, 4
    handle = h(nvml, 0)
    get = nvml.nvmlDeviceGetTotalEccErrors
    assert get(handle, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC) == 1
    assert get(handle, nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, nvml.NVML_VOLATILE_ECC) == 2
    assert get(handle, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_AGGREGATE_ECC) == 3
    assert get(handle, nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, nvml.NVML_AGGREGATE_ECC) == 4
    assert nvml.nvmlDeviceGetEccMode(handle) == [1, 1]
    with pytest.raises(nvml.NVMLError_InvalidArgument):
        get(handle, 5, 0)


def test_ecc_disabled_counters_are_not_supported(nvml, spec):
    spec.gpus[0].ecc_enabled = False
    assert nvml.nvmlDeviceGetEccMode(h(nvml, 0)) == [0, 0]
    with pytest.raises(nvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetTotalEccErrors(h(nvml, 0), 1, 0)


def test_retired_pages_are_not_supported_on_ampere_and_newer(nvml):
    with pytest.raises(nvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetRetiredPages(h(nvml, 0), 1)
    with pytest.raises(nvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetRetiredPagesPendingStatus(h(nvml, 0))


def test_volta_retires_pages_and_has_no_row_remapper():
    spec = make_spec(1, name="Tesla V100-SXM2-32GB", retired_pages=3)
    fake = FakeNvml(spec)
    fake.nvmlInit()
    handle = h(fake, 0)
    assert len(fake.nvmlDeviceGetRetiredPages(handle, 1)) == 3
    assert fake.nvmlDeviceGetRetiredPages(handle, 0) == []
    assert fake.nvmlDeviceGetRetiredPagesPendingStatus(handle) == 0
    with pytest.raises(fake.NVMLError_NotSupported):
        fake.nvmlDeviceGetRemappedRows(handle)
    with pytest.raises(fake.NVMLError_NotSupported):
        fake.nvmlDeviceGetRowRemapperHistogram(handle)


def test_row_remapper_histogram_struct(nvml, spec):
    spec.gpus[0].histogram.update({"max": 630, "low": 8, "none": 2})
    hist = nvml.nvmlDeviceGetRowRemapperHistogram(h(nvml, 0))
    assert (hist.max, hist.high, hist.partial, hist.low, hist.none) == (630, 0, 0, 8, 2)


# --- clocks, temperature, power --------------------------------------------------------------


def test_clock_event_reasons_under_both_names(nvml, spec):
    spec.gpus[0].clock_event_reasons = (nvml.nvmlClocksEventReasonHwSlowdown
                                        | nvml.nvmlClocksEventReasonSwPowerCap)
    assert nvml.nvmlDeviceGetCurrentClocksEventReasons(h(nvml, 0)) == 0xC
    assert nvml.nvmlDeviceGetCurrentClocksThrottleReasons(h(nvml, 0)) == 0xC


def test_function_not_found_on_the_new_name_leaves_the_old_one_working(nvml, spec):
    spec.gpus[0].nvml_errors["nvmlDeviceGetCurrentClocksEventReasons"] = "FunctionNotFound"
    with pytest.raises(nvml.NVMLError_FunctionNotFound):
        nvml.nvmlDeviceGetCurrentClocksEventReasons(h(nvml, 0))
    assert nvml.nvmlDeviceGetCurrentClocksThrottleReasons(h(nvml, 0)) == 1


@pytest.mark.parametrize(("policy", "key"), [
    ("NVML_PERF_POLICY_POWER", "power"),
    ("NVML_PERF_POLICY_THERMAL", "thermal"),
    ("NVML_PERF_POLICY_SYNC_BOOST", "sync_boost"),
    ("NVML_PERF_POLICY_BOARD_LIMIT", "board_limit"),
    ("NVML_PERF_POLICY_LOW_UTILIZATION", "low_utilization"),
    ("NVML_PERF_POLICY_RELIABILITY", "reliability"),
    ("NVML_PERF_POLICY_TOTAL_APP_CLOCKS", "total_app_clocks"),
    ("NVML_PERF_POLICY_TOTAL_BASE_CLOCKS", "total_base_clocks"),
])
def test_violation_status_maps_perf_policies_to_spec_keys(nvml, spec, policy, key):
    spec.gpus[0].violation_ns[key] = 5_000_000_000
    v = nvml.nvmlDeviceGetViolationStatus(h(nvml, 0), getattr(nvml, policy))
    assert v.violationTime == 5_000_000_000
    assert v.referenceTime > 0


def test_violation_status_defaults_to_zero_and_refuses_unknown_policies(nvml):
    assert nvml.nvmlDeviceGetViolationStatus(h(nvml, 0), 0).violationTime == 0
    with pytest.raises(nvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceGetViolationStatus(h(nvml, 0), 7)


def test_temperature_and_thresholds(nvml):
    handle = h(nvml, 0)
    assert nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU) == 32
    get = nvml.nvmlDeviceGetTemperatureThreshold
    assert get(handle, nvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN) == 90
    assert get(handle, nvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN) == 92
    assert get(handle, nvml.NVML_TEMPERATURE_THRESHOLD_MEM_MAX) == 95
    with pytest.raises(nvml.NVMLError_NotSupported):
        get(handle, nvml.NVML_TEMPERATURE_THRESHOLD_GPU_MAX)
    with pytest.raises(nvml.NVMLError_InvalidArgument):
        get(handle, 42)
    with pytest.raises(nvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceGetTemperature(handle, 3)


def test_memory_temperature_field_value(nvml, spec):
    values = nvml.nvmlDeviceGetFieldValues(h(nvml, 0), [nvml.NVML_FI_DEV_MEMORY_TEMP, 9999])
    assert values[0].nvmlReturn == nvml.NVML_SUCCESS
    assert values[0].valueType == nvml.NVML_VALUE_TYPE_UNSIGNED_INT
    assert values[0].value.uiVal == 36
    assert values[1].nvmlReturn == nvml.NVML_ERROR_NOT_SUPPORTED
    spec.gpus[0].temperature_memory_c = None
    values = nvml.nvmlDeviceGetFieldValues(h(nvml, 0), [(nvml.NVML_FI_DEV_MEMORY_TEMP, 0)])
    assert values[0].nvmlReturn == nvml.NVML_ERROR_NOT_SUPPORTED


def test_injected_field_error_is_returned_per_field(nvml, spec):
    spec.gpus[0].nvml_errors["NVML_FI_DEV_MEMORY_TEMP"] = "GpuIsLost"
    values = nvml.nvmlDeviceGetFieldValues(h(nvml, 0), [nvml.NVML_FI_DEV_MEMORY_TEMP])
    assert values[0].nvmlReturn == nvml.NVML_ERROR_GPU_IS_LOST


def test_power_and_clocks(nvml):
    handle = h(nvml, 0)
    assert nvml.nvmlDeviceGetPowerUsage(handle) == 70_000
    assert nvml.nvmlDeviceGetEnforcedPowerLimit(handle) == 700_000
    assert nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM) == 1980
    assert nvml.nvmlDeviceGetMaxClockInfo(handle, nvml.NVML_CLOCK_GRAPHICS) == 1980
    with pytest.raises(nvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_MEM)
    with pytest.raises(nvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceGetClockInfo(handle, 9)


# --- interconnects ---------------------------------------------------------------------------


def test_nvlink_state_per_link_and_beyond_the_gpus_links(nvml, spec):
    spec.gpus[0].nvlink_up[5] = False
    handle = h(nvml, 0)
    assert nvml.nvmlDeviceGetNvLinkState(handle, 4) == nvml.NVML_FEATURE_ENABLED
    assert nvml.nvmlDeviceGetNvLinkState(handle, 5) == nvml.NVML_FEATURE_DISABLED
    with pytest.raises(nvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceGetNvLinkState(handle, 18)


def test_gpu_without_nvlink_says_not_supported(nvml, spec):
    spec.gpus[0].nvlink_up = []
    with pytest.raises(nvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetNvLinkState(h(nvml, 0), 0)


@pytest.mark.parametrize("spelling", ["crc_flit", "DL_CRC_FLIT", "NVML_NVLINK_ERROR_DL_CRC_FLIT"])
def test_nvlink_error_counters(nvml, spec, spelling):
    spec.gpus[0].nvlink_errors[(3, spelling)] = 17
    spec.gpus[0].nvlink_errors[(3, "replay")] = 2
    handle = h(nvml, 0)
    assert nvml.nvmlDeviceGetNvLinkErrorCounter(handle, 3, nvml.NVML_NVLINK_ERROR_DL_CRC_FLIT) == 17
    assert nvml.nvmlDeviceGetNvLinkErrorCounter(handle, 3, nvml.NVML_NVLINK_ERROR_DL_REPLAY) == 2
    assert nvml.nvmlDeviceGetNvLinkErrorCounter(handle, 4, nvml.NVML_NVLINK_ERROR_DL_REPLAY) == 0
    with pytest.raises(nvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceGetNvLinkErrorCounter(handle, 3, 9)


def test_pcie_link_and_replay_counter(nvml, spec):
    g = spec.gpus[0]
    g.pcie_gen_current, g.pcie_width_current, g.pcie_replay_counter = 3, 8, 12
    handle = h(nvml, 0)
    assert nvml.nvmlDeviceGetCurrPcieLinkGeneration(handle) == 3
    assert nvml.nvmlDeviceGetCurrPcieLinkWidth(handle) == 8
    assert nvml.nvmlDeviceGetMaxPcieLinkGeneration(handle) == 5
    assert nvml.nvmlDeviceGetMaxPcieLinkWidth(handle) == 16
    assert nvml.nvmlDeviceGetPcieReplayCounter(handle) == 12


@pytest.mark.parametrize("by_reference", [True, False])
def test_fabric_info_fills_the_callers_struct(nvml, by_reference):
    info = nvml.c_nvmlGpuFabricInfoV_t()
    assert info.version == nvml.nvmlGpuFabricInfo_v2
    arg = ctypes.byref(info) if by_reference else info
    assert nvml.nvmlDeviceGetGpuFabricInfoV(h(nvml, 0), arg) == nvml.NVML_SUCCESS
    assert info.state == nvml.NVML_GPU_FABRIC_STATE_COMPLETED
    assert info.status == nvml.NVML_SUCCESS
    assert any(bytes(info.clusterUuid))


def test_fabric_info_in_progress_and_unsupported(nvml, spec):
    spec.gpus[0].fabric_state = nvml.NVML_GPU_FABRIC_STATE_IN_PROGRESS
    spec.gpus[0].fabric_status = nvml.NVML_ERROR_NOT_READY
    info = nvml.c_nvmlGpuFabricInfo_t()
    nvml.nvmlDeviceGetGpuFabricInfo(h(nvml, 0), ctypes.byref(info))
    assert (info.state, info.status) == (2, 27)
    assert not any(bytes(info.clusterUuid))
    spec.gpus[0].fabric_supported = False
    with pytest.raises(nvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetGpuFabricInfo(h(nvml, 0), ctypes.byref(info))


def test_versioned_fabric_info_checks_the_struct_version(nvml):
    with pytest.raises(nvml.NVMLError_ArgumentVersionMismatch):
        nvml.nvmlDeviceGetGpuFabricInfoV(h(nvml, 0), ctypes.byref(nvml.c_nvmlGpuFabricInfo_t()))
    v3 = nvml.c_nvmlGpuFabricInfo_v3_t()
    nvml.nvmlDeviceGetGpuFabricInfoV(h(nvml, 0), ctypes.byref(v3))
    assert v3.state == nvml.NVML_GPU_FABRIC_STATE_COMPLETED


# --- MIG and processes -----------------------------------------------------------------------


def test_mig_mode(nvml, spec):
    assert nvml.nvmlDeviceGetMigMode(h(nvml, 0)) == [0, 0]
    spec.gpus[0].mig_enabled = True
    assert nvml.nvmlDeviceGetMigMode(h(nvml, 0)) == [1, 1]


def test_mig_mode_is_not_supported_on_parts_without_mig():
    fake = FakeNvml(make_spec(1, name="NVIDIA L40S"))
    fake.nvmlInit()
    with pytest.raises(fake.NVMLError_NotSupported):
        fake.nvmlDeviceGetMigMode(h(fake, 0))


def test_processes_are_friendly_objects_like_pynvml(nvml, spec):
    spec.gpus[0].processes.append((4242, 3 << 30, "python"))
    procs = nvml.nvmlDeviceGetComputeRunningProcesses(h(nvml, 0))
    assert [(p.pid, p.usedGpuMemory) for p in procs] == [(4242, 3 << 30)]
    assert isinstance(procs[0], nvml.nvmlFriendlyObject)
    assert nvml.nvmlDeviceGetGraphicsRunningProcesses(h(nvml, 0)) == []


def test_unversioned_process_call_on_an_old_driver_raises_library_mismatch(nvml, spec):
    spec.gpus[0].nvml_errors["nvmlDeviceGetComputeRunningProcesses_v3"] = "FunctionNotFound"
    with pytest.raises(nvml.NVMLLibraryMismatchError):
        nvml.nvmlDeviceGetComputeRunningProcesses(h(nvml, 0))
    assert nvml.nvmlDeviceGetComputeRunningProcesses_v2(h(nvml, 0)) == []


# --- module surface and threads --------------------------------------------------------------


def test_fake_pynvml_module_is_a_module_with_the_same_surface(spec):
    module = fake_pynvml_module(spec)
    assert isinstance(module, types.ModuleType)
    module.nvmlInit()
    assert module.nvmlDeviceGetCount() == 4
    handle = module.nvmlDeviceGetHandleByIndex(0)
    spec.gpus[0].lost = True
    with pytest.raises(module.NVMLError_GpuIsLost):
        module.nvmlDeviceGetName(handle)
    assert module.NVML_FI_DEV_MEMORY_TEMP == 82
    assert module.fake.calls["nvmlDeviceGetCount"] == 1


def test_concurrent_calls_keep_the_refcount_consistent(spec):
    fake = FakeNvml(spec)
    fake.nvmlInit()
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            for _ in range(200):
                fake.nvmlInit()
                fake.nvmlDeviceGetName(fake.nvmlDeviceGetHandleByIndex(1))
                fake.nvmlShutdown()
        except BaseException as exc:  # noqa: BLE001 - collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    fake.nvmlShutdown()
    with pytest.raises(fake.NVMLError_Uninitialized):
        fake.nvmlDeviceGetCount()


# --- conformance with the real pynvml ----------------------------------------------------------


@pytest.fixture(scope="module")
def pynvml():
    return pytest.importorskip("pynvml")


def test_every_constant_equals_pynvmls(pynvml):
    assert len(fake_nvml.CONSTANTS) > 100
    mismatched = {name: (value, getattr(pynvml, name, "<absent>"))
                  for name, value in fake_nvml.CONSTANTS.items()
                  if getattr(pynvml, name, object()) != value}
    assert mismatched == {}


def test_exception_classes_match_pynvmls(pynvml):
    real = {name for name in dir(pynvml) if name.startswith("NVMLError_")}
    assert set(fake_nvml.ERROR_CLASSES) == real
    for name, cls in fake_nvml.ERROR_CLASSES.items():
        assert cls().value == getattr(pynvml, name)().value, name
    assert hasattr(pynvml, "NVMLLibraryMismatchError")


def test_the_calls_that_name_no_gpu_take_no_device_in_pynvml_and_the_rest_do(pynvml):
    for name in fake_nvml.SYSTEM_FUNCTIONS:
        params = list(inspect.signature(inspect.unwrap(getattr(pynvml, name))).parameters)
        assert params in ([], ["flags"]), (name, params)
    for name in fake_nvml.DEVICE_FUNCTIONS:
        params = list(inspect.signature(inspect.unwrap(getattr(pynvml, name))).parameters)
        assert params and params[0] in ("handle", "device", "index", "uuid", "pciBusId"), (
            name, params)
    assert set(fake_nvml.FUNCTIONS) == (fake_nvml.SYSTEM_FUNCTIONS | fake_nvml.DEVICE_FUNCTIONS
                                        | {"nvmlErrorString", "nvmlExceptionClass"})


def test_every_error_name_is_a_pynvml_error_class(pynvml):
    assert {f"NVMLError_{n}" for n in fake_nvml.ERROR_NAMES} == {
        n for n in dir(pynvml) if n.startswith("NVMLError_")}


def test_every_fake_function_exists_in_pynvml_with_the_same_parameters(pynvml):
    fake = FakeNvml(make_spec(1))
    for name in fake_nvml.FUNCTIONS:
        real = getattr(pynvml, name, None)
        assert callable(real), f"pynvml has no {name}"
        real_params = list(inspect.signature(inspect.unwrap(real)).parameters)
        fake_params = list(inspect.signature(getattr(fake, name)).parameters)
        assert fake_params == real_params, name


def _shape(struct: type) -> list[tuple[str, int]]:
    return [(name, ctypes.sizeof(ctype)) for name, ctype, *_ in struct._fields_]


def test_structs_have_pynvmls_layout(pynvml):
    for name, struct in fake_nvml.STRUCTS.items():
        real = getattr(pynvml, name)
        assert _shape(struct) == _shape(real), name
        assert ctypes.sizeof(struct) == ctypes.sizeof(real), name
    assert pynvml.c_nvmlGpuFabricInfoV_t().version == fake_nvml.c_nvmlGpuFabricInfoV_t().version
