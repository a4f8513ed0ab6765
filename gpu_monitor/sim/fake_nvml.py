"""A fake ``pynvml`` that renders a ``NodeSpec`` the way the real NVML library would.

Why a fake module and not a mock of our reader: the NVML reader (hw/nvml.py) and everything above
it must run unchanged on the simulated node, so the seam is the lowest one, the ``pynvml`` module
object itself. ``FakeNvml`` therefore has the same function names, constants, ctypes struct
shapes and exception classes as ``pynvml`` from nvidia-ml-py (13.x), and code written for the
real module (``except nvml.NVMLError_NotSupported``, ``info.busId``, ``byref(fabric_info)``)
works on both.

Contract:

1. The spec is read live on every call: a fault applied to ``NodeSpec`` after construction shows
   at the next call, exactly as a GPU going bad under a running daemon would.
2. Error semantics follow nvml.h: calls before ``nvmlInit`` (or after the last ``nvmlShutdown``)
   raise ``Uninitialized``; ``NodeSpec.nvml_library_missing`` makes ``nvmlInit`` raise
   ``LibraryNotFound``; ``GpuSpec.missing`` GPUs are not enumerated; ``GpuSpec.lost`` GPUs raise
   ``GpuIsLost`` from every per-device call (handle lookup included, as nvml.h documents);
   ``GpuSpec.nvml_errors[call] = "NotSupported"`` makes that call raise that class for that GPU.
   Features the hardware lacks raise ``NotSupported`` (retired pages on Ampere+, row remapping
   before Ampere, MIG on non-MIG parts, fabric info without ``fabric_supported``).
3. Enumeration is real NVML's: devices are numbered 0..count-1 among the *enumerated* GPUs (in
   ``GpuSpec.index`` order), so with GPU slot 3 missing the spec's slot 5 is NVML index 4, as on
   a real node after a GPU fell off the bus. Handles stay bound to their GPU, not their index.
4. A spec value of ``None`` (e.g. ``temperature_memory_c = None``) means the part does not report
   it: the call (or the field value) answers ``NotSupported``.
5. Thread-safe: every call holds one lock, as the real library serialises its own state.

Node-level faults (``nvmlInit`` raising ``DriverNotLoaded``, ``nvmlDeviceGetCount`` raising
``Unknown``) go in ``FakeNvml.system_errors`` (or ``NodeSpec.nvml_errors`` where the spec has it).
NVLink error counters are keyed ``(link, name)`` in ``GpuSpec.nvlink_errors`` with ``name`` one of
``replay``, ``recovery``, ``crc_flit``, ``crc_data``, ``ecc_data`` (``DL_REPLAY`` and
``NVML_NVLINK_ERROR_DL_REPLAY`` spellings are accepted too).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import re
import string
import threading
import time
import types
import uuid as uuidlib
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

from gpu_monitor.hw import nvml as nvml_h
from gpu_monitor.model import canonical_pci
from gpu_monitor.sim.spec import GpuSpec, NodeSpec

# --- constants, by value from pynvml (nvidia-ml-py 13.x; the values are the C ABI of nvml.h) ----

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_ALREADY_INITIALIZED = 5
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_INSUFFICIENT_SIZE = 7
NVML_ERROR_INSUFFICIENT_POWER = 8
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_IRQ_ISSUE = 11
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_CORRUPTED_INFOROM = 14
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_RESET_REQUIRED = 16
NVML_ERROR_OPERATING_SYSTEM = 17
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18
NVML_ERROR_IN_USE = 19
NVML_ERROR_MEMORY = 20
NVML_ERROR_NO_DATA = 21
NVML_ERROR_VGPU_ECC_NOT_SUPPORTED = 22
NVML_ERROR_INSUFFICIENT_RESOURCES = 23
NVML_ERROR_FREQ_NOT_SUPPORTED = 24
NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25
NVML_ERROR_DEPRECATED = 26
NVML_ERROR_NOT_READY = 27
NVML_ERROR_GPU_NOT_FOUND = 28
NVML_ERROR_INVALID_STATE = 29
NVML_ERROR_RESET_TYPE_NOT_SUPPORTED = 30
NVML_ERROR_UNKNOWN = 999

NVML_FEATURE_DISABLED = 0
NVML_FEATURE_ENABLED = 1

NVML_INIT_FLAG_NO_GPUS = 1
NVML_INIT_FLAG_NO_ATTACH = 2
NVML_INIT_FLAG_FORCE_INIT = 4

NVML_TEMPERATURE_GPU = 0
NVML_TEMPERATURE_THRESHOLD_SHUTDOWN = 0
NVML_TEMPERATURE_THRESHOLD_SLOWDOWN = 1
NVML_TEMPERATURE_THRESHOLD_MEM_MAX = 2
NVML_TEMPERATURE_THRESHOLD_GPU_MAX = 3
NVML_TEMPERATURE_THRESHOLD_ACOUSTIC_MIN = 4
NVML_TEMPERATURE_THRESHOLD_ACOUSTIC_CURR = 5
NVML_TEMPERATURE_THRESHOLD_ACOUSTIC_MAX = 6
NVML_TEMPERATURE_THRESHOLD_GPS_CURR = 7
NVML_TEMPERATURE_THRESHOLD_COUNT = 8

NVML_CLOCK_GRAPHICS = 0
NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2
NVML_CLOCK_VIDEO = 3
NVML_CLOCK_COUNT = 4

NVML_VALUE_TYPE_DOUBLE = 0
NVML_VALUE_TYPE_UNSIGNED_INT = 1
NVML_VALUE_TYPE_UNSIGNED_LONG = 2
NVML_VALUE_TYPE_UNSIGNED_LONG_LONG = 3
NVML_VALUE_TYPE_SIGNED_LONG_LONG = 4
NVML_VALUE_TYPE_SIGNED_INT = 5
NVML_VALUE_TYPE_UNSIGNED_SHORT = 6

NVML_FI_DEV_MEMORY_TEMP = 82

NVML_NVLINK_MAX_LINKS = 36
NVML_NVLINK_ERROR_COUNT = 5

NVML_DEVICE_MIG_DISABLE = 0
NVML_DEVICE_MIG_ENABLE = 1

NVML_GPU_FABRIC_UUID_LEN = 16
NVML_GPU_FABRIC_STATE_NOT_SUPPORTED = 0
NVML_GPU_FABRIC_STATE_NOT_STARTED = 1
NVML_GPU_FABRIC_STATE_IN_PROGRESS = 2
NVML_GPU_FABRIC_STATE_COMPLETED = 3
nvmlGpuFabricInfo_v2 = 0x02000024
nvmlGpuFabricInfo_v3 = 0x3000028
nvmlMemory_v2 = 0x02000028

NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE = 32
NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE = 16
NVML_DEVICE_PCI_BUS_ID_LEGACY_FMT = "%04X:%02X:%02X.0"
NVML_DEVICE_PCI_BUS_ID_FMT = "%08X:%02X:%02X.0"

nvmlClocksEventReasonNone = 0x0
nvmlClocksEventReasonGpuIdle = 0x1
nvmlClocksEventReasonApplicationsClocksSetting = 0x2
nvmlClocksEventReasonSwPowerCap = 0x4
nvmlClocksEventReasonHwSlowdown = 0x8
nvmlClocksEventReasonSyncBoost = 0x10
nvmlClocksEventReasonSwThermalSlowdown = 0x20
nvmlClocksEventReasonHwThermalSlowdown = 0x40
nvmlClocksEventReasonHwPowerBrakeSlowdown = 0x80
nvmlClocksEventReasonDisplayClockSetting = 0x100
nvmlClocksThrottleReasonNone = 0x0
nvmlClocksThrottleReasonGpuIdle = 0x1
nvmlClocksThrottleReasonApplicationsClocksSetting = 0x2
nvmlClocksThrottleReasonSwPowerCap = 0x4
nvmlClocksThrottleReasonHwSlowdown = 0x8
nvmlClocksThrottleReasonSyncBoost = 0x10
nvmlClocksThrottleReasonSwThermalSlowdown = 0x20
nvmlClocksThrottleReasonHwThermalSlowdown = 0x40
nvmlClocksThrottleReasonHwPowerBrakeSlowdown = 0x80
nvmlClocksThrottleReasonDisplayClockSetting = 0x100
nvmlClocksThrottleReasonBoardLimit = 0x200
nvmlClocksThrottleReasonReliability = 0x400


def _is_constant(name: str) -> bool:
    return name.startswith(("NVML_", "nvmlClocksEventReason", "nvmlClocksThrottleReason")) or (
        name in ("nvmlGpuFabricInfo_v2", "nvmlGpuFabricInfo_v3", "nvmlMemory_v2")
    )


#: Every constant this fake defines, by name; each equals pynvml's value (a test checks). The
#: nvml.h values the reader keeps (hw/nvml.py: ECC, page retirement, perf policies, NVLink
#: error counters) are taken from there, one table of them; the fake adds the rest.
CONSTANTS: dict[str, int | str] = {
    **{k: v for k, v in vars(nvml_h).items() if k.startswith("NVML_")},
    **{k: v for k, v in dict(globals()).items() if _is_constant(k)},
}

#: NVML_PERF_POLICY_* value -> its ``violation_ns`` name (the reader's table, inverted).
_PERF_POLICY_KEYS = {v: k for k, v in nvml_h.PERF_POLICIES.items()}

#: NVLink error counter id -> the name used in ``GpuSpec.nvlink_errors`` keys (the reader's).
NVLINK_COUNTER_NAMES = nvml_h.NVLINK_COUNTERS

# --- exceptions: the same hierarchy pynvml's _extractNVMLErrorsAsClasses builds ---------------

_ERROR_STRINGS = {
    NVML_ERROR_UNINITIALIZED: "Uninitialized",
    NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
    NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
    NVML_ERROR_ALREADY_INITIALIZED: "Already Initialized",
    NVML_ERROR_NOT_FOUND: "Not Found",
    NVML_ERROR_INSUFFICIENT_SIZE: "Insufficient Size",
    NVML_ERROR_INSUFFICIENT_POWER: "Insufficient External Power",
    NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
    NVML_ERROR_TIMEOUT: "Timeout",
    NVML_ERROR_IRQ_ISSUE: "Interrupt Request Issue",
    NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
    NVML_ERROR_FUNCTION_NOT_FOUND: "Function Not Found",
    NVML_ERROR_CORRUPTED_INFOROM: "Corrupted infoROM",
    NVML_ERROR_GPU_IS_LOST: "GPU is lost",
    NVML_ERROR_RESET_REQUIRED: "GPU requires restart",
    NVML_ERROR_OPERATING_SYSTEM: "The operating system has blocked the request.",
    NVML_ERROR_LIB_RM_VERSION_MISMATCH: "RM has detected an NVML/RM version mismatch.",
    NVML_ERROR_MEMORY: "Insufficient Memory",
    NVML_ERROR_UNKNOWN: "Unknown Error",
}


class NVMLError(Exception):
    """Base of the fake's NVML errors; ``NVMLError(code)`` builds the matching subclass."""

    _valClassMapping: dict[int, type[NVMLError]] = {}
    _code: int | None = None
    value: int

    def __new__(cls, *args: Any) -> NVMLError:
        if cls is NVMLError:
            value = args[0] if args else NVML_ERROR_UNKNOWN
            cls = NVMLError._valClassMapping.get(value, NVMLError)
        else:
            value = cls._code
        obj = Exception.__new__(cls)
        obj.value = value
        return obj

    def __str__(self) -> str:
        return _ERROR_STRINGS.get(self.value, f"NVML Error with code {self.value}")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, NVMLError) and self.value == other.value

    __hash__ = None  # type: ignore[assignment]  # like pynvml's: __eq__ without __hash__


