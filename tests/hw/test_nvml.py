"""NvmlReader against the fake pynvml (every reader, every error path) and against real pynvml."""

from __future__ import annotations

import ctypes
import pickle
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_monitor.hw import nvml as nvml_mod
from gpu_monitor.hw import nvml_reader
from gpu_monitor.hw.nvml import (
    EccInfo,
    FabricInfo,
    GpuProcess,
    NvmlError,
    NvmlErrorKind,
    PcieLink,
    RemapHistogram,
    RemapInfo,
    SystemInfo,
    Temperatures,
    translate_error,
)
from gpu_monitor.hw.nvml_reader import NvmlReader
from gpu_monitor.sim.fake_nvml import FakeNvml
from gpu_monitor.sim.spec import GpuSpec, NodeSpec

H100 = "NVIDIA H100 80GB HBM3"
K = NvmlErrorKind


def nvml_raises(kind: NvmlErrorKind, call: Callable[..., object], *args: Any) -> NvmlError:
    """The NvmlError ``call(*args)`` raises, held to ``kind``."""
    with pytest.raises(NvmlError) as info:
        call(*args)
    assert info.value.kind is kind
    return info.value


def make_spec(n: int = 8, name: str = H100, **gpu_fields: Any) -> NodeSpec:
    gpus = [
        GpuSpec(index=i, uuid=f"GPU-{i:08x}-aaaa-bbbb-cccc-ddddeeeeffff", name=name,
                pci_bus_id=f"0000:{0x18 + 0x10 * i:02x}:00.0", nvlink_up=[True] * 18,
                **gpu_fields)
        for i in range(n)
    ]
    return NodeSpec(profile="h100-sxm-8", gpus=gpus)


class Overlay:
    """A pynvml-like module: ``base`` with some functions replaced and some names hidden (older
    bindings)."""

    def __init__(self, base: Any, hidden: tuple[str, ...] = (), **overrides: Any):
        self._base, self._hidden, self._overrides = base, hidden, overrides

    def __getattr__(self, name: str) -> Any:
        if name in self._hidden:
            raise AttributeError(name)
        if name in self._overrides:
            return self._overrides[name]
        return getattr(self._base, name)


@pytest.fixture
def spec() -> NodeSpec:
    return make_spec()


@pytest.fixture
def fake(spec: NodeSpec) -> FakeNvml:
    return FakeNvml(spec)


@pytest.fixture
def reader(fake: FakeNvml) -> NvmlReader:
    r = NvmlReader(fake)
    yield r
    r.close()


# --- lifecycle and availability --------------------------------------------------------------


def test_importing_the_reader_does_not_import_pynvml():
    code = ("import sys, gpu_monitor.hw.nvml, gpu_monitor.hw.nvml_reader, gpu_monitor.sim.fake_nvml; "
            "sys.exit(1 if 'pynvml' in sys.modules else 0)")
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_start_is_idempotent_and_inits_once(reader, fake):
    reader.start()
    reader.start()
    assert reader.available()
    assert fake.calls["nvmlInitWithFlags"] == 1


