"""fingerprints(): the definition, pinned values, and what it must (and can only) detect."""

from __future__ import annotations

import pytest
import torch

from gpu_monitor.sdc import fingerprint as F
from gpu_monitor.sdc import fingerprints

M64 = (1 << 64) - 1
WIDTH_INT = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def s64(x: int) -> int:
    x &= M64
    return x - (1 << 64) if x >= 1 << 63 else x


def mix_ref(z: int) -> int:
    a, b, c = F.MIX_SHIFTS
    z ^= z >> a
    z = (z * F.MIX_1) & M64
    z ^= z >> b
    z = (z * F.MIX_2) & M64
    z ^= z >> c
    return z


def reference(t: torch.Tensor) -> list[int]:
    """The definition in plain Python integers (docs/sdc.md, gpu_monitor/sdc/fingerprint.py)."""
    vals = t.detach().contiguous().reshape(-1).view(WIDTH_INT[t.element_size()]).tolist()
    s0 = s1 = s2 = 0
    for p, v in enumerate(vals, 1):
        s0 += v
        s1 += p * v
        s2 += mix_ref((v * F.KEY_BITS + p * F.KEY_POS + F.KEY_SEED) & M64)
    return [s64(s0), s64(s1), s64(s2)]


def pinned_inputs() -> dict[str, torch.Tensor]:
    """Inputs built by exact arithmetic only (no RNG, no libm), so they are the same everywhere."""
    return {
        "fp32_quarters": torch.arange(-500, 500, dtype=torch.float32) * 0.25,
        "int16_hashed": (torch.arange(777, dtype=torch.int64) * 2654435761 % 65536 - 32768).to(
            torch.int16
        ),
        "fp64_eighths_2d": torch.arange(300, dtype=torch.float64).reshape(30, 10) / 8,
        "uint8_all": torch.arange(256, dtype=torch.int64).to(torch.uint8),
        "bf16_halves": (torch.arange(-64, 64, dtype=torch.float32) * 0.5).to(torch.bfloat16),
        "bool_every_third": torch.arange(50) % 3 == 0,
        "int64_extremes": torch.tensor([2**63 - 1, -(2**63), 0, 1, -1, 12345678901234]),
        "fp16_quarters": (torch.arange(100, dtype=torch.float32) / 4).to(torch.float16),
        "int32_multi_chunk": torch.arange(300_000, dtype=torch.int32) - 150_000,
        "scalar_fp32": torch.tensor(1.5),
    }


# Computed once with this implementation and checked against reference(); they must never change.
PINNED = {
    "fp32_quarters": [36428054528, 286660942102528, 476207646225686509],
    "int16_hashed": [81508, 44689392, 7351831556835713078],
    "fp64_eighths_2d": [-913351115053989888, 5250563846816399360, -7370212526650825826],
    "uint8_all": [-128, -715520, -5738292788081792593],
    "bf16_halves": [25216, 68715136, -6797955428694828791],
    "bool_every_third": [17, 425, 207128457347955808],
    "int64_extremes": [12345678901233, -9223297962781368406, 7329666774220516245],
    "fp16_quarters": [1842528, 97403712, -2225487708330757317],
    "int32_multi_chunk": [-150000, 2249977499900000, -8458659493830228731],
    "scalar_fp32": [1069547520, 1069547520, 7882807153639065690],
}


def fp(t, **kw) -> list[int]:
    return fingerprints([t], **kw)[0].tolist()


# -- the definition --------------------------------------------------------------------------


def test_torch_int64_arithmetic_wraps_modulo_2_to_the_64():
    big = torch.tensor([2**62, 2**63 - 1, -(2**63)], dtype=torch.int64)
    assert (big * 4).tolist() == [0, -4, 0]
    assert (big + 1).tolist() == [2**62 + 1, -(2**63), -(2**63) + 1]
    assert big.sum().tolist() == s64(2**62 + 2**63 - 1 - 2**63)
    assert (big * s64(F.MIX_1)).tolist() == [s64(v * F.MIX_1) for v in (2**62, 2**63 - 1, -(2**63))]


