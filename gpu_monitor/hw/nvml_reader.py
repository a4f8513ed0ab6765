"""NVML, read through one wrapper that turns its answers into the frozen values of nvml.py and
its failures into ``NvmlError``.

Why a wrapper: checks must tell "this GPU is lost" from "this field is not supported here" from
"NVML is not installed", and they must do it the same way on the real ``pynvml`` module, on
older bindings, and on the simulator's fake module. So the module is a constructor argument
(DESIGN §5), and this is the one place that calls it.

Guarantees:

1. ``import gpu_monitor.hw.nvml_reader`` imports no ``pynvml``; the default loader imports it on
   ``start()``. Missing bindings, a missing library or an unloaded driver make the reader
   *unavailable* with a reason a person can act on; nothing is raised from ``start()``.
2. ``start()`` calls ``nvmlInit`` at most once (thread-safe); a failure is sticky until
   ``close()``, so a node without a driver is not re-probed on every poll.
3. Device handles are cached per index and dropped when a call says ``GpuIsLost``, so a later
   call asks NVML again instead of reusing a handle to a GPU that fell off the bus.
4. "Not supported here" is a value, not an error, where the field is optional by nature
   (memory temperature, thresholds, serial, graphics processes, MIG mode, fabric): it reads as
   ``None`` / ``False`` / ``FabricInfo.supported = False``. Everywhere else it is raised as
   ``NvmlError(kind=not_supported)`` so the check can say ``skipped`` with the reason.

Constraints of NVML versions and parts (what raises ``not_supported`` or ``function_not_found``):

- ``nvmlDeviceGetRemappedRows``: Ampere and newer (A100, H100, ...); Volta/Turing raise
  NotSupported and report ``nvmlDeviceGetRetiredPages`` instead, which Ampere+ do not support.
- ``nvmlDeviceGetRowRemapperHistogram``: Ampere+ and a driver from the R510/R520 era or later;
  older drivers lack the symbol (FunctionNotFound).
- ``nvmlDeviceGetCurrentClocksEventReasons``: the R535+ name of
  ``nvmlDeviceGetCurrentClocksThrottleReasons``; older drivers only have the old name, so
  ``clock_event_reasons`` falls back to it. The bit values are the same.
- ``nvmlDeviceGetGpuFabricInfo``: Hopper+ on NVSwitch systems, driver R525+;
  ``nvmlDeviceGetGpuFabricInfoV`` (versioned struct) is newer still (R550 era) and is tried
  first. Parts without a fabric raise NotSupported or report state ``NOT_SUPPORTED``.
- ``NVML_FI_DEV_MEMORY_TEMP`` (HBM temperature): data-centre HBM parts; GDDR boards answer
  NotSupported per field.
- ``nvmlDeviceGetComputeRunningProcesses`` in nvidia-ml-py 12+ calls the ``_v3`` symbol; drivers
  before R510 lack it (``NVMLLibraryMismatchError``), so the ``_v2`` call is tried next.
- ``nvmlDeviceGetNumaNodeId``: recent drivers only; absent → ``None``.
- NVLink calls: ``InvalidArgument`` past the GPU's link count (18 on H100/H200 SXM, 12 on A100
  SXM), ``NotSupported`` on GPUs without NVLink.
- ``nvmlDeviceGetViolationStatus``: ``referenceTime`` is a CPU timestamp in microseconds,
  ``violationTime`` is cumulative nanoseconds (nvml.h).
"""

from __future__ import annotations

import ctypes
import importlib
import logging
import threading
import uuid
from collections.abc import Callable
from typing import Any