def _error_class_name(const_name: str) -> str:
    """``NVML_ERROR_GPU_IS_LOST`` -> ``NVMLError_GpuIsLost`` (pynvml's naming rule)."""
    words = const_name[len("NVML_ERROR_"):]
    return "NVMLError_" + string.capwords(words, "_").replace("_", "")


def _build_error_classes() -> dict[str, type[NVMLError]]:
    classes: dict[str, type[NVMLError]] = {}
    for const_name, code in CONSTANTS.items():
        if not const_name.startswith("NVML_ERROR_"):
            continue
        name = _error_class_name(const_name)
        cls = type(name, (NVMLError,), {"_code": code, "__module__": __name__})
        NVMLError._valClassMapping[int(code)] = cls
        classes[name] = cls
    return classes


#: ``NVMLError_NotSupported`` etc., by class name.
ERROR_CLASSES: dict[str, type[NVMLError]] = _build_error_classes()
globals().update(ERROR_CLASSES)


def error_class(name: str) -> type[NVMLError]:
    """Resolve ``GpuIsLost`` / ``NVMLError_GpuIsLost`` / ``GPU_IS_LOST`` to the error class."""
    key = re.sub(r"^(NVMLError_|NVML_ERROR_)", "", name.strip(), flags=re.IGNORECASE)
    key = key.replace("_", "").lower()
    for cls_name, cls in ERROR_CLASSES.items():
        if cls_name[len("NVMLError_"):].lower() == key:
            return cls
    raise ValueError(f"unknown NVML error name {name!r}; known: "
                     f"{', '.join(n[len('NVMLError_'):] for n in ERROR_CLASSES)}")