@pytest.mark.parametrize("name", sorted(PINNED))
def test_pinned_vectors_never_change(name):
    assert fp(pinned_inputs()[name]) == PINNED[name]


@pytest.mark.parametrize("name", sorted(set(PINNED) - {"int32_multi_chunk"}))
def test_pinned_vectors_follow_the_written_definition(name):
    assert reference(pinned_inputs()[name]) == PINNED[name]


def test_plain_and_weighted_sums_of_a_scalar_are_its_raw_bits():
    row = fp(torch.tensor(-2.0))  # 0xC0000000 as a signed int32
    assert row[0] == row[1] == -(1 << 30)


DTYPES = [torch.bool, torch.uint8, torch.int8, torch.float16, torch.bfloat16, torch.int16,
          torch.float32, torch.int32, torch.float64, torch.int64, torch.complex64]
DTYPES += [getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2") if hasattr(torch, n)]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_1_2_4_8_byte_dtype_matches_the_reference(dtype):
    g = torch.Generator().manual_seed(7)
    raw = torch.randint(-(2**62), 2**62, (257,), generator=g, dtype=torch.int64)
    width = torch.empty(0, dtype=dtype).element_size()
    t = raw.view(torch.uint8)[: 257 * width].view(dtype)
    assert fp(t) == reference(t)


def test_only_the_bits_matter_not_the_dtype_name():
    bits = torch.arange(64, dtype=torch.int64).to(torch.int8)
    assert fp(bits.view(torch.uint8)) == fp(bits)
    if hasattr(torch, "float8_e4m3fn"):
        assert fp(bits.view(torch.float8_e4m3fn)) == fp(bits)


def test_sixteen_byte_elements_are_refused():
    with pytest.raises(TypeError, match="complex128"):
        fingerprints([torch.zeros(3, dtype=torch.complex128)])


def test_meta_tensors_are_refused():
    with pytest.raises(TypeError, match="meta"):
        fingerprints([torch.zeros(3, device="meta")])


def test_none_and_empty_give_zero_rows_and_the_shape_is_n_by_3():
    out = fingerprints([None, torch.zeros(0), torch.ones(2)])
    assert out.dtype == torch.int64 and out.shape == (3, 3)
    assert out[0].tolist() == [0, 0, 0] and out[1].tolist() == [0, 0, 0]
    assert fingerprints([]).shape == (0, 3)


@pytest.mark.parametrize("chunk", [7, 64, 512, 1000, 4096, None])
def test_result_does_not_depend_on_chunk_size_or_packing(chunk):
    g = torch.Generator().manual_seed(3)
    ts = [torch.randn(5000, generator=g), torch.randn(3, 7, generator=g).half(), None,
          torch.randn(1536, generator=g), torch.randint(0, 9, (10,), generator=g),
          torch.randn(40000, generator=g).double()]
    assert fingerprints(ts, chunk_elems=chunk).tolist() == [
        [0, 0, 0] if t is None else reference(t) for t in ts
    ]


def test_non_contiguous_tensors_are_read_in_logical_order():
    t = torch.arange(600, dtype=torch.float32).reshape(20, 30)
    assert fp(t.t()) == fp(t.t().contiguous())
    assert fp(t.t()) != fp(t)


def test_temporary_memory_is_bounded_by_the_chunk():
    big = torch.arange(1_000_000, dtype=torch.float32)
    F._cache.work = {}
    fingerprints([big], chunk_elems=10_000)
    assert max(b.numel() for bufs in F._cache.work.values() for b in bufs) <= 10_000


# -- what it detects -------------------------------------------------------------------------


def base(n=1000, seed=0):
    return torch.randn(n, generator=torch.Generator().manual_seed(seed))


def bits(t):
    return t.view(WIDTH_INT[t.element_size()])


def test_every_single_element_change_changes_all_three_columns():
    t = base()
    ref = fingerprints([t])[0]
    variants = []
    for i in range(t.numel()):
        v = t.clone()
        bits(v)[i] += 1 + (i % 5) * 12345
        variants.append(v)
    rows = fingerprints(variants)
    assert bool((rows != ref).all())


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.float64, torch.int8])
def test_a_flip_of_every_bit_position_is_detected(dtype):
    t = (torch.arange(64) - 20).to(dtype)
    ref = fingerprints([t])[0]
    width_bits = t.element_size() * 8
    variants = []
    for b in range(width_bits):
        v = t.clone()
        ib = bits(v)
        flip = torch.tensor(1, dtype=torch.int64).bitwise_left_shift(b).to(ib.dtype)
        ib[17] ^= flip
        variants.append(v)
    rows = fingerprints(variants)
    assert bool((rows[:, 2] != ref[2]).all())  # the mixer column catches every flip
    if t.element_size() <= 4:  # < 2^32 elements of <= 4 bytes: the linear columns do too
        assert bool((rows[:, 0] != ref[0]).all()) and bool((rows[:, 1] != ref[1]).all())


