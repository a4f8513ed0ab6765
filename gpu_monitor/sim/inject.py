"""``--inject`` faults for the simulated node: ``KIND@TARGET[,key=value...]``.

Each fault changes the simulated hardware (``NodeSpec``) and nothing else; the fake pynvml, the
sysfs tree, the kernel-log file and the fake tools then show it at the lowest boundary, so the
real readers and checks see it exactly as they would see real hardware.

``after=SECONDS`` delays a fault, ``for=SECONDS`` ends it (for faults that unfold over time, e.g.
``port-down@ib:mlx5_0:1,after=10,for=30``). ``count=N`` repeats a kernel-log fault (an XID burst,
spaced ``every=SECONDS`` apart).

The kinds are declared by domain in ``gpu_monitor/sim/faults/`` (``gpu.py``, ``kernel_log.py``,
``links.py``, ``tools.py``); this module is where callers find them: :data:`KINDS` (in the order
``--inject help`` lists them), :func:`parse` and :func:`help_text`.
"""

from __future__ import annotations

import dataclasses
import re

from gpu_monitor.sim.faults import gpu, kernel_log, links, tools
from gpu_monitor.sim.faults.base import Fault, FaultKind, InjectError

_TARGET_RES = {
    "gpu": re.compile(r"^gpu:\d+$"),
    "ib": re.compile(r"^ib:[A-Za-z0-9_\-]+:\d+$"),
    "nvswitch": re.compile(r"^nvswitch:\d+$"),
    "node": re.compile(r"^node$"),
    "gpu or node": re.compile(r"^(gpu:\d+|node)$"),
    "sysfs": re.compile(r"^(?:gpu:\d+|nvswitch:\d+|ib:[A-Za-z0-9_\-]+:\d+"
                        r"|pcie:[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])$"),
}
_TARGET_EXAMPLES = {"gpu": "gpu:3", "ib": "ib:mlx5_0:1", "nvswitch": "nvswitch:0",
                    "node": "node", "gpu or node": "gpu:3 or node",
                    "sysfs": "gpu:0, nvswitch:0, ib:mlx5_0:1 or pcie:0000:4f:00.0"}

_EXAMPLES = {
    'gpu-missing': 'gpu-missing@gpu:7',
    'xid': 'xid@gpu:3,code=79',
    'sxid': 'sxid@nvswitch:0,code=20034,fatal=1',
    'row-remap-pending': 'row-remap-pending@gpu:2',
    'row-remap-failure': 'row-remap-failure@gpu:2',
    'remap-headroom': 'remap-headroom@gpu:1,low=8,none=1',
    'ecc-uncorrectable': 'ecc-uncorrectable@gpu:5',
    'pcie-downgrade': 'pcie-downgrade@gpu:1,gen=3,width=8',
    'aer': 'aer@gpu:0,kind=fatal',
    'nvlink-down': 'nvlink-down@gpu:0,link=4',
    'throttle': 'throttle@gpu:5,event=hw_slowdown',
    'hot': 'hot@gpu:3,core=88,memory=98',
    'power-limit': 'power-limit@gpu:4',
    'port-down': 'port-down@ib:mlx5_0:1,after=10,for=30',
    'slow': 'slow@gpu:4,factor=3',
    'wrong-results': 'wrong-results@gpu:6',
    'sdc': 'sdc@gpu:3',
    'dcgm-fail': 'dcgm-fail@gpu:2,test=memory',
    'ib-bw': 'ib-bw@ib:mlx5_1:1,gbit=100',
    'nvml-error': 'nvml-error@gpu:2,call=nvmlDeviceGetTemperature,error=Unknown',
    'gpu-process': 'gpu-process@gpu:0,pid=1234',
    'missing': 'missing@node,what=dcgmi',
    'sysfs': 'sysfs@ib:mlx5_0:1,file=rate,value=banana',
    'dcgm-output': 'dcgm-output@node,format=text,lines=20',
    'ib-bw-output': 'ib-bw-output@ib:mlx5_0:1,cut=mid-row',
}
_DECLARED = {k.name: k for m in (gpu, kernel_log, links, tools) for k in m.FAULT_KINDS}

KINDS: dict[str, FaultKind] = {
    name: dataclasses.replace(_DECLARED[name], example=example)
    for name, example in _EXAMPLES.items()
}
assert set(KINDS) == set(_DECLARED), "every declared fault kind has an example"

_COMMON = ("after", "for")


def parse(text: str) -> Fault:
    """Parse ``KIND@TARGET[,key=value...]`` and validate it against the kind's declaration."""
    raw = text.strip()
    if "@" not in raw:
        raise InjectError(f"{text!r}: expected KIND@TARGET[,key=value...], e.g. xid@gpu:3,code=79")
    kind_name, rest = raw.split("@", 1)
    parts = rest.split(",")
    target, kvs = parts[0].strip(), parts[1:]
    kind = KINDS.get(kind_name.strip())
    if kind is None:
        raise InjectError(f"{text!r}: unknown fault kind {kind_name!r}; known: "
                          f"{', '.join(sorted(KINDS))}")
    if not _TARGET_RES[kind.target].match(target):
        raise InjectError(f"{text!r}: {kind.name} needs a {kind.target} target like "
                          f"{_TARGET_EXAMPLES[kind.target]}, got {target!r}")
    params: dict[str, str] = {}
    for kv in kvs:
        if "=" not in kv:
            raise InjectError(f"{text!r}: {kv!r} is not key=value")
        k, v = (s.strip() for s in kv.split("=", 1))
        allowed = kind.params + (_COMMON if kind.timed else ())
        if k not in allowed:
            raise InjectError(f"{text!r}: {kind.name} takes no {k!r}; it takes "
                              f"{', '.join(allowed) or 'no parameters'}")
        params[k] = v
    fault = Fault(kind.name, target, params, text=raw)
    after = fault.float("after", 0.0)
    dur = fault.float("for") if "for" in params else None
    if after < 0 or (dur is not None and dur <= 0):
        raise InjectError(f"{text!r}: after must be >= 0 and for > 0")
    return Fault(kind.name, target, params, after, dur, raw)


def help_text() -> str:
    lines = ["Fault kinds for --inject KIND@TARGET[,key=value...] (with --simulate):"]
    for k in KINDS.values():
        timed = " [,after=S][,for=S]" if k.timed else ""
        lines.append(f"  {k.example}{timed}")
        extra = f" (keys: {', '.join(k.params)})" if k.params else ""
        lines.append(f"      {k.summary}{extra}")
    return "\n".join(lines)