def _fail(code: int) -> NVMLError:
    return NVMLError(code)


class NVMLLibraryMismatchError(Exception):
    """pynvml raises this (not an NVMLError) when an unversioned call's symbol is missing."""


@contextlib.contextmanager
def _version_mismatch(name: str) -> Iterator[None]:
    try:
        yield
    except NVMLError as exc:
        if exc.value != NVML_ERROR_FUNCTION_NOT_FOUND:
            raise
        raise NVMLLibraryMismatchError(
            "Unversioned function called and the pyNVML version does not match the NVML lib "
            f"version. Either use matching pyNVML and NVML lib versions or use a versioned "
            f"function such as {name}_v2") from None


# --- structs: the same ctypes layouts as pynvml -----------------------------------------------


class nvmlPciInfo_t(ctypes.Structure):
    _fields_ = [
        ("busIdLegacy", ctypes.c_char * NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE),
        ("domain", ctypes.c_uint),
        ("bus", ctypes.c_uint),
        ("device", ctypes.c_uint),
        ("pciDeviceId", ctypes.c_uint),
        ("pciSubSystemId", ctypes.c_uint),
        ("busId", ctypes.c_char * NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE),
    ]


class c_nvmlMemory_t(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong),
                ("used", ctypes.c_ulonglong)]


class c_nvmlMemory_v2_t(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint), ("total", ctypes.c_ulonglong),
                ("reserved", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong),
                ("used", ctypes.c_ulonglong)]


class c_nvmlViolationTime_t(ctypes.Structure):
    _fields_ = [("referenceTime", ctypes.c_ulonglong), ("violationTime", ctypes.c_ulonglong)]


class c_nvmlValue_t(ctypes.Union):
    _fields_ = [
        ("dVal", ctypes.c_double),
        ("uiVal", ctypes.c_uint),
        ("ulVal", ctypes.c_ulong),
        ("ullVal", ctypes.c_ulonglong),
        ("sllVal", ctypes.c_longlong),
        ("siVal", ctypes.c_int),
        ("usVal", ctypes.c_ushort),
    ]


class c_nvmlFieldValue_t(ctypes.Structure):
    _fields_ = [
        ("fieldId", ctypes.c_uint32),
        ("scopeId", ctypes.c_uint32),
        ("timestamp", ctypes.c_int64),
        ("latencyUsec", ctypes.c_int64),
        ("valueType", ctypes.c_uint),
        ("nvmlReturn", ctypes.c_uint),
        ("value", c_nvmlValue_t),
    ]


class c_nvmlRowRemapperHistogramValues(ctypes.Structure):
    _fields_ = [("max", ctypes.c_uint), ("high", ctypes.c_uint), ("partial", ctypes.c_uint),
                ("low", ctypes.c_uint), ("none", ctypes.c_uint)]


class c_nvmlGpuFabricInfo_t(ctypes.Structure):
    _fields_ = [
        ("clusterUuid", ctypes.c_uint8 * NVML_GPU_FABRIC_UUID_LEN),
        ("status", ctypes.c_uint),
        ("cliqueId", ctypes.c_uint32),
        ("state", ctypes.c_uint),
    ]


# nvml.h's v3 fabric info is v2 with ``healthSummary`` appended; both spell their version first.
_FABRIC_INFO_V2_FIELDS = [
    ("version", ctypes.c_uint),
    ("clusterUuid", ctypes.c_uint8 * NVML_GPU_FABRIC_UUID_LEN),
    ("status", ctypes.c_uint),
    ("cliqueId", ctypes.c_uint32),
    ("state", ctypes.c_uint),
    ("healthMask", ctypes.c_uint32),
]


class c_nvmlGpuFabricInfo_v2_t(ctypes.Structure):
    _fields_ = _FABRIC_INFO_V2_FIELDS

    def __init__(self) -> None:
        super().__init__(version=nvmlGpuFabricInfo_v2)


class c_nvmlGpuFabricInfo_v3_t(ctypes.Structure):
    _fields_ = [*_FABRIC_INFO_V2_FIELDS, ("healthSummary", ctypes.c_uint8)]

    def __init__(self) -> None:
        super().__init__(version=nvmlGpuFabricInfo_v3)


c_nvmlGpuFabricInfoV_t = c_nvmlGpuFabricInfo_v2_t


class c_nvmlProcessInfo_v2_t(ctypes.Structure):
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong),
                ("gpuInstanceId", ctypes.c_uint), ("computeInstanceId", ctypes.c_uint)]


