"""Fingerprints in one fused pass: the definition in fingerprint.py, compiled by ``torch.compile``.

Why: fingerprints run on the training step's path (gradient fingerprints on audit steps, weight
checks). The eager form in fingerprint.py widens every chunk to int64 and then makes a dozen
passes over it (copy, two sums, a weighted sum, three shift/mask/xor/multiply rounds, a sum);
Inductor fuses the whole formula into one loop that reads each element once and keeps the three
running sums in registers (C++/OpenMP on CPUs, a Triton kernel on CUDA). The eager form stays,
as the reference the tests compare against and as the fallback.

Speed on the CPU (torch 2.13, AVX2, one thread; docs/sdc.md "Costs"): 0.11-0.14x the throughput
of ``tensor.sum()`` on fp32, 2.7-3.5x the eager form. The issue's 0.25x is not reached: the formula
needs five 64-bit multiplies per element (three of them, ``v * KEY_BITS`` and the two mixer
rounds, whatever the formulation), AVX2 has no 64-bit lane multiply, and Inductor emulates it
lane by lane; the kernel is therefore built scalar (``_CPU_OPTIONS``), which is faster.

Guarantees:

1. Same numbers. The compiled function is the definition itself, written with the same int64
   ring operations (wrapping multiply and add, arithmetic shift then mask for the logical shift);
   integer sums do not depend on the order of the reduction. tests/sdc/test_fingerprint_fused.py
   compares compiled with eager on the pinned vectors and on overflow vectors of every element
   width, one and several segments.
2. Never less available than eager. In mode ``auto`` (the default) any exception while compiling
   or running the fused form (no C++ compiler, no Triton, an Inductor error) switches that device
   type to the eager form for the rest of the process, with one warning; ``fused_status()`` says
   which form each device type uses and why. Mode ``compiled`` raises instead (tests, benchmarks);
   mode ``eager`` never compiles. The mode is read from ``$GPU_MONITOR_SDC_FINGERPRINTS`` at
   every call, so a launcher or a test can set it for spawned ranks.
3. Bounded compile work. One graph per (device, element width), dynamic in the tensor's length,
   each with its own code object so that dynamo's per-code recompile limit (8) is never shared
   between them; the only other guards are global modes (deterministic algorithms on audit steps
   toggles one), and the call always runs under ``no_grad``. Tensors below ``FUSED_MIN`` elements
   stay on the eager path, where fingerprint.py packs them together.
4. Not inside someone else's graph. While ``torch.compile`` traces the caller
   (``torch.compiler.is_compiling()``), the eager form is used.
5. A compiled kernel is checked before its first answer counts. The generated code does int64
   arithmetic that wraps, which C and C++ leave undefined: a C++ compiler that reasons from
   signed overflow may skip part of the loop (it did, with the key's constants literal: see
   ``_CPU_OPTIONS``) and return a wrong sum in microseconds, which would be a false SDC alarm on
   a healthy node. So the first fused call for each (device, element width) also computes a
   probe of random bit patterns and the width's extremes (``FUSED_MIN + 3`` elements) both
   ways; a fused row that differs from the eager one is a failure of the fused form like any
   other (guarantee 2: the eager form from then on, in mode ``auto``; an error in mode
   ``compiled``).

The compile cache is Inductor's own, on disk: ``$TORCHINDUCTOR_CACHE_DIR`` (default
``/tmp/torchinductor_<user>``) holds the FX-graph cache and the built C++ libraries, Triton's
kernels go under its ``triton/`` (or ``$TRITON_CACHE_DIR``). An entry is keyed by a hash of the
traced graph, the input properties (dtype, device, symbolic sizes), the torch version and the
Inductor configuration, so a second process with the same torch finds it and pays only the
tracing (docs/sdc.md, "Fingerprints": measured figures). This module never moves it: the
directory is the training process's choice, shared with its own compiled models.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import types
from collections.abc import Iterator
from typing import Any

__all__ = ["FUSED_MIN", "MODE_ENV", "MODES", "FusedMismatch", "eager_here", "fingerprint_mode",
           "fused_rows", "fused_status", "use_fused"]

MODE_ENV = "GPU_MONITOR_SDC_FINGERPRINTS"
MODES = ("auto", "eager", "compiled")
FUSED_MIN = 1 << 16  # smaller tensors: a compiled call's fixed cost exceeds the work
_SEGMENT = 1 << 30  # positions and indices stay far below 2^63 (and index math below 2^31·8)

_log = logging.getLogger(__name__)
_lock = threading.Lock()
_compiled: dict[tuple[str, int], Any] = {}  # (device, width) -> compiled callable
_broken: dict[str, str] = {}  # device type -> why the fused form is off there
_used: dict[str, str] = {}  # device type -> "compiled" once a fused call succeeded
_checked: set[tuple[str, int]] = set()  # (device, width) whose kernel matched eager (guarantee 5)
_here = threading.local()  # eager_here() depth on this thread


def fingerprint_mode(environ=None) -> str:
    """The mode from the environment; an unknown value is an error, not a silent default."""
    env = os.environ if environ is None else environ
    mode = (env.get(MODE_ENV) or "auto").strip().lower()
    if mode not in MODES:
        raise ValueError(f"${MODE_ENV}={env.get(MODE_ENV)!r}: expected one of {', '.join(MODES)}")
    return mode


@contextlib.contextmanager
def eager_here() -> Iterator[None]:
    """The eager form for this thread inside the block, whatever the mode.

    For one-shot processes that would pay a compile for a single use (the daemon's workers: the
    node probe, probe_worker.py, and burn_in's result digest): eager costs less there.
    """
    _here.depth = getattr(_here, "depth", 0) + 1
    try:
        yield
    finally:
        _here.depth -= 1


def fused_status() -> dict[str, str]:
    """Per device type: ``compiled`` (a fused call ran), or ``eager: <why>`` after a fallback."""
    with _lock:
        out = {dev: f"eager: {why}" for dev, why in _broken.items()}
        out.update({dev: v for dev, v in _used.items() if dev not in _broken})
    return out


def use_fused(device, numel: int, chunk: int | None) -> bool:
    """Whether a tensor of ``numel`` elements on ``device`` goes through the fused form."""
    import torch

    if numel < FUSED_MIN or (chunk is not None and chunk < FUSED_MIN):
        return False
    mode = fingerprint_mode()
    if mode == "eager" or getattr(_here, "depth", 0) or torch.compiler.is_compiling():
        return False
    return mode == "compiled" or device.type not in _broken


def _make_formula(torch, m: dict[str, int], name: str):
    """The definition as one traceable function, given a code object of its own (guarantee 3)."""

    def formula(v, start):
        z = v.to(torch.int64)
        p = torch.arange(1, v.numel() + 1, dtype=torch.int64, device=v.device) + start
        col0 = z.sum()
        col1 = (z * p).sum()
        x = z * m["kb"] + p * m["kp"] + m["ks"]
        x = x ^ ((x >> m["s1"]) & m["m1"])
        x = x * m["mul1"]
        x = x ^ ((x >> m["s2"]) & m["m2"])
        x = x * m["mul2"]
        x = x ^ ((x >> m["s3"]) & m["m3"])
        return torch.stack([col0, col1, x.sum()])

    code = formula.__code__.replace(co_name=name, co_qualname=name)
    return types.FunctionType(code, formula.__globals__, name, None, formula.__closure__)


# The CPU kernel is built as a scalar loop. Inductor's vector code (torch 2.13, AVX2: no 64-bit
# lane multiply) emulates every int64 multiply lane by lane (extract, imul, insert; five per
# element here) and loads integer vectors through a stack buffer that stalls on store forwarding;
# the scalar loop does the same arithmetic in registers: 358 -> 191 ms on 64 Mi fp32 elements,
# bench/bench_fingerprints.py, docs/sdc.md "Costs". (2-byte elements were scalar already: Inductor
# does not vectorise int16.) The scalar loop relies on the key reaching the C++ code as runtime
# arguments (the closure's values are traced as symbolic ints): with literal multipliers GCC
# bounds the loop by the signed overflow of ``position * KEY_POS`` and skips nearly all of it.
_CPU_OPTIONS = {"cpp.simdlen": 1}


def _compiled_for(device, width: int, consts: dict[str, int]):
    import torch

    key = (str(device), width)
    with _lock:
        fn = _compiled.get(key)
        if fn is None:
            name = f"fingerprint_fused_{device.type}{device.index or 0}_w{width}"
            # dynamic=True, not mark_dynamic on the input: the latter keeps the key's constants
            # literal, and the scalar C++ loop (_CPU_OPTIONS) is then miscompiled (see there).
            fn = torch.compile(_make_formula(torch, consts, name), dynamic=True, fullgraph=True,
                               options=_CPU_OPTIONS if device.type == "cpu" else None)
            _compiled[key] = fn
    return fn


def _segments(flat, chunk: int | None, consts: dict[str, int]) -> Any:
    import torch

    fn = _compiled_for(flat.device, flat.element_size(), consts)
    n = flat.numel()
    step = min(chunk or _SEGMENT, _SEGMENT)
    starts = list(range(0, n, step))
    if len(starts) > 1 and n - starts[-1] < FUSED_MIN:
        starts.pop()  # a short tail joins the segment before it: no 0/1-size specialisation
    ends = starts[1:] + [n]
    rows = []
    with torch.no_grad():
        for s, e in zip(starts, ends, strict=True):
            start = torch.full((), s, dtype=torch.int64, device=flat.device)
            rows.append(fn(flat[s:e].detach(), start))  # not a view: no guards on its base
    return rows[0] if len(rows) == 1 else torch.stack(rows).sum(0)


class FusedMismatch(RuntimeError):
    """The compiled kernel's row differs from the eager form's on the probe (guarantee 5)."""


def _probe(dtype, device):
    """Random bit patterns of ``dtype``'s width, its extremes and -1 first (guarantee 5)."""
    import torch

    width = torch.empty((), dtype=dtype).element_size()
    gen = torch.Generator().manual_seed(5)
    raw = torch.randint(0, 256, ((FUSED_MIN + 3) * width,), dtype=torch.uint8, generator=gen)
    probe = raw.view(dtype).clone()
    info = torch.iinfo(dtype)
    probe[:3] = torch.tensor([info.min, info.max, -1], dtype=dtype)
    return probe.to(device)


def _check_once(flat, consts: dict[str, int], reference) -> None:
    """Guarantee 5 for ``flat``'s device and width, once per process; raises FusedMismatch."""
    import torch

    key = (str(flat.device), flat.element_size())
    if key in _checked:
        return
    probe = _probe(flat.dtype, flat.device)
    fused, want = _segments(probe, None, consts), reference(probe)
    if not torch.equal(fused.to(want.device), want):
        raise FusedMismatch(f"the compiled {key[1]}-byte kernel on {key[0]} gave "
                            f"{fused.tolist()} for the probe, the eager form {want.tolist()}")
    with _lock:
        _checked.add(key)


def fused_rows(flat, chunk: int | None, consts: dict[str, int], reference):
    """The [3] fingerprint row of one flat int tensor, fused; ``None``: use the eager form.

    ``consts``: the fixed key as signed int64 values, named as in ``_make_formula`` (given by
    fingerprint.py, which owns the definition). ``reference``: the eager form's [3] row of a
    flat int tensor, for the first-use check (guarantee 5).

    Returns ``None`` only in mode ``auto`` after a failure (guarantee 2), which it records.
    """
    dev_type = flat.device.type
    try:
        _check_once(flat, consts, reference)
        row = _segments(flat, chunk, consts)
    except Exception as exc:  # noqa: BLE001 - guarantee 2: any failure means the eager form
        if fingerprint_mode() == "compiled":
            raise
        why = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
        with _lock:
            _broken.setdefault(dev_type, why[:300])
        _log.warning("fingerprints: the fused form failed on %s (%s); using the eager form",
                     dev_type, why[:300])
        return None
    if dev_type not in _used:
        with _lock:
            _used[dev_type] = "compiled"
    return row


def _reset_for_tests() -> None:
    """Forget compiled functions and fallbacks (tests only)."""
    with _lock:
        _compiled.clear()
        _broken.clear()
        _used.clear()
        _checked.clear()