def test_concurrent_starts_init_once(fake):
    reader = NvmlReader(fake)
    barrier = threading.Barrier(16)

    def go() -> None:
        barrier.wait()
        reader.start()

    threads = [threading.Thread(target=go) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert fake.calls["nvmlInitWithFlags"] == 1
    assert reader.available()


def test_close_shuts_nvml_down_and_a_later_call_starts_again(reader, fake):
    assert reader.count() == 8
    reader.close()
    assert fake.calls["nvmlShutdown"] == 1
    with pytest.raises(fake.NVMLError_Uninitialized):
        fake.nvmlDeviceGetCount()
    assert reader.count() == 8
    assert fake.calls["nvmlInitWithFlags"] == 2


def test_context_manager_closes(fake):
    with NvmlReader(fake) as reader:
        assert reader.count() == 8
    assert fake.calls["nvmlShutdown"] == 1


def test_loader_is_called_lazily_once(fake):
    loads: list[int] = []

    def loader() -> FakeNvml:
        loads.append(1)
        return fake

    reader = NvmlReader(loader)
    assert loads == []
    assert reader.available() and reader.available()
    assert loads == [1]


def test_missing_bindings_make_the_reader_unavailable_not_crashed():
    def loader() -> Any:
        raise ModuleNotFoundError("No module named 'pynvml'")

    reader = NvmlReader(loader)
    reader.start()
    assert not reader.available()
    assert reader.unavailable_reason() == "nvidia-ml-py not installed"
    assert reader.init_error.kind is K.BINDINGS_MISSING
    nvml_raises(K.BINDINGS_MISSING, reader.gpus)


def test_broken_bindings_are_unavailable_with_the_error():
    def loader() -> Any:
        raise OSError("bad ELF header")

    reader = NvmlReader(loader)
    assert not reader.available()
    assert "bad ELF header" in reader.unavailable_reason()


def test_junk_instead_of_a_module_is_a_type_error():
    with pytest.raises(TypeError):
        NvmlReader(42)


def test_missing_nvml_library_is_unavailable_with_a_reason(spec):
    spec.nvml_library_missing = True
    reader = NvmlReader(FakeNvml(spec))
    assert not reader.available()
    assert reader.unavailable_reason() == (
        "NVML library not found (libnvidia-ml.so.1): driver not installed")
    assert reader.init_error.kind is K.LIBRARY_NOT_FOUND
    assert reader.init_error.call == "nvmlInit"


@pytest.mark.parametrize(("error", "kind", "reason"), [
    ("DriverNotLoaded", K.DRIVER_NOT_LOADED, "NVIDIA kernel driver not loaded"),
    ("NoPermission", K.NO_PERMISSION, "no permission to open the NVIDIA device files"),
    ("LibRmVersionMismatch", K.LIB_RM_VERSION_MISMATCH,
     "NVML library and kernel driver versions differ (driver updated without a reboot?)"),
    ("Unknown", K.UNKNOWN, "NVML initialisation failed: nvmlInit: Unknown Error (unknown)"),
    ("Timeout", K.TIMEOUT, "NVML initialisation failed: nvmlInit: Timeout (timeout)"),
])
def test_init_failures_name_their_cause(spec, error, kind, reason):
    reader = NvmlReader(FakeNvml(spec, system_errors={"nvmlInit": error}))
    assert not reader.available()
    assert reader.init_error.kind is kind
    assert reader.unavailable_reason() == reason


def test_init_failure_is_sticky_until_close(spec):
    fake = FakeNvml(spec, system_errors={"nvmlInit": "DriverNotLoaded"})
    reader = NvmlReader(fake)
    assert not reader.available()
    fake.system_errors.clear()
    assert not reader.available()
    assert fake.calls["nvmlInitWithFlags"] == 1
    reader.close()
    assert reader.available()


def test_reader_calls_when_unavailable_raise_the_init_kind(spec):
    spec.nvml_library_missing = True
    reader = NvmlReader(FakeNvml(spec))
    for call in (reader.system, reader.count, lambda: reader.ecc(0), lambda: reader.fabric(0)):
        nvml_raises(K.LIBRARY_NOT_FOUND, call)


def _nvml_library_loadable() -> bool:
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


def test_real_pynvml_through_the_default_loader():
    pytest.importorskip("pynvml")
    reader = NvmlReader()
    if _nvml_library_loadable():
        assert reader.available(), reader.unavailable_reason()
        assert reader.count() >= 0
        reader.close()
    else:
        assert not reader.available()
        assert reader.init_error.kind is K.LIBRARY_NOT_FOUND
        assert "libnvidia-ml.so.1" in reader.unavailable_reason()


# --- error translation -----------------------------------------------------------------------


@pytest.mark.parametrize(("error", "kind"), [
    ("NotSupported", K.NOT_SUPPORTED),
    ("GpuIsLost", K.GPU_LOST),
    ("Unknown", K.UNKNOWN),
    ("NoPermission", K.NO_PERMISSION),
    ("Timeout", K.TIMEOUT),
    ("Uninitialized", K.UNINITIALIZED),
    ("InvalidArgument", K.INVALID_ARGUMENT),
    ("DriverNotLoaded", K.DRIVER_NOT_LOADED),
    ("LibraryNotFound", K.LIBRARY_NOT_FOUND),
    ("NotFound", K.NOT_FOUND),
    ("FunctionNotFound", K.FUNCTION_NOT_FOUND),
    ("ResetRequired", K.RESET_REQUIRED),
    ("CorruptedInforom", K.CORRUPTED_INFOROM),
    ("InsufficientResources", K.INSUFFICIENT_RESOURCES),
    ("InsufficientPower", K.INSUFFICIENT_POWER),
    ("IrqIssue", K.IRQ_ISSUE),
    ("NotReady", K.NOT_READY),
])
def test_nvml_errors_become_nvmlerror_with_kind_call_and_gpu(reader, spec, error, kind):
    spec.gpus[3].nvml_errors["nvmlDeviceGetRemappedRows"] = error
    with pytest.raises(NvmlError) as info:
        reader.remapped_rows(3)
    err = info.value
    assert (err.kind, err.call, err.gpu_index) == (kind, "nvmlDeviceGetRemappedRows", 3)
    assert err.message
    assert "gpu:3" in str(err)
    assert reader.remapped_rows(2) == RemapInfo(0, 0, False, False)


def test_nvmlerror_survives_pickling():
    err = NvmlError(K.GPU_LOST, "nvmlDeviceGetName", 2, "GPU is lost", 15)
    back = pickle.loads(pickle.dumps(err))
    assert (back.kind, back.call, back.gpu_index, back.message, back.code) == (
        K.GPU_LOST, "nvmlDeviceGetName", 2, "GPU is lost", 15)


def test_real_pynvml_exceptions_translate_by_code_and_name():
    pynvml = pytest.importorskip("pynvml")
    assert translate_error(pynvml.NVMLError_GpuIsLost(), "x").kind is K.GPU_LOST
    assert translate_error(pynvml.NVMLError(3), "x").kind is K.NOT_SUPPORTED
    mismatch = pynvml.NVMLLibraryMismatchError("use _v2")
    assert translate_error(mismatch, "x").kind is K.FUNCTION_NOT_FOUND
    assert translate_error(ValueError("bug"), "x") is None


def test_error_class_without_a_value_is_matched_by_name():
    class NVMLError(Exception):
        pass

    class NVMLError_GpuIsLost(NVMLError):  # noqa: N801 - pynvml's spelling
        pass

    assert translate_error(NVMLError_GpuIsLost(), "x").kind is K.GPU_LOST


def test_non_nvml_exceptions_are_not_disguised_as_hardware_findings(fake):
    def broken(handle: Any) -> Any:
        raise TypeError("bug in bindings")

    reader = NvmlReader(Overlay(fake, nvmlDeviceGetRemappedRows=broken))
    with pytest.raises(TypeError):
        reader.remapped_rows(0)


def test_call_missing_from_old_bindings_is_function_not_found(fake):
    reader = NvmlReader(Overlay(fake, hidden=("nvmlDeviceGetRowRemapperHistogram",)))
    nvml_raises(K.FUNCTION_NOT_FOUND, reader.remap_histogram, 0)


# --- system and enumeration ------------------------------------------------------------------


def test_system_info(reader):
    assert reader.system() == SystemInfo("550.90.07", "12.4", "12.550.90.07")


def test_cuda_version_formatting(spec):
    spec.cuda_driver_version = 12080
    assert NvmlReader(FakeNvml(spec)).system().cuda_driver_version == "12.8"


def test_gpus_are_enumerated_with_canonical_pci_ids(reader, spec):
    gpus = reader.gpus()
    assert [g.index for g in gpus] == list(range(8))
    assert gpus[1].uuid == spec.gpus[1].uuid
    assert gpus[1].name == H100
    assert gpus[1].pci_bus_id == "0000:28:00.0"
    assert gpus[1].serial == "1650000000000"
    assert gpus[1].memory_total_bytes == 80 * 1024**3
    assert not any(g.lost or g.error for g in gpus)


@pytest.mark.parametrize(("bus_id", "canonical"), [
    (b"00000000:3B:00.0", "0000:3b:00.0"),
    (b"0000:3b:00.0", "0000:3b:00.0"),
    ("00000001:C1:00.0", "0001:c1:00.0"),
    (b"00000000:BB:00.1", "0000:bb:00.1"),
])
def test_pci_bus_id_normalisation(fake, bus_id, canonical):
    reader = NvmlReader(Overlay(fake, nvmlDeviceGetPciInfo=lambda h: SimpleNamespace(busId=bus_id)))
    assert reader.gpu_info(0).pci_bus_id == canonical


def test_missing_gpu_is_absent_and_indices_follow_nvml(reader, spec):
    spec.gpus[3].missing = True
    gpus = reader.gpus()
    assert len(gpus) == 7
    assert gpus[3].uuid == spec.gpus[4].uuid


def test_lost_gpu_is_listed_as_lost_not_dropped(reader, spec):
    spec.gpus[2].lost = True
    gpus = reader.gpus()
    assert len(gpus) == 8
    assert gpus[2].lost and gpus[2].uuid is None
    assert gpus[2].error.kind is K.GPU_LOST
    assert not gpus[1].lost


def test_gpu_lost_midway_keeps_what_was_read(reader, spec):
    spec.gpus[2].nvml_errors["nvmlDeviceGetPciInfo"] = "GpuIsLost"
    info = reader.gpu_info(2)
    assert info.lost
    assert (info.uuid, info.name, info.pci_bus_id) == (spec.gpus[2].uuid, H100, None)


def test_unsupported_serial_is_none_without_error(reader, spec):
    spec.gpus[0].nvml_errors["nvmlDeviceGetSerial"] = "NotSupported"
    info = reader.gpu_info(0)
    assert info.serial is None and info.error is None and not info.lost


def test_identity_error_is_kept_on_the_gpu(reader, spec):
    spec.gpus[0].nvml_errors["nvmlDeviceGetName"] = "Unknown"
    info = reader.gpu_info(0)
    assert info.name is None and not info.lost
    assert info.error.kind is K.UNKNOWN
    assert info.uuid == spec.gpus[0].uuid


def test_handle_error_other_than_lost(reader, spec):
    spec.gpus[0].nvml_errors["nvmlDeviceGetHandleByIndex"] = "Unknown"
    info = reader.gpu_info(0)
    assert not info.lost and info.error.kind is K.UNKNOWN


def test_every_identity_error_is_kept_in_call_order_and_the_first_is_error(reader, spec):
    spec.gpus[4].nvml_errors.update({"nvmlDeviceGetName": "InsufficientPower",
                                     "nvmlDeviceGetSerial": "Timeout"})
    info = reader.gpu_info(4)
    assert [(e.call, e.kind) for e in info.errors] == [
        ("nvmlDeviceGetName", K.INSUFFICIENT_POWER), ("nvmlDeviceGetSerial", K.TIMEOUT)]
    assert info.error is info.errors[0] and info.error.gpu_index == 4
    assert not info.identified and not info.lost
    assert (info.uuid, info.pci_bus_id) == (spec.gpus[4].uuid, "0000:58:00.0")


@pytest.mark.parametrize("call", ["nvmlDeviceGetHandleByIndex", "nvmlDeviceGetUUID",
                                  "nvmlDeviceGetName", "nvmlDeviceGetPciInfo"])
def test_a_required_identity_call_unsupported_is_an_error_not_a_blank(reader, spec, call):
    spec.gpus[1].nvml_errors[call] = "NotSupported"
    info = reader.gpu_info(1)
    assert not info.identified
    assert (info.error.call, info.error.kind) == (call, K.NOT_SUPPORTED)


def test_a_gpu_read_whole_is_identified(reader):
    assert all(g.identified and g.errors == () and g.error is None for g in reader.gpus())


def test_a_lost_gpu_is_not_identified_and_keeps_the_errors_before(reader, spec):
    spec.gpus[2].nvml_errors.update({"nvmlDeviceGetUUID": "Unknown",
                                     "nvmlDeviceGetPciInfo": "GpuIsLost"})
    info = reader.gpu_info(2)
    assert info.lost and not info.identified
    assert [e.call for e in info.errors] == ["nvmlDeviceGetUUID", "nvmlDeviceGetPciInfo"]
    assert info.name == H100 and info.uuid is None


def test_gpuinfo_error_and_errors_imply_each_other():
    err = NvmlError(K.GPU_LOST, "nvmlDeviceGetHandleByIndex", 0)
    assert nvml_mod.GpuInfo(0, lost=True, error=err).errors == (err,)
    assert nvml_mod.GpuInfo(0, errors=(err,)).error is err
    assert nvml_mod.GpuInfo(0).identified


@pytest.mark.parametrize("bus_id", [b"", b"garbage", b"0000:zz:00.0", "GPU-1234"])
def test_an_unusable_pci_bus_id_is_an_error_of_its_call(fake, bus_id):
    reader = NvmlReader(Overlay(fake, nvmlDeviceGetPciInfo=lambda h: SimpleNamespace(busId=bus_id)))
    info = reader.gpu_info(0)
    assert info.pci_bus_id is None and not info.identified
    assert (info.error.call, info.error.kind) == ("nvmlDeviceGetPciInfo", K.UNKNOWN)
    assert "unusable pci_bus_id" in info.error.message


@settings(deadline=None, derandomize=True, max_examples=200)
@given(st.one_of(st.binary(max_size=40), st.text(max_size=40)))
def test_gpu_info_never_raises_whatever_bus_id_nvml_returns(bus_id):
    fake = FakeNvml(make_spec(1))
    reader = NvmlReader(Overlay(fake, nvmlDeviceGetPciInfo=lambda h: SimpleNamespace(busId=bus_id)))
    info = reader.gpu_info(0)
    assert (info.pci_bus_id is None) == (not info.identified)
    if info.pci_bus_id is not None:
        assert re.fullmatch(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]", info.pci_bus_id)


def test_count_error_raises(reader, fake):
    fake.system_errors["nvmlDeviceGetCount"] = "Unknown"
    assert nvml_raises(K.UNKNOWN, reader.gpus).call == "nvmlDeviceGetCount"


# --- handle cache ----------------------------------------------------------------------------


def test_handles_are_cached(reader, fake):
    reader.ecc(1)
    reader.remapped_rows(1)
    reader.temperatures(1)
    assert fake.calls["nvmlDeviceGetHandleByIndex"] == 1


def test_gpu_is_lost_drops_the_cached_handle(reader, fake, spec):
    reader.ecc(1)
    spec.gpus[1].nvml_errors["nvmlDeviceGetRemappedRows"] = "GpuIsLost"
    nvml_raises(K.GPU_LOST, reader.remapped_rows, 1)
    del spec.gpus[1].nvml_errors["nvmlDeviceGetRemappedRows"]
    assert reader.remapped_rows(1) == RemapInfo(0, 0, False, False)
    assert fake.calls["nvmlDeviceGetHandleByIndex"] == 2


def test_other_errors_keep_the_cached_handle(reader, fake, spec):
    reader.ecc(1)
    spec.gpus[1].nvml_errors["nvmlDeviceGetRemappedRows"] = "Unknown"
    with pytest.raises(NvmlError):
        reader.remapped_rows(1)
    reader.ecc(1)
    assert fake.calls["nvmlDeviceGetHandleByIndex"] == 1


def test_lost_gpu_keeps_failing_until_it_comes_back(reader, spec):
    assert reader.pcie_replay_counter(0) == 0
    spec.gpus[0].lost = True
    for _ in range(2):
        nvml_raises(K.GPU_LOST, reader.pcie_replay_counter, 0)
    spec.gpus[0].lost = False
    assert reader.pcie_replay_counter(0) == 0


# --- memory health ---------------------------------------------------------------------------


def test_ecc_healthy_and_with_errors(reader, spec):
    assert reader.ecc(0) == EccInfo(True, 0, 0, 0, 0, True)
    g = spec.gpus[0]
    g.ecc_volatile_uncorrected, g.ecc_volatile_corrected = 2, 7
    g.ecc_aggregate_uncorrected, g.ecc_aggregate_corrected = 5, 90
    assert reader.ecc(0) == EccInfo(True, 2, 7, 5, 90, True)


def test_ecc_disabled_has_no_counters(reader, spec):
    spec.gpus[0].ecc_enabled = False
    assert reader.ecc(0) == EccInfo(False, None, None, None, None, False)


def test_ecc_unsupported_counters_are_none(reader, spec):
    spec.gpus[0].nvml_errors["nvmlDeviceGetTotalEccErrors"] = "NotSupported"
    assert reader.ecc(0) == EccInfo(True, None, None, None, None, True)


@pytest.mark.parametrize(("error", "kind"), [("NotSupported", K.NOT_SUPPORTED),
                                             ("GpuIsLost", K.GPU_LOST),
                                             ("NoPermission", K.NO_PERMISSION)])
def test_ecc_mode_errors_raise(reader, spec, error, kind):
    spec.gpus[0].nvml_errors["nvmlDeviceGetEccMode"] = error
    nvml_raises(kind, reader.ecc, 0)


def test_ecc_counter_errors_other_than_not_supported_raise(reader, spec):
    spec.gpus[0].nvml_errors["nvmlDeviceGetTotalEccErrors"] = "Unknown"
    nvml_raises(K.UNKNOWN, reader.ecc, 0)


def test_retired_pages_on_volta_and_not_supported_on_hopper(reader):
    volta = NvmlReader(FakeNvml(make_spec(1, name="Tesla V100-SXM2-32GB", retired_pages=4)))
    pages = volta.retired_pages(0)
    assert (pages.single_bit, pages.double_bit, pages.pending) == (0, 4, False)
    nvml_raises(K.NOT_SUPPORTED, reader.retired_pages, 0)


def test_remapped_rows_with_faults(reader, spec):
    g = spec.gpus[4]
    g.remapped_corr, g.remapped_unc, g.remap_pending, g.remap_failure = 1, 2, True, True
    assert reader.remapped_rows(4) == RemapInfo(1, 2, True, True)


def test_remapped_rows_not_supported_before_ampere():
    reader = NvmlReader(FakeNvml(make_spec(1, name="Tesla V100-SXM2-32GB")))
    nvml_raises(K.NOT_SUPPORTED, reader.remapped_rows, 0)


def test_remap_histogram(reader, spec):
    assert reader.remap_histogram(0) == RemapHistogram(640, 0, 0, 0, 0)
    spec.gpus[0].histogram.update({"max": 600, "partial": 30, "low": 8, "none": 2})
    assert reader.remap_histogram(0) == RemapHistogram(600, 0, 30, 8, 2)


def test_remap_histogram_on_a_driver_without_it(reader, spec):
    spec.gpus[0].nvml_errors["nvmlDeviceGetRowRemapperHistogram"] = "FunctionNotFound"
    nvml_raises(K.FUNCTION_NOT_FOUND, reader.remap_histogram, 0)


# --- clocks, temperature, power --------------------------------------------------------------


def test_clock_event_reasons(reader, spec):
    assert reader.clock_event_reasons(0) == 0x1
    spec.gpus[0].clock_event_reasons = 0x8 | 0x40
    assert reader.clock_event_reasons(0) == 0x48


def test_clock_event_reasons_fall_back_on_a_pre_r535_driver(reader, spec):
    spec.gpus[0].clock_event_reasons = 0x8
    spec.gpus[0].nvml_errors["nvmlDeviceGetCurrentClocksEventReasons"] = "FunctionNotFound"
    assert reader.clock_event_reasons(0) == 0x8


def test_clock_event_reasons_with_old_bindings(fake, spec):
    spec.gpus[0].clock_event_reasons = 0x20
    reader = NvmlReader(Overlay(fake, hidden=("nvmlDeviceGetCurrentClocksEventReasons",)))
    assert reader.clock_event_reasons(0) == 0x20
    assert "nvmlDeviceGetCurrentClocksEventReasons" not in fake.calls


def test_clock_event_reasons_other_errors_do_not_fall_back(reader, spec):
    spec.gpus[0].nvml_errors["nvmlDeviceGetCurrentClocksEventReasons"] = "GpuIsLost"
    nvml_raises(K.GPU_LOST, reader.clock_event_reasons, 0)


def test_violation_time_by_name_and_by_constant(reader, spec):
    spec.gpus[0].violation_ns["thermal"] = 3_000_000
    by_name = reader.violation_ns(0, "thermal")
    assert by_name.violation_ns == 3_000_000
    assert by_name.reference_ns == by_name.reference_us * 1000
    assert reader.violation_ns(0, nvml_mod.NVML_PERF_POLICY_THERMAL).violation_ns == 3_000_000
    assert reader.violation_ns(0, "power").violation_ns == 0
    with pytest.raises(ValueError):
        reader.violation_ns(0, "bogus")


def test_temperatures(reader):
    assert reader.temperatures(0) == Temperatures(32, 36, 90, 92, 95)


def test_memory_temperature_not_supported_is_none(reader, spec):
    spec.gpus[0].temperature_memory_c = None
    spec.gpus[0].memory_max_threshold_c = None
    assert reader.temperatures(0) == Temperatures(32, None, 90, 92, None)


def test_field_values_call_not_supported_is_none(reader, spec):
    spec.gpus[0].nvml_errors["nvmlDeviceGetFieldValues"] = "NotSupported"
    assert reader.temperatures(0).memory_c is None


@pytest.mark.parametrize(("error", "kind"), [("GpuIsLost", K.GPU_LOST), ("Unknown", K.UNKNOWN)])
def test_memory_temperature_field_errors_raise(reader, spec, fake, error, kind):
    reader.ecc(0)
    spec.gpus[0].nvml_errors["NVML_FI_DEV_MEMORY_TEMP"] = error
    err = nvml_raises(kind, reader.temperatures, 0)
    assert err.call == "nvmlDeviceGetFieldValues(NVML_FI_DEV_MEMORY_TEMP)"


def test_core_temperature_error_raises(reader, spec):
    spec.gpus[0].nvml_errors["nvmlDeviceGetTemperature"] = "Unknown"
    with pytest.raises(NvmlError):
        reader.temperatures(0)


def test_power_and_clocks(reader, spec):
    assert reader.power(0) == nvml_mod.Power(70_000, 700_000)
    assert reader.clocks(0) == nvml_mod.Clocks(1980, 1980)
    spec.gpus[0].nvml_errors["nvmlDeviceGetEnforcedPowerLimit"] = "NotSupported"
    assert reader.power(0).limit_mw is None
    spec.gpus[0].nvml_errors["nvmlDeviceGetPowerUsage"] = "NotSupported"
    with pytest.raises(NvmlError):
        reader.power(0)


def test_numa_node(reader, spec):
    spec.gpus[5].numa_node = 1
    assert reader.numa_node(5) == 1
    spec.gpus[5].nvml_errors["nvmlDeviceGetNumaNodeId"] = "FunctionNotFound"
    assert reader.numa_node(5) is None


# --- interconnects ---------------------------------------------------------------------------


def test_nvlink_states(reader, spec):
    spec.gpus[0].nvlink_up[7] = False
    states = reader.nvlink_states(0)
    assert len(states) == 18
    assert states[7] is False and states.count(True) == 17


def test_nvlink_states_stop_at_the_gpus_link_count(reader, spec):
    spec.gpus[0].nvlink_up = [True] * 12
    assert reader.nvlink_states(0, max_links=18) == [True] * 12
    assert reader.nvlink_states(0, max_links=4) == [True] * 4


def test_gpu_without_nvlink_has_no_links(reader, spec):
    spec.gpus[0].nvlink_up = []
    assert reader.nvlink_states(0) == []


def test_unreadable_link_state_is_none(reader, spec):
    spec.gpus[0].nvml_errors["nvmlDeviceGetNvLinkState"] = "Unknown"
    assert reader.nvlink_states(0, max_links=3) == [None, None, None]


def test_link_state_errors_say_why_each_link_is_unreadable_or_where_the_links_end(reader, spec):
    spec.gpus[0].nvml_errors["nvmlDeviceGetNvLinkState"] = "Timeout"
    states, errors = reader.nvlink_states_with_errors(0, max_links=2)
    assert states == [None, None]
    assert [(lk, e.kind) for lk, e in errors.items()] == [(0, K.TIMEOUT), (1, K.TIMEOUT)]
    spec.gpus[0].nvml_errors.clear()
    spec.gpus[0].nvlink_up = [True] * 12
    states, errors = reader.nvlink_states_with_errors(0, max_links=18)
    assert states == [True] * 12 and list(errors) == [12]
    assert errors[12].kind is K.INVALID_ARGUMENT  # past the GPU's last link
    spec.gpus[0].nvlink_up = []
    assert reader.nvlink_states_with_errors(0)[1][0].kind is K.NOT_SUPPORTED


def test_nvlink_state_on_a_lost_gpu_raises(reader, spec):
    spec.gpus[0].lost = True
    nvml_raises(K.GPU_LOST, reader.nvlink_states, 0)


def test_nvlink_error_counters(reader, spec):
    spec.gpus[2].nvlink_errors[(5, "crc_flit")] = 11
    spec.gpus[2].nvlink_errors[(5, "recovery")] = 1
    assert reader.nvlink_errors(2, 5) == {"replay": 0, "recovery": 1, "crc_flit": 11,
                                         "crc_data": 0, "ecc_data": 0}


def test_unsupported_nvlink_counters_are_absent(reader, spec):
    spec.gpus[2].nvml_errors["nvmlDeviceGetNvLinkErrorCounter"] = "NotSupported"
    assert reader.nvlink_errors(2, 5) == {}
    spec.gpus[2].nvml_errors["nvmlDeviceGetNvLinkErrorCounter"] = "Unknown"
    with pytest.raises(NvmlError):
        reader.nvlink_errors(2, 5)


def test_pcie_link_and_replays(reader, spec):
    assert reader.pcie_link(0) == PcieLink(5, 5, 16, 16)
    spec.gpus[0].pcie_gen_current, spec.gpus[0].pcie_width_current = 4, 8
    spec.gpus[0].pcie_replay_counter = 3
    assert reader.pcie_link(0) == PcieLink(4, 5, 8, 16)
    assert reader.pcie_replay_counter(0) == 3


def test_pcie_link_error_raises(reader, spec):
    spec.gpus[0].nvml_errors["nvmlDeviceGetMaxPcieLinkWidth"] = "NoPermission"
    nvml_raises(K.NO_PERMISSION, reader.pcie_link, 0)


def test_fabric_completed(reader, fake):
    info = reader.fabric(0)
    assert info.supported and info.completed
    assert info.state == 3 and info.status == 0
    assert re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
                        info.cluster_uuid)
    assert fake.calls.get("nvmlDeviceGetGpuFabricInfoV") == 1


