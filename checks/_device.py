"""What the active device checks share: burn_in, nccl_allreduce, nvlink_peer and sdc_probe.

Not a check: :class:`DeviceCheck`, their base. Each loads every usable GPU with torch in worker
processes (gpu_monitor/workers): it runs in a bootstrap (``kinds``), needs a GPU and torch
(``requires``) and is invasive (it refuses to run beside foreign GPU processes). The reasons
their shared code gives are ``DEVICE_REASONS``: a GPU NVML reports lost or cannot identify is
left out, ``unknown`` DeviceUnavailable, and a GPU list NVML cannot give is ``unknown``
NvmlReadError (``active_gpus``, checks/_gpus.py rule 5); a worker that times out, crashes or
opens the wrong device is one of ``WORKER_REASONS``.
"""

from __future__ import annotations

from checks._builtin import BuiltinCheck
from checks._gpus import active_gpus
from gpu_monitor.check import Context
from gpu_monitor.model import Kind, Result
from gpu_monitor.workers.pool import WORKER_REASONS, DeviceRef

DEVICE_REASONS = ("DeviceUnavailable", "NvmlReadError", *WORKER_REASONS)


class DeviceCheck(BuiltinCheck):
    kinds = frozenset({Kind.BOOTSTRAP})
    requires = frozenset({"gpu", "torch"})
    invasive = True

    def devices(self, ctx: Context, left_out: str
                ) -> tuple[list[Result], list[DeviceRef] | None]:
        """(the results for the GPUs left out, the devices its workers open), the devices None
        when NVML cannot list the GPUs (the results then hold that `unknown`). ``left_out``
        completes "gpu:N ... : NVML reports it lost", e.g. "not burned" (``active_gpus``)."""
        results, usable = active_gpus(self, ctx, left_out)
        if usable is None:
            return results, None
        return results, [DeviceRef(g.index, g.uuid) for g in usable]
