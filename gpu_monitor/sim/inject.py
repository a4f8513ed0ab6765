"""``--inject`` faults for the simulated node: ``KIND@TARGET[,key=value...]``.

Each fault changes the simulated hardware (``NodeSpec``) and nothing else; the fake pynvml, the
sysfs tree, the kernel-log file and the fake tools then show it at the lowest boundary, so the
real readers and checks see it exactly as they would see real hardware.

``after=SECONDS`` delays a fault, ``for=SECONDS`` ends it (for faults that unfold over time, e.g.
``port-down@ib:mlx5_0:1,after=10,for=30``). ``count=N`` repeats a kernel-log fault (an XID burst,
spaced ``every=SECONDS`` apart).
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from gpu_monitor.model import canonical_pci
from gpu_monitor.sim import fake_nvml
from gpu_monitor.sim.spec import (
    CLOCK_EVENT_HW_POWER_BRAKE,
    CLOCK_EVENT_HW_SLOWDOWN,
    CLOCK_EVENT_HW_THERMAL,
    GpuSpec,
    NodeSpec,
    SysfsOverride,
    TimedLine,
)


class InjectError(ValueError):
    """A malformed ``--inject`` spec; the message says what is wrong and what is accepted."""


@dataclass(frozen=True)
class Fault:
    kind: str
    target: str
    params: dict[str, str] = field(default_factory=dict)
    after_s: float = 0.0
    for_s: float | None = None
    text: str = ""

    def int(self, key: str, default: int | None = None) -> int:
        raw = self.params.get(key)
        if raw is None:
            if default is None:
                raise InjectError(f"{self.text}: missing {key}=N")
            return default
        try:
            return int(raw, 0)
        except ValueError:
            raise InjectError(f"{self.text}: {key}={raw!r} is not an integer") from None

    def float(self, key: str, default: float | None = None) -> float:
        raw = self.params.get(key)
        if raw is None:
            if default is None:
                raise InjectError(f"{self.text}: missing {key}=X")
            return default
        try:
            return float(raw)
        except ValueError:
            raise InjectError(f"{self.text}: {key}={raw!r} is not a number") from None

    def choice(self, key: str, choices: tuple[str, ...], default: str | None = None) -> str:
        raw = self.params.get(key, default)
        if raw is None:
            raise InjectError(f"{self.text}: missing {key}= (one of {', '.join(choices)})")
        if raw not in choices:
            raise InjectError(f"{self.text}: {key}={raw!r}: expected one of {', '.join(choices)}")
        return raw

    @property
    def gpu_index(self) -> int:
        return int(self.target.split(":")[1])

    @property
    def ib(self) -> tuple[str, int]:
        _, dev, port = self.target.split(":")
        return dev, int(port)


@dataclass(frozen=True)
class FaultKind:
    name: str
    target: str  # "gpu", "ib", "nvswitch", "node", "gpu or node"
    params: tuple[str, ...]
    summary: str
    apply: Callable[[NodeSpec, Fault], None]
    revert: Callable[[NodeSpec, Fault], None] | None = None
    timed: bool = False  # may use after=/for=
    example: str = ""


_TARGET_RES = {
    "gpu": re.compile(r"^gpu:\d+$"),
    "ib": re.compile(r"^ib:[A-Za-z0-9_\-]+:\d+$"),
    "nvswitch": re.compile(r"^nvswitch:\d+$"),
    "node": re.compile(r"^node$"),
    "gpu or node": re.compile(r"^(gpu:\d+|node)$"),
    "sysfs": re.compile(r"^(?:gpu:\d+|nvswitch:\d+|ib:[A-Za-z0-9_\-]+:\d+"
                        r"|pcie:[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])$"),
}
_TARGET_EXAMPLES = {"gpu": "gpu:3", "ib": "ib:mlx5_0:1", "nvswitch": "nvswitch:0",
                    "node": "node", "gpu or node": "gpu:3 or node",
                    "sysfs": "gpu:0, nvswitch:0, ib:mlx5_0:1 or pcie:0000:4f:00.0"}


# --- kernel-log lines, in the real NVRM/nvswitch formats ------------------------------------------

XID_TEXT = {
    13: "Graphics SM Warp Exception on (GPC 0, TPC 0, SM 0): Out Of Range Address",
    31: "Ch 00000008, intr 10000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ "
        "0x7f2a_bc000000. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ",
    43: "Ch 00000010",
    45: "Ch 00000010",
    48: "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer "
        "at partition 6, subpartition 0.",
    63: "Row Remapper: New row marked for remapping, reset gpu to activate.",
    64: "Row Remapper: Failed to remap a row, the row needs to be remapped.",
    74: "NVLink: fatal error detected on link 4(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)",
    79: "GPU has fallen off the bus.",
    92: "High single-bit ECC error rate.",
    94: "Contained: SM (0x1). RST: No, D-RST: No",
    95: "Uncontained: FBHUB. RST: Yes, D-RST: No",
    119: "Timeout after 6s of waiting for RPC response from GPU0 GSP! Expected function 76 "
         "(GSP_RM_CONTROL) (0x20803032 0x38).",
    120: "GSP task failure.",
}
APP_XIDS_WITH_PID = {13, 31, 43, 45}


def xid_line(gpu: GpuSpec, code: int, pid: int = 21842, name: str = "python") -> str:
    bus = gpu.pci_bus_id[: gpu.pci_bus_id.rindex(".")]  # NVRM prints domain:bus:dev
    text = XID_TEXT.get(code, f"Unspecified error (simulated Xid {code}).")
    if code in APP_XIDS_WITH_PID or code in (48, 63, 64, 79, 94, 95):
        return f"NVRM: Xid (PCI:{bus}): {code}, pid={pid}, name={name}, {text}"
    return f"NVRM: Xid (PCI:{bus}): {code}, pid='<unknown>', name=<unknown>, {text}"


def sxid_line(switch_index: int, pci: str, code: int, fatal: bool, link: int = 30) -> str:
    sev = "Fatal" if fatal else "Non-fatal"
    return (f"nvidia-nvswitch{switch_index}: SXid (PCI:{pci}): {code}, {sev}, Link {link} "
            "LTSSM Fault Up")


# --- appliers -------------------------------------------------------------------------------------


def _gpu(spec: NodeSpec, f: Fault) -> GpuSpec:
    try:
        return spec.gpu(f.gpu_index)
    except KeyError as exc:
        raise InjectError(f"{f.text}: {exc.args[0]}") from None


def _gpu_missing(spec: NodeSpec, f: Fault) -> None:
    g = _gpu(spec, f)
    g.missing = True
    g.off_bus = f.int("bus", 1) == 0
    spec.kmsg_lines.append(TimedLine(f.after_s, xid_line(g, 79)))


def _xid(spec: NodeSpec, f: Fault) -> None:
    g = _gpu(spec, f)
    code = f.int("code")
    count = f.int("count", 1)
    every = f.float("every", 1.0)
    for i in range(count):
        spec.kmsg_lines.append(TimedLine(f.after_s + i * every, xid_line(g, code)))


def _sxid(spec: NodeSpec, f: Fault) -> None:
    idx = int(f.target.split(":")[1])
    try:
        sw = spec.nvswitch(idx)
    except KeyError as exc:
        raise InjectError(f"{f.text}: {exc.args[0]}") from None
    code = f.int("code")
    fatal = f.int("fatal", 0) != 0
    if fatal:
        sw.fatal = True
    spec.kmsg_lines.append(TimedLine(f.after_s, sxid_line(idx, sw.pci_bus_id, code, fatal)))


def _remap_pending(spec: NodeSpec, f: Fault) -> None:
    g = _gpu(spec, f)
    g.remap_pending = True
    g.remapped_unc += 1
    spec.kmsg_lines.append(TimedLine(f.after_s, xid_line(g, 63)))


def _remap_failure(spec: NodeSpec, f: Fault) -> None:
    g = _gpu(spec, f)
    g.remap_failure = True
    spec.kmsg_lines.append(TimedLine(f.after_s, xid_line(g, 64)))


def _remap_headroom(spec: NodeSpec, f: Fault) -> None:
    g = _gpu(spec, f)
    low = f.int("low", 0)
    none = f.int("none", 0)
    h = g.histogram
    h["low"] = low
    h["none"] = none
    h["max"] = max(0, h.get("max", 0) - low - none)


def _ecc_uncorrectable(spec: NodeSpec, f: Fault) -> None:
    g = _gpu(spec, f)
    n = f.int("count", 1)
    g.ecc_volatile_uncorrected += n
    g.ecc_aggregate_uncorrected += n
    spec.kmsg_lines.append(TimedLine(f.after_s, xid_line(g, 48)))


def _pcie_downgrade(spec: NodeSpec, f: Fault) -> None:
    g = _gpu(spec, f)
    g.pcie_gen_current = f.int("gen", g.pcie_gen_current)
    g.pcie_width_current = f.int("width", g.pcie_width_current)
    if (g.pcie_gen_current, g.pcie_width_current) == (g.pcie_gen_max, g.pcie_width_max):
        raise InjectError(f"{f.text}: give gen= or width= below the maximum "
                          f"(Gen{g.pcie_gen_max} x{g.pcie_width_max})")


def _aer(spec: NodeSpec, f: Fault) -> None:
    g = _gpu(spec, f)
    kind = f.choice("kind", ("fatal", "nonfatal", "correctable"))
    n = f.int("count", 1)
    if kind == "fatal":
        g.aer_fatal += n
    elif kind == "nonfatal":
        g.aer_nonfatal += n
    else:
        g.aer_correctable += n


def _nvlink_down(spec: NodeSpec, f: Fault) -> None:
    g = _gpu(spec, f)
    link = f.int("link")
    if not 0 <= link < len(g.nvlink_up):
        raise InjectError(f"{f.text}: link {link} out of range (gpu has {len(g.nvlink_up)} links)")
    g.nvlink_up[link] = False


def _nvlink_up(spec: NodeSpec, f: Fault) -> None:
    g = _gpu(spec, f)
    g.nvlink_up[f.int("link")] = True


_THROTTLE_BITS = {
    "hw_slowdown": CLOCK_EVENT_HW_SLOWDOWN,
    "hw_thermal_slowdown": CLOCK_EVENT_HW_THERMAL,
    "hw_power_brake": CLOCK_EVENT_HW_POWER_BRAKE,
}


def _throttle(spec: NodeSpec, f: Fault) -> None:
    g = _gpu(spec, f)
    event = f.choice("event", tuple(_THROTTLE_BITS))
    g.clock_event_reasons |= _THROTTLE_BITS[event]


def _unthrottle(spec: NodeSpec, f: Fault) -> None:
    g = _gpu(spec, f)
    g.clock_event_reasons &= ~_THROTTLE_BITS[f.params["event"]]


def _hot(spec: NodeSpec, f: Fault) -> None:
    g = _gpu(spec, f)
    g.temperature_core_c = f.int("core", g.temperature_core_c)
    g.temperature_memory_c = f.int("memory", g.temperature_memory_c)


def _power_limit(spec: NodeSpec, f: Fault) -> None:
    g = _gpu(spec, f)
    pct = f.float("pct", 100.0)
    if pct < 0:
        raise InjectError(f"{f.text}: pct must be >= 0")
    g.power_usage_mw = round(g.power_limit_mw * pct / 100)


def _port_down(spec: NodeSpec, f: Fault) -> None:
    dev, port = f.ib
    try:
        p = spec.ib_port(dev, port)
    except KeyError as exc:
        raise InjectError(f"{f.text}: {exc.args[0]}") from None
    p.outages.append((f.after_s, f.for_s if f.for_s is not None else float("inf")))


def _slow(spec: NodeSpec, f: Fault) -> None:
    g = _gpu(spec, f)
    factor = f.float("factor", 3.0)
    if factor <= 0:
        raise InjectError(f"{f.text}: factor must be > 0")
    g.speed_factor = factor


def _wrong_results(spec: NodeSpec, f: Fault) -> None:
    _gpu(spec, f).wrong_results = True


def _sdc(spec: NodeSpec, f: Fault) -> None:
    _gpu(spec, f).sdc = True


def _dcgm_fail(spec: NodeSpec, f: Fault) -> None:
    g = _gpu(spec, f)
    g.dcgm_failures.append(f.params.get("test", "memory"))


def _ib_bw(spec: NodeSpec, f: Fault) -> None:
    dev, port = f.ib
    try:
        p = spec.ib_port(dev, port)
    except KeyError as exc:
        raise InjectError(f"{f.text}: {exc.args[0]}") from None
    p.loopback_gbit = f.float("gbit")


# What ``missing@node`` can take away: the image's tools and runtimes, not hardware.
MISSING = ("dcgmi", "nv-hostengine", "ib_write_bw", "torch")


def _missing(spec: NodeSpec, f: Fault) -> None:
    what = f.choice("what", MISSING)
    if what == "dcgmi":
        spec.dcgmi_installed = False
    elif what == "nv-hostengine":
        spec.dcgm_available = False
    elif what == "ib_write_bw":
        spec.perftest_available = False
    else:
        spec.torch_available = False


def _exit_code(f: Fault) -> int:
    code = f.int("exit")
    if not 0 <= code <= 255:
        raise InjectError(f"{f.text}: exit={code} is not an exit status (0..255)")
    return code


DCGM_CUTS = ("Metadata", "Deployment", "Integration", "Hardware", "Stress", "end")


def _dcgm_output(spec: NodeSpec, f: Fault) -> None:
    """What the fake dcgmi prints and returns instead of a faithful report."""
    if not f.params:
        raise InjectError(f"{f.text}: give at least one of format=, exit=, cut=, lines=, "
                          "drop=, status=, file=")
    out = spec.dcgm_output
    if "format" in f.params:
        out["format"] = f.choice("format", ("json", "text"))
    if "exit" in f.params:
        out["exit"] = _exit_code(f)
    if "cut" in f.params:
        out["cut"] = f.choice("cut", DCGM_CUTS)
    if "lines" in f.params:
        out["lines"] = f.int("lines")
        if out["lines"] < 0:
            raise InjectError(f"{f.text}: lines must be >= 0")
    if "drop" in f.params:
        index = f.int("drop")
        try:
            spec.gpu(index)
        except KeyError as exc:
            raise InjectError(f"{f.text}: {exc.args[0]}") from None
        out.setdefault("drop", []).append(index)
    if "status" in f.params:
        word = f.params["status"]
        if not word or "\n" in word:
            raise InjectError(f"{f.text}: status= needs a word")
        out["status"] = word
    if "file" in f.params:
        if not os.path.isfile(f.params["file"]):
            raise InjectError(f"{f.text}: file={f.params['file']!r} does not exist")
        out["file"] = os.path.abspath(f.params["file"])


PERFTEST_CUTS = ("before-report", "after-header", "mid-row", "before-rule")


def _ib_bw_output(spec: NodeSpec, f: Fault) -> None:
    """How the fake ib_write_bw mangles its report on that port (server and client alike)."""
    dev, port = f.ib
    try:
        p = spec.ib_port(dev, port)
    except KeyError as exc:
        raise InjectError(f"{f.text}: {exc.args[0]}") from None
    if not f.params:
        raise InjectError(f"{f.text}: give cut= ({', '.join(PERFTEST_CUTS)}) and/or exit=")
    if "cut" in f.params:
        p.perftest_output["cut"] = f.choice("cut", PERFTEST_CUTS)
    if "exit" in f.params:
        p.perftest_output["exit"] = _exit_code(f)


SYSFS_SHAPES = ("text", "empty", "binary", "dir", "missing")


def _sysfs(spec: NodeSpec, f: Fault) -> None:
    """Replace one file of a PCI function (gpu:/nvswitch:/pcie: target, file relative to the
    function's directory) or of an RDMA port (ib: target, relative to ``ports/<n>``)."""
    rel = f.params.get("file", "").strip()
    parts = rel.split("/")
    if not rel or rel.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise InjectError(f"{f.text}: file= must name a file below the target's directory, "
                          "e.g. file=max_link_width or file=counters/link_downed")
    shape = f.choice("shape", SYSFS_SHAPES, "text")
    if shape == "text" and "value" not in f.params:
        raise InjectError(f"{f.text}: shape=text needs value=TEXT")
    kind, _, rest = f.target.partition(":")
    try:
        if kind == "ib":
            dev, port = f.ib
            spec.ib_port(dev, port)
            owner = f"ib:{dev}:{port}"
        elif kind == "gpu":
            owner = f"pci:{canonical_pci(spec.gpu(f.gpu_index).pci_bus_id)}"
        elif kind == "nvswitch":
            owner = f"pci:{canonical_pci(spec.nvswitch(int(rest)).pci_bus_id)}"
        else:
            addr = canonical_pci(rest)
            known = {canonical_pci(x.pci_bus_id) for x in (*spec.gpus, *spec.nvswitches,
                                                            *spec.ib_ports)}
            if addr not in known:
                raise KeyError(f"no PCI function {addr} on this simulated node")
            owner = f"pci:{addr}"
    except KeyError as exc:
        raise InjectError(f"{f.text}: {exc.args[0]}") from None
    spec.sysfs_overrides[(owner, rel)] = SysfsOverride(shape, f.params.get("value", ""))


#: Every error pynvml can raise, by its class name less ``NVMLError_`` (nvml.h's return codes).
NVML_ERRORS = fake_nvml.ERROR_NAMES


def _nvml_error(spec: NodeSpec, f: Fault) -> None:
    """``@gpu:N``: the call fails for that GPU (a ``NVML_FI_*`` name fails that field of
    ``nvmlDeviceGetFieldValues``); ``@node``: the call fails for every GPU, and calls that name
    no GPU (nvmlInit, nvmlDeviceGetCount, nvmlSystemGet*) fail at all. A name the simulated
    NVML does not have is refused: an injection that changes nothing would pass any test."""
    call = f.params.get("call")
    error = f.choice("error", NVML_ERRORS, "GpuIsLost")
    if f.target == "node":
        if not call or call == "*":
            raise InjectError(f"{f.text}: call=NAME is required at node")
        if call not in fake_nvml.FUNCTIONS and call not in fake_nvml.FIELD_NAMES:
            raise InjectError(f"{f.text}: call={call!r} is not an NVML function of the "
                              "simulated node")
        spec.nvml_errors[call] = error
        return
    g = _gpu(spec, f)
    if not call or call == "*":
        if error == "GpuIsLost":
            g.lost = True
            return
        raise InjectError(f"{f.text}: call=NAME is required unless error=GpuIsLost")
    if call in fake_nvml.SYSTEM_FUNCTIONS:
        raise InjectError(f"{f.text}: {call} names no GPU; inject it at the node: "
                          f"nvml-error@node,call={call},error={error}")
    if call not in fake_nvml.DEVICE_FUNCTIONS and call not in fake_nvml.FIELD_NAMES:
        raise InjectError(f"{f.text}: call={call!r} is not a per-GPU NVML function of the "
                          "simulated node (or an NVML_FI_* field it answers)")
    g.nvml_errors[call] = error


def _gpu_process(spec: NodeSpec, f: Fault) -> None:
    g = _gpu(spec, f)
    pid = f.int("pid", 4242)
    g.processes.append((pid, f.int("mib", 1024) * 1024 * 1024, f.params.get("name", "python")))


_EXAMPLES = {
    'gpu-missing': 'gpu-missing@gpu:7',
    'xid': 'xid@gpu:3,code=79',
    'sxid': 'sxid@nvswitch:0,code=20034,fatal=1',
    'row-remap-pending': 'row-remap-pending@gpu:2',
    'row-remap-failure': 'row-remap-failure@gpu:2',
    'remap-headroom': 'remap-headroom@gpu:1,low=8,none=1',
    'ecc-uncorrectable': 'ecc-uncorrectable@gpu:5',
    'pcie-downgrade': 'pcie-downgrade@gpu:1,gen=3,width=8',
    'aer': 'aer@gpu:0,kind=fatal',
    'nvlink-down': 'nvlink-down@gpu:0,link=4',
    'throttle': 'throttle@gpu:5,event=hw_slowdown',
    'hot': 'hot@gpu:3,core=88,memory=98',
    'power-limit': 'power-limit@gpu:4',
    'port-down': 'port-down@ib:mlx5_0:1,after=10,for=30',
    'slow': 'slow@gpu:4,factor=3',
    'wrong-results': 'wrong-results@gpu:6',
    'sdc': 'sdc@gpu:3',
    'dcgm-fail': 'dcgm-fail@gpu:2,test=memory',
    'ib-bw': 'ib-bw@ib:mlx5_1:1,gbit=100',
    'nvml-error': 'nvml-error@gpu:2,call=nvmlDeviceGetTemperature,error=Unknown',
    'gpu-process': 'gpu-process@gpu:0,pid=1234',
    'missing': 'missing@node,what=dcgmi',
    'sysfs': 'sysfs@ib:mlx5_0:1,file=rate,value=banana',
    'dcgm-output': 'dcgm-output@node,format=text,lines=20',
    'ib-bw-output': 'ib-bw-output@ib:mlx5_0:1,cut=mid-row',
}

KINDS: dict[str, FaultKind] = {
    k.name: dataclasses.replace(k, example=_EXAMPLES[k.name])
    for k in (
        FaultKind("gpu-missing", "gpu", ("bus",),
                  "GPU not enumerated by NVML (fallen off the bus); bus=0 also removes it "
                  "from the PCI bus", _gpu_missing),
        FaultKind("xid", "gpu", ("code", "count", "every"),
                  "an NVRM Xid line in the kernel log (code=N; count=N for a burst)", _xid,
                  timed=True),
        FaultKind("sxid", "nvswitch", ("code", "fatal"),
                  "an NVSwitch SXid line (fatal=1 marks the switch fatal)", _sxid, timed=True),
        FaultKind("row-remap-pending", "gpu", (), "a row remap pending (needs a GPU reset)",
                  _remap_pending),
        FaultKind("row-remap-failure", "gpu", (), "a row remap failure (needs replacement)",
                  _remap_failure),
        FaultKind("remap-headroom", "gpu", ("low", "none"),
                  "remapper histogram: N banks at low / none spare rows", _remap_headroom),
        FaultKind("ecc-uncorrectable", "gpu", ("count",), "volatile uncorrectable ECC errors",
                  _ecc_uncorrectable),
        FaultKind("pcie-downgrade", "gpu", ("gen", "width"), "PCIe link trained below max",
                  _pcie_downgrade),
        FaultKind("aer", "gpu", ("kind", "count"), "PCIe AER counter increase", _aer,
                  timed=True),
        FaultKind("nvlink-down", "gpu", ("link",), "one NVLink link down", _nvlink_down,
                  _nvlink_up, timed=True),
        FaultKind("throttle", "gpu", ("event",),
                  "a HW clock event active (hw_slowdown, hw_thermal_slowdown, hw_power_brake)",
                  _throttle, _unthrottle, timed=True),
        FaultKind("hot", "gpu", ("core", "memory"), "core / HBM temperature in Celsius", _hot,
                  timed=True),
        FaultKind("power-limit", "gpu", ("pct",),
                  "the GPU draws pct % (default 100) of its enforced power limit",
                  _power_limit),
        FaultKind("port-down", "ib", (), "an RDMA port goes down (after=, for=)", _port_down,
                  timed=True),
        FaultKind("slow", "gpu", ("factor",), "the device computes factor× slower", _slow),
        FaultKind("wrong-results", "gpu", (), "the device's matmul results are wrong",
                  _wrong_results),
        FaultKind("sdc", "gpu", (), "silent data corruption in the device's training step",
                  _sdc),
        FaultKind("dcgm-fail", "gpu", ("test",), "a DCGM diagnostic test fails on the GPU",
                  _dcgm_fail),
        FaultKind("ib-bw", "ib", ("gbit",), "RDMA loopback bandwidth in Gbit/s", _ib_bw),
        FaultKind("nvml-error", "gpu or node", ("call", "error"),
                  "an NVML call raises an error for the GPU (call=*, error=GpuIsLost: the GPU "
                  "is lost), or at the node for every GPU and for nvmlInit, "
                  "nvmlDeviceGetCount, nvmlSystemGet*", _nvml_error),
        FaultKind("gpu-process", "gpu", ("pid", "name", "mib"),
                  "a foreign process holds the GPU", _gpu_process),
        FaultKind("missing", "node", ("what",),
                  "the image lacks a tool or runtime: dcgmi, nv-hostengine (DCGM's host "
                  "engine not running), ib_write_bw (perftest), torch (the passive image)",
                  _missing),
        FaultKind("sysfs", "sysfs", ("file", "value", "shape"),
                  "one sysfs file of a PCI function or RDMA port holds value=TEXT, or is "
                  "shape=empty|binary|dir|missing", _sysfs),
        FaultKind("dcgm-output", "node",
                  ("format", "exit", "cut", "lines", "drop", "status", "file"),
                  "the fake dcgmi diag prints format=json|text whatever -j says, stops before "
                  "the cut=SECTION|end or after lines=N, exits exit=N, leaves GPU drop=N out, "
                  "prints status=WORD for every pass, or prints file=PATH", _dcgm_output),
        FaultKind("ib-bw-output", "ib", ("cut", "exit"),
                  "the fake ib_write_bw cuts its report short (cut=before-report|after-header|"
                  "mid-row|before-rule) or exits exit=N", _ib_bw_output),
    )
}

_COMMON = ("after", "for")


def parse(text: str) -> Fault:
    """Parse ``KIND@TARGET[,key=value...]`` and validate it against the kind's declaration."""
    raw = text.strip()
    if "@" not in raw:
        raise InjectError(f"{text!r}: expected KIND@TARGET[,key=value...], e.g. xid@gpu:3,code=79")
    kind_name, rest = raw.split("@", 1)
    parts = rest.split(",")
    target, kvs = parts[0].strip(), parts[1:]
    kind = KINDS.get(kind_name.strip())
    if kind is None:
        raise InjectError(f"{text!r}: unknown fault kind {kind_name!r}; known: "
                          f"{', '.join(sorted(KINDS))}")
    if not _TARGET_RES[kind.target].match(target):
        raise InjectError(f"{text!r}: {kind.name} needs a {kind.target} target like "
                          f"{_TARGET_EXAMPLES[kind.target]}, got {target!r}")
    params: dict[str, str] = {}
    for kv in kvs:
        if "=" not in kv:
            raise InjectError(f"{text!r}: {kv!r} is not key=value")
        k, v = (s.strip() for s in kv.split("=", 1))
        allowed = kind.params + (_COMMON if kind.timed else ())
        if k not in allowed:
            raise InjectError(f"{text!r}: {kind.name} takes no {k!r}; it takes "
                              f"{', '.join(allowed) or 'no parameters'}")
        params[k] = v
    fault = Fault(kind.name, target, params, text=raw)
    after = fault.float("after", 0.0)
    dur = fault.float("for") if "for" in params else None
    if after < 0 or (dur is not None and dur <= 0):
        raise InjectError(f"{text!r}: after must be >= 0 and for > 0")
    return Fault(kind.name, target, params, after, dur, raw)


def help_text() -> str:
    lines = ["Fault kinds for --inject KIND@TARGET[,key=value...] (with --simulate):"]
    for k in KINDS.values():
        timed = " [,after=S][,for=S]" if k.timed else ""
        lines.append(f"  {k.example}{timed}")
        extra = f" (keys: {', '.join(k.params)})" if k.params else ""
        lines.append(f"      {k.summary}{extra}")
    return "\n".join(lines)
