"""What NVML answers, as values: nvml.h constants, frozen readings, and one failure type.

Why it exists: checks must tell "this GPU is lost" from "this field is not supported here" from
"NVML is not installed" (``failed`` vs ``skipped`` vs ``unknown``), the same way on the real
``pynvml`` module, on older bindings and on the simulator's fake module. So every NVML
exception becomes an ``NvmlError`` (``translate_error``) whose ``kind`` is decided by the
error's code (``.value``) or class name, never by ``isinstance`` against one particular
module's classes. Checks import these values; only ``nvml_reader.py`` talks to the bindings.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpu_monitor.model import TokenEnum

# nvml.h values the reader passes in or compares against (a test checks them against pynvml).
NVML_SUCCESS = 0
NVML_FEATURE_ENABLED = 1
NVML_DEVICE_MIG_ENABLE = 1
NVML_TEMPERATURE_GPU = 0
NVML_TEMPERATURE_THRESHOLD_SHUTDOWN = 0
NVML_TEMPERATURE_THRESHOLD_SLOWDOWN = 1
NVML_TEMPERATURE_THRESHOLD_MEM_MAX = 2
NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0
NVML_AGGREGATE_ECC = 1
NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS = 0
NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR = 1
NVML_CLOCK_SM = 1
NVML_FI_DEV_MEMORY_TEMP = 82
NVML_GPU_FABRIC_STATE_NOT_SUPPORTED = 0
NVML_GPU_FABRIC_STATE_COMPLETED = 3
NVML_ERROR_NOT_SUPPORTED = 3
NVML_PERF_POLICY_POWER = 0
NVML_PERF_POLICY_THERMAL = 1
NVML_PERF_POLICY_SYNC_BOOST = 2
NVML_PERF_POLICY_BOARD_LIMIT = 3
NVML_PERF_POLICY_LOW_UTILIZATION = 4
NVML_PERF_POLICY_RELIABILITY = 5
NVML_PERF_POLICY_TOTAL_APP_CLOCKS = 10
NVML_PERF_POLICY_TOTAL_BASE_CLOCKS = 11
NVML_NVLINK_ERROR_DL_REPLAY = 0
NVML_NVLINK_ERROR_DL_RECOVERY = 1
NVML_NVLINK_ERROR_DL_CRC_FLIT = 2
NVML_NVLINK_ERROR_DL_CRC_DATA = 3
NVML_NVLINK_ERROR_DL_ECC_DATA = 4

#: ``violation_ns(i, "thermal")`` accepts these names for the NVML_PERF_POLICY_* values.
PERF_POLICIES: dict[str, int] = {
    "power": NVML_PERF_POLICY_POWER,
    "thermal": NVML_PERF_POLICY_THERMAL,
    "sync_boost": NVML_PERF_POLICY_SYNC_BOOST,
    "board_limit": NVML_PERF_POLICY_BOARD_LIMIT,
    "low_utilization": NVML_PERF_POLICY_LOW_UTILIZATION,
    "reliability": NVML_PERF_POLICY_RELIABILITY,
    "total_app_clocks": NVML_PERF_POLICY_TOTAL_APP_CLOCKS,
    "total_base_clocks": NVML_PERF_POLICY_TOTAL_BASE_CLOCKS,
}

#: The keys of ``nvlink_errors()``, by NVML_NVLINK_ERROR_* counter.
NVLINK_COUNTERS: dict[int, str] = {
    NVML_NVLINK_ERROR_DL_REPLAY: "replay",
    NVML_NVLINK_ERROR_DL_RECOVERY: "recovery",
    NVML_NVLINK_ERROR_DL_CRC_FLIT: "crc_flit",
    NVML_NVLINK_ERROR_DL_CRC_DATA: "crc_data",
    NVML_NVLINK_ERROR_DL_ECC_DATA: "ecc_data",
}


class NvmlErrorKind(TokenEnum):
    """What went wrong, independent of which bindings raised it."""

    NOT_SUPPORTED = "not_supported"
    GPU_LOST = "gpu_lost"
    LIBRARY_NOT_FOUND = "library_not_found"
    DRIVER_NOT_LOADED = "driver_not_loaded"
    BINDINGS_MISSING = "bindings_missing"  # nvidia-ml-py itself is not installed
    UNINITIALIZED = "uninitialized"
    NO_PERMISSION = "no_permission"
    TIMEOUT = "timeout"
    NOT_FOUND = "not_found"
    INVALID_ARGUMENT = "invalid_argument"
    FUNCTION_NOT_FOUND = "function_not_found"  # the driver predates the call
    RESET_REQUIRED = "reset_required"
    LIB_RM_VERSION_MISMATCH = "lib_rm_version_mismatch"
    CORRUPTED_INFOROM = "corrupted_inforom"
    ARGUMENT_VERSION_MISMATCH = "argument_version_mismatch"
    NOT_READY = "not_ready"
    # The rest of nvml.h's return codes: rarer, but a check names them rather than "unknown".
    ALREADY_INITIALIZED = "already_initialized"
    INSUFFICIENT_SIZE = "insufficient_size"
    INSUFFICIENT_POWER = "insufficient_power"  # a power cable not attached
    IRQ_ISSUE = "irq_issue"
    OPERATING_SYSTEM = "operating_system"
    IN_USE = "in_use"
    MEMORY = "memory"
    NO_DATA = "no_data"
    VGPU_ECC_NOT_SUPPORTED = "vgpu_ecc_not_supported"
    INSUFFICIENT_RESOURCES = "insufficient_resources"
    FREQ_NOT_SUPPORTED = "freq_not_supported"
    DEPRECATED = "deprecated"
    INVALID_STATE = "invalid_state"
    RESET_TYPE_NOT_SUPPORTED = "reset_type_not_supported"
    UNKNOWN = "unknown"


CODE_KINDS: dict[int, NvmlErrorKind] = {
    1: NvmlErrorKind.UNINITIALIZED,
    2: NvmlErrorKind.INVALID_ARGUMENT,
    3: NvmlErrorKind.NOT_SUPPORTED,
    4: NvmlErrorKind.NO_PERMISSION,
    6: NvmlErrorKind.NOT_FOUND,
    9: NvmlErrorKind.DRIVER_NOT_LOADED,
    10: NvmlErrorKind.TIMEOUT,
    12: NvmlErrorKind.LIBRARY_NOT_FOUND,
    13: NvmlErrorKind.FUNCTION_NOT_FOUND,
    14: NvmlErrorKind.CORRUPTED_INFOROM,
    15: NvmlErrorKind.GPU_LOST,
    16: NvmlErrorKind.RESET_REQUIRED,
    18: NvmlErrorKind.LIB_RM_VERSION_MISMATCH,
    25: NvmlErrorKind.ARGUMENT_VERSION_MISMATCH,
    27: NvmlErrorKind.NOT_READY,
    28: NvmlErrorKind.NOT_FOUND,  # NVML_ERROR_GPU_NOT_FOUND
    5: NvmlErrorKind.ALREADY_INITIALIZED,
    7: NvmlErrorKind.INSUFFICIENT_SIZE,
    8: NvmlErrorKind.INSUFFICIENT_POWER,
    11: NvmlErrorKind.IRQ_ISSUE,
    17: NvmlErrorKind.OPERATING_SYSTEM,
    19: NvmlErrorKind.IN_USE,
    20: NvmlErrorKind.MEMORY,
    21: NvmlErrorKind.NO_DATA,
    22: NvmlErrorKind.VGPU_ECC_NOT_SUPPORTED,
    23: NvmlErrorKind.INSUFFICIENT_RESOURCES,
    24: NvmlErrorKind.FREQ_NOT_SUPPORTED,
    26: NvmlErrorKind.DEPRECATED,
    29: NvmlErrorKind.INVALID_STATE,
    30: NvmlErrorKind.RESET_TYPE_NOT_SUPPORTED,
    999: NvmlErrorKind.UNKNOWN,
}

# For NVML errors without a usable ``.value``: pynvml's class names (NVMLError_<CamelCase>).
_NAME_KINDS: dict[str, NvmlErrorKind] = {
    "NVMLError_Uninitialized": NvmlErrorKind.UNINITIALIZED,
    "NVMLError_InvalidArgument": NvmlErrorKind.INVALID_ARGUMENT,
    "NVMLError_NotSupported": NvmlErrorKind.NOT_SUPPORTED,
    "NVMLError_NoPermission": NvmlErrorKind.NO_PERMISSION,
    "NVMLError_NotFound": NvmlErrorKind.NOT_FOUND,
    "NVMLError_DriverNotLoaded": NvmlErrorKind.DRIVER_NOT_LOADED,
    "NVMLError_Timeout": NvmlErrorKind.TIMEOUT,
    "NVMLError_LibraryNotFound": NvmlErrorKind.LIBRARY_NOT_FOUND,
    "NVMLError_FunctionNotFound": NvmlErrorKind.FUNCTION_NOT_FOUND,
    "NVMLError_CorruptedInforom": NvmlErrorKind.CORRUPTED_INFOROM,
    "NVMLError_GpuIsLost": NvmlErrorKind.GPU_LOST,
    "NVMLError_ResetRequired": NvmlErrorKind.RESET_REQUIRED,
    "NVMLError_LibRmVersionMismatch": NvmlErrorKind.LIB_RM_VERSION_MISMATCH,
    "NVMLError_ArgumentVersionMismatch": NvmlErrorKind.ARGUMENT_VERSION_MISMATCH,
    "NVMLError_NotReady": NvmlErrorKind.NOT_READY,
    "NVMLError_GpuNotFound": NvmlErrorKind.NOT_FOUND,
    "NVMLError_AlreadyInitialized": NvmlErrorKind.ALREADY_INITIALIZED,
    "NVMLError_InsufficientSize": NvmlErrorKind.INSUFFICIENT_SIZE,
    "NVMLError_InsufficientPower": NvmlErrorKind.INSUFFICIENT_POWER,
    "NVMLError_IrqIssue": NvmlErrorKind.IRQ_ISSUE,
    "NVMLError_OperatingSystem": NvmlErrorKind.OPERATING_SYSTEM,
    "NVMLError_InUse": NvmlErrorKind.IN_USE,
    "NVMLError_Memory": NvmlErrorKind.MEMORY,
    "NVMLError_NoData": NvmlErrorKind.NO_DATA,
    "NVMLError_VgpuEccNotSupported": NvmlErrorKind.VGPU_ECC_NOT_SUPPORTED,
    "NVMLError_InsufficientResources": NvmlErrorKind.INSUFFICIENT_RESOURCES,
    "NVMLError_FreqNotSupported": NvmlErrorKind.FREQ_NOT_SUPPORTED,
    "NVMLError_Deprecated": NvmlErrorKind.DEPRECATED,
    "NVMLError_InvalidState": NvmlErrorKind.INVALID_STATE,
    "NVMLError_ResetTypeNotSupported": NvmlErrorKind.RESET_TYPE_NOT_SUPPORTED,
    "NVMLError_Unknown": NvmlErrorKind.UNKNOWN,
}

UNAVAILABLE_REASONS: dict[NvmlErrorKind, str] = {
    NvmlErrorKind.BINDINGS_MISSING: "nvidia-ml-py not installed",
    NvmlErrorKind.LIBRARY_NOT_FOUND:
        "NVML library not found (libnvidia-ml.so.1): driver not installed",
    NvmlErrorKind.DRIVER_NOT_LOADED: "NVIDIA kernel driver not loaded",
    NvmlErrorKind.NO_PERMISSION: "no permission to open the NVIDIA device files",
    NvmlErrorKind.LIB_RM_VERSION_MISMATCH:
        "NVML library and kernel driver versions differ (driver updated without a reboot?)",
    NvmlErrorKind.NOT_FOUND: "the NVIDIA driver found no GPU",
}


class NvmlError(Exception):
    """One NVML failure: ``kind`` (what), ``call`` (which function), ``gpu_index`` (where)."""

    def __init__(self, kind: NvmlErrorKind | str, call: str, gpu_index: int | None = None,
                 message: str = "", code: int | None = None):
        super().__init__(kind, call, gpu_index, message, code)  # keeps it picklable
        self.kind = NvmlErrorKind(kind)
        self.call = call
        self.gpu_index = gpu_index
        self.message = message
        self.code = code

    def __str__(self) -> str:
        where = f" on gpu:{self.gpu_index}" if self.gpu_index is not None else ""
        return f"{self.call}{where}: {self.message or self.kind.value} ({self.kind.value})"


# --- values ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class SystemInfo:
    driver_version: str  # "550.90.07"
    cuda_driver_version: str  # "12.4"
    nvml_version: str  # "12.550.90.07"


@dataclass(frozen=True)
class GpuInfo:
    """A GPU as NVML enumerates it. A lost GPU keeps its place with what could be read.

    ``errors`` holds every identity read NVML answered with an error (the handle, UUID, name,
    PCI info, serial, memory size; each ``NvmlError`` names its call), in call order; ``error``
    is the first of them. A field left ``None`` without an error is one the part does not have
    (serial or memory size NotSupported). ``identified`` is what a check asks before judging
    the GPU: an unidentified GPU's readings cannot be tied to its board (the UUID keys results
    in the store and metrics) or to its PCI device (sysfs, PCIe, kernel-log mapping).
    """

    index: int
    uuid: str | None = None
    name: str | None = None
    pci_bus_id: str | None = None  # canonical: 0000:18:00.0
    serial: str | None = None
    memory_total_bytes: int | None = None
    lost: bool = False
    error: NvmlError | None = field(default=None, compare=False)
    errors: tuple[NvmlError, ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        # Either spelling may be given; each implies the other.
        if self.errors and self.error is None:
            object.__setattr__(self, "error", self.errors[0])
        elif self.error is not None and not self.errors:
            object.__setattr__(self, "errors", (self.error,))

    @property
    def identified(self) -> bool:
        """Not lost, and every identity read answered."""
        return not self.lost and self.error is None


@dataclass(frozen=True)
class EccInfo:
    """Counters are ``None`` where NVML does not keep them (ECC off, counter unsupported)."""

    enabled: bool
    volatile_uncorrected: int | None
    volatile_corrected: int | None
    aggregate_uncorrected: int | None
    aggregate_corrected: int | None
    pending_enabled: bool | None = None  # the mode after the next reboot


@dataclass(frozen=True)
class RetiredPages:
    single_bit: int
    double_bit: int
    pending: bool


@dataclass(frozen=True)
class RemapInfo:
    corrected: int
    uncorrected: int
    pending: bool  # a remap waits for a GPU reset
    failure: bool  # a remap failed: the GPU needs replacing


@dataclass(frozen=True)
class RemapHistogram:
    """Memory banks by spare rows left: ``max`` (all spare) ... ``none`` (no spare left)."""

    max: int
    high: int
    partial: int
    low: int
    none: int


@dataclass(frozen=True)
class ViolationTime:
    reference_us: int  # CPU timestamp of the sample, microseconds (nvml.h)
    violation_ns: int  # cumulative time the policy held clocks down

    @property
    def reference_ns(self) -> int:
        return self.reference_us * 1000


@dataclass(frozen=True)
class Temperatures:
    core_c: int
    memory_c: int | None = None
    slowdown_c: int | None = None
    shutdown_c: int | None = None
    memory_max_c: int | None = None


@dataclass(frozen=True)
class PcieLink:
    """Note: idle GPUs may train the link down (power saving); compare under load or max."""

    gen: int
    max_gen: int
    width: int
    max_width: int


@dataclass(frozen=True)
class FabricInfo:
    state: int  # NVML_GPU_FABRIC_STATE_*: 0 not supported, 1 not started, 2 in progress, 3 done
    status: int  # an NVML return code; 0 once registration succeeded
    supported: bool
    cluster_uuid: str = ""
    clique_id: int = 0
    call: str = field(default="", compare=False)  # the NVML call that answered

    @property
    def completed(self) -> bool:
        return self.state == NVML_GPU_FABRIC_STATE_COMPLETED and self.status == NVML_SUCCESS


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    used_memory_bytes: int | None  # None where the driver cannot tell (NVML_VALUE_NOT_AVAILABLE)


@dataclass(frozen=True)
class Power:
    usage_mw: int
    limit_mw: int | None


@dataclass(frozen=True)
class Clocks:
    sm_mhz: int
    max_sm_mhz: int | None



def translate_error(exc: BaseException, call: str, gpu_index: int | None = None
                    ) -> NvmlError | None:
    """An ``NvmlError`` for an exception from any pynvml-shaped module; ``None`` if it is not an
    NVML error (a bug in the caller, which must not be mistaken for a hardware finding)."""
    names = [cls.__name__ for cls in type(exc).__mro__]
    if "NVMLLibraryMismatchError" in names:  # pynvml's wrapper around FunctionNotFound
        return NvmlError(NvmlErrorKind.FUNCTION_NOT_FOUND, call, gpu_index, str(exc))
    if "NVMLError" not in names:
        return None
    code = getattr(exc, "value", None)
    kind = CODE_KINDS.get(code) if isinstance(code, int) else None
    if kind is None:
        kind = next((_NAME_KINDS[n] for n in names if n in _NAME_KINDS), NvmlErrorKind.UNKNOWN)
    try:
        message = str(exc)
    except Exception:  # pynvml's __str__ may itself call into a broken library
        message = f"NVML error {code}"
    return NvmlError(kind, call, gpu_index, message, code if isinstance(code, int) else None)