c_nvmlProcessInfo_v3_t = c_nvmlProcessInfo_v2_t
c_nvmlProcessInfo_t = c_nvmlProcessInfo_v3_t


class nvmlFriendlyObject:
    """What pynvml returns for process lists: a plain object with the struct's fields."""

    def __init__(self, dictionary: dict[str, Any]):
        for key, value in dictionary.items():
            setattr(self, key, value)

    def __str__(self) -> str:
        return str(self.__dict__)


STRUCTS: dict[str, type] = {
    name: obj for name, obj in dict(globals()).items()
    if name.startswith(("c_nvml", "nvmlPciInfo_t")) and isinstance(obj, type)
}

# A fixed cluster UUID for a completed fabric registration (any 16 bytes would do).
_CLUSTER_UUID = uuidlib.uuid5(uuidlib.NAMESPACE_URL, "gpu-monitor/sim/fabric").bytes
_PRE_AMPERE = re.compile(r"\b(V100S?|P100|P40|P4|T4|K80|K40|M40|M60|P6000|GV100|TITAN V)\b")
_MIG_CAPABLE = re.compile(r"\b(A100|A30|A800|H100|H200|H800|H20|GH200|B100|B200|GB200|B300|"
                          r"GB300)\b")


def _pre_ampere(gpu: GpuSpec) -> bool:
    """Volta/Turing and older retire pages; Ampere and newer remap rows instead."""
    return bool(_PRE_AMPERE.search(gpu.name))


def _counter_name(name: str) -> str:
    key = name.strip().lower()
    for prefix in ("nvml_nvlink_error_", "dl_"):
        if key.startswith(prefix):
            key = key[len(prefix):]
    return key


class FakeDeviceHandle:
    """Opaque like ``c_nvmlDevice_t``; bound to the GPU's slot (``GpuSpec.index``)."""

    __slots__ = ("slot",)

    def __init__(self, slot: int):
        self.slot = slot

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FakeDeviceHandle) and other.slot == self.slot

    def __hash__(self) -> int:
        return hash(("FakeDeviceHandle", self.slot))

    def __repr__(self) -> str:
        return f"<FakeDeviceHandle slot={self.slot}>"


_F = TypeVar("_F", bound=Callable[..., Any])


