"""Fingerprints in one fused pass: the definition in fingerprint.py, compiled by ``torch.compile``.

Why: fingerprints run on the training step's path (gradient fingerprints on audit steps, weight
checks). The eager form in fingerprint.py widens every chunk to int64 and then makes a dozen
passes over it (copy, two sums, a weighted sum, three shift/mask/xor/multiply rounds, a sum);
Inductor fuses the whole formula into one kernel that keeps the three running sums in registers
(C++/OpenMP on CPUs, a Triton kernel on CUDA) and reads each element from memory once (on the
CPU, 4- and 8-byte elements a row at a time: then once more from cache). The eager form stays,
as the reference the tests compare against and as the fallback.

Speed on the CPU (torch 2.13; docs/sdc.md "Costs"; ``python bench/bench_fingerprints.py``, 256 MiB
of fp32, best of 5): on the 2-core AVX-512 development VM 0.38-0.39x the throughput of
``tensor.sum()`` with two threads (30 ms; CPU time 0.33-0.34x) and 0.38x with one (57-59 ms),
where the 1-D scalar kernel before gave 0.08x (0.13-0.14x CPU time) and 0.15-0.17x; the issue
asks for 0.25x. Two changes (``_ROW_COLS``): the CPU kernel for 4- and 8-byte elements reads the
tensor row by row, each row first summed (which streams it into cache) and then mixed from cache
— the 1-D loop waited on memory, not on its five 64-bit multiplies per element — and on AVX-512
it is Inductor's vector code (``vpmullq``); without AVX-512 it stays scalar (AVX2 has no 64-bit
lane multiply and torch emulates it lane by lane, slower than scalar). 1- and 2-byte elements
(bf16/fp16 gradients and weights, bytes) are read through 4-byte words, 4 // width elements to
each, split out with shifts (the words form, ``_ROW_COLS``): on AVX-512, 256 MiB of bf16 in
38 ms, 0.29x ``tensor.sum()`` of as many bytes of fp32 (CPU time 0.25x), and 256 MiB of int8
in 63 ms, 0.18x (0.15x), where the 1-D scalar kernel before took 110 ms (0.10x) and 195 ms
(0.055x) (``--dtype bf16|int8``, best of 3, the machine shared with a test run); without
AVX-512 (or on a big-endian machine) they stay in the 1-D form, scalar.

Guarantees:

1. Same numbers. The compiled function is the definition itself, written with the same int64
   ring operations (wrapping multiply and add, arithmetic shift then mask for the logical shift);
   integer sums do not depend on the order of the reduction. (The CPU's rows and words forms
   split the position terms into a per-row and a per-column part, an identity of that ring, and
   the words form takes each element out of its word by shifts that sign-extend it exactly as
   the element's own read would: ``_ROW_COLS``.)
   tests/sdc/test_fingerprint_fused.py compares compiled with eager on the pinned vectors and on
   overflow vectors of every element width, one and several segments, and the words form on
   every offset into the storage, every kind of tail and extremes in every element of a word.
2. Never less available than eager. In mode ``auto`` (the default) any exception while compiling
   or running the fused form (no C++ compiler, no Triton, an Inductor error) switches that device
   type to the eager form for the rest of the process, with one warning; ``fused_status()`` says
   which form each device type uses and why. Mode ``compiled`` raises instead (tests, benchmarks);
   mode ``eager`` never compiles. The mode is read from ``$GPU_MONITOR_SDC_FINGERPRINTS`` at
   every call, so a launcher or a test can set it for spawned ranks.
3. Bounded compile work. One graph per (device, element width), dynamic in the tensor's length
   (in the CPU's rows and words forms: in their head, rows and tail, every size kept >= 2 by
   ``_split`` and ``_split_words``; the words form also takes any offset into the storage),
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
import functools
import logging
import os
import sys
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


def _make_formula(torch, m: dict[str, int], name: str, form: str, lanes: int = 1):
    """The definition as one traceable function, given a code object of its own (guarantee 3).

    ``form="flat"``: the definition as written, ``(v, start)``, over the positions
    ``arange(1..n) + start``. ``form="rows"`` (the CPU, 4- and 8-byte elements): the same numbers
    for a segment given as ``(bulk, tail, start, cpos, cposk)``, its bulk viewed as ``[rows,
    cols]`` and the rest a 1-D tail (``_split``). ``form="words"`` (the CPU, 1- and 2-byte
    elements, ``lanes = 4 // width`` of them in each 4-byte word): ``(head, words, tail, start,
    cposw, *cposk)``, the bulk read as ``[rows, cols]`` int32 words (``_split_words``); see
    ``_ROW_COLS`` for why and for the identities these rely on.
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

    bits = 32 // lanes  # of one element in the word

    def formula_words(head, words, tail, start, cposw, *cposk):
        nrows, cols = words.shape
        # element k of each word (little-endian: the k-th lowest ``bits`` bits), sign-extended by
        # shifting it to the top of the int32 and back (arithmetic), then widened; the top one's
        # sign is the word's
        v = [((words << (32 - bits * (k + 1))) >> (32 - bits)).to(torch.int64)
             for k in range(lanes - 1)]
        v.append((words >> (32 - bits)).to(torch.int64))
        # sum_k v_k and sum_k (k + 1) * v_k (the word's column-1 part beyond lanes * c), by adds
        vsum, upper = v[0], v[lanes - 1]
        vpos = upper
        for k in range(lanes - 2, 0, -1):
            upper = upper + v[k]
            vpos = vpos + upper
        for k in range(1, lanes):
            vsum = vsum + v[k]
        vpos = vpos + vsum
        # no "rsum & 0" here: Inductor then runs the sums and the mixer in one loop over the
        # row, which is faster for this form (its work per byte is 2 or 4 times the rows form's)
        rsum = vsum.sum(1)
        base = torch.arange(nrows, dtype=torch.int64, device=words.device) * (cols * lanes)
        base = base + (start + head.numel())
        rkey = base * m["kp"] + m["ks"]
        # element k of word c sits at position base + cposw[c] + k + 1, cposw[c] = lanes * c
        mixed = mix(v[0] * m["kb"] + (rkey[:, None] + cposk[0]))
        for k in range(1, lanes):
            mixed = mixed + mix(v[k] * m["kb"] + (rkey[:, None] + cposk[k]))
        h0, h1, h2 = flat(head, start)
        t0, t1, t2 = flat(tail, start + head.numel() + nrows * cols * lanes)
        return torch.stack([rsum.sum() + h0 + t0,
                            (rsum * base).sum() + (vsum * cposw + vpos).sum(1).sum() + h1 + t1,
                            mixed.sum(1).sum() + h2 + t2])

    fn = {"flat": formula, "rows": formula_rows, "words": formula_words}[form]
    code = fn.__code__.replace(co_name=name, co_qualname=name)
    return types.FunctionType(code, fn.__globals__, name, None, fn.__closure__)