def test_fabric_in_progress(reader, spec):
    spec.gpus[0].fabric_state, spec.gpus[0].fabric_status = 2, 27
    info = reader.fabric(0)
    assert (info.state, info.status, info.supported, info.completed) == (2, 27, True, False)
    assert info.cluster_uuid == ""


def test_fabric_not_supported_is_a_value(reader, spec):
    spec.gpus[0].fabric_supported = False
    assert reader.fabric(0) == FabricInfo(0, 3, False)
    assert reader.fabric(0).call == "nvmlDeviceGetGpuFabricInfoV"  # which call said so


def test_fabric_state_not_supported_is_unsupported(reader, spec):
    spec.gpus[0].fabric_state = 0
    assert not reader.fabric(0).supported


def test_fabric_falls_back_to_the_unversioned_call(reader, spec, fake):
    spec.gpus[0].nvml_errors["nvmlDeviceGetGpuFabricInfoV"] = "FunctionNotFound"
    assert reader.fabric(0).completed
    assert fake.calls["nvmlDeviceGetGpuFabricInfo"] == 1


def test_fabric_with_bindings_lacking_the_versioned_call(fake):
    reader = NvmlReader(Overlay(fake, hidden=("nvmlDeviceGetGpuFabricInfoV",
                                              "c_nvmlGpuFabricInfoV_t")))
    assert reader.fabric(0).completed


