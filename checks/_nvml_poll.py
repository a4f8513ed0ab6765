"""What the passive checks that poll NVML per GPU share: temperature, throttle, power and
nvlink_state.

Not a check: :class:`NvmlPollCheck`, their base. Each polls NVML (``requires``) every
``interval`` seconds in the daemon and once in a bootstrap (``kinds``); a poll first asks
``poll_gpus`` (checks/_gpus.py), whose results stand alone when NVML is missing, cannot list the
GPUs or lists none, and otherwise judges the GPUs (``judge_gpus``), passing the results through
the check's ``ClearTracker`` so that a problem that ended is reported ``Cleared``.
"""

from __future__ import annotations

from collections.abc import Sequence

from checks._builtin import BuiltinCheck
from checks._gpus import poll_gpus
from gpu_monitor.check import ClearTracker, Context
from gpu_monitor.hw.nvml import GpuInfo
from gpu_monitor.model import Kind, Result


class NvmlPollCheck(BuiltinCheck):
    kinds = frozenset({Kind.PASSIVE, Kind.BOOTSTRAP})
    requires = frozenset({"nvml"})
    interval = 10.0
    timeout = 30.0

    def __init__(self) -> None:
        self._clear = ClearTracker(self.name)

    def poll(self, ctx: Context) -> Sequence[Result]:
        gpus, early = poll_gpus(self, ctx)
        if early is not None:
            return early
        return self._clear.track(ctx, self.judge_gpus(ctx, gpus))

    def judge_gpus(self, ctx: Context, gpus: list[GpuInfo]) -> list[Result]:
        """One poll's results for the GPUs NVML lists (lost and unidentified ones included:
        ask ``unidentified`` before judging each)."""
        raise NotImplementedError
