"""Tensor fingerprints: three 64-bit numbers per tensor, computed from its raw bit pattern.

Why: every SDC check compares computations across GPUs (loss bits, gradients, weights). Sending
whole tensors is too expensive, so each tensor is reduced to a fixed-size fingerprint that is
identical across ranks, runs, devices and versions of this code for identical bits, and differs
with overwhelming probability when any bit differs.

Definition (the contract; the pinned vectors in tests/sdc/test_sdc_fingerprints.py guard it).
Each element's storage is read as the signed integer of the element's width (1, 2, 4 or 8 bytes)
and sign-extended to 64 bits: ``v_p`` for positions ``p = 1 .. numel`` in row-major (logical)
order. All arithmetic is modulo 2^64 and the results are stored as signed int64:

- column 0: ``sum(v_p)``
- column 1: ``sum(p * v_p)``
- column 2: ``sum(mix(v_p * KEY_BITS + p * KEY_POS + KEY_SEED))`` where ``mix`` is a
  full-avalanche finaliser ``z ^= z >>> 30; z *= MIX_1; z ^= z >>> 27; z *= MIX_2;
  z ^= z >>> 31`` (logical shifts).

Columns 0 and 1 are linear: one or two changed elements always change them for tensors of
< 2^32 elements with <= 4-byte elements, a swap of two values keeps column 0 but changes column 1,
and the pattern (+d, -2d, +d) on three consecutive elements cancels both. Column 2 is not
linear: no fixed pattern of changes cancels it except with probability about 2^-64. Equal
fingerprints are strong evidence of equal bits, not proof.

The constants below are the fixed key. Changing any of them changes every stored fingerprint and
is a breaking change.

Speed: tensors of at least ``fingerprint_fused.FUSED_MIN`` elements go through the fused form
(fingerprint_fused.py: the same formula compiled by ``torch.compile``; on the 2-core AVX-512
development machine 0.38x the throughput of ``tensor.sum()`` on fp32 and 7-9x this form, on
bf16/fp16 0.29x (``sum`` of as many bytes of fp32) and 11x this form, docs/sdc.md "Costs";
this eager form is its fallback and reference). Here, the work is streamed
through chunks of at most ``chunk_elems`` elements (a few int64 buffers of that size are the
only temporaries), small tensors are packed together so that a model with thousands of tiny
tensors costs a few dozen kernel launches, not thousands.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from gpu_monitor.sdc.fingerprint_fused import fused_rows, use_fused

if TYPE_CHECKING:
    import torch

__all__ = [
    "KEY_BITS",
    "KEY_POS",
    "KEY_SEED",
    "MIX_1",
    "MIX_2",
    "MIX_SHIFTS",
    "fingerprints",
    "default_chunk_elems",
]

# The fixed key (unsigned 64-bit values). KEY_BITS: 2^64 / golden ratio, odd. KEY_POS: an odd
# constant from the R2 low-discrepancy sequence. KEY_SEED: the first SHA-512 initial hash value.
# MIX_1 / MIX_2 / MIX_SHIFTS: the splitmix64 finaliser's multipliers and shifts (Stafford "Mix13").
KEY_BITS = 0x9E3779B97F4A7C15
KEY_POS = 0xD1B54A32D192ED03
KEY_SEED = 0x6A09E667F3BCC908
MIX_1 = 0xBF58476D1CE4E5B9
MIX_2 = 0x94D049BB133111EB
MIX_SHIFTS = (30, 27, 31)

_MASK64 = (1 << 64) - 1
_CPU_CHUNK = 1 << 18  # 256 Ki elements: the int64 work buffers stay in L2/L3 cache
_GPU_CHUNK = 1 << 21  # 2 Mi elements: 16 MiB per int64 buffer
_SMALL = 1 << 14  # tensors up to this size are packed together with others
_ROW = 512  # row width of the row/column-sum trick for the weighted sum


def _s64(x: int) -> int:
    """An unsigned 64-bit constant as the signed value torch's int64 scalars accept."""
    x &= _MASK64
    return x - (1 << 64) if x >= (1 << 63) else x


_KB, _KP, _KS, _M1, _M2 = (_s64(c) for c in (KEY_BITS, KEY_POS, KEY_SEED, MIX_1, MIX_2))
_SHIFT_MASKS = tuple((s, (1 << (64 - s)) - 1) for s in MIX_SHIFTS)
# the key as the fused form (fingerprint_fused.py) takes it
_FUSED_KEY = {"kb": _KB, "kp": _KP, "ks": _KS, "mul1": _M1, "mul2": _M2,
              **{f"s{i}": sh for i, (sh, _) in enumerate(_SHIFT_MASKS, 1)},
              **{f"m{i}": mask for i, (_, mask) in enumerate(_SHIFT_MASKS, 1)}}