from gpu_monitor.hw.nvml import (
    CODE_KINDS,
    NVLINK_COUNTERS,
    NVML_AGGREGATE_ECC,
    NVML_CLOCK_SM,
    NVML_DEVICE_MIG_ENABLE,
    NVML_ERROR_NOT_SUPPORTED,
    NVML_FEATURE_ENABLED,
    NVML_FI_DEV_MEMORY_TEMP,
    NVML_GPU_FABRIC_STATE_NOT_SUPPORTED,
    NVML_MEMORY_ERROR_TYPE_CORRECTED,
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
    NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR,
    NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS,
    NVML_SUCCESS,
    NVML_TEMPERATURE_GPU,
    NVML_TEMPERATURE_THRESHOLD_MEM_MAX,
    NVML_TEMPERATURE_THRESHOLD_SHUTDOWN,
    NVML_TEMPERATURE_THRESHOLD_SLOWDOWN,
    NVML_VOLATILE_ECC,
    PERF_POLICIES,
    UNAVAILABLE_REASONS,
    Clocks,
    EccInfo,
    FabricInfo,
    GpuInfo,
    GpuProcess,
    NvmlError,
    NvmlErrorKind,
    PcieLink,
    Power,
    RemapHistogram,
    RemapInfo,
    RetiredPages,
    SystemInfo,
    Temperatures,
    ViolationTime,
    translate_error,
)
from gpu_monitor.model import canonical_pci

log = logging.getLogger(__name__)


# --- helpers --------------------------------------------------------------------------------


def _text(value: Any) -> str:
    """pynvml returns ``str`` since 11.x and ``bytes`` before; struct char arrays are bytes."""
    return value.decode(errors="replace") if isinstance(value, (bytes, bytearray)) else str(value)


def _cuda_version(value: int) -> str:
    """``12040`` -> ``"12.4"`` (nvml.h: major * 1000 + minor * 10)."""
    return f"{value // 1000}.{(value % 1000) // 10}"


def _field_value(fv: Any) -> int | float:
    member = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal",
              6: "usVal"}.get(int(fv.valueType), "uiVal")
    return getattr(fv.value, member)



def _default_loader() -> Any:
    return importlib.import_module("pynvml")


# --- the reader -----------------------------------------------------------------------------