def test_fabric_with_bindings_lacking_both(fake):
    reader = NvmlReader(Overlay(fake, hidden=("nvmlDeviceGetGpuFabricInfoV",
                                              "nvmlDeviceGetGpuFabricInfo")))
    nvml_raises(K.FUNCTION_NOT_FOUND, reader.fabric, 0)


def test_fabric_lost_gpu_raises(reader, spec):
    spec.gpus[0].lost = True
    nvml_raises(K.GPU_LOST, reader.fabric, 0)


# --- MIG and processes -----------------------------------------------------------------------


def test_mig_enabled(reader, spec):
    assert reader.mig_enabled(0) is False
    spec.gpus[0].mig_enabled = True
    assert reader.mig_enabled(0) is True


def test_mig_not_supported_reads_as_disabled():
    reader = NvmlReader(FakeNvml(make_spec(1, name="NVIDIA L40S")))
    assert reader.mig_enabled(0) is False


def test_mig_mode_lost_gpu_raises(reader, spec):
    spec.gpus[0].lost = True
    with pytest.raises(NvmlError):
        reader.mig_enabled(0)


def test_processes(reader, spec):
    assert reader.processes(0) == []
    spec.gpus[0].processes += [(300, 1 << 30, "python"), (200, 2 << 30, "torchrun")]
    assert reader.processes(0) == [GpuProcess(200, 2 << 30), GpuProcess(300, 1 << 30)]


