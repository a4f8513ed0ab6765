"""The simulated device's seam: how ``slow`` and ``wrong-results`` reach a CPU "GPU".

This is the only place where a simulated fault changes what an active check measures. The
simulated node writes its state file (sim/node.py), names it in the workers' environment as
``GPU_MONITOR_SIM_STATE`` and names ``seam_for`` as its workers' device seam
(``WorkerSettings.device_seam = SEAM_FOR``). The worker's main resolves that name -- worker code
never imports this module -- and its device layer (gpu_monitor/workers/device.py) calls
``seam_for()`` once when it opens a device and, when that returns a ``Seam``, routes these
through it:

- ``Seam.account(elapsed_s)`` after each timed burst of compute: a device with
  ``speed_factor`` 3 sleeps twice the burst's duration, so it is measured three times slower
  (sleeping, not spinning, keeps a shared 2-core machine free for the other workers; the
  device's compute clock counts the stretch it returns, ``Device.compute_clock``);
- ``Seam.corrupt(tensor)`` on what the device produces (matmul results) and what it contributes
  to a collective: a device with ``wrong_results`` flips the top mantissa bit of one element,
  every time, at the same place (a stuck bit). The device agrees with itself, so only a
  comparison *across* devices finds it; the error is large enough to survive a sum.
- ``Seam.forward_hook()`` (``sdc_forward_hook``) for a device with ``sdc``: a forward hook that
  a model-running check (the SDC probe) registers on one layer of its model, so the device
  computes a wrong, finite training step, every time, while its matmuls stay right.

Check code never looks at this module or the variable: on every real host no seam is named and
the device layer calls nothing here. Peer copies
(nvlink_peer) do not pass through the seam: on real GPUs they run on the copy engines, not on
the SMs that ``wrong-results`` stands for.

This module imports no torch; ``corrupt`` works on whatever tensor it is handed.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

SEAM_ENV = "GPU_MONITOR_SIM_STATE"
# How the simulated node names this seam to its workers (``WorkerSettings.device_seam``).
SEAM_FOR = "gpu_monitor.sim.worker:seam_for"


@dataclass(frozen=True)
class Seam:
    """The faults of one simulated device, as the state file described them at open time."""

    uuid: str | None
    index: int | None
    speed_factor: float = 1.0
    wrong_results: bool = False
    sdc: bool = False

    @property
    def active(self) -> bool:
        return self.speed_factor != 1.0 or self.wrong_results or self.sdc

    def account(self, elapsed_s: float, sleep=time.sleep) -> float:
        """Stretch a burst that took ``elapsed_s`` to ``speed_factor`` times as long; returns
        the seconds it was stretched by (what a CPU device's compute clock adds)."""
        if self.speed_factor > 1.0 and elapsed_s > 0:
            stretch = elapsed_s * (self.speed_factor - 1.0)
            sleep(stretch)
            return stretch
        return 0.0

    def corrupt(self, tensor: Any) -> Any:
        """Flip the top mantissa bit of one element of ``tensor`` in place (when
        ``wrong_results``).

        The element is fixed (a third of the way in), so the device is wrong the same way every
        time. Returns the tensor.
        """
        if self.wrong_results and tensor.numel() > 0:
            flip_bit(tensor, tensor.numel() // 3)
        return tensor

    def forward_hook(self) -> Any:
        """The ``sdc`` forward hook for this device, or None (see ``sdc_forward_hook``)."""
        return sdc_forward_hook(self)

    def describe(self) -> dict[str, Any]:
        """The faults, as the framework's probe task reports them."""
        return {"speed_factor": self.speed_factor, "wrong_results": self.wrong_results}


def flip_bit(tensor: Any, flat_index: int) -> None:
    """Flip the top mantissa bit (floats) or the lowest bit (integers) of element
    ``flat_index`` of a contiguous tensor, in place."""
    import torch  # the worker has it already; the daemon never calls this

    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    flat = tensor.view(-1)
    if tensor.dtype.is_floating_point:
        mantissa_bits = round(-math.log2(torch.finfo(tensor.dtype).eps))
        raw = flat.view(ints[tensor.element_size()])
        raw[flat_index] ^= 1 << (mantissa_bits - 1)
    else:
        flat[flat_index] ^= 1


def read_state(path: str) -> Mapping[str, Any]:
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def seam_for(uuid: str | None, index: int | None,
             environ: Mapping[str, str] | None = None) -> Seam | None:
    """The seam of the device with ``uuid`` (else ``index``); ``None`` on a real host.

    A state file that is named but unreadable raises: a simulated run must not silently lose
    its injected faults and report a healthy node.
    """
    env = os.environ if environ is None else environ
    path = env.get(SEAM_ENV)
    if not path:
        return None
    try:
        state = read_state(path)
    except (OSError, ValueError) as exc:
        raise RuntimeError(f"{SEAM_ENV}={path}: cannot read the simulation state: {exc}") from exc
    gpus = state.get("gpus") or []
    entry = None
    if uuid:
        entry = next((g for g in gpus if g.get("uuid") == uuid), None)
    if entry is None and index is not None:
        entry = next((g for g in gpus if g.get("index") == index), None)
    if entry is None:
        return Seam(uuid, index)
    return Seam(
        uuid=entry.get("uuid", uuid),
        index=entry.get("index", index),
        speed_factor=float(entry.get("speed_factor") or 1.0),
        wrong_results=bool(entry.get("wrong_results")),
        sdc=bool(entry.get("sdc")),
    )


# --- sdc: a silently wrong step of a model's computation --------------------------------------

SDC_FACTOR = 1000.0


def sdc_forward_hook(seam: Seam | None) -> Any:
    """A forward hook that makes a model's computation silently wrong on an ``sdc`` device.

    ``sdc`` (``--inject sdc@gpu:3``) stands for a faulty multiply-add lane: matmuls of a burn
    test still come out right (``corrupt`` leaves them alone), but a training step computes a
    wrong, finite value and reports nothing. A check that runs a model (the SDC probe) registers
    the returned hook on one layer (``module.register_forward_hook(hook)``) of the model on a
    device whose ``Device.seam`` is set; the hook returns the layer's output with one element
    (a third of the way in) multiplied by ``SDC_FACTOR`` plus 1 (so a zero changes too) — the
    fault table's "x1000 on one forward element". The change is added as a constant, so the
    backward pass runs as usual through the wrong value. It applies to every forward on that
    device: its own micro-batch, its replays of other devices' and its recomputations alike,
    the same way every time (a persistent fault).

    Returns ``None`` (nothing to register) when ``seam`` is ``None`` or has no ``sdc`` flag.
    """
    if seam is None or not seam.sdc:
        return None

    def hook(module: Any, inputs: Any, output: Any) -> Any:
        import torch  # the worker has it already; the daemon never calls this

        flat = output.detach().reshape(-1)
        if flat.numel() == 0:
            return output
        i = flat.numel() // 3
        delta = torch.zeros_like(flat)
        delta[i] = flat[i] * (SDC_FACTOR - 1.0) + 1.0
        return output + delta.view_as(output)

    return hook