def _locked(fn: _F) -> _F:
    @functools.wraps(fn)
    def wrapper(self: FakeNvml, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            self.calls[fn.__name__] = self.calls.get(fn.__name__, 0) + 1
            return fn(self, *args, **kwargs)

    return wrapper  # type: ignore[return-value]


def _spec_value(call: str, field: str) -> Callable[..., Any]:
    """The system call ``call`` as the fake serves it: it needs NVML initialised (and honours an
    injected error for ``call``), then answers one field of the node's spec, read live."""

    def read(self: FakeNvml) -> Any:
        self._require_init(call)
        return getattr(self.spec, field)

    read.__name__, read.__qualname__ = call, f"FakeNvml.{call}"
    return _locked(read)


def _raw(arg: Any) -> Any:
    """``byref(struct)`` -> struct (the real module passes the pointer to C)."""
    return getattr(arg, "_obj", arg)


class FakeNvml:
    """An object that quacks like the ``pynvml`` module, rendering ``spec`` live.

    ``calls`` counts calls per function name, so tests can see e.g. handle caching.
    """

    def __init__(self, spec: NodeSpec, system_errors: dict[str, str] | None = None):
        self.spec = spec
        self.system_errors: dict[str, str] = dict(system_errors or {})
        self.calls: dict[str, int] = {}
        self._lock = threading.RLock()
        self._refcount = 0

    # -- plumbing ------------------------------------------------------------------------------

    def _system_error(self, *names: str) -> None:
        errors = dict(getattr(self.spec, "nvml_errors", None) or {})
        errors.update(self.system_errors)
        for name in names:
            if name in errors:
                raise error_class(errors[name])()

    def _require_init(self, *calls: str) -> None:
        if self._refcount <= 0:
            raise _fail(NVML_ERROR_UNINITIALIZED)
        self._system_error(*calls)

    def _enumerated(self) -> list[GpuSpec]:
        return sorted((g for g in self.spec.gpus if not g.missing), key=lambda g: g.index)

    def _gpu(self, handle: Any, *calls: str) -> GpuSpec:
        """The GPU behind ``handle`` after the lost / injected-error checks for ``calls``."""
        self._require_init(*calls)
        if not isinstance(handle, FakeDeviceHandle):
            raise _fail(NVML_ERROR_INVALID_ARGUMENT)
        gpu = next((g for g in self.spec.gpus if g.index == handle.slot), None)
        if gpu is None or gpu.missing or gpu.lost:
            raise _fail(NVML_ERROR_GPU_IS_LOST)
        self._injected(gpu, calls)
        return gpu

    @staticmethod
    def _injected(gpu: GpuSpec, calls: Iterable[str]) -> None:
        for call in calls:
            name = gpu.nvml_errors.get(call)
            if name:
                raise error_class(name)()

    @staticmethod
    def _value(value: Any) -> Any:
        if value is None:
            raise _fail(NVML_ERROR_NOT_SUPPORTED)
        return value

    def _handle_for(self, gpu: GpuSpec, call: str) -> FakeDeviceHandle:
        if gpu.lost:
            raise _fail(NVML_ERROR_GPU_IS_LOST)
        self._injected(gpu, (call,))
        return FakeDeviceHandle(gpu.index)

    # -- init and system -----------------------------------------------------------------------

    @_locked
    def nvmlInitWithFlags(self, flags: int) -> None:
        if self.spec.nvml_library_missing:
            raise _fail(NVML_ERROR_LIBRARY_NOT_FOUND)
        self._system_error("nvmlInitWithFlags", "nvmlInit")
        self._refcount += 1

    def nvmlInit(self) -> None:
        self.nvmlInitWithFlags(0)

    @_locked
    def nvmlShutdown(self) -> None:
        self._require_init("nvmlShutdown")
        self._refcount -= 1

    @_locked
    def nvmlErrorString(self, result: int) -> str:
        return _ERROR_STRINGS.get(result, "Unknown Error")

    @staticmethod
    def nvmlExceptionClass(nvmlErrorCode: int) -> type[NVMLError]:
        if nvmlErrorCode not in NVMLError._valClassMapping:
            raise ValueError(f"nvmlErrorCode {nvmlErrorCode} is not valid")
        return NVMLError._valClassMapping[nvmlErrorCode]

    nvmlSystemGetDriverVersion = _spec_value("nvmlSystemGetDriverVersion", "driver_version")
    nvmlSystemGetCudaDriverVersion = _spec_value("nvmlSystemGetCudaDriverVersion",
                                                 "cuda_driver_version")
    nvmlSystemGetCudaDriverVersion_v2 = _spec_value("nvmlSystemGetCudaDriverVersion_v2",
                                                    "cuda_driver_version")
    nvmlSystemGetNVMLVersion = _spec_value("nvmlSystemGetNVMLVersion", "nvml_version")

    # -- enumeration and identity --------------------------------------------------------------

    @_locked
    def nvmlDeviceGetCount(self) -> int:
        self._require_init("nvmlDeviceGetCount")
        return len(self._enumerated())

    @_locked
    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeDeviceHandle:
        self._require_init("nvmlDeviceGetHandleByIndex")
        gpus = self._enumerated()
        if not isinstance(index, int) or not 0 <= index < len(gpus):
            raise _fail(NVML_ERROR_INVALID_ARGUMENT)
        return self._handle_for(gpus[index], "nvmlDeviceGetHandleByIndex")

    @_locked
    def nvmlDeviceGetHandleByUUID(self, uuid: str | bytes) -> FakeDeviceHandle:
        self._require_init("nvmlDeviceGetHandleByUUID")
        text = uuid.decode() if isinstance(uuid, bytes) else uuid
        for gpu in self._enumerated():
            if gpu.uuid == text:
                return self._handle_for(gpu, "nvmlDeviceGetHandleByUUID")
        raise _fail(NVML_ERROR_NOT_FOUND)

    @_locked
    def nvmlDeviceGetHandleByPciBusId(self, pciBusId: str | bytes) -> FakeDeviceHandle:
        self._require_init("nvmlDeviceGetHandleByPciBusId")
        text = pciBusId.decode() if isinstance(pciBusId, bytes) else pciBusId
        try:
            wanted = canonical_pci(text)
        except ValueError:
            raise _fail(NVML_ERROR_INVALID_ARGUMENT) from None
        for gpu in self._enumerated():
            if canonical_pci(gpu.pci_bus_id) == wanted:
                return self._handle_for(gpu, "nvmlDeviceGetHandleByPciBusId")
        raise _fail(NVML_ERROR_NOT_FOUND)

    @_locked
    def nvmlDeviceGetIndex(self, handle: FakeDeviceHandle) -> int:
        gpu = self._gpu(handle, "nvmlDeviceGetIndex")
        return [g.index for g in self._enumerated()].index(gpu.index)

    @_locked
    def nvmlDeviceGetName(self, handle: FakeDeviceHandle) -> str:
        return self._gpu(handle, "nvmlDeviceGetName").name

    @_locked
    def nvmlDeviceGetUUID(self, handle: FakeDeviceHandle) -> str:
        return self._gpu(handle, "nvmlDeviceGetUUID").uuid

    @_locked
    def nvmlDeviceGetSerial(self, handle: FakeDeviceHandle) -> str:
        return self._value(self._gpu(handle, "nvmlDeviceGetSerial").serial)

    @_locked
    def nvmlDeviceGetPciInfo(self, handle: FakeDeviceHandle) -> nvmlPciInfo_t:
        gpu = self._gpu(handle, "nvmlDeviceGetPciInfo", "nvmlDeviceGetPciInfo_v3")
        domain_s, bus_s, rest = canonical_pci(gpu.pci_bus_id).split(":")
        dev_s, fn_s = rest.split(".")
        domain, bus, dev, fn = int(domain_s, 16), int(bus_s, 16), int(dev_s, 16), int(fn_s)
        info = nvmlPciInfo_t()
        info.busId = f"{domain:08X}:{bus:02X}:{dev:02X}.{fn}".encode()
        info.busIdLegacy = f"{domain:04X}:{bus:02X}:{dev:02X}.{fn}".encode()
        info.domain, info.bus, info.device = domain, bus, dev
        info.pciDeviceId = gpu.pci_device_id
        info.pciSubSystemId = getattr(gpu, "pci_subsystem_id", 0)
        return info

    nvmlDeviceGetPciInfo_v3 = nvmlDeviceGetPciInfo

    @_locked
    def nvmlDeviceGetNumaNodeId(self, handle: FakeDeviceHandle) -> int:
        return self._value(self._gpu(handle, "nvmlDeviceGetNumaNodeId").numa_node)

    @_locked
    def nvmlDeviceGetMemoryInfo(self, handle: FakeDeviceHandle, version: int | None = None):
        gpu = self._gpu(handle, "nvmlDeviceGetMemoryInfo")
        total = gpu.memory_total_bytes
        used = min(total, sum(mem for _, mem, _ in gpu.processes))
        if not version:
            return c_nvmlMemory_t(total=total, free=total - used, used=used)
        if version != nvmlMemory_v2:
            raise _fail(NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        return c_nvmlMemory_v2_t(version=version, total=total, reserved=0, free=total - used,
                                 used=used)

    # -- memory health -------------------------------------------------------------------------

    @_locked
    def nvmlDeviceGetEccMode(self, handle: FakeDeviceHandle) -> list[int]:
        gpu = self._gpu(handle, "nvmlDeviceGetEccMode")
        enabled = int(bool(self._value(gpu.ecc_enabled)))
        return [enabled, enabled]

    @_locked
    def nvmlDeviceGetTotalEccErrors(self, handle: FakeDeviceHandle, errorType: int,
                                    counterType: int) -> int:
        gpu = self._gpu(handle, "nvmlDeviceGetTotalEccErrors")
        if errorType not in (0, 1) or counterType not in (0, 1):
            raise _fail(NVML_ERROR_INVALID_ARGUMENT)
        if not gpu.ecc_enabled:
            raise _fail(NVML_ERROR_NOT_SUPPORTED)
        unc = nvml_h.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
        cor = nvml_h.NVML_MEMORY_ERROR_TYPE_CORRECTED
        vol, agg = nvml_h.NVML_VOLATILE_ECC, nvml_h.NVML_AGGREGATE_ECC
        table = {
            (unc, vol): gpu.ecc_volatile_uncorrected,
            (cor, vol): gpu.ecc_volatile_corrected,
            (unc, agg): gpu.ecc_aggregate_uncorrected,
            (cor, agg): gpu.ecc_aggregate_corrected,
        }
        return self._value(table[(errorType, counterType)])

    @_locked
    def nvmlDeviceGetRetiredPages(self, device: FakeDeviceHandle, sourceFilter: int) -> list[int]:
        gpu = self._gpu(device, "nvmlDeviceGetRetiredPages")
        if not _pre_ampere(gpu):
            raise _fail(NVML_ERROR_NOT_SUPPORTED)
        if sourceFilter not in (0, 1):
            raise _fail(NVML_ERROR_INVALID_ARGUMENT)
        if sourceFilter == nvml_h.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS:
            return []
        # Page addresses are opaque to health checks; only their number matters.
        return [0x1_0000_0000 + 0x1000 * i for i in range(gpu.retired_pages)]

    @_locked
    def nvmlDeviceGetRetiredPagesPendingStatus(self, device: FakeDeviceHandle) -> int:
        gpu = self._gpu(device, "nvmlDeviceGetRetiredPagesPendingStatus")
        if not _pre_ampere(gpu):
            raise _fail(NVML_ERROR_NOT_SUPPORTED)
        return int(bool(getattr(gpu, "retired_pages_pending", False)))

    @_locked
    def nvmlDeviceGetRemappedRows(self, device: FakeDeviceHandle) -> tuple[int, int, int, int]:
        gpu = self._gpu(device, "nvmlDeviceGetRemappedRows")
        if _pre_ampere(gpu):
            raise _fail(NVML_ERROR_NOT_SUPPORTED)
        return (gpu.remapped_corr, gpu.remapped_unc, int(gpu.remap_pending),
                int(gpu.remap_failure))

    @_locked
    def nvmlDeviceGetRowRemapperHistogram(self, device: FakeDeviceHandle):
        gpu = self._gpu(device, "nvmlDeviceGetRowRemapperHistogram")
        if _pre_ampere(gpu) or gpu.histogram is None:
            raise _fail(NVML_ERROR_NOT_SUPPORTED)
        h = gpu.histogram
        return c_nvmlRowRemapperHistogramValues(
            max=h.get("max", 0), high=h.get("high", 0), partial=h.get("partial", 0),
            low=h.get("low", 0), none=h.get("none", 0))

    # -- clocks, power, temperature ------------------------------------------------------------

    @_locked
    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: FakeDeviceHandle) -> int:
        gpu = self._gpu(handle, "nvmlDeviceGetCurrentClocksEventReasons")
        return self._value(gpu.clock_event_reasons)

    @_locked
    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: FakeDeviceHandle) -> int:
        # The pre-R535 name of the same entry point; injecting ``FunctionNotFound`` on the new
        # name alone simulates an old driver under new bindings.
        gpu = self._gpu(handle, "nvmlDeviceGetCurrentClocksThrottleReasons")
        return self._value(gpu.clock_event_reasons)

    @_locked
    def nvmlDeviceGetViolationStatus(self, device: FakeDeviceHandle, perfPolicyType: int):
        gpu = self._gpu(device, "nvmlDeviceGetViolationStatus")
        key = _PERF_POLICY_KEYS.get(perfPolicyType)
        if key is None:
            raise _fail(NVML_ERROR_INVALID_ARGUMENT)
        # referenceTime is a CPU timestamp in microseconds (nvml.h); violationTime is in ns.
        return c_nvmlViolationTime_t(referenceTime=time.time_ns() // 1000,
                                     violationTime=gpu.violation_ns.get(key, 0))

    @_locked
    def nvmlDeviceGetTemperature(self, handle: FakeDeviceHandle, sensor: int) -> int:
        gpu = self._gpu(handle, "nvmlDeviceGetTemperature")
        if sensor != NVML_TEMPERATURE_GPU:
            raise _fail(NVML_ERROR_INVALID_ARGUMENT)
        return self._value(gpu.temperature_core_c)

    @_locked
    def nvmlDeviceGetTemperatureThreshold(self, handle: FakeDeviceHandle, threshold: int) -> int:
        gpu = self._gpu(handle, "nvmlDeviceGetTemperatureThreshold")
        if not 0 <= threshold < NVML_TEMPERATURE_THRESHOLD_COUNT:
            raise _fail(NVML_ERROR_INVALID_ARGUMENT)
        values = {
            NVML_TEMPERATURE_THRESHOLD_SHUTDOWN: gpu.shutdown_threshold_c,
            NVML_TEMPERATURE_THRESHOLD_SLOWDOWN: gpu.slowdown_threshold_c,
            NVML_TEMPERATURE_THRESHOLD_MEM_MAX: gpu.memory_max_threshold_c,
            NVML_TEMPERATURE_THRESHOLD_GPU_MAX: getattr(gpu, "gpu_max_threshold_c", None),
        }
        return self._value(values.get(threshold))

    @_locked
    def nvmlDeviceGetFieldValues(self, handle: FakeDeviceHandle, fieldIds: list[Any]):
        gpu = self._gpu(handle, "nvmlDeviceGetFieldValues")
        values = (c_nvmlFieldValue_t * len(fieldIds))()
        now_us = time.time_ns() // 1000
        for i, field_id in enumerate(fieldIds):
            fv = values[i]
            if isinstance(field_id, tuple):
                fv.fieldId, fv.scopeId = field_id
            else:
                fv.fieldId = field_id
            fv.timestamp = now_us
            injected = gpu.nvml_errors.get(_FIELD_NAMES.get(fv.fieldId, ""))
            if injected:
                fv.nvmlReturn = error_class(injected)._code or NVML_ERROR_UNKNOWN
            elif fv.fieldId == NVML_FI_DEV_MEMORY_TEMP and gpu.temperature_memory_c is not None:
                fv.valueType = NVML_VALUE_TYPE_UNSIGNED_INT
                fv.value.uiVal = gpu.temperature_memory_c
                fv.nvmlReturn = NVML_SUCCESS
            else:
                fv.nvmlReturn = NVML_ERROR_NOT_SUPPORTED
        return values

    @_locked
    def nvmlDeviceGetPowerUsage(self, handle: FakeDeviceHandle) -> int:
        return self._value(self._gpu(handle, "nvmlDeviceGetPowerUsage").power_usage_mw)

    @_locked
    def nvmlDeviceGetEnforcedPowerLimit(self, handle: FakeDeviceHandle) -> int:
        return self._value(self._gpu(handle, "nvmlDeviceGetEnforcedPowerLimit").power_limit_mw)

    def _clock(self, gpu: GpuSpec, clock_type: int, current: bool) -> int:
        if not 0 <= clock_type < NVML_CLOCK_COUNT:
            raise _fail(NVML_ERROR_INVALID_ARGUMENT)
        if clock_type in (NVML_CLOCK_GRAPHICS, NVML_CLOCK_SM):
            return self._value(gpu.sm_clock_mhz if current else gpu.max_sm_clock_mhz)
        attr = {NVML_CLOCK_MEM: "mem_clock_mhz", NVML_CLOCK_VIDEO: "video_clock_mhz"}[clock_type]
        return self._value(getattr(gpu, attr if current else "max_" + attr, None))

    @_locked
    def nvmlDeviceGetClockInfo(self, handle: FakeDeviceHandle, type: int) -> int:
        return self._clock(self._gpu(handle, "nvmlDeviceGetClockInfo"), type, current=True)

    @_locked
    def nvmlDeviceGetMaxClockInfo(self, handle: FakeDeviceHandle, type: int) -> int:
        return self._clock(self._gpu(handle, "nvmlDeviceGetMaxClockInfo"), type, current=False)

    # -- interconnects -------------------------------------------------------------------------

    def _link(self, gpu: GpuSpec, link: int) -> None:
        if not gpu.nvlink_up:
            raise _fail(NVML_ERROR_NOT_SUPPORTED)
        if not isinstance(link, int) or not 0 <= link < len(gpu.nvlink_up):
            raise _fail(NVML_ERROR_INVALID_ARGUMENT)

    @_locked
    def nvmlDeviceGetNvLinkState(self, device: FakeDeviceHandle, link: int) -> int:
        gpu = self._gpu(device, "nvmlDeviceGetNvLinkState")
        self._link(gpu, link)
        return NVML_FEATURE_ENABLED if gpu.nvlink_up[link] else NVML_FEATURE_DISABLED

    @_locked
    def nvmlDeviceGetNvLinkErrorCounter(self, device: FakeDeviceHandle, link: int,
                                        counter: int) -> int:
        gpu = self._gpu(device, "nvmlDeviceGetNvLinkErrorCounter")
        self._link(gpu, link)
        name = NVLINK_COUNTER_NAMES.get(counter)
        if name is None:
            raise _fail(NVML_ERROR_INVALID_ARGUMENT)
        return sum(v for (lk, key), v in gpu.nvlink_errors.items()
                   if lk == link and _counter_name(key) == name)

    @_locked
    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: FakeDeviceHandle) -> int:
        return self._value(self._gpu(handle, "nvmlDeviceGetCurrPcieLinkGeneration")
                           .pcie_gen_current)

    @_locked
    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: FakeDeviceHandle) -> int:
        return self._value(self._gpu(handle, "nvmlDeviceGetCurrPcieLinkWidth")
                           .pcie_width_current)

    @_locked
    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: FakeDeviceHandle) -> int:
        return self._value(self._gpu(handle, "nvmlDeviceGetMaxPcieLinkGeneration").pcie_gen_max)

    @_locked
    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: FakeDeviceHandle) -> int:
        return self._value(self._gpu(handle, "nvmlDeviceGetMaxPcieLinkWidth").pcie_width_max)

    @_locked
    def nvmlDeviceGetPcieReplayCounter(self, handle: FakeDeviceHandle) -> int:
        return self._value(self._gpu(handle, "nvmlDeviceGetPcieReplayCounter")
                           .pcie_replay_counter)

    def _fill_fabric(self, gpu: GpuSpec, info: Any) -> None:
        if not gpu.fabric_supported:
            raise _fail(NVML_ERROR_NOT_SUPPORTED)
        completed = gpu.fabric_state == NVML_GPU_FABRIC_STATE_COMPLETED
        ctypes.memmove(info.clusterUuid, _CLUSTER_UUID if completed else bytes(16), 16)
        info.status = gpu.fabric_status
        info.cliqueId = getattr(gpu, "fabric_clique_id", 0) if completed else 0
        info.state = gpu.fabric_state

    @_locked
    def nvmlDeviceGetGpuFabricInfo(self, device: FakeDeviceHandle, gpuFabricInfo: Any) -> int:
        gpu = self._gpu(device, "nvmlDeviceGetGpuFabricInfo")
        self._fill_fabric(gpu, _raw(gpuFabricInfo))
        return NVML_SUCCESS

    @_locked
    def nvmlDeviceGetGpuFabricInfoV(self, device: FakeDeviceHandle, gpuFabricInfo: Any) -> int:
        gpu = self._gpu(device, "nvmlDeviceGetGpuFabricInfoV")
        info = _raw(gpuFabricInfo)
        if getattr(info, "version", None) not in (nvmlGpuFabricInfo_v2, nvmlGpuFabricInfo_v3):
            raise _fail(NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        self._fill_fabric(gpu, info)
        info.healthMask = 0
        return NVML_SUCCESS

    # -- MIG and processes ---------------------------------------------------------------------

    @_locked
    def nvmlDeviceGetMigMode(self, device: FakeDeviceHandle) -> list[int]:
        gpu = self._gpu(device, "nvmlDeviceGetMigMode")
        if not _MIG_CAPABLE.search(gpu.name):
            raise _fail(NVML_ERROR_NOT_SUPPORTED)
        mode = NVML_DEVICE_MIG_ENABLE if gpu.mig_enabled else NVML_DEVICE_MIG_DISABLE
        return [mode, mode]

    @staticmethod
    def _process_objects(gpu: GpuSpec) -> list[nvmlFriendlyObject]:
        # gpuInstanceId/computeInstanceId are 0xFFFFFFFF outside MIG, as the driver reports.
        return [nvmlFriendlyObject({"pid": pid, "usedGpuMemory": mem,
                                    "gpuInstanceId": 0xFFFFFFFF, "computeInstanceId": 0xFFFFFFFF})
                for pid, mem, _name in gpu.processes]

    @_locked
    def nvmlDeviceGetComputeRunningProcesses(self, handle: FakeDeviceHandle):
        # pynvml's unversioned call is the _v3 one behind @throwOnVersionMismatch.
        with _version_mismatch("nvmlDeviceGetComputeRunningProcesses"):
            gpu = self._gpu(handle, "nvmlDeviceGetComputeRunningProcesses",
                            "nvmlDeviceGetComputeRunningProcesses_v3")
        return self._process_objects(gpu)

    @_locked
    def nvmlDeviceGetComputeRunningProcesses_v3(self, handle: FakeDeviceHandle):
        gpu = self._gpu(handle, "nvmlDeviceGetComputeRunningProcesses_v3")
        return self._process_objects(gpu)

    @_locked
    def nvmlDeviceGetComputeRunningProcesses_v2(self, handle: FakeDeviceHandle):
        gpu = self._gpu(handle, "nvmlDeviceGetComputeRunningProcesses_v2")
        return self._process_objects(gpu)

    @_locked
    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: FakeDeviceHandle):
        # Simulated workloads are CUDA compute contexts; none of them is a graphics client.
        with _version_mismatch("nvmlDeviceGetGraphicsRunningProcesses"):
            self._gpu(handle, "nvmlDeviceGetGraphicsRunningProcesses",
                      "nvmlDeviceGetGraphicsRunningProcesses_v3")
        return []

    @_locked
    def nvmlDeviceGetGraphicsRunningProcesses_v3(self, handle: FakeDeviceHandle):
        self._gpu(handle, "nvmlDeviceGetGraphicsRunningProcesses_v3")
        return []

    @_locked
    def nvmlDeviceGetGraphicsRunningProcesses_v2(self, handle: FakeDeviceHandle):
        self._gpu(handle, "nvmlDeviceGetGraphicsRunningProcesses_v2")
        return []