def test_processes_are_deduplicated_across_compute_and_graphics(fake):
    proc = SimpleNamespace(pid=10, usedGpuMemory=5)
    unknown_mem = SimpleNamespace(pid=11, usedGpuMemory=None)
    reader = NvmlReader(Overlay(
        fake,
        nvmlDeviceGetComputeRunningProcesses=lambda h: [proc, unknown_mem],
        nvmlDeviceGetGraphicsRunningProcesses=lambda h: [SimpleNamespace(pid=10, usedGpuMemory=5),
                                                         SimpleNamespace(pid=11,
                                                                         usedGpuMemory=7)]))
    assert reader.processes(0) == [GpuProcess(10, 5), GpuProcess(11, 7)]


def test_processes_graphics_not_supported_is_ignored(reader, spec):
    spec.gpus[0].processes.append((42, 1, "python"))
    spec.gpus[0].nvml_errors["nvmlDeviceGetGraphicsRunningProcesses"] = "NotSupported"
    assert reader.processes(0) == [GpuProcess(42, 1)]


def test_processes_fall_back_to_v2_on_an_old_driver(reader, spec, fake):
    spec.gpus[0].processes.append((42, 1, "python"))
    spec.gpus[0].nvml_errors["nvmlDeviceGetComputeRunningProcesses_v3"] = "FunctionNotFound"
    assert reader.processes(0) == [GpuProcess(42, 1)]
    assert fake.calls["nvmlDeviceGetComputeRunningProcesses_v2"] == 1