def test_a_swap_keeps_the_plain_sum_but_changes_the_others():
    t = base()
    ref = fp(t)
    for i, j in [(0, 1), (3, 900), (998, 999)]:
        v = t.clone()
        v[i], v[j] = t[j], t[i]
        row = fp(v)
        assert row[0] == ref[0] and row[1] != ref[1] and row[2] != ref[2]


def test_a_compensating_pair_keeps_the_plain_sum_but_changes_the_others():
    t = base()
    ref = fp(t)
    for i, j, d in [(0, 1, 4096), (10, 500, 1), (999, 3, 1 << 20)]:
        v = t.clone()
        bits(v)[i] += d
        bits(v)[j] -= d
        row = fp(v)
        assert row[0] == ref[0] and row[1] != ref[1] and row[2] != ref[2]


def test_the_plus_d_minus_2d_plus_d_pattern_cancels_the_linear_columns_not_the_mixer():
    t = base(4096, seed=1)
    ref = fingerprints([t])[0]
    g = torch.Generator().manual_seed(11)
    variants = []
    for _ in range(2000):
        i = int(torch.randint(0, t.numel() - 2, (1,), generator=g))
        d = int(torch.randint(1, 1 << 16, (1,), generator=g))
        v = t.clone()
        b = bits(v)
        b[i] += d
        b[i + 1] -= 2 * d
        b[i + 2] += d
        variants.append(v)
    rows = fingerprints(variants)
    assert bool((rows[:, 0] == ref[0]).all()) and bool((rows[:, 1] == ref[1]).all())
    assert bool((rows[:, 2] != ref[2]).all())


def test_100k_random_multi_element_changes_have_no_collisions():
    n, count = 64, 100_000
    g = torch.Generator().manual_seed(2024)
    t = torch.randn(n, generator=g)
    batch = t.repeat(count, 1)
    ib = batch.view(torch.int32)
    k = torch.randint(2, 6, (count,), generator=g)  # 2..5 changed elements per variant
    for j in range(5):
        rows = torch.nonzero(k > j).squeeze(1)
        pos = torch.randint(0, n, (rows.numel(),), generator=g)
        delta = torch.randint(1, 1 << 20, (rows.numel(),), generator=g, dtype=torch.int32)
        sign = torch.where(torch.rand(rows.numel(), generator=g) < 0.5, -1, 1).to(torch.int32)
        ib[rows, pos] += delta * sign
    distinct = torch.unique(ib, dim=0)  # the variants that really differ
    distinct = distinct[(distinct != t.view(torch.int32)).any(1)]
    variants = list(distinct.view(torch.float32).unbind(0))
    assert len(variants) > 99_000
    rows = fingerprints(variants + [t])
    assert len({tuple(r) for r in rows.tolist()}) == len(variants) + 1
    assert len(set(rows[:, 2].tolist())) == len(variants) + 1  # even the mixer alone


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_and_cpu_agree():
    ts = [pinned_inputs()[k] for k in sorted(PINNED)]
    cpu = fingerprints(ts)
    gpu = fingerprints([t.cuda() for t in ts])
    assert gpu.device.type == "cuda" and gpu.cpu().tolist() == cpu.tolist()
