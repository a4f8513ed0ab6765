"""Fingerprints in one fused pass: the definition in fingerprint.py, compiled by ``torch.compile``.

Why: fingerprints run on the training step's path (gradient fingerprints on audit steps, weight
checks). The eager form in fingerprint.py widens every chunk to int64 and then makes a dozen
passes over it (copy, two sums, a weighted sum, three shift/mask/xor/multiply rounds, a sum);
Inductor fuses the whole formula into one kernel that keeps the three running sums in registers
(C++/OpenMP on CPUs, a Triton kernel on CUDA) and reads each element from memory once (on the
CPU, a row at a time: then once more from cache). The eager form stays, as the reference the
tests compare against and as the fallback.

Speed on the CPU (torch 2.13; docs/sdc.md "Costs"; ``python bench/bench_fingerprints.py``, 256 MiB
of fp32, best of 5): on the 2-core AVX-512 development VM 0.38-0.39x the throughput of
``tensor.sum()`` with two threads (30 ms; CPU time 0.33-0.34x) and 0.38x with one (57-59 ms),
where the 1-D scalar kernel before gave 0.08x (0.13-0.14x CPU time) and 0.15-0.17x; the issue
asks for 0.25x. Two changes (``_ROW_COLS``): the CPU kernel for 4- and 8-byte elements reads the
tensor row by row, each row first summed (which streams it into cache) and then mixed from cache
— the 1-D loop waited on memory, not on its five 64-bit multiplies per element — and on AVX-512
it is Inductor's vector code (``vpmullq``); without AVX-512 it stays scalar (AVX2 has no 64-bit
lane multiply and torch emulates it lane by lane, slower than scalar), and so do 1- and 2-byte
elements, in the 1-D form.

Guarantees:

1. Same numbers. The compiled function is the definition itself, written with the same int64
   ring operations (wrapping multiply and add, arithmetic shift then mask for the logical shift);
   integer sums do not depend on the order of the reduction. (The CPU's rows form splits the
   position terms into a per-row and a per-column part, an identity of that ring: ``_ROW_COLS``.)
   tests/sdc/test_fingerprint_fused.py compares compiled with eager on the pinned vectors and on
   overflow vectors of every element width, one and several segments.
2. Never less available than eager. In mode ``auto`` (the default) any exception while compiling
   or running the fused form (no C++ compiler, no Triton, an Inductor error) switches that device
   type to the eager form for the rest of the process, with one warning; ``fused_status()`` says
   which form each device type uses and why. Mode ``compiled`` raises instead (tests, benchmarks);
   mode ``eager`` never compiles. The mode is read from ``$GPU_MONITOR_SDC_FINGERPRINTS`` at
   every call, so a launcher or a test can set it for spawned ranks.
3. Bounded compile work. One graph per (device, element width), dynamic in the tensor's length
   (in the CPU's rows form: in its rows and tail, every size kept >= 2 by ``_split``),
   each with its own code object so that dynamo's per-code recompile limit (8) is never shared
   between them; the only other guards are global modes (deterministic algorithms on audit steps
   toggles one), and the call always runs under ``no_grad``. Tensors below ``FUSED_MIN`` elements
   stay on the eager path, where fingerprint.py packs them together.
4. Not inside someone else's graph. While ``torch.compile`` traces the caller
   (``torch.compiler.is_compiling()``), the eager form is used.
5. A compiled kernel is checked before its first answer counts. The generated code does int64
   arithmetic that wraps, which C and C++ leave undefined: a C++ compiler that reasons from
   signed overflow may skip part of the loop (it did, with the key's constants literal: see
   ``_ROW_COLS``) and return a wrong sum in microseconds, which would be a false SDC alarm on
   a healthy node. So the first fused call for each (device, element width) also computes a
   probe of random bit patterns and the width's extremes (64 Ki + 3 elements) both
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
# The probe of guarantee 5: FUSED_MIN + 3 elements, kept where a test lowers FUSED_MIN. It is also
# the first call each kernel traces, and its sizes (CPU: 16 rows of 4096, a tail of 3) differ from
# one another, so dynamo's duck sizing ties none of them together (a graph whose rows, columns and
# tail had once been equal would be traced again for every length where they are not).
_PROBE_LEN = (1 << 16) + 3

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

    least = max(FUSED_MIN, ROWS_MIN)  # ROWS_MIN matters only where a test lowers FUSED_MIN
    if numel < least or (chunk is not None and chunk < least):
        return False
    mode = fingerprint_mode()
    if mode == "eager" or getattr(_here, "depth", 0) or torch.compiler.is_compiling():
        return False
    return mode == "compiled" or device.type not in _broken


def _make_formula(torch, m: dict[str, int], name: str, rows: bool):
    """The definition as one traceable function, given a code object of its own (guarantee 3).

    ``rows=False``: the definition as written, ``(v, start)``, over the positions
    ``arange(1..n) + start``. ``rows=True`` (the CPU): the same numbers for a segment given as
    ``(bulk, tail, start, cpos, cposk)``, its bulk viewed as ``[rows, cols]`` and the rest a 1-D
    tail (``_split``); see ``_ROW_COLS`` for why and for the identities it relies on.
    """

    def mix(x):
        x = x ^ ((x >> m["s1"]) & m["m1"])
        x = x * m["mul1"]
        x = x ^ ((x >> m["s2"]) & m["m2"])
        x = x * m["mul2"]
        return x ^ ((x >> m["s3"]) & m["m3"])

    def flat(v, start):
        z = v.to(torch.int64)
        p = torch.arange(1, v.numel() + 1, dtype=torch.int64, device=v.device) + start
        return z.sum(), (z * p).sum(), mix(z * m["kb"] + p * m["kp"] + m["ks"]).sum()

    def formula(v, start):
        return torch.stack(flat(v, start))

    def formula_rows(bulk, tail, start, cpos, cposk):
        nrows, cols = bulk.shape
        z = bulk.to(torch.int64)
        rsum = z.sum(1)  # its own loop over the row, before the mixer's: pulls the row into cache
        base = torch.arange(nrows, dtype=torch.int64, device=bulk.device) * cols + start
        # "& 0" adds nothing; it makes the mixer's loop depend on the row's sum, so that Inductor
        # runs the two as consecutive inner loops of one row loop instead of merging them
        rkey = base * m["kp"] + m["ks"] + (rsum & 0)
        x = z * m["kb"] + (rkey[:, None] + cposk)
        c0, c1, c2 = flat(tail, start + nrows * cols)
        return torch.stack([rsum.sum() + c0,
                            (rsum * base).sum() + (z * cpos).sum(1).sum() + c1,
                            mix(x).sum(1).sum() + c2])

    fn = formula_rows if rows else formula
    code = fn.__code__.replace(co_name=name, co_qualname=name)
    return types.FunctionType(code, fn.__globals__, name, None, fn.__closure__)


# The CPU form: rows for 4- and 8-byte elements, vector code where the ISA has a 64-bit lane
# multiply. Measured on the 2-core AVX-512 development VM (torch 2.13, 64 Mi elements, two
# threads unless said; ``t.sum()`` of 256 MiB of fp32: 11 ms).
#
# Why rows (``_make_formula(rows=True)``). The 1-D loop is bound by memory latency, not by its
# arithmetic: each element's chain (three dependent 64-bit multiplies of ~15 cycles each) fills
# the out-of-order window with a few cache lines' worth of work, so few loads are in flight, and
# the hardware prefetcher evidently does not make up for it (a hand-written AVX-512 loop of the
# formula, one thread, int32: 104 ms streaming from memory, 33 ms on data already in cache, 42 ms
# with a software prefetch). Inductor emits no prefetch, but it runs two reductions over the same
# row as consecutive inner loops of one parallel row loop when the second depends on the first
# (as in softmax): the row's plain sum streams the row into L1/L2 at memory speed, and the mixer
# then reads it from cache. Viewing the bulk as ``[rows, cols]`` (``_split``: cols = _ROW_COLS
# for any tensor the fused form takes) also takes the positions out of the inner loop: for the
# element (r, c), ``p = base_r + cpos[c]`` with ``base_r = r * cols + start`` and ``cpos[c] =
# c + 1``, so ``p * KEY_POS + KEY_SEED`` is a per-row scalar plus the cached table ``cposk[c] =
# cpos[c] * KEY_POS``, and ``sum(v * p)`` is ``sum_r base_r * rowsum_r + sum(v * cpos[c])`` —
# identities of the int64 ring (wrapping multiply and add), so the sums are the definition's to
# the bit. The tail (2 .. cols + 1 elements) goes through the 1-D formula. Figures, int32: 1-D
# vector 71-75 ms (0.15x sum), rows vector 29-32 ms (0.34-0.38x; row widths 512 to 16384 gave
# 0.33-0.38x), rows scalar 64-67 ms, the 1-D scalar kernel used before 83 ms in a loop of calls
# and 137-148 ms in bench/bench_fingerprints.py; int64: 1-D scalar 69-71 ms, rows vector 21-23 ms,
# rows scalar 40 ms. 1- and 2-byte elements stay 1-D and scalar: 256 Mi int8 took 195 ms 1-D
# scalar, 216 ms rows scalar, 405-411 ms rows vector (why Inductor's int8 vector code is that
# slow was not examined); 128 Mi int16 115 ms 1-D, 114 ms rows (Inductor does not vectorise int16).
#
# Why vector code only with AVX-512 (``_cpu_options``). AVX-512DQ has a 64-bit lane multiply
# (``vpmullq``); AVX2 has none, and torch 2.13's ``at::vec`` emulates it lane by lane (extract,
# imul, insert), slower than the scalar loop: on an AVX2 machine 358 ms vector vs 191 ms scalar
# (1-D, fp32, one thread); here, the AVX2 build of the rows form (``cpp.simdlen=256``) 99 ms vs
# 64 ms scalar. Without AVX-512 the kernel is therefore built scalar (``cpp.simdlen=1``).
#
# The key reaches the C++ code as runtime arguments (the closure's values are traced as symbolic
# ints): with literal multipliers GCC bounds a scalar loop by the signed overflow of
# ``position * KEY_POS`` and skips nearly all of it (guarantee 5 is the net under that).
_ROW_COLS = 4096
_SCALAR = {"cpp.simdlen": 1}
_cpu_opts: list[bool] = []  # [whether the vector ISA is AVX-512], once known
_row_tables: dict[tuple[str, int], tuple[Any, Any]] = {}  # (device, cols) -> (1..cols, · KEY_POS)
ROWS_MIN = 6  # the rows form needs >= 2 rows of >= 2 columns and a tail of >= 2 (see _split)


def _split(n: int) -> tuple[int, int]:
    """(rows, cols) of a segment of ``n >= ROWS_MIN`` elements in the rows form; the tail,
    ``n - rows * cols``, is 2 .. cols + 1 elements.

    Every size the compiled graph sees is then >= 2: dynamo specialises sizes 0 and 1, and a
    derived size (``n // cols``, its remainder) would get such guards too, hence separate inputs.
    """
    cols = min(_ROW_COLS, (n - 2) // 2)
    return (n - 2) // cols, cols


def _cpu_options(width: int) -> dict:
    """Inductor options for the CPU kernel of ``width``-byte elements: Inductor's default vector
    code on AVX-512 for 4- and 8-byte elements, else scalar (``_ROW_COLS``)."""
    if not _cpu_opts:
        try:
            from torch._inductor.cpu_vec_isa import pick_vec_isa

            wide = pick_vec_isa().bit_width() >= 512
        except Exception:  # noqa: BLE001 - an Inductor without this helper: the safe choice
            wide = False
        _cpu_opts.append(wide)
    return {} if _cpu_opts[0] and width >= 4 else dict(_SCALAR)


def _in_rows(device, width: int) -> bool:
    """Whether the kernel for ``device`` and ``width`` takes the rows form (``_ROW_COLS``)."""
    return device.type == "cpu" and width >= 4


def _tables_for(device, cols: int, kp: int):
    import torch

    key = (str(device), cols)
    with _lock:
        tabs = _row_tables.get(key)
        if tabs is None:
            cpos = torch.arange(1, cols + 1, dtype=torch.int64, device=device)
            tabs = _row_tables[key] = (cpos, cpos * kp)
    return tabs


def _compiled_for(device, width: int, consts: dict[str, int]):
    import torch

    key = (str(device), width)
    with _lock:
        fn = _compiled.get(key)
        if fn is None:
            name = f"fingerprint_fused_{device.type}{device.index or 0}_w{width}"
            cpu = device.type == "cpu"
            # dynamic=True, not mark_dynamic on the input: the latter keeps the key's constants
            # literal, and a scalar C++ loop is then miscompiled (see _ROW_COLS).
            fn = torch.compile(_make_formula(torch, consts, name, _in_rows(device, width)),
                               dynamic=True, fullgraph=True,
                               options=_cpu_options(width) if cpu else None)
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
            if not _in_rows(flat.device, flat.element_size()):
                rows.append(fn(flat[s:e].detach(), start))  # not a view: no guards on its base
                continue
            nrows, cols = _split(e - s)
            mid = s + nrows * cols
            rows.append(fn(flat[s:mid].view(nrows, cols).detach(), flat[mid:e].detach(), start,
                           *_tables_for(flat.device, cols, consts["kp"])))
    return rows[0] if len(rows) == 1 else torch.stack(rows).sum(0)


class FusedMismatch(RuntimeError):
    """The compiled kernel's row differs from the eager form's on the probe (guarantee 5)."""


def _probe(dtype, device):
    """Random bit patterns of ``dtype``'s width, its extremes and -1 first (guarantee 5)."""
    import torch

    width = torch.empty((), dtype=dtype).element_size()
    gen = torch.Generator().manual_seed(5)
    raw = torch.randint(0, 256, (_PROBE_LEN * width,), dtype=torch.uint8, generator=gen)
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
        _row_tables.clear()
        _cpu_opts.clear()
