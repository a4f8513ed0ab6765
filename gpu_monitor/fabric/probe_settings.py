"""What a fabric probe sweeps and how it judges it: the profile's ``fabric.*`` then ``nccl.*``
keys, then the command line.

Why apart: rank 0 alone resolves the settings (it loads the profile) and sends them to every
rank as a plain mapping, so they are one frozen value with a lossless ``to_dict``/``from_dict``
and the result records exactly what the sweep was held to. Per operation (all-reduce,
all-gather) the sweep runs from ``nccl.sweep_min_bytes`` to ``nccl.sweep_max_bytes`` by
``nccl.sweep_factor`` (8 B to 2 GiB on GPUs, capped at ``CPU_MAX_BYTES`` on CPU).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from gpu_monitor.fabric.probe_env import ProbeError
from gpu_monitor.nccl import ALL_GATHER, ALL_REDUCE, SweepLimits, sweep_sizes

CPU_MAX_BYTES = 16 * 1024 * 1024
OPS = (ALL_REDUCE, ALL_GATHER)


@dataclass(frozen=True)
class ProbeSettings:
    """What to sweep and how to judge it (rank 0 resolves these and sends them to all)."""

    sizes: tuple[int, ...]
    iterations: int = 20
    warmup: int = 5
    busbw_floor_gb_per_s: float | None = None
    small_p95_latency_limit_s: float | None = None
    large_message_min_bytes: int = 1 << 31
    small_message_max_bytes: int = 65536
    warning_band: float = 0.0
    expect_transport: str = "any"  # rdma | any
    ops: tuple[str, ...] = OPS
    profile: str | None = None
    straggler_min_s: float = 0.001

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["sizes"] = list(self.sizes)
        d["ops"] = list(self.ops)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ProbeSettings:
        data = dict(d)
        data["sizes"] = tuple(int(s) for s in data["sizes"])
        data["ops"] = tuple(data.get("ops") or OPS)
        return cls(**data)

    @property
    def limits(self) -> SweepLimits:
        """The limits every operation's sweep is held to."""
        return SweepLimits(busbw_floor_gb_per_s=self.busbw_floor_gb_per_s,
                           large_message_min_bytes=self.large_message_min_bytes,
                           small_message_max_bytes=self.small_message_max_bytes,
                           small_p95_latency_limit_s=self.small_p95_latency_limit_s,
                           warning_band=self.warning_band)


def resolve_settings(profile: Any, *, device_type: str, overrides: Mapping[str, Any],
                     multi_node: bool) -> ProbeSettings:
    """Settings from the profile (``fabric.*`` then ``nccl.*``), then the command line."""

    def get(key: str, default: Any = None) -> Any:
        if overrides.get(key) is not None:
            return overrides[key]
        value = profile.check_setting("fabric_probe", key) if profile is not None else None
        return default if value is None else value

    lo = int(get("sweep_min_bytes", 8))
    hi = int(get("sweep_max_bytes", 1 << 31))
    if device_type == "cpu":
        hi = min(hi, CPU_MAX_BYTES)
    if lo > hi:
        raise ProbeError(f"sweep from {lo} B to {hi} B is empty")
    sizes = tuple(sweep_sizes(lo, hi, int(get("sweep_factor", 4))))
    expect = str(overrides.get("expect_transport") or "auto")
    if expect == "auto":
        ports = profile.get("rdma.ports", ()) if profile is not None else ()
        expect = "rdma" if (ports and multi_node and device_type == "cuda") else "any"
    ops = tuple(overrides.get("ops") or OPS)
    bad = [o for o in ops if o not in OPS]
    if bad:
        raise ProbeError(f"unknown operation(s) {', '.join(bad)} (known: {', '.join(OPS)})")

    def opt_float(key: str) -> float | None:
        value = get(key)
        return None if value is None else float(value)

    return ProbeSettings(
        sizes=sizes,
        iterations=max(1, int(get("iterations", 20))),
        warmup=max(0, int(get("warmup_iterations", 5))),
        busbw_floor_gb_per_s=opt_float("busbw_floor_gb_per_s"),
        small_p95_latency_limit_s=opt_float("small_p95_latency_limit_s"),
        large_message_min_bytes=int(get("large_message_min_bytes", sizes[-1])),
        small_message_max_bytes=int(get("small_message_max_bytes", 65536)),
        warning_band=float(get("warning_band", 0.0) or 0.0),
        expect_transport=expect,
        ops=ops,
        profile=getattr(profile, "name", None),
    )