class NvmlReader:
    """Reads GPU health through a pynvml-shaped module.

    ``module_or_loader``: the ``pynvml`` module, any object with the same functions (the
    simulator's ``FakeNvml``), or a zero-argument callable returning one. ``None`` imports the
    real ``pynvml`` lazily on ``start()``.
    """

    def __init__(self, module_or_loader: Any = None):
        if module_or_loader is None:
            self._loader: Callable[[], Any] = _default_loader
        elif hasattr(module_or_loader, "nvmlInit"):
            module = module_or_loader
            self._loader = lambda: module
        elif callable(module_or_loader):
            self._loader = module_or_loader
        else:
            raise TypeError("NvmlReader needs a pynvml-like module or a loader returning one, "
                            f"got {type(module_or_loader).__name__}")
        self._lock = threading.RLock()
        self._started = False
        self._module: Any = None
        self._init_error: NvmlError | None = None
        self._handles: dict[int, Any] = {}

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> None:
        """Load the bindings and ``nvmlInit`` once. Never raises for a missing NVML: see
        ``available()`` / ``unavailable_reason()``."""
        with self._lock:
            if self._started:
                return
            self._started = True
            try:
                module = self._loader()
            except ImportError as exc:
                self._init_error = NvmlError(NvmlErrorKind.BINDINGS_MISSING, "import pynvml",
                                             None, f"nvidia-ml-py not installed ({exc})")
                return
            except Exception as exc:  # broken bindings: unavailable with a reason, not a crash
                self._init_error = NvmlError(NvmlErrorKind.UNKNOWN, "import pynvml", None,
                                             f"cannot load the NVML bindings: {exc!r}")
                log.warning("NVML unavailable: %s", self._init_error)
                return
            try:
                self._invoke(module, "nvmlInit")
            except NvmlError as err:
                self._init_error = err
                log.info("NVML unavailable: %s", err)
                return
            except Exception as exc:
                self._init_error = NvmlError(NvmlErrorKind.UNKNOWN, "nvmlInit", None,
                                             f"nvmlInit raised {exc!r}")
                log.warning("NVML unavailable: %s", self._init_error)
                return
            self._module = module

    def close(self) -> None:
        """``nvmlShutdown`` (if initialised) and forget everything; a later call starts again."""
        with self._lock:
            module, self._module = self._module, None
            self._started = False
            self._init_error = None
            self._handles.clear()
            if module is not None:
                try:
                    self._invoke(module, "nvmlShutdown")
                except NvmlError as err:
                    log.debug("nvmlShutdown failed: %s", err)

    def __enter__(self) -> NvmlReader:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def available(self) -> bool:
        self.start()
        return self._module is not None

    @property
    def init_error(self) -> NvmlError | None:
        self.start()
        return self._init_error

    def unavailable_reason(self) -> str:
        """Why NVML cannot be used here, for a ``skipped`` result; ``""`` when it can."""
        self.start()
        err = self._init_error
        if self._module is not None or err is None:
            return ""
        reason = UNAVAILABLE_REASONS.get(err.kind)
        return reason or f"NVML initialisation failed: {err}"

    # -- plumbing ------------------------------------------------------------------------------

    def _invoke(self, module: Any, call: str, *args: Any, gpu: int | None = None) -> Any:
        fn = getattr(module, call, None)
        if fn is None:
            raise NvmlError(NvmlErrorKind.FUNCTION_NOT_FOUND, call, gpu,
                            "not provided by these NVML bindings")
        try:
            return fn(*args)
        except Exception as exc:
            err = translate_error(exc, call, gpu)
            if err is None:
                raise
            if err.kind is NvmlErrorKind.GPU_LOST and gpu is not None:
                self._forget(gpu)
            raise err from exc

    def _ready(self, call: str, gpu: int | None = None) -> Any:
        self.start()
        module = self._module
        if module is None:
            err = self._init_error
            kind = err.kind if err else NvmlErrorKind.UNINITIALIZED
            raise NvmlError(kind, call, gpu, f"NVML unavailable: {self.unavailable_reason()}",
                            err.code if err else None)
        return module

    def _forget(self, index: int) -> None:
        with self._lock:
            self._handles.pop(index, None)

    def _handle(self, index: int) -> Any:
        module = self._ready("nvmlDeviceGetHandleByIndex", index)
        with self._lock:
            handle = self._handles.get(index)
        if handle is None:
            handle = self._invoke(module, "nvmlDeviceGetHandleByIndex", index, gpu=index)
            with self._lock:
                self._handles[index] = handle
        return handle

    def _device(self, call: str, index: int, *args: Any) -> Any:
        module = self._ready(call, index)
        return self._invoke(module, call, self._handle(index), *args, gpu=index)

    def _optional(self, call: str, index: int, *args: Any,
                  absent: tuple[NvmlErrorKind, ...] = (NvmlErrorKind.NOT_SUPPORTED,)) -> Any:
        try:
            return self._device(call, index, *args)
        except NvmlError as err:
            if err.kind in absent:
                return None
            raise

    # -- system and enumeration ----------------------------------------------------------------

    def system(self) -> SystemInfo:
        module = self._ready("nvmlSystemGetDriverVersion")
        return SystemInfo(
            driver_version=_text(self._invoke(module, "nvmlSystemGetDriverVersion")),
            cuda_driver_version=_cuda_version(
                int(self._invoke(module, "nvmlSystemGetCudaDriverVersion"))),
            nvml_version=_text(self._invoke(module, "nvmlSystemGetNVMLVersion")),
        )

    def count(self) -> int:
        return int(self._invoke(self._ready("nvmlDeviceGetCount"), "nvmlDeviceGetCount"))

    def gpus(self) -> list[GpuInfo]:
        """Every GPU NVML enumerates, lost ones included (``lost=True``); a failing count raises."""
        return [self.gpu_info(i) for i in range(self.count())]

    def gpu_info(self, index: int) -> GpuInfo:
        """One GPU's identity. Never raises an ``NvmlError``: each failed read is kept in
        ``GpuInfo.errors`` (GpuIsLost ends the reads: ``lost``). A value NVML returns that
        cannot be used (a PCI bus id that does not parse) is an error of its call too."""
        try:
            self._handle(index)
        except NvmlError as err:
            return GpuInfo(index, lost=err.kind is NvmlErrorKind.GPU_LOST, errors=(err,))
        steps: tuple[tuple[str, str, Callable[[Any], Any], bool], ...] = (
            ("uuid", "nvmlDeviceGetUUID", _text, False),
            ("name", "nvmlDeviceGetName", _text, False),
            ("pci_bus_id", "nvmlDeviceGetPciInfo", lambda i: canonical_pci(_text(i.busId)), False),
            ("serial", "nvmlDeviceGetSerial", _text, True),
            ("memory_total_bytes", "nvmlDeviceGetMemoryInfo", lambda m: int(m.total), True),
        )
        values: dict[str, Any] = {}
        errors: list[NvmlError] = []
        for key, call, convert, optional in steps:
            try:
                raw = self._device(call, index)
            except NvmlError as err:
                if err.kind is NvmlErrorKind.GPU_LOST:
                    return GpuInfo(index, **values, lost=True, errors=(*errors, err))
                if not (optional and err.kind is NvmlErrorKind.NOT_SUPPORTED):
                    errors.append(err)
                continue
            try:
                values[key] = convert(raw)
            except ValueError as exc:
                errors.append(NvmlError(NvmlErrorKind.UNKNOWN, call, index,
                                        f"returned an unusable {key}: {exc}"))
        return GpuInfo(index, **values, errors=tuple(errors))

    # -- memory health -------------------------------------------------------------------------

    def ecc(self, index: int) -> EccInfo:
        current, pending = self._device("nvmlDeviceGetEccMode", index)
        enabled = int(current) == NVML_FEATURE_ENABLED
        pending_enabled = int(pending) == NVML_FEATURE_ENABLED
        if not enabled:
            return EccInfo(False, None, None, None, None, pending_enabled)

        def count(error_type: int, counter: int) -> int | None:
            value = self._optional("nvmlDeviceGetTotalEccErrors", index, error_type, counter)
            return None if value is None else int(value)

        return EccInfo(
            enabled=True,
            volatile_uncorrected=count(NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC),
            volatile_corrected=count(NVML_MEMORY_ERROR_TYPE_CORRECTED, NVML_VOLATILE_ECC),
            aggregate_uncorrected=count(NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_AGGREGATE_ECC),
            aggregate_corrected=count(NVML_MEMORY_ERROR_TYPE_CORRECTED, NVML_AGGREGATE_ECC),
            pending_enabled=pending_enabled,
        )

    def retired_pages(self, index: int) -> RetiredPages:
        """Pre-Ampere page retirement; Ampere+ raise ``not_supported`` (use ``remapped_rows``)."""
        single = self._device("nvmlDeviceGetRetiredPages", index,
                              NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS)
        double = self._device("nvmlDeviceGetRetiredPages", index,
                              NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)
        pending = self._device("nvmlDeviceGetRetiredPagesPendingStatus", index)
        return RetiredPages(len(single), len(double), int(pending) == NVML_FEATURE_ENABLED)

    def remapped_rows(self, index: int) -> RemapInfo:
        corrected, uncorrected, pending, failure = self._device("nvmlDeviceGetRemappedRows", index)
        return RemapInfo(int(corrected), int(uncorrected), bool(pending), bool(failure))

    def remap_histogram(self, index: int) -> RemapHistogram:
        h = self._device("nvmlDeviceGetRowRemapperHistogram", index)
        return RemapHistogram(int(h.max), int(h.high), int(h.partial), int(h.low), int(h.none))

    # -- clocks, power, temperature ------------------------------------------------------------

    def clock_event_reasons(self, index: int) -> int:
        """The nvmlClocksEventReason* bit mask (same bits as the older ThrottleReason names)."""
        module = self._ready("nvmlDeviceGetCurrentClocksEventReasons", index)
        old = "nvmlDeviceGetCurrentClocksThrottleReasons"
        if hasattr(module, "nvmlDeviceGetCurrentClocksEventReasons"):
            try:
                return int(self._device("nvmlDeviceGetCurrentClocksEventReasons", index))
            except NvmlError as err:  # a pre-R535 driver under new bindings
                if err.kind is not NvmlErrorKind.FUNCTION_NOT_FOUND or not hasattr(module, old):
                    raise
        return int(self._device(old, index))

    def violation_ns(self, index: int, policy: int | str) -> ViolationTime:
        """Cumulative time ``policy`` (an NVML_PERF_POLICY_* value or a ``PERF_POLICIES`` name)
        held the clocks down."""
        if isinstance(policy, str):
            if policy not in PERF_POLICIES:
                raise ValueError(f"unknown perf policy {policy!r}; known: {sorted(PERF_POLICIES)}")
            policy = PERF_POLICIES[policy]
        v = self._device("nvmlDeviceGetViolationStatus", index, policy)
        return ViolationTime(int(v.referenceTime), int(v.violationTime))

    def temperatures(self, index: int) -> Temperatures:
        core = int(self._device("nvmlDeviceGetTemperature", index, NVML_TEMPERATURE_GPU))

        def threshold(which: int) -> int | None:
            value = self._optional("nvmlDeviceGetTemperatureThreshold", index, which)
            return None if value is None else int(value)

        return Temperatures(
            core_c=core,
            memory_c=self._memory_temperature(index),
            slowdown_c=threshold(NVML_TEMPERATURE_THRESHOLD_SLOWDOWN),
            shutdown_c=threshold(NVML_TEMPERATURE_THRESHOLD_SHUTDOWN),
            memory_max_c=threshold(NVML_TEMPERATURE_THRESHOLD_MEM_MAX),
        )

    def _memory_temperature(self, index: int) -> int | None:
        call = "nvmlDeviceGetFieldValues"
        values = self._optional(call, index, [NVML_FI_DEV_MEMORY_TEMP],
                                absent=(NvmlErrorKind.NOT_SUPPORTED,
                                        NvmlErrorKind.FUNCTION_NOT_FOUND))
        if values is None:
            return None
        fv = values[0]
        ret = int(fv.nvmlReturn)
        if ret == NVML_SUCCESS:
            return int(_field_value(fv))
        kind = CODE_KINDS.get(ret, NvmlErrorKind.UNKNOWN)
        if kind is NvmlErrorKind.NOT_SUPPORTED:
            return None
        if kind is NvmlErrorKind.GPU_LOST:
            self._forget(index)
        raise NvmlError(kind, f"{call}(NVML_FI_DEV_MEMORY_TEMP)", index,
                        f"field value returned NVML error {ret}", ret)

    def power(self, index: int) -> Power:
        usage = int(self._device("nvmlDeviceGetPowerUsage", index))
        limit = self._optional("nvmlDeviceGetEnforcedPowerLimit", index)
        return Power(usage, None if limit is None else int(limit))

    def clocks(self, index: int) -> Clocks:
        sm = int(self._device("nvmlDeviceGetClockInfo", index, NVML_CLOCK_SM))
        max_sm = self._optional("nvmlDeviceGetMaxClockInfo", index, NVML_CLOCK_SM)
        return Clocks(sm, None if max_sm is None else int(max_sm))

    # -- interconnects -------------------------------------------------------------------------

    def nvlink_states(self, index: int, max_links: int = 18) -> list[bool | None]:
        """Up/down per link, stopping at the first link the GPU does not have; ``None`` where one
        link's state could not be read (``Unknown`` / ``Timeout``). ``[]``: no NVLink."""
        return self.nvlink_states_with_errors(index, max_links)[0]

    def nvlink_states_with_errors(self, index: int, max_links: int = 18
                                  ) -> tuple[list[bool | None], dict[int, NvmlError]]:
        """``nvlink_states`` and, for each ``None`` in it, the error that link's read gave;
        at key ``len(states)``, the answer that ended the list before ``max_links``."""
        states: list[bool | None] = []
        errors: dict[int, NvmlError] = {}
        for link in range(max_links):
            try:
                state = self._device("nvmlDeviceGetNvLinkState", index, link)
            except NvmlError as err:
                if err.kind in (NvmlErrorKind.INVALID_ARGUMENT, NvmlErrorKind.NOT_SUPPORTED):
                    errors[link] = err
                    break
                if err.kind in (NvmlErrorKind.UNKNOWN, NvmlErrorKind.TIMEOUT):
                    errors[link] = err
                    states.append(None)
                    continue
                raise
            states.append(int(state) == NVML_FEATURE_ENABLED)
        return states, errors

    def nvlink_errors(self, index: int, link: int) -> dict[str, int]:
        """Error counters of one link by ``NVLINK_COUNTERS`` name; unsupported ones are absent."""
        out: dict[str, int] = {}
        for counter, name in NVLINK_COUNTERS.items():
            value = self._optional("nvmlDeviceGetNvLinkErrorCounter", index, link, counter)
            if value is not None:
                out[name] = int(value)
        return out

    def pcie_link(self, index: int) -> PcieLink:
        return PcieLink(
            gen=int(self._device("nvmlDeviceGetCurrPcieLinkGeneration", index)),
            max_gen=int(self._device("nvmlDeviceGetMaxPcieLinkGeneration", index)),
            width=int(self._device("nvmlDeviceGetCurrPcieLinkWidth", index)),
            max_width=int(self._device("nvmlDeviceGetMaxPcieLinkWidth", index)),
        )

    def pcie_replay_counter(self, index: int) -> int:
        return int(self._device("nvmlDeviceGetPcieReplayCounter", index))

    def fabric(self, index: int) -> FabricInfo:
        """NVSwitch fabric registration (Hopper+); ``supported=False`` where there is none."""
        module = self._ready("nvmlDeviceGetGpuFabricInfoV", index)
        attempts = [(call, getattr(module, struct, None)) for call, struct in (
            ("nvmlDeviceGetGpuFabricInfoV", "c_nvmlGpuFabricInfoV_t"),
            ("nvmlDeviceGetGpuFabricInfo", "c_nvmlGpuFabricInfo_t"),
        ) if hasattr(module, call) and hasattr(module, struct)]
        if not attempts:
            raise NvmlError(NvmlErrorKind.FUNCTION_NOT_FOUND, "nvmlDeviceGetGpuFabricInfo", index,
                            "these NVML bindings have no fabric info")
        for n, (call, struct) in enumerate(attempts):
            info = struct()
            try:
                self._device(call, index, ctypes.byref(info))
            except NvmlError as err:
                if err.kind is NvmlErrorKind.NOT_SUPPORTED:
                    return FabricInfo(NVML_GPU_FABRIC_STATE_NOT_SUPPORTED,
                                      NVML_ERROR_NOT_SUPPORTED, False, call=call)
                retry = (NvmlErrorKind.FUNCTION_NOT_FOUND, NvmlErrorKind.ARGUMENT_VERSION_MISMATCH)
                if err.kind in retry and n + 1 < len(attempts):
                    continue
                raise
            raw = bytes(info.clusterUuid)
            state = int(info.state)
            return FabricInfo(
                state=state,
                status=int(info.status),
                supported=state != NVML_GPU_FABRIC_STATE_NOT_SUPPORTED,
                cluster_uuid=str(uuid.UUID(bytes=raw)) if any(raw) else "",
                clique_id=int(info.cliqueId),
                call=call,
            )
        raise AssertionError("unreachable")  # pragma: no cover

    # -- MIG and processes ---------------------------------------------------------------------

    def mig_enabled(self, index: int) -> bool:
        mode = self._optional("nvmlDeviceGetMigMode", index)
        return mode is not None and int(mode[0]) == NVML_DEVICE_MIG_ENABLE

    def numa_node(self, index: int) -> int | None:
        node = self._optional("nvmlDeviceGetNumaNodeId", index,
                              absent=(NvmlErrorKind.NOT_SUPPORTED,
                                      NvmlErrorKind.FUNCTION_NOT_FOUND))
        return None if node is None or int(node) < 0 else int(node)

    def processes(self, index: int) -> list[GpuProcess]:
        """Compute and graphics processes on the GPU, one entry per pid, sorted by pid."""
        found: dict[int, int | None] = {}
        for call, optional in (("nvmlDeviceGetComputeRunningProcesses", False),
                               ("nvmlDeviceGetGraphicsRunningProcesses", True)):
            try:
                procs = self._processes(call, index)
            except NvmlError as err:
                if optional and err.kind is NvmlErrorKind.NOT_SUPPORTED:
                    continue
                raise
            for p in procs:
                pid = int(p.pid)
                mem = getattr(p, "usedGpuMemory", None)
                mem = None if mem is None else int(mem)
                known = found.get(pid)
                found[pid] = mem if known is None else max(known, mem or 0)
        return [GpuProcess(pid, mem) for pid, mem in sorted(found.items())]

    def _processes(self, call: str, index: int) -> list[Any]:
        try:
            return list(self._device(call, index))
        except NvmlError as err:  # bindings newer than the driver: the _v3 symbol is missing
            module = self._ready(call, index)
            if err.kind is not NvmlErrorKind.FUNCTION_NOT_FOUND or not hasattr(module,
                                                                                call + "_v2"):
                raise
            return list(self._device(call + "_v2", index))