# The CPU forms: rows for 4- and 8-byte elements, words for 1- and 2-byte ones, vector code where
# the ISA has a 64-bit lane multiply. Measured on the 2-core AVX-512 development VM (torch 2.13,
# 64 Mi elements unless said, two threads; ``t.sum()`` of 256 MiB of fp32: 11 ms).
#
# Why rows (``_make_formula(form="rows")``). The 1-D loop is bound by memory latency, not by its
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
# rows scalar 40 ms. 1- and 2-byte elements in this rows form were no faster: 256 Mi int8 195 ms
# 1-D scalar, 216 ms rows scalar, 405-411 ms rows vector (why Inductor's int8 vector code is that
# slow was not examined); 128 Mi int16 115 ms 1-D, 114 ms rows (Inductor does not vectorise int16).
#
# Why words for 1- and 2-byte elements (``_make_formula(form="words")``). Inductor vectorises
# int32 well, so the bulk is viewed as int32 words, ``lanes = 4 // width`` elements to a word:
# in little-endian order element k of a word is its k-th lowest ``8 * width`` bits, taken out as
# ``(word << (32 - bits * (k + 1))) >> (32 - bits)`` (int32 shifts, the right one arithmetic:
# the element sign-extended, exactly as reading it as int8/int16 would) and the top one as
# ``word >> (32 - bits)``, then widened to int64 (a left shift into the sign bit is defined in
# C++20, and GCC documents that it never treats one as undefined; guarantee 5 checks the kernel
# all the same). Positions as in the rows form, per word: element
# k of word c in row r is at ``base_r + lanes * c + k + 1``, so the mixer adds a per-row scalar
# and one per-column table per element of the word (``cposk_k``), and column 1 is ``sum_r base_r
# * rowsum_r + sum(wordsum * lanes * c + sum_k (k + 1) * v_k)``, the last by adds alone: one
# multiply per word, not per element. A 4-byte view needs the words to start on a multiple of
# ``lanes`` in the storage, so a head of 2 .. lanes + 1 elements (by the tensor's offset) and the
# tail go through the 1-D formula (``_split_words``); the tables are separate 1-D tensors (a
# ``[lanes, cols]`` one would have a size dynamo could tie to an equal head's). Here the row's
# sums and the mixer are left to share one loop (no ``& 0``): this form does 2 or 4 times the
# arithmetic per byte of the rows form, and the separate summing loop (with the elements taken
# out of the words twice) cost more than it saved: 128 Mi int16 46-68 ms in one loop, 52-88 ms
# in two; 256 Mi int8 64 ms vs 92 ms (alternating, the machine shared with a test run).
# Figures with ``bench/bench_fingerprints.py --dtype bf16|int8 --repeats 3`` (t.sum() of 256 MiB
# fp32: 11 ms): 256 MiB bf16 38 ms (0.29x; CPU time 0.25x), the 1-D scalar kernel 110 ms
# (0.10x); 256 MiB int8 63 ms (0.18x; 0.15x), 1-D scalar 195 ms (0.055x). The words form built
# scalar is slower than the 1-D one (128 Mi int16 228-298 ms vs 121-180 ms), so without AVX-512
# 1- and 2-byte elements keep the 1-D form, scalar; so does a big-endian machine.
#
# Why vector code only with AVX-512 (``_cpu_options``). AVX-512DQ has a 64-bit lane multiply
# (``vpmullq``); AVX2 has none, and torch 2.13's ``at::vec`` emulates it lane by lane (extract,
# imul, insert), slower than the scalar loop: on an AVX2 machine 358 ms vector vs 191 ms scalar
# (1-D, fp32, one thread); here, the AVX2 build of the rows form (``cpp.simdlen=256``) 99 ms vs
# 64 ms scalar. Without AVX-512 the kernel is therefore built scalar (``cpp.simdlen=1``), and
# 1- and 2-byte elements take the 1-D form (``_form``).
#
# The key reaches the C++ code as runtime arguments (the closure's values are traced as symbolic
# ints): with literal multipliers GCC bounds a scalar loop by the signed overflow of
# ``position * KEY_POS`` and skips nearly all of it (guarantee 5 is the net under that).
_ROW_COLS = 4096
_SCALAR = {"cpp.simdlen": 1}
_BYTEORDER = sys.byteorder  # the words form reads element k of a word from its k-th lowest bits
_row_tables: dict[tuple[str, int, int], tuple] = {}  # (device, cols, lanes) -> position tables
# the rows form needs >= 2 rows of >= 2 columns and a tail of >= 2 (``_split``), the words form
# a head of 2 .. lanes + 1 elements, then as many words and a tail of >= 2 (``_split_words``)
ROWS_MIN = 24