def test_processes_compute_errors_raise(reader, spec):
    spec.gpus[0].nvml_errors["nvmlDeviceGetComputeRunningProcesses"] = "NoPermission"
    nvml_raises(K.NO_PERMISSION, reader.processes, 0)


# --- threads ---------------------------------------------------------------------------------


def test_thread_safety_smoke(spec, fake):
    reader = NvmlReader(fake)
    stop = threading.Event()
    failures: list[BaseException] = []

    def read() -> None:
        try:
            while not stop.is_set():
                for i in range(8):
                    try:
                        reader.ecc(i)
                        reader.temperatures(i)
                        reader.nvlink_states(i)
                        reader.gpu_info(i)
                    except NvmlError as err:
                        if err.kind is not K.GPU_LOST:
                            raise
        except BaseException as exc:  # noqa: BLE001 - collected and asserted below
            failures.append(exc)

    threads = [threading.Thread(target=read) for _ in range(8)]
    for t in threads:
        t.start()
    for n in range(200):
        spec.gpus[n % 8].lost = not spec.gpus[n % 8].lost
        time.sleep(0.001)
    for g in spec.gpus:
        g.lost = False
    stop.set()
    for t in threads:
        t.join(timeout=30)
    assert failures == []
    assert fake.calls["nvmlInitWithFlags"] == 1
    assert [g.lost for g in reader.gpus()] == [False] * 8


