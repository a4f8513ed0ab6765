"""Device-agnostic torch helpers for worker processes (the daemon never imports this module).

One ``Device`` per device a worker opened: ``cuda:N`` on a GPU node, ``cpu`` on the simulated
node and in tests. Check code is written once against this class — timing (``now`` synchronises
first), matmul, dtype names, the process group — so the CUDA path and the CPU path are the same
code with a different ``torch.device``.

A device seam is applied here and only here: ``open_devices`` is handed a ``seam_for``
function by the worker's main, which resolves the one the parent named
(``WorkerSettings.device_seam``; the simulated node names gpu_monitor/sim/worker.py's), and asks
it for each device's ``DeviceSeam``. Four hooks carry it: ``matmul`` (results), ``account``
(speed), ``outgoing`` (data a device contributes to a collective) and ``forward_hook`` (a
model's forward pass). On a real host no seam is named: a plain matmul, two no-ops and no hook.
This module never imports the simulator; the seam comes in through the parent's choice.

Device identity: devices are opened by NVML UUID when the parent knows it. On CUDA the worker
looks the UUID up among torch's devices (``CUDA_DEVICE_ORDER=PCI_BUS_ID`` makes torch's index
the NVML index, but ``CUDA_VISIBLE_DEVICES`` can still renumber them) and reports torch's UUID
back, so results are keyed by the device that really ran. A CPU device takes the UUID it is
given.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # pragma: no cover
    import torch

# torch is imported inside the functions: this module runs in worker processes, but it is
# also importable (fabric/probe.py's normalize_uuid) by processes that must not load torch.
DTYPES = {
    "bf16": "bfloat16",
    "fp16": "float16",
    "tf32": "float32",  # fp32 storage; TF32 tensor-core math is a matmul flag
    "fp32": "float32",
    "fp64": "float64",
}


class DeviceSeam(Protocol):
    """What a seam does to one device (gpu_monitor/sim/worker.py's ``Seam`` is the one there
    is): stretch its compute time, corrupt what it produces, hook a model's forward pass."""

    @property
    def active(self) -> bool: ...

    def account(self, elapsed_s: float) -> float: ...

    def corrupt(self, tensor: Any) -> Any: ...

    def forward_hook(self) -> Callable[..., Any] | None: ...

    def describe(self) -> dict[str, Any]: ...


# ``seam_for(uuid, index)``: the seam of that device, or None.
SeamFor = Callable[[str | None, int], DeviceSeam | None]


def normalize_uuid(raw: Any) -> str:
    """torch prints a CUDA UUID bare (``5d7a...``); NVML writes ``GPU-5d7a...``."""
    text = str(raw).strip()
    if text.startswith(("GPU-", "MIG-")):
        return text
    return "GPU-" + text


def cuda_uuids() -> list[str]:
    """Torch's UUID for each CUDA index it sees."""
    import torch

    return [normalize_uuid(torch.cuda.get_device_properties(i).uuid)
            for i in range(torch.cuda.device_count())]