_INT_BY_WIDTH: dict[int, Any] = {}


def _int_dtype(width: int):
    import torch

    if not _INT_BY_WIDTH:
        _INT_BY_WIDTH.update({1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64})
    return _INT_BY_WIDTH.get(width)


def default_chunk_elems(device) -> int:
    """The chunk size used on ``device``: small enough to stay in cache on CPUs, large on GPUs."""
    return _CPU_CHUNK if getattr(device, "type", str(device)) == "cpu" else _GPU_CHUNK


class _Tables:
    """Per-(device, chunk) position tables, cached: positions 1..L and positions * KEY_POS."""

    def __init__(self, device, length: int) -> None:
        import torch

        self.pos = torch.arange(1, length + 1, dtype=torch.int64, device=device)
        self.pos_key = self.pos * _KP
        rows = max(1, length // _ROW)
        self.row_idx = torch.arange(rows, dtype=torch.int64, device=device) * _ROW


_cache = threading.local()


def _tables(device, length: int) -> _Tables:
    store = getattr(_cache, "tables", None)
    if store is None:
        store = _cache.tables = {}
    key = (str(device), length)
    tab = store.get(key)
    if tab is None:
        tab = store[key] = _Tables(device, length)
    return tab


def _work(device, length: int):
    """Two int64 work buffers per thread and device, reused so chunks do not re-fault pages."""
    import torch

    store = getattr(_cache, "work", None)
    if store is None:
        store = _cache.work = {}
    key = str(device)
    if getattr(device, "type", "cpu") == "cuda":
        key += f"/{torch.cuda.current_stream(device).cuda_stream}"
    bufs = store.get(key)
    if bufs is None or bufs[0].numel() < length:
        bufs = store[key] = (
            torch.empty(length, dtype=torch.int64, device=device),
            torch.empty(length, dtype=torch.int64, device=device),
        )
    return bufs[0][:length], bufs[1][:length]


def _mix_inplace(z, tmp) -> None:
    """The finaliser on an int64 buffer, in place; ``tmp`` is scratch of the same size."""
    import torch

    (s1, m1), (s2, m2), (s3, m3) = _SHIFT_MASKS
    torch.bitwise_right_shift(z, s1, out=tmp)
    tmp.bitwise_and_(m1)
    z.bitwise_xor_(tmp)
    z.mul_(_M1)
    torch.bitwise_right_shift(z, s2, out=tmp)
    tmp.bitwise_and_(m2)
    z.bitwise_xor_(tmp)
    z.mul_(_M2)
    torch.bitwise_right_shift(z, s3, out=tmp)
    tmp.bitwise_and_(m3)
    z.bitwise_xor_(tmp)


def _flat_int(t) -> Any:
    """The tensor as a flat view of signed integers of its element width (copy if strided)."""
    import torch

    if t.is_quantized or t.layout != torch.strided:
        raise TypeError(f"fingerprints: unsupported tensor kind {t.dtype} / {t.layout}")
    if t.device.type == "meta":
        raise TypeError("fingerprints: meta tensors have no data")
    width = t.element_size()
    it = _int_dtype(width)
    if it is None:
        raise TypeError(
            f"fingerprints: dtype {t.dtype} has {width}-byte elements; 1, 2, 4 or 8 are supported"
        )
    t = t.detach()
    if not t.is_contiguous():
        t = t.contiguous()
    flat = t.reshape(-1)
    if flat.dtype != it:
        flat = flat.view(it)
    return flat


def _one_segment(flat, start: int, length: int, chunk: int):
    """(s0, s1, s2) of ``flat[start:start+length]`` as 0-d int64 tensors (positions from start+1)."""
    import torch

    dev = flat.device
    tab = _tables(dev, chunk)
    z, tmp = _work(dev, length)
    z.copy_(flat[start : start + length])  # sign-extends to int64
    if length % _ROW == 0:
        # sum(p * v) for p = 1..L via row and column sums of the [L/ROW, ROW] view: two cheap
        # reductions instead of a full multiply (exact: every step is a ring operation mod 2^64).
        m = z.view(-1, _ROW)
        rows = m.sum(1)
        cols = m.sum(0)
        s0 = rows.sum()
        s1 = torch.dot(rows, tab.row_idx[: rows.numel()]) if dev.type == "cpu" else (
            rows * tab.row_idx[: rows.numel()]
        ).sum()
        s1 = s1 + ((cols * tab.pos[:_ROW]).sum())
    else:
        s0 = z.sum()
        s1 = torch.mul(z, tab.pos[:length], out=tmp).sum()
    if start:
        s1 = s1 + s0 * start
    # mixer input v * KEY_BITS + p * KEY_POS + KEY_SEED, with p = start + 1 + j
    torch.add(tab.pos_key[:length], z, alpha=_KB, out=z)
    z.add_(_s64(start * KEY_POS + KEY_SEED))
    _mix_inplace(z, tmp)
    return s0, s1, z.sum()


def _eager_row(flat) -> Any:
    """The [3] row of one flat int tensor in the eager form, in one segment (the fused form's
    first-use check: fingerprint_fused.py, guarantee 5)."""
    import torch

    return torch.stack(_one_segment(flat, 0, flat.numel(), flat.numel()))


def _packed(flats: list, device) -> Any:
    """[k, 3] rows for k small flat int tensors, all in one concatenated buffer."""
    import torch

    sizes = [f.numel() for f in flats]
    total = sum(sizes)
    k = len(flats)
    z, tmp = _work(device, total)
    z.copy_(torch.cat(flats))  # mixed widths promote to the widest: values are kept
    sizes_t = torch.tensor(sizes, dtype=torch.int64, device=device)
    ends = torch.cumsum(sizes_t, 0)
    starts = ends - sizes_t
    seg = torch.repeat_interleave(torch.arange(k, device=device), sizes_t, output_size=total)
    pos = torch.arange(1, total + 1, dtype=torch.int64, device=device) - starts[seg]
    del seg

    def segment_sums(x):
        # per-tensor sums from one running sum (int64 wraps, so differences stay exact mod
        # 2^64); cumsum rather than index_add_, which deterministic mode slows down on CUDA
        run = torch.cumsum(x, 0)
        hi = run[ends - 1]
        lo = torch.where(starts > 0, run[(starts - 1).clamp_(min=0)], torch.zeros_like(hi))
        return hi - lo

    out = torch.empty(k, 3, dtype=torch.int64, device=device)
    out[:, 0] = segment_sums(z)
    out[:, 1] = segment_sums(torch.mul(z, pos, out=tmp))
    torch.add(pos.mul_(_KP), z, alpha=_KB, out=z)
    z.add_(_s64(KEY_SEED))
    _mix_inplace(z, tmp)
    out[:, 2] = segment_sums(z)
    return out


def fingerprints(tensors: Sequence[Any], *, chunk_elems: int | None = None) -> torch.Tensor:
    """Fingerprint each tensor: an int64 tensor of shape ``[len(tensors), 3]``.

    ``None`` entries (e.g. parameters without a gradient) give a zero row, as does an empty
    tensor. The result lies on the device of the first non-``None`` tensor (CPU when there is
    none); tensors on other devices are fingerprinted where they are and their rows copied over.
    ``chunk_elems`` bounds the temporary memory (a few int64 buffers of that many elements,
    plus cached position tables); the result does not depend on it.
    """
    import torch

    items = list(tensors)
    out_dev = next((t.device for t in items if t is not None), torch.device("cpu"))
    out = torch.zeros(len(items), 3, dtype=torch.int64, device=out_dev)
    by_dev: dict[Any, list[tuple[int, Any]]] = {}
    for i, t in enumerate(items):
        if t is None:
            continue
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"fingerprints: item {i} is {type(t).__name__}, not a tensor")
        flat = _flat_int(t)
        if flat.numel():
            by_dev.setdefault(flat.device, []).append((i, flat))
    for dev, entries in by_dev.items():
        chunk = int(chunk_elems) if chunk_elems else default_chunk_elems(dev)
        if chunk < 1:
            raise ValueError("fingerprints: chunk_elems must be >= 1")
        rows = torch.zeros(len(entries), 3, dtype=torch.int64, device=dev)
        small: list[tuple[int, Any]] = []
        for j, (_, flat) in enumerate(entries):
            n = flat.numel()
            if use_fused(dev, n, chunk_elems):
                row = fused_rows(flat, chunk_elems, _FUSED_KEY, reference=_eager_row)
                if row is not None:
                    rows[j] = row
                    continue
            if n <= min(_SMALL, chunk // 4):
                small.append((j, flat))
                continue
            parts = [_one_segment(flat, s, min(chunk, n - s), chunk) for s in range(0, n, chunk)]
            rows[j] = torch.stack([torch.stack(p) for p in parts]).sum(0)
        pack: list[tuple[int, Any]] = []
        filled = 0
        for j, flat in small + [(None, None)]:
            if flat is None or (pack and filled + flat.numel() > chunk):
                if pack:
                    rows[[p[0] for p in pack]] = _packed([p[1] for p in pack], dev)
                pack, filled = [], 0
            if flat is not None:
                pack.append((j, flat))
                filled += flat.numel()
        idx = torch.tensor([i for i, _ in entries], dtype=torch.int64, device=out_dev)
        # non-blocking only towards a GPU: a non-blocking copy into host memory may be read early
        out.index_copy_(0, idx, rows.to(out_dev, non_blocking=out_dev.type == "cuda"))
    return out
