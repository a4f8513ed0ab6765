"""Faults of the image's tools and libraries rather than the hardware: a missing tool or
runtime, DCGM diagnostics that fail or print damaged output, a damaged ``ib_write_bw``
report, and NVML calls that raise.

Why together: each changes what a fake command or the fake NVML module answers, so the
checks' parsers and error handling meet the shapes real tools produce.
"""

from __future__ import annotations

import os

from gpu_monitor.sim import fake_nvml
from gpu_monitor.sim.faults.base import Fault, FaultKind, InjectError, fault_gpu, fault_port
from gpu_monitor.sim.spec import (
    NodeSpec,
)

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


def _dcgm_fail(spec: NodeSpec, f: Fault) -> None:
    g = fault_gpu(spec, f)
    g.dcgm_failures.append(f.params.get("test", "memory"))


PERFTEST_CUTS = ("before-report", "after-header", "mid-row", "before-rule")


def _ib_bw_output(spec: NodeSpec, f: Fault) -> None:
    """How the fake ib_write_bw mangles its report on that port (server and client alike)."""
    p = fault_port(spec, f)
    if not f.params:
        raise InjectError(f"{f.text}: give cut= ({', '.join(PERFTEST_CUTS)}) and/or exit=")
    if "cut" in f.params:
        p.perftest_output["cut"] = f.choice("cut", PERFTEST_CUTS)
    if "exit" in f.params:
        p.perftest_output["exit"] = _exit_code(f)


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
    g = fault_gpu(spec, f)
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


FAULT_KINDS: tuple[FaultKind, ...] = (
    FaultKind("dcgm-fail", "gpu", ("test",), "a DCGM diagnostic test fails on the GPU",
          _dcgm_fail),
    FaultKind("missing", "node", ("what",),
          "the image lacks a tool or runtime: dcgmi, nv-hostengine (DCGM's host "
          "engine not running), ib_write_bw (perftest), torch (the passive image)",
          _missing),
    FaultKind("dcgm-output", "node",
          ("format", "exit", "cut", "lines", "drop", "status", "file"),
          "the fake dcgmi diag prints format=json|text whatever -j says, stops before "
          "the cut=SECTION|end or after lines=N, exits exit=N, leaves GPU drop=N out, "
          "prints status=WORD for every pass, or prints file=PATH", _dcgm_output),
    FaultKind("ib-bw-output", "ib", ("cut", "exit"),
          "the fake ib_write_bw cuts its report short (cut=before-report|after-header|"
          "mid-row|before-rule) or exits exit=N", _ib_bw_output),
    FaultKind("nvml-error", "gpu or node", ("call", "error"),
          "an NVML call raises an error for the GPU (call=*, error=GpuIsLost: the GPU "
          "is lost), or at the node for every GPU and for nvmlInit, "
          "nvmlDeviceGetCount, nvmlSystemGet*", _nvml_error),
)
