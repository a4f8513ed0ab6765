"""Faults that are kernel-log lines: Xid and SXid, in the real NVRM and nvidia-nvswitch
formats (``xid_line``, ``sxid_line``; the GPU faults that the driver also logs use them too).

Why it exists: the kernel-log checks must read simulated lines through the real parsers, so
the text here follows what the driver prints.
"""

from __future__ import annotations

from gpu_monitor.sim.faults.base import Fault, FaultKind, InjectError, fault_gpu
from gpu_monitor.sim.spec import (
    GpuSpec,
    NodeSpec,
    TimedLine,
)

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


def _xid(spec: NodeSpec, f: Fault) -> None:
    g = fault_gpu(spec, f)
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


FAULT_KINDS: tuple[FaultKind, ...] = (
    FaultKind("xid", "gpu", ("code", "count", "every"),
          "an NVRM Xid line in the kernel log (code=N; count=N for a burst)", _xid,
          timed=True),
    FaultKind("sxid", "nvswitch", ("code", "fatal"),
          "an NVSwitch SXid line (fatal=1 marks the switch fatal)", _sxid, timed=True),
)
