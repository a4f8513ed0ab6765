"""The fabric probe's settings (``checks.fabric_probe``), declared as a check declares its own.

The multi-node probe is not a check class: it runs as a Job under torchrun
(``gpu-monitor fabric-probe``), and nothing schedules it in the daemon. Its settings still live
in the profile's ``checks`` block, so it declares them the same way (type, default, meaning,
source) and the profile schema, the config schema and docs/configuration.md are composed from
this declaration like from the checks'.
"""

from __future__ import annotations

from types import MappingProxyType

from gpu_monitor.check import Setting
from gpu_monitor.profiles.schema import COUNT, POSITIVE_INT


class FabricProbe:
    name = "fabric_probe"
    summary = "the multi-node probe, `gpu-monitor fabric-probe`"
    sections = ("fabric", "nccl")
    settings = MappingProxyType({
        "iterations": Setting(POSITIVE_INT, 20, "timed iterations per size",
                              "nccl-tests `-n` default"),
        "warmup_iterations": Setting(COUNT, 5, "iterations", "nccl-tests"),
    })
