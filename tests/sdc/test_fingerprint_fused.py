"""The fused (compiled) fingerprint form: the same numbers as the eager form, and a safe fallback.

The compiled tests compare against the pinned vectors of test_fingerprint.py and against the
eager form on overflow vectors: for every element width, vectors whose plain sum leaves the
element's own width, whose weighted sum wraps modulo 2^64 where the width allows it, whose
values need sign extension (all ones), in one segment and in several (positions offset).
"""

from __future__ import annotations

import threading

import pytest
import torch

from gpu_monitor.sdc import fingerprint_fused as FF
from gpu_monitor.sdc import fingerprints
from tests.sdc.test_fingerprint import PINNED, pinned_inputs, s64

DEVICES = ["cpu", pytest.param("cuda", marks=[
    pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")])]
INT_BY_WIDTH = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
FLOAT_BY_WIDTH = {1: torch.uint8, 2: torch.bfloat16, 4: torch.float32, 8: torch.float64}


@pytest.fixture
def mode(monkeypatch):
    def set_mode(value: str) -> None:
        monkeypatch.setenv(FF.MODE_ENV, value)

    return set_mode


@pytest.fixture
def fresh():
    FF._reset_for_tests()
    yield
    FF._reset_for_tests()


def eager(ts, monkeypatch, **kw):
    with monkeypatch.context() as m:
        m.setenv(FF.MODE_ENV, "eager")
        return fingerprints(ts, **kw).cpu().tolist()


# -- the mode and the fallback (nothing compiles here) -------------------------------------------


@pytest.mark.parametrize("value, expected", [(None, "auto"), ("", "auto"), ("eager", "eager"),
                                             (" Compiled ", "compiled"), ("auto", "auto")])
def test_the_mode_comes_from_the_environment(value, expected):
    env = {} if value is None else {FF.MODE_ENV: value}
    assert FF.fingerprint_mode(env) == expected


def test_an_unknown_mode_is_refused_not_guessed():
    with pytest.raises(ValueError, match="GPU_MONITOR_SDC_FINGERPRINTS='fast'"):
        FF.fingerprint_mode({FF.MODE_ENV: "fast"})


@pytest.fixture
def failing_compile(monkeypatch, fresh):
    """torch.compile as it behaves without a C++ compiler: the first call of the result raises."""
    calls = []

    def fake_compile(fn, **kw):
        def run(*a):
            calls.append(a)
            raise RuntimeError("InvalidCxxCompiler: No working C++ compiler found\nmore")

        return run

    monkeypatch.setattr(torch, "compile", fake_compile)
    return calls


def big(seed: int = 0, n: int = FF.FUSED_MIN + 1000):
    return torch.randn(n, generator=torch.Generator().manual_seed(seed))


def test_a_compile_failure_falls_back_to_eager_once_and_says_why(mode, failing_compile,
                                                                 monkeypatch, caplog):
    mode("auto")
    t = big()
    assert fingerprints([t]).tolist() == eager([t], monkeypatch)
    assert FF.fused_status() == {"cpu": "eager: RuntimeError: InvalidCxxCompiler: No working C++ "
                                        "compiler found"}
    assert "using the eager form" in caplog.text
    fingerprints([t, big(1)])
    assert len(failing_compile) == 1  # not retried on every call


def test_compiled_mode_raises_instead_of_falling_back(mode, failing_compile):
    mode("compiled")
    with pytest.raises(RuntimeError, match="InvalidCxxCompiler"):
        fingerprints([big()])


@pytest.fixture
def kernel(monkeypatch, fresh):
    """torch.compile as the identity (the formula runs as plain torch ops), each call counted;
    ``kernel.skew`` is added to every row it returns: a miscompiled kernel."""
    class Kernel:
        calls = 0
        skew = torch.zeros(3, dtype=torch.int64)

    def fake_compile(fn, **kw):
        def run(*args):
            Kernel.calls += 1
            return fn(*args) + Kernel.skew

        return run

    monkeypatch.setattr(torch, "compile", fake_compile)
    return Kernel


def test_a_kernel_is_checked_against_eager_once_before_its_first_answer(mode, kernel,
                                                                       monkeypatch):
    mode("compiled")
    t = big()
    assert fingerprints([t]).tolist() == eager([t], monkeypatch)
    assert kernel.calls == 2  # the probe, then the tensor
    fingerprints([big(1)])
    assert kernel.calls == 3  # checked once per (device, width)
    fingerprints([big(2).to(torch.float64)])
    assert kernel.calls == 5  # another width: another kernel, checked too


def test_a_miscompiled_kernel_is_caught_by_the_check_and_eager_answers(mode, kernel,
                                                                      monkeypatch, caplog):
    mode("auto")
    kernel.skew = torch.tensor([0, 0, 1])  # e.g. a loop cut short by an overflow assumption
    t = big()
    assert fingerprints([t]).tolist() == eager([t], monkeypatch)
    assert FF.fused_status()["cpu"].startswith("eager: FusedMismatch: the compiled 4-byte kernel")
    assert "using the eager form" in caplog.text
    assert kernel.calls == 1  # the probe only: its wrong row never reached a caller


def test_compiled_mode_raises_on_a_miscompiled_kernel(mode, kernel):
    mode("compiled")
    kernel.skew = torch.tensor([1, 0, 0])
    with pytest.raises(FF.FusedMismatch, match="gave .* for the probe, the eager form"):
        fingerprints([big()])


def test_eager_mode_never_compiles(mode, failing_compile, monkeypatch):
    mode("eager")
    fingerprints([big()])
    assert failing_compile == [] and FF.fused_status() == {}


@pytest.mark.parametrize("isa_bits, width, byteorder, vector, form", [
    (512, 4, "little", True, "rows"), (512, 8, "little", True, "rows"),
    (512, 1, "little", True, "words"), (512, 2, "little", True, "words"),
    (512, 2, "big", False, "flat"), (256, 4, "little", False, "rows"),
    (256, 8, "little", False, "rows"), (256, 1, "little", False, "flat"),
    (256, 2, "little", False, "flat"), (0, 4, "little", False, "rows")])
def test_the_cpu_kernel_form_and_options_follow_the_isa_and_the_key_stays_runtime(
        isa_bits, width, byteorder, vector, form, monkeypatch, fresh):
    """Why (fingerprint_fused.py, ``_ROW_COLS``): 4- and 8-byte elements take the rows form (the
    1-D loop waits on memory), 1- and 2-byte ones the words form (read as int32 words) where
    there is vector code and the byte order is the one it assumes, else the 1-D form (scalar,
    the words form is slower than it); vector code only with AVX-512 (a 64-bit lane multiply;
    AVX2's is emulated lane by lane, slower than scalar). The key must stay out of the C++
    source (closure values, traced as symbolic ints): with literal multipliers GCC bounds a
    scalar loop by the signed overflow of ``position * KEY_POS`` and skips almost all of it."""
    from torch._inductor import cpu_vec_isa

    class Isa:
        def bit_width(self):
            return isa_bits

    monkeypatch.setattr(cpu_vec_isa, "pick_vec_isa", lambda: Isa())
    monkeypatch.setattr(FF, "_BYTEORDER", byteorder)
    seen = []

    def closure(fn):  # names and constants of fn and of the functions it closes over
        names, consts = set(fn.__code__.co_freevars), set(fn.__code__.co_consts)
        for cell in fn.__closure__ or ():
            if callable(cell.cell_contents) and hasattr(cell.cell_contents, "__code__"):
                more_names, more_consts = closure(cell.cell_contents)
                names |= more_names
                consts |= more_consts
        return names, consts

    def fake_compile(fn, **kw):
        seen.append((closure(fn), fn.__code__.co_varnames, kw))
        return fn

    monkeypatch.setattr(torch, "compile", fake_compile)
    from gpu_monitor.sdc.fingerprint import _FUSED_KEY

    FF._compiled_for(torch.device("cpu"), width, _FUSED_KEY)
    ((freevars, consts), names, kw), = seen
    assert kw["options"] == ({} if vector else {"cpp.simdlen": 1}) and kw["dynamic"] is True
    assert "m" in freevars  # the key is read from the closure, not baked into the code
    assert not consts & {v for v in _FUSED_KEY.values() if abs(v) > 64}
    assert names[0] == {"rows": "bulk", "words": "head", "flat": "v"}[form]


@pytest.mark.parametrize("n", [6, 7, 8200, 8201, FF.FUSED_MIN, FF.FUSED_MIN + 3, 3 << 20])
def test_the_rows_split_leaves_every_size_at_two_or_more(n):
    nrows, cols = FF._split(n)
    assert nrows >= 2 and 2 <= cols <= FF._ROW_COLS and 2 <= n - nrows * cols <= cols + 1
    if n >= 2 * FF._ROW_COLS + 2:
        assert cols == FF._ROW_COLS


@pytest.mark.parametrize("lanes", [2, 4])
def test_the_words_split_aligns_the_words_and_leaves_every_size_at_two_or_more(lanes):
    big = [FF._ROW_COLS * lanes * 3 + k for k in range(2 * lanes)] + [FF.FUSED_MIN + 3, 3 << 20]
    for n in [*range(FF.ROWS_MIN, FF.ROWS_MIN + 4 * lanes), 1001, *big]:
        for offset in range(2 * lanes):
            head, nrows, cols = FF._split_words(n, offset, lanes)
            tail = n - head - nrows * cols * lanes
            assert 2 <= head <= lanes + 1 and (offset + head) % lanes == 0, (n, offset)
            assert nrows >= 2 and 2 <= cols <= FF._ROW_COLS and 2 <= tail <= cols * lanes + 1
            if n >= 2 * FF._ROW_COLS * lanes + 2 * lanes + 2:
                assert cols == FF._ROW_COLS


def test_small_tensors_small_chunks_and_traced_callers_take_the_eager_form(mode, monkeypatch):
    mode("compiled")
    cpu = torch.device("cpu")
    assert FF.use_fused(cpu, FF.FUSED_MIN, None)
    assert not FF.use_fused(cpu, FF.FUSED_MIN - 1, None)
    assert not FF.use_fused(cpu, 10 * FF.FUSED_MIN, FF.FUSED_MIN - 1)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert not FF.use_fused(cpu, 10 * FF.FUSED_MIN, None)


# -- compiled against pinned and eager (these compile: one graph per element width) ---------------


@pytest.mark.slow
@pytest.mark.parametrize("device", DEVICES)
def test_pinned_vectors_compiled(device, mode, monkeypatch):
    mode("compiled")
    monkeypatch.setattr(FF, "FUSED_MIN", 2)  # every pinned vector of >= 2 elements is fused
    names = sorted(n for n in PINNED if pinned_inputs()[n].numel() >= 2)
    rows = fingerprints([pinned_inputs()[n].to(device) for n in names])
    assert rows.cpu().tolist() == [PINNED[n] for n in names]
    widths = {pinned_inputs()[n].element_size() for n in names}
    assert {w for d, w in FF._compiled if d.startswith(device)} >= widths  # it really compiled


def overflow_vectors(width: int, n: int) -> dict[str, torch.Tensor]:
    it = INT_BY_WIDTH[width]
    info = torch.iinfo(it)
    return {
        "all_max": torch.full((n,), info.max, dtype=it),  # plain sum leaves the width
        "all_min": torch.full((n,), info.min, dtype=it),
        "all_ones_bits": torch.full((n,), -1, dtype=it),  # sign extension, not zero extension
        "alternating_extremes": torch.where(torch.arange(n) % 2 == 0, info.max, info.min).to(it),
        "wrapping_ramp": (torch.arange(n, dtype=torch.int64) * 2654435761).to(it),
    }


def closed_form(c: int, n: int) -> tuple[int, int]:
    """Columns 0 and 1 of n copies of the signed value c, modulo 2^64."""
    return s64(n * c), s64(c * n * (n + 1) // 2)


@pytest.mark.slow
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("width", [1, 2, 4, 8])
@pytest.mark.parametrize("chunk", [None, FF.FUSED_MIN], ids=["one_segment", "segments"])
def test_overflow_vectors_compiled_equal_eager(device, width, chunk, mode, monkeypatch):
    n = 3 * FF.FUSED_MIN + 7  # with the chunk: segments at FUSED_MIN, 2*FUSED_MIN (+ short tail)
    vecs = overflow_vectors(width, n)
    ts = [v.to(device) for v in vecs.values()]
    ts += [vecs["wrapping_ramp"].view(FLOAT_BY_WIDTH[width]).to(device)]  # the bits, not the name
    mode("compiled")
    got = fingerprints(ts, chunk_elems=chunk).cpu().tolist()
    assert (device, width) in {(d.split(":")[0], w) for d, w in FF._compiled}
    assert got == eager([t.cpu() for t in ts], monkeypatch)
    assert got[-1] == got[-2]
    info = torch.iinfo(INT_BY_WIDTH[width])
    for row, c in zip(got[:3], (info.max, info.min, -1), strict=True):
        assert tuple(row[:2]) == closed_form(c, n)
    if width == 8:  # columns 0 and 1 wrap modulo 2^64 themselves
        assert abs(n * info.max) >= 2**63 and row[0] == s64(n * -1)


def lane_vectors(width: int, n: int) -> torch.Tensor:
    """Every element of a 4-byte word (little-endian: element k in the k-th lowest bits) gets
    the width's extremes, -1, 0, 1 and random bits: a pattern of a length prime to the lanes."""
    it = INT_BY_WIDTH[width]
    info = torch.iinfo(it)
    pattern = torch.tensor([info.min, info.max, -1, 0, 1, info.min + 1, info.max - 1],
                           dtype=torch.int64)
    v = pattern.repeat(n // len(pattern) + 1)[:n].to(it)
    gen = torch.Generator().manual_seed(width)
    rnd = torch.randint(0, 256, (n * width,), dtype=torch.uint8, generator=gen).view(it)
    v[n // 2:] = rnd[n // 2:]
    return v


@pytest.mark.slow
@pytest.mark.parametrize("width", [1, 2])
@pytest.mark.parametrize("chunk", [None, 1001], ids=["one_segment", "segments"])
def test_narrow_elements_read_as_words_equal_eager(width, chunk, mode, monkeypatch, fresh):
    """The words form (fingerprint_fused.py, ``_ROW_COLS``): 1- and 2-byte elements read 4 // width
    to an int32 word. Lengths that are no multiple of the word or of a row, the shortest the
    form takes, tails of every kind, tensors that start at every offset into their storage (the
    head that aligns the words), extremes and -1 in every element of the word, one segment and
    several (chunks of 1001: segment starts at every offset too)."""
    monkeypatch.setattr(FF, "FUSED_MIN", 2)
    lanes = 4 // width
    cols = FF._ROW_COLS
    lengths = [FF.ROWS_MIN, FF.ROWS_MIN + 1, 37, 1001, 2 * cols * lanes + 2 * lanes + 1,
               3 * cols * lanes + 5, 3 * cols * lanes + cols * lanes + 3, (1 << 16) + 3]
    base = lane_vectors(width, max(lengths) + 2 * lanes)
    ts = [base[off:off + n] for n in lengths for off in range(lanes + 1)]
    ts += [base.view(FLOAT_BY_WIDTH[width])[1:]]  # the bits of a float view, odd offset
    mode("compiled")
    got = fingerprints(ts, chunk_elems=chunk).tolist()
    assert ("cpu", width) in FF._compiled
    assert FF._form("cpu", width) == ("words" if FF._avx512() else "flat")
    assert got == eager(ts, monkeypatch, chunk_elems=chunk)


@pytest.mark.slow
@pytest.mark.parametrize("width", [4, 8])
def test_float_bit_patterns_read_through_a_float_view_keep_every_bit(width, mode, monkeypatch):
    """Floating-point tensors are fingerprinted by their bits: signalling and quiet NaNs with
    payloads, infinities, -0.0 and denormals reach the compiled formula unchanged."""
    it, ft = INT_BY_WIDTH[width], FLOAT_BY_WIDTH[width]
    bits = 8 * width
    exp_all = ((1 << (bits - {4: 9, 8: 12}[width])) - 1) << {4: 23, 8: 52}[width]  # exponent ones
    patterns = [exp_all | 1, exp_all | 0x5A5A, exp_all | (1 << ({4: 22, 8: 51}[width])),  # NaNs
                exp_all, 1 << (bits - 1), 1, 3]  # +inf, -0.0, denormals
    pats = torch.tensor([s64(x) if width == 8 else x - (1 << 32) * (x >= 1 << 31)
                         for x in patterns], dtype=torch.int64).to(it)
    n = FF.FUSED_MIN + 11
    ints = pats.repeat(n // len(patterns) + 1)[:n]
    ints[::3] = -ints[::3]  # sign bit set on some of them too
    t = ints.view(ft)
    mode("compiled")
    got = fingerprints([t, ints]).tolist()
    assert got[0] == got[1] == eager([ints], monkeypatch)[0]


@pytest.mark.slow
def test_a_gradient_hook_in_backward_gets_the_fused_form(mode, monkeypatch, fresh):
    """The library fingerprints gradients from DDP's communication hook, inside backward."""
    from torch._dynamo.utils import counters

    mode("compiled")
    w = torch.nn.Parameter(torch.ones(FF.FUSED_MIN + 3))
    seen = {}
    graphs = counters["stats"]["unique_graphs"]

    def hook(grad):
        seen["row"] = fingerprints([grad])[0].tolist()

    w.register_hook(hook)

    def other_thread():
        (w * big(5, w.numel())).sum().backward()

    th = threading.Thread(target=other_thread)
    th.start()
    th.join()
    assert counters["stats"]["unique_graphs"] > graphs  # compiled, not run op by op
    assert seen["row"] == eager([w.grad], monkeypatch)[0]


def test_eager_here_keeps_this_thread_eager_even_in_compiled_mode(mode, failing_compile):
    mode("compiled")
    with FF.eager_here():
        fingerprints([big()])
    assert failing_compile == []
    with pytest.raises(RuntimeError, match="InvalidCxxCompiler"):
        fingerprints([big()])  # the block is over


@pytest.mark.slow
def test_by_default_a_large_tensor_takes_the_fused_form(monkeypatch, fresh):
    monkeypatch.delenv(FF.MODE_ENV)
    t = big(9)
    row = fingerprints([t]).tolist()
    assert FF.fused_status() == {"cpu": "compiled"}
    assert row == eager([t], monkeypatch)


@pytest.mark.slow
@pytest.mark.parametrize("width", [1, 2, 4, 8])
def test_one_graph_per_width_whatever_the_length(width, mode, monkeypatch, fresh):
    """Guarantee 3 in the rows and words forms: head, rows, columns and tail are separate inputs
    of >= 2 elements (dynamo specialises 0 and 1, also for a derived size such as a remainder),
    and the first trace (the probe: 16 rows of 4096 and a tail of 3; in words, a head of 2 or 4,
    7 or 3 rows of 4096 words and a long tail) gives them different sizes, so duck sizing ties
    none of them together: lengths with a tail of exactly a row, a row plus one, two, or a long
    one, and (words) tensors that start at every offset into their storage reuse that graph."""
    from torch._dynamo.utils import counters

    mode("compiled")
    it = INT_BY_WIDTH[width]
    gen = torch.Generator().manual_seed(width)
    ts = [torch.randint(-1000, 1000, (n,), dtype=torch.int64, generator=gen).to(it)
          for n in (FF.FUSED_MIN, FF.FUSED_MIN + 1, 5 * 4096 * 4 + 4097, 3 * FF.FUSED_MIN + 7)]
    ts += [ts[-1][off:] for off in (1, 2, 3)]  # words: a head of every size
    fingerprints(ts[:1])  # the probe and the first tensor
    graphs = counters["stats"]["unique_graphs"]
    got = fingerprints(ts).tolist()
    assert counters["stats"]["unique_graphs"] == graphs
    assert got == eager(ts, monkeypatch)
