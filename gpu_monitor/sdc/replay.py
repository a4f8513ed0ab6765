"""Recompute one micro-batch on the unwrapped module and summarise the result as six numbers.

Why: the ring audit, its confirmations and the node probe all need "what does this device get
for that micro-batch" without disturbing training: no collectives (the DDP wrapper is bypassed),
and the caller's gradients, module buffers and RNG state are exactly as before afterwards.

A result row is int64 ``[6]``: the loss fingerprint (3 numbers; column 0 is the loss's raw bits
for a scalar loss; with gradient accumulation, of the vector of every micro-step's loss) and, in deterministic mode, the fingerprint of the ``[P, 3]`` matrix of
per-parameter gradient fingerprints (else zeros). Two rows are equal exactly when the loss bits
and (if compared) every gradient fingerprint agree.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from gpu_monitor.sdc.fingerprint import fingerprints

__all__ = ["accumulate", "deterministic_mode", "grad_digest", "replay", "result_row"]

ROW = 6


@contextlib.contextmanager
def deterministic_mode(enabled: bool = True) -> Iterator[None]:
    """Deterministic kernels (and math attention) inside, the caller's settings restored after.

    Ops without a deterministic implementation raise inside (torch's own error) rather than
    produce a result that a replay would not reproduce.
    """
    if not enabled:
        yield
        return
    import torch

    cuda = torch.backends.cuda
    cudnn = torch.backends.cudnn
    prev = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        cudnn.deterministic,
        cudnn.benchmark,
        cuda.flash_sdp_enabled(),
        cuda.mem_efficient_sdp_enabled(),
        cuda.math_sdp_enabled(),
        _cudnn_sdp_enabled(),
    )
    try:
        torch.use_deterministic_algorithms(True)
        cudnn.deterministic = True
        cudnn.benchmark = False
        cuda.enable_flash_sdp(False)
        cuda.enable_mem_efficient_sdp(False)
        cuda.enable_math_sdp(True)
        _enable_cudnn_sdp(False)
        yield
    finally:
        torch.use_deterministic_algorithms(prev[0], warn_only=prev[1])
        cudnn.deterministic = prev[2]
        cudnn.benchmark = prev[3]
        cuda.enable_flash_sdp(prev[4])
        cuda.enable_mem_efficient_sdp(prev[5])
        cuda.enable_math_sdp(prev[6])
        if prev[7] is not None:
            _enable_cudnn_sdp(prev[7])


def _cudnn_sdp_enabled() -> bool | None:
    import torch

    f = getattr(torch.backends.cuda, "cudnn_sdp_enabled", None)
    return f() if f else None


def _enable_cudnn_sdp(on: bool) -> None:
    import torch

    f = getattr(torch.backends.cuda, "enable_cudnn_sdp", None)
    if f:
        f(on)


def grad_digest(grad_fps) -> Any:
    """Three numbers standing for a ``[P, 3]`` matrix of per-parameter gradient fingerprints."""
    return fingerprints([grad_fps])[0]


def result_row(loss, grad_fps=None) -> Any:
    """The int64 ``[6]`` row of a computation (``grad_fps=None``: loss only)."""
    import torch

    loss_fp = fingerprints([loss.detach()])[0]
    if grad_fps is None:
        return torch.cat([loss_fp, torch.zeros(3, dtype=torch.int64, device=loss_fp.device)])
    return torch.cat([loss_fp, grad_digest(grad_fps).to(loss_fp.device)])


def accumulate(model: Any, compute_loss: Callable[[Any, Any], Any], batch: Any, micro_steps: int,
               *, backward: bool, scale: Callable[[Any], Any] | None = None,
               no_sync: Callable[[], Any] | None = None) -> Any:
    """Forward (and ``backward``) of one step: the loss, or the vector of micro-step losses.

    ``micro_steps == 1``: ``batch`` is the step's one micro-batch and the loss is returned as
    ``compute_loss`` made it. Otherwise ``batch`` is the sequence of ``micro_steps``
    micro-batches; each micro-step's loss is divided by ``micro_steps`` before its backward (the
    gradients accumulate to the mean, as nanoGPT's loop makes them) and every micro-step but the
    last runs under ``no_sync()`` (DDP: no all-reduce until the last). Training and replay both
    come through here, so a replay accumulates in exactly the training step's order.
    """
    import torch

    def back(loss) -> None:
        if backward:
            (scale(loss) if scale else loss).backward()

    if micro_steps == 1:
        loss = compute_loss(model, batch)
        back(loss)
        return loss
    micro = list(batch)
    if len(micro) != micro_steps:
        raise ValueError(
            f"gpu_monitor.sdc: micro_steps={micro_steps} but the step's batch holds {len(micro)} "
            "micro-batches (batches and rebuild_batch must give a sequence of micro_steps of them)"
        )
    losses = []
    for i, mb in enumerate(micro):
        last = i == micro_steps - 1
        with contextlib.nullcontext() if last or no_sync is None else no_sync():
            loss = compute_loss(model, mb)
            back(loss / micro_steps)
        losses.append(loss.detach().reshape(()))
    return torch.stack(losses)


def _rng_state() -> tuple:
    import torch

    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    return torch.get_rng_state(), cuda


def _set_rng_state(state: tuple) -> None:
    import torch

    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state_all(state[1])


def replay(
    module: Any,
    compute_loss: Callable[[Any, Any], Any],
    batch: Any,
    *,
    params: Sequence[Any],
    with_grads: bool,
    grad_rows: Sequence[int] | None = None,
    scale: Callable[[Any], Any] | None = None,
    micro_steps: int = 1,
) -> Any:
    """Forward (and, ``with_grads``, backward) of ``batch`` on ``module``; the result row.

    ``params`` are the parameters whose gradients are compared (their ``.grad`` is set aside and
    put back); ``grad_rows`` restricts the comparison to those indices (the rows the DDP hook
    fills; others stay zero, like the hook's). A parameter the batch does not reach counts as a
    zero gradient, which is what DDP's buckets hold for it with ``find_unused_parameters``.
    ``scale`` maps the loss to what backward is called on (a grad scaler's ``scale``).
    ``micro_steps > 1``: ``batch`` is the step's micro-batches, every one recomputed and its
    gradient accumulated as in training (``accumulate``).
    """
    import torch

    saved_grads = [p.grad for p in params]
    buffers = [(b, b.detach().clone()) for b in module.buffers()]
    rng = _rng_state()
    try:
        for p in params:
            p.grad = None
        with torch.enable_grad():
            loss = accumulate(module, compute_loss, batch, micro_steps, backward=with_grads,
                              scale=scale)
            if not with_grads:
                return result_row(loss)
        rows = range(len(params)) if grad_rows is None else sorted(grad_rows)
        grads = []
        for i in rows:
            g = params[i].grad
            grads.append(g if g is not None else torch.zeros_like(params[i]))
        fps = torch.zeros(len(params), 3, dtype=torch.int64, device=loss.device)
        if grads:
            fps[list(rows)] = fingerprints(grads).to(fps.device)
        return result_row(loss, fps)
    finally:
        for p, g in zip(params, saved_grads, strict=True):
            p.grad = g
        with torch.no_grad():
            for b, old in buffers:
                b.copy_(old)
        _set_rng_state(rng)
