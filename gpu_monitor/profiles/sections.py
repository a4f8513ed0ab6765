"""The profile's hardware sections: what a healthy node of one SKU is, and the floors it meets.

``gpu``, ``nvlink``, ``pcie``, ``rdma``, ``nccl``, ``fabric`` and ``dcgm`` describe the node, not
one check: several checks are judged against each section (a check names the sections it reads
in its declaration, ``Check.sections``), and a profile file must give every required key here,
because a wrong default for a hardware fact would pass a broken node. The checks' own
thresholds are declared on the checks (``Check.settings``), with their defaults.
"""

from __future__ import annotations

from gpu_monitor.profiles.schema import (
    BYTES,
    COUNT,
    NON_NEGATIVE,
    POSITIVE,
    SECONDS,
    SECONDS0,
    Bool,
    Int,
    List,
    Map,
    Nullable,
    Str,
    Version,
)

DTYPES = ("bf16", "fp16", "tf32", "fp32", "fp64")
RDMA_PORT = Str(pattern=r"[A-Za-z0-9_.\-]+:\d+",
                what="an RDMA port 'device:port' such as 'mlx5_0:1'")
DTYPE = Str(choices=DTYPES)

SECTIONS: dict[str, Map] = {
    "gpu": Map({
        "count": COUNT,
        "product_name": Nullable(Str()),
        "pci_device_id": Nullable(Int(0, 0xFFFF)),
        "memory_gib": Nullable(POSITIVE),
        "min_driver_version": Nullable(Version()),
        "min_cuda_version": Nullable(Version()),
        "peak_tflops": Map({d: POSITIVE for d in DTYPES}, doc="a mapping dtype -> TFLOP/s"),
        "slowdown_temp_celsius": Nullable(POSITIVE),
    }, required=frozenset({"count", "product_name", "pci_device_id", "memory_gib",
                           "min_driver_version", "min_cuda_version", "peak_tflops"})),
    "nvlink": Map({
        "links_per_gpu": COUNT,
        "nvswitch": Bool(),
        "nvswitch_count": COUNT,
        "p2p_floor_gb_per_s": Nullable(NON_NEGATIVE),
        "boot_grace_s": SECONDS0,
    }, required=frozenset({"links_per_gpu", "nvswitch", "nvswitch_count", "p2p_floor_gb_per_s",
                           "boot_grace_s"})),
    "pcie": Map({
        "gen": Nullable(Int(1, 7)),
        "width": Nullable(Int(1, 32)),
        "h2d_floor_gb_per_s": Nullable(NON_NEGATIVE),
        "d2h_floor_gb_per_s": Nullable(NON_NEGATIVE),
        "gpu_numa": Nullable(List(COUNT)),
        "gpu_nic": Nullable(List(Str(what="an RDMA device name such as 'mlx5_0'"))),
    }, required=frozenset({"gen", "width", "h2d_floor_gb_per_s", "d2h_floor_gb_per_s"})),
    "rdma": Map({
        "ports": List(RDMA_PORT),
        "rate_gbit_per_s": Nullable(POSITIVE),
        "loopback_floor_gbit_per_s": Nullable(NON_NEGATIVE),
        "message_bytes": BYTES,
    }, required=frozenset({"ports", "rate_gbit_per_s", "loopback_floor_gbit_per_s",
                           "message_bytes"})),
    "nccl": Map({
        "allreduce_busbw_floor_gb_per_s": Nullable(NON_NEGATIVE),
        "large_message_min_bytes": BYTES,
        "small_message_max_bytes": BYTES,
        "small_p95_latency_limit_s": Nullable(SECONDS),
        "sweep_min_bytes": BYTES,
        "sweep_max_bytes": BYTES,
        "sweep_factor": Int(2),
    }, required=frozenset({"allreduce_busbw_floor_gb_per_s", "large_message_min_bytes",
                           "small_message_max_bytes", "small_p95_latency_limit_s",
                           "sweep_min_bytes", "sweep_max_bytes", "sweep_factor"})),
    "fabric": Map({
        "busbw_floor_gb_per_s": Nullable(NON_NEGATIVE),
        "small_p95_latency_limit_s": Nullable(SECONDS),
    }),
    "dcgm": Map({
        "level": Int(1, 4),
        "targeted_power_w": Nullable(POSITIVE),
    }, required=frozenset({"level"})),
}

# Pairs (a, b) of section keys that must satisfy a <= b when both are set.
ORDERED_KEYS: tuple[tuple[str, str], ...] = (
    ("nccl.sweep_min_bytes", "nccl.sweep_max_bytes"),
    ("nccl.small_message_max_bytes", "nccl.large_message_min_bytes"),
)
