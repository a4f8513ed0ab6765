"""The node SDC probe's worker side: one device computes the node's micro-batches, bit for bit.

Why a module of its own: ``checks/sdc_probe.py`` runs in the daemon and never imports torch; it
hands each local device a ``Task("gpu_monitor.sdc.probe_worker:probe_worker")`` through the
worker pool (one subprocess per device), and this function runs there.

What a worker computes (SPEC-SDC.md "The node probe"): a small fixed model — residual blocks
``x + down(gelu(up(x)))`` and a linear head, mean-squared-error loss — with weights drawn from the
probe's seed, so every device holds identical weights. Device ``gpu:i`` owns micro-batch ``i``
(inputs and targets drawn from ``(seed, i)``). Each worker computes, in deterministic mode
(``gpu_monitor.sdc.replay.deterministic_mode``) and through the library's ``replay`` (forward +
backward, gradients, buffers and RNG restored):

1. its own micro-batch;
2. every other device's micro-batch, in ring order starting with the next device (the ring
   replay, plus whatever a confirmation may ask for: the parent decides later which of these it
   reads, so no second round of processes is needed);
3. its own micro-batch again (the determinism check, and the target's recomputation in a
   confirmation).

Each computation is summarised by the library's result row (``result_row``: the loss bits'
fingerprint and the digest of every parameter's gradient fingerprint, six int64 numbers), so
"equal rows" means equal loss bits and equal gradients (strong evidence, not proof: see
docs/sdc.md "Fingerprints"). The model is tiny (the simulated node's profile: hidden 64, two
layers, batch 8), so computing every micro-batch of an 8-device node costs milliseconds.

Precision: bf16 on GPUs (tensor-core multiply-adds, where arithmetic SDC lives), fp32 on CPU
devices (the simulated node). Both are fully deterministic under deterministic mode.

Simulation: the device's forward hook (``Device.forward_hook``; on a simulated device with the
``sdc`` flag, the seam's) is registered on the first block's down projection, which feeds the
residual stream (a fault there cannot vanish behind an activation). On a real host the device
has no seam and nothing is registered.

Test-only: ``GPU_MONITOR_SDC_TEST_NONDETERMINISM`` (``*`` or a comma-separated list of labels
such as ``gpu:1,gpu:2``) makes the named workers' loss change slightly on every call, as a
non-deterministic kernel would, so the tests can prove that the determinism pre-check reports
``unknown``. Never set it in production.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from gpu_monitor.sdc.fingerprint_fused import eager_here

__all__ = [
    "TEST_NONDETERMINISM_ENV",
    "build_model",
    "compute_loss",
    "micro_batch",
    "Probe",
    "probe_worker",
]

TEST_NONDETERMINISM_ENV = "GPU_MONITOR_SDC_TEST_NONDETERMINISM"
_BATCH_SEED_STRIDE = 1_000_003  # micro-batch i draws from seed * stride + i + 1


def _dtype(dev: Any) -> tuple[Any, str]:
    import torch

    return (torch.bfloat16, "bf16") if dev.is_cuda else (torch.float32, "fp32")


def build_model(hidden: int, layers: int, seed: int, dtype: Any, device: Any) -> Any:
    """The probe model, identical on every device: weights drawn on the CPU from ``seed``."""
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.up = nn.Linear(hidden, 2 * hidden)
            self.down = nn.Linear(2 * hidden, hidden)

        def forward(self, x: Any) -> Any:
            return x + self.down(torch.nn.functional.gelu(self.up(x)))

    class ProbeModel(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.head = nn.Linear(hidden, hidden)

        def forward(self, x: Any) -> Any:
            for block in self.blocks:
                x = block(x)
            return self.head(x)

    model = ProbeModel()
    gen = torch.Generator().manual_seed(int(seed))
    with torch.no_grad():
        for p in model.parameters():
            fan_in = p.shape[-1] if p.dim() > 1 else p.shape[0]
            p.copy_(torch.randn(p.shape, generator=gen) / fan_in ** 0.5)
    return model.to(device=device, dtype=dtype)


def micro_batch(seed: int, owner: int, batch_size: int, hidden: int, dtype: Any,
                device: Any) -> tuple[Any, Any]:
    """Device ``owner``'s micro-batch (inputs, targets): the same bits wherever it is built."""
    import torch

    gen = torch.Generator().manual_seed(int(seed) * _BATCH_SEED_STRIDE + int(owner) + 1)
    x = torch.randn(batch_size, hidden, generator=gen)
    y = torch.randn(batch_size, hidden, generator=gen)
    return x.to(device=device, dtype=dtype), y.to(device=device, dtype=dtype)


def compute_loss(model: Any, batch: tuple[Any, Any]) -> Any:
    """Mean squared error, reduced in fp32 (one loss for training-like use and replay)."""
    import torch

    x, y = batch
    return torch.nn.functional.mse_loss(model(x).float(), y.float())