def _split(n: int) -> tuple[int, int]:
    """(rows, cols) of a segment of ``n >= ROWS_MIN`` elements in the rows form; the tail,
    ``n - rows * cols``, is 2 .. cols + 1 elements.

    Every size the compiled graph sees is then >= 2: dynamo specialises sizes 0 and 1, and a
    derived size (``n // cols``, its remainder) would get such guards too, hence separate inputs.
    """
    cols = min(_ROW_COLS, (n - 2) // 2)
    return (n - 2) // cols, cols


def _split_words(n: int, offset: int, lanes: int) -> tuple[int, int, int]:
    """(head, rows, cols) of a segment of ``n >= ROWS_MIN`` elements whose first one lies
    ``offset`` elements into its storage, in the words form of ``lanes`` elements per 4-byte
    word: a head of 2 .. lanes + 1 elements (the words start on a multiple of ``lanes`` in the
    storage, as a 4-byte view needs), ``rows`` rows of ``cols`` words, and a tail, ``n - head -
    rows * cols * lanes``, of 2 .. cols * lanes + 1 elements: every size >= 2 (``_split``)."""
    head = 2 + (-(offset + 2)) % lanes
    nwords = (n - head - 2) // lanes
    cols = min(_ROW_COLS, nwords // 2)
    return head, nwords // cols, cols


@functools.cache
def _avx512() -> bool:
    """Whether Inductor's vector ISA here is 512 bits wide (AVX-512: a 64-bit lane multiply);
    asked once per process."""
    try:
        from torch._inductor.cpu_vec_isa import pick_vec_isa

        return pick_vec_isa().bit_width() >= 512
    except Exception:  # noqa: BLE001 - an Inductor without this helper: the safe choice
        return False


def _cpu_options(width: int) -> dict:
    """Inductor options for the CPU kernel of ``width``-byte elements: Inductor's default vector
    code on AVX-512 for the rows and words forms, else scalar (``_ROW_COLS``)."""
    vector = _avx512() and _form("cpu", width) != "flat"
    return {} if vector else dict(_SCALAR)


def _form(dev_type: str, width: int) -> str:
    """The kernel's form for a device type and ``width`` (``_make_formula``, ``_ROW_COLS``): the CPU
    takes 4- and 8-byte elements in rows, and 1- and 2-byte ones through 4-byte words with
    AVX-512 and a little-endian byte order (the order ``formula_words`` assumes; without vector
    code the words form is slower than the 1-D one), otherwise 1-D."""
    if dev_type != "cpu":
        return "flat"
    if width >= 4:
        return "rows"
    return "words" if _BYTEORDER == "little" and _avx512() else "flat"


def _tables_for(device, cols: int, kp: int, lanes: int = 1) -> tuple:
    """Rows form (``lanes=1``): ``(cpos, cposk)``, ``cpos = 1..cols`` and ``cpos * KEY_POS``.
    Words form: ``(cposw, cposk_0, .., cposk_{lanes-1})``, ``cposw[c] = lanes * c`` and
    ``cposk_k = (cposw + k + 1) * KEY_POS``: one 1-D table per element of the word, not a
    ``[lanes, cols]`` one, whose first size dynamo would tie to an equal head's (duck sizing)."""
    import torch

    key = (str(device), cols, lanes)
    with _lock:
        tabs = _row_tables.get(key)
        if tabs is None:
            if lanes == 1:
                cpos = torch.arange(1, cols + 1, dtype=torch.int64, device=device)
                tabs = (cpos, cpos * kp)
            else:
                cposw = torch.arange(cols, dtype=torch.int64, device=device) * lanes
                tabs = (cposw, *((cposw + (k + 1)) * kp for k in range(lanes)))
            _row_tables[key] = tabs
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
            form = _form(device.type, width)
            fn = torch.compile(_make_formula(torch, consts, name, form, max(1, 4 // width)),
                               dynamic=True, fullgraph=True,
                               options=_cpu_options(width) if cpu else None)
            _compiled[key] = fn
    return fn


def _segments(flat, chunk: int | None, consts: dict[str, int]) -> Any:
    import torch

    width = flat.element_size()
    fn = _compiled_for(flat.device, width, consts)
    form, lanes = _form(flat.device.type, width), max(1, 4 // width)
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
            if form == "flat":
                rows.append(fn(flat[s:e].detach(), start))  # not a view: no guards on its base
                continue
            if form == "words":
                head, nrows, cols = _split_words(e - s, flat.storage_offset() + s, lanes)
                mid = s + head + nrows * cols * lanes
                words = flat[s + head:mid].view(torch.int32).view(nrows, cols)
                rows.append(fn(flat[s:s + head].detach(), words.detach(), flat[mid:e].detach(),
                               start, *_tables_for(flat.device, cols, consts["kp"], lanes)))
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
    _avx512.cache_clear()