_FIELD_NAMES = {NVML_FI_DEV_MEMORY_TEMP: "NVML_FI_DEV_MEMORY_TEMP"}

# The module-like surface: constants, exception classes and struct types as class attributes.
for _name, _value in {**CONSTANTS, **ERROR_CLASSES, **STRUCTS}.items():
    setattr(FakeNvml, _name, _value)
FakeNvml.NVMLError = NVMLError  # type: ignore[attr-defined]
FakeNvml.NVMLLibraryMismatchError = NVMLLibraryMismatchError  # type: ignore[attr-defined]
FakeNvml.nvmlFriendlyObject = nvmlFriendlyObject  # type: ignore[attr-defined]
del _name, _value

#: The public NVML function names the fake implements.
FUNCTIONS: tuple[str, ...] = tuple(sorted(
    n for n in dir(FakeNvml)
    if n.startswith("nvml") and callable(getattr(FakeNvml, n))
    and not isinstance(getattr(FakeNvml, n), type)
))

#: Calls that name no GPU: an error injected on one goes in ``NodeSpec.nvml_errors``.
SYSTEM_FUNCTIONS: frozenset[str] = frozenset({
    "nvmlInit", "nvmlInitWithFlags", "nvmlShutdown", "nvmlDeviceGetCount",
    "nvmlSystemGetDriverVersion", "nvmlSystemGetCudaDriverVersion",
    "nvmlSystemGetCudaDriverVersion_v2", "nvmlSystemGetNVMLVersion",
})