class Device:
    """One device as a worker uses it."""

    def __init__(self, kind: str, index: int, uuid: str | None, torch_index: int | None = None,
                 seam: DeviceSeam | None = None):
        import torch

        self.kind = kind  # "cuda" | "cpu"
        self.index = index  # NVML index (the target's number)
        self.uuid = uuid
        self.seam = seam if seam is not None and seam.active else None
        self.torch = torch.device("cuda", torch_index) if kind == "cuda" else torch.device("cpu")
        self.stretched_s = 0.0  # what the seam added to this device's bursts (compute_clock)

    def __repr__(self) -> str:
        return f"Device({self.torch}, gpu:{self.index}, {self.uuid})"

    @property
    def is_cuda(self) -> bool:
        return self.kind == "cuda"

    # -- time --------------------------------------------------------------------------------

    def synchronize(self) -> None:
        import torch

        if self.is_cuda:
            torch.cuda.synchronize(self.torch)

    def now(self) -> float:
        """A timestamp after everything queued on the device has finished."""
        self.synchronize()
        return time.perf_counter()

    def compute_clock(self) -> float:
        """A clock for timing a burst of compute on this device alone (burn-in's TFLOP/s).

        On CUDA it is ``now()``: the GPU computes whatever else the host runs. A CPU device is
        one thread of a core shared with everything on the host, so the wall clock would time
        the host's scheduler, not the device: there it is this thread's CPU time (the worker
        runs torch on one thread) plus what the seam stretched the bursts by (``account``).
        Not for anything that waits (copies between processes, collectives): those are
        timed by ``now()``.
        """
        if self.is_cuda:
            return self.now()
        return time.thread_time() + self.stretched_s

    # -- compute, through the seam ----------------------------------------------------------------

    def set_precision(self, dtype_name: str) -> torch.dtype:
        """The storage dtype for ``dtype_name``, with the matching matmul precision set."""
        import torch

        if dtype_name not in DTYPES:
            raise ValueError(f"unknown dtype {dtype_name!r}; known: {', '.join(DTYPES)}")
        if self.is_cuda:
            torch.backends.cuda.matmul.allow_tf32 = dtype_name == "tf32"
            torch.backends.cudnn.allow_tf32 = dtype_name == "tf32"
        return getattr(torch, DTYPES[dtype_name])

    def matmul(self, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        import torch

        torch.matmul(a, b, out=out)
        if self.seam is not None:
            self.seam.corrupt(out)
        return out

    def account(self, elapsed_s: float) -> None:
        """Called after each timed burst of compute (a slow simulated device stretches it)."""
        if self.seam is not None:
            self.stretched_s += self.seam.account(elapsed_s)

    def outgoing(self, t: torch.Tensor) -> torch.Tensor:
        """The data this device contributes to a collective, as it leaves the device."""
        if self.seam is not None:
            self.seam.corrupt(t)
        return t

    def forward_hook(self) -> Callable[..., Any] | None:
        """A forward hook for a model run on this device (``module.register_forward_hook``),
        or None: nothing to register."""
        return self.seam.forward_hook() if self.seam is not None else None

    # -- collectives ------------------------------------------------------------------------------

    @property
    def backend(self) -> str:
        return "nccl" if self.is_cuda else "gloo"

    def init_process_group(self, rank: int, world_size: int, rendezvous: str,
                           timeout_s: float) -> str:
        """Join the node-local group (NCCL on CUDA, gloo on CPU) through a file rendezvous:
        no TCP port to pick, none to collide."""
        import torch
        import torch.distributed as dist

        if self.is_cuda:
            torch.cuda.set_device(self.torch)
        kwargs: dict[str, Any] = {}
        if self.is_cuda:
            kwargs["device_id"] = self.torch  # eager NCCL init: a broken link fails here
        dist.init_process_group(self.backend, init_method=f"file://{rendezvous}", rank=rank,
                                world_size=world_size, timeout=timedelta(seconds=timeout_s),
                                **kwargs)
        return self.backend


def _no_seam(uuid: str | None, index: int) -> None:
    return None


def open_devices(kind: str, refs: Sequence[Mapping[str, Any]],
                 seam_for: SeamFor | None = None) -> list[Device]:
    """Open the devices a worker was given (``[{"index": 3, "uuid": "GPU-..."}]``), each with
    its seam when ``seam_for`` is given."""
    import torch

    seam_of = seam_for or _no_seam
    if kind == "cpu":
        torch.set_num_threads(1)  # CPU "devices" share a few cores; one thread each
        return [Device("cpu", int(r["index"]), r.get("uuid"),
                       seam=seam_of(r.get("uuid"), int(r["index"]))) for r in refs]
    if kind != "cuda":
        raise ValueError(f"unknown device type {kind!r} (cuda or cpu)")
    if not torch.cuda.is_available():
        raise RuntimeError("CUDA is not available in the worker (torch "
                           f"{torch.__version__}, built for CUDA {torch.version.cuda})")
    uuids = cuda_uuids()
    devices = []
    for r in refs:
        index, want = int(r["index"]), r.get("uuid")
        if want:
            if want not in uuids:
                raise RuntimeError(f"gpu:{index} ({want}) is not among the CUDA devices this "
                                   f"worker sees ({len(uuids)}; CUDA_VISIBLE_DEVICES?)")
            torch_index = uuids.index(want)
        else:
            if index >= len(uuids):
                raise RuntimeError(f"gpu:{index}: the worker sees only {len(uuids)} CUDA "
                                   "devices")
            torch_index = index
        devices.append(Device("cuda", index, uuids[torch_index], torch_index,
                              seam=seam_of(uuids[torch_index], index)))
    if len(devices) == 1:
        torch.cuda.set_device(devices[0].torch)
    return devices


def probe(ctx: Any) -> dict[str, Any]:
    """A task that measures nothing: what the worker sees (torch, devices, threads, seam).

    The framework's own tests and the ``gpu`` tests use it; ``args.steps`` progress steps per
    turn and ``args.sleep_s`` between them exercise the turn/progress protocol.
    """
    import torch

    turns = []
    for turn in ctx.turns():
        t0 = time.perf_counter()
        for n in range(int(ctx.args.get("steps", 0))):
            ctx.step(f"probe step {n}")
            time.sleep(float(ctx.args.get("sleep_s", 0.0)))
        turns.append({"turn": turn, "start": t0, "end": time.perf_counter()})
    return {
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cuda_device_order": os.environ.get("CUDA_DEVICE_ORDER"),
        "devices": [{"index": d.index, "uuid": d.uuid, "torch": str(d.torch),
                     "seam": None if d.seam is None else d.seam.describe()}
                    for d in ctx.devices],
        "cuda_uuids": cuda_uuids() if torch.cuda.is_available() else [],
        "turns": turns,
        "rank": ctx.rank,
        "world_size": ctx.world_size,
    }