# --- conformance with the real pynvml ----------------------------------------------------------


def _calls_in_reader_source() -> set[str]:
    source = Path(nvml_reader.__file__).read_text()
    names = set(re.findall(r'"(nvml[A-Z][A-Za-z0-9_]*)"', source))
    # call + "_v2" fallbacks
    names |= {n + "_v2" for n in names if n.endswith("RunningProcesses")}
    return names


def test_every_function_the_reader_calls_exists_in_pynvml_and_in_the_fake():
    pynvml = pytest.importorskip("pynvml")
    calls = _calls_in_reader_source()
    assert "nvmlDeviceGetRemappedRows" in calls and len(calls) > 30
    assert sorted(c for c in calls if not callable(getattr(pynvml, c, None))) == []
    fake = FakeNvml(make_spec(1))
    assert sorted(c for c in calls if not callable(getattr(fake, c, None))) == []


def test_struct_names_the_reader_uses_exist_in_pynvml():
    pynvml = pytest.importorskip("pynvml")
    for name in ("c_nvmlGpuFabricInfoV_t", "c_nvmlGpuFabricInfo_t"):
        assert isinstance(getattr(pynvml, name), type)
    assert pynvml.c_nvmlGpuFabricInfoV_t().version == pynvml.nvmlGpuFabricInfo_v2


def test_reader_constants_equal_pynvmls():
    pynvml = pytest.importorskip("pynvml")
    constants = {k: v for k, v in vars(nvml_mod).items() if k.startswith("NVML_")}
    assert len(constants) > 20
    assert {k: v for k, v in constants.items() if getattr(pynvml, k, None) != v} == {}


def test_error_kind_tables_agree_with_pynvml():
    pynvml = pytest.importorskip("pynvml")
    for name, kind in nvml_mod._NAME_KINDS.items():
        cls = getattr(pynvml, name)
        assert nvml_mod.CODE_KINDS[cls().value] is kind, name