#: Calls that can fail for one GPU (``GpuSpec.nvml_errors``), and the field ids
#: ``nvmlDeviceGetFieldValues`` answers per field (an injected error is that field's
#: ``nvmlReturn``, the call itself succeeds, as on real NVML).
DEVICE_FUNCTIONS: frozenset[str] = frozenset(
    set(FUNCTIONS) - SYSTEM_FUNCTIONS - {"nvmlErrorString", "nvmlExceptionClass"})
FIELD_NAMES: frozenset[str] = frozenset(_FIELD_NAMES.values())

#: Every NVML error the fake can raise, by pynvml's class name less ``NVMLError_``.
ERROR_NAMES: tuple[str, ...] = tuple(n[len("NVMLError_"):] for n in ERROR_CLASSES)


def fake_pynvml_module(spec: NodeSpec, fake: FakeNvml | None = None) -> types.ModuleType:
    """A real module object (``types.ModuleType``) over a ``FakeNvml``: for code that insists on
    a module, e.g. ``sys.modules["pynvml"] = fake_pynvml_module(spec)`` in a subprocess."""
    fake = fake if fake is not None else FakeNvml(spec)
    module = types.ModuleType("pynvml", "Simulated pynvml (gpu_monitor.sim.fake_nvml)")
    for name in dir(FakeNvml):
        if name.startswith(("nvml", "NVML", "c_nvml")):
            setattr(module, name, getattr(fake, name))
    module.fake = fake  # type: ignore[attr-defined]
    return module