@contextlib.contextmanager
def _deterministic(dev: Any) -> Iterator[None]:
    """Deterministic kernels inside, the previous settings restored after.

    On GPUs this is the library's ``deterministic_mode`` (deterministic algorithms, cuDNN,
    math attention). On CPU devices only the eager deterministic-algorithms flag is set: the
    public setter also configures the compiler (``torch._inductor.config``), whose import costs
    about 1.5 CPU-seconds in every forked worker — most of the probe's time on the simulated
    node — and the probe compiles nothing.
    """
    import torch

    setter = getattr(torch._C, "_set_deterministic_algorithms", None)
    if dev.is_cuda or setter is None:
        from gpu_monitor.sdc.replay import deterministic_mode

        with deterministic_mode(True):
            yield
        return
    prev = (torch.are_deterministic_algorithms_enabled(),
            torch.is_deterministic_algorithms_warn_only_enabled())
    setter(True, warn_only=False)
    try:
        yield
    finally:
        setter(prev[0], warn_only=prev[1])


def _test_nondeterminism(label: str, environ: Mapping[str, str]) -> bool:
    wanted = [w.strip() for w in environ.get(TEST_NONDETERMINISM_ENV, "").split(",") if w.strip()]
    return "*" in wanted or label in wanted


def _jittered(loss_fn: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    """``loss_fn`` whose result grows by 2^-20 relative per call: a stand-in for a kernel
    whose reduction order changes from call to call (test-only)."""
    calls = [0]

    def jittered(model: Any, batch: Any) -> Any:
        loss = loss_fn(model, batch)
        calls[0] += 1
        return loss * (1.0 + calls[0] * 2.0 ** -20)

    return jittered


class Probe:
    """One device's probe, prepared (model, inputs, imports) before its turn and run in it."""

    def __init__(self, dev: Any, own: int, batches: Sequence[int], *, seed: int,
                 batch_size: int, hidden: int, layers: int, label: str = "",
                 environ: Mapping[str, str] | None = None):
        from gpu_monitor.sdc.replay import replay

        environ = os.environ if environ is None else environ
        self.dev, self.own, self._replay = dev, int(own), replay
        self.dtype, self.dtype_name = _dtype(dev)
        self.model = build_model(hidden, layers, seed, self.dtype, dev.torch)
        hook = dev.forward_hook()
        if hook is not None:
            self.model.blocks[0].down.register_forward_hook(hook)
        self.loss_fn = (_jittered(compute_loss) if _test_nondeterminism(label, environ)
                        else compute_loss)
        ring = [int(b) for b in batches]
        if self.own not in ring:
            raise ValueError(f"device {self.own} is not in the ring {ring}")
        start = ring.index(self.own)
        self.order = ring[start:] + ring[:start]  # own, next, next but one, ..., previous
        self.inputs = {b: micro_batch(seed, b, batch_size, hidden, self.dtype, dev.torch)
                       for b in self.order}
        self.params = list(self.model.parameters())

    def _one(self, owner: int) -> list[int]:
        row = self._replay(self.model, self.loss_fn, self.inputs[owner], params=self.params,
                           with_grads=True)
        return [int(v) for v in row.cpu().tolist()]

    def run(self, step: Callable[[str], None] | None = None) -> dict[str, Any]:
        """Every micro-batch of the ring (own first, own again last); the JSON-able result.

        ``rows``: owner index (a string) -> six ints; ``again``: the own micro-batch
        recomputed; plus the precision and the software versions the reference key needs.
        """
        import torch

        step = step or (lambda phase: None)
        rows: dict[str, list[int]] = {}
        t0 = time.perf_counter()
        with _deterministic(self.dev), eager_here():  # one use: compiling would cost more
            for b in self.order:
                step(f"micro-batch of gpu:{b}")
                rows[str(b)] = self._one(b)
            step(f"micro-batch of gpu:{self.own} again")
            again = self._one(self.own)
        self.dev.synchronize()
        return {
            "own": self.own,
            "rows": rows,
            "again": again,
            "dtype": self.dtype_name,
            "compute_s": time.perf_counter() - t0,
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "device": str(self.dev.torch),
        }


def probe_worker(ctx: Any) -> dict[str, Any]:
    """The pool task: build the inputs before the turn, compute inside it (see ``run_probe``)."""
    a = ctx.args
    probe = Probe(ctx.device, int(a["own"]), list(a["batches"]), seed=int(a["seed"]),
                  batch_size=int(a["batch_size"]), hidden=int(a["hidden_size"]),
                  layers=int(a["layers"]), label=ctx.label)
    result: dict[str, Any] = {}
    for _turn in ctx.turns():
        result = probe.run(ctx.step)
    return result
