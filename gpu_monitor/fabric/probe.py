"""``gpu-monitor fabric-probe``: one rank of a multi-node all-reduce / all-gather sweep.

Runs under any torch.distributed launcher: torchrun, or an Indexed Job that sets RANK,
WORLD_SIZE, MASTER_ADDR and MASTER_PORT (``JOB_COMPLETION_INDEX`` stands in for a missing
RANK: one process per pod). NCCL on GPUs, gloo on CPU (the tests): the same code.

Per operation (all-reduce, all-gather) and per message size (``nccl.sweep_min_bytes`` to
``nccl.sweep_max_bytes`` by ``nccl.sweep_factor``; 8 B to 2 GiB on GPUs, capped at 16 MiB on
CPU) every rank

1. proves the data right: rank r contributes w_r x a pattern of small integers in fp32
   (w_r = r mod 16 + 1, pattern values 1..m with m chosen so that every partial sum stays
   below 2**24), so the reduced and gathered values are exactly representable and compared for
   equality, not closeness; an all-gather names whose contribution arrives wrong;
2. times ``warmup`` + ``iterations`` collectives, each on its own (synchronised on CUDA);
3. checks the data again.

Rank 0 gathers everything and reports, per size, p50/p95 latency (of the slowest rank in each
iteration, as nccl-tests' per-iteration timing does), algbw = bytes / the slowest rank's mean
time, and busbw = algbw x 2(n-1)/n (all-reduce) or x (n-1)/n (all-gather, whose size is the
gathered total, as in nccl-tests). Small messages (<= ``nccl.small_message_max_bytes``) are
judged by p95 latency against ``fabric.small_p95_latency_limit_s``; large ones (>=
``nccl.large_message_min_bytes``, else the largest size swept) by busbw against
``fabric.busbw_floor_gb_per_s``, with the profile's warning band. A rank that arrives late at
every collective (a straggler) spends the least time inside them: it is named as a suspect.

Transport: before NCCL starts, the probe sets ``NCCL_DEBUG=INFO``,
``NCCL_DEBUG_SUBSYS=INIT,NET`` and ``NCCL_DEBUG_FILE`` (unless the user set their own file),
then parses the lines (``... via NET/IB/0/GDRDMA``, ``via NET/Socket/0``, ``via P2P/IPC``,
``via SHM/direct/direct``, ``Using network IB``) to record what carried the traffic. On a
fabric that should be RDMA (the profile lists RDMA ports, or ``--expect-transport rdma``) and
spans nodes, traffic over sockets makes the verdict ``unknown`` (``FabricTransportFallback``):
the numbers measure the wrong path.

Output: rank 0 prints the group result (JSON, ``RESULT_SCHEMA``, docs/fabric.md) and every
node's local rank 0 writes a compact summary (< 4 KiB) to ``--termination-log``, which the
fabric scheduler reads from the pod status. Exit codes: 0 healthy, 1 unhealthy, 3 unknown (or
0 whenever a result was produced, with ``--zero-exit``).

Test-only fault seam: ``GPU_MONITOR_FABRIC_TEST_FAULT`` makes one process slow or corrupting,
so tests and benchmarks can prove the sweep flags it. Format: entries ``slow:RANK[:SECONDS]``
(sleep before each timed collective, default 0.05 s) or ``corrupt:RANK`` (the rank's
contribution is off by one in one element), joined by ``,``. Never set it in production; a run
with it set says so in its result (``test_fault``).
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import json
import logging
import math
import os
import re
import socket
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from checks.nccl_allreduce import percentile, sweep_sizes
from gpu_monitor.fabric import termination
from gpu_monitor.model import (
    EXIT_HEALTHY,
    EXIT_UNHEALTHY,
    EXIT_UNKNOWN,
    EXIT_USAGE,
    Status,
    iso,
    utcnow,
)

log = logging.getLogger(__name__)

RESULT_SCHEMA = 1
RESULT_KIND = "FabricProbeResult"
SUMMARY_KIND = "FabricProbeSummary"
TEST_FAULT_ENV = "GPU_MONITOR_FABRIC_TEST_FAULT"
CPU_MAX_BYTES = 16 * 1024 * 1024
TERMINATION_LOG_LIMIT = termination.TERMINATION_LOG_LIMIT
OPS = ("all_reduce", "all_gather")
REASONS = ("FabricWrongData", "FabricBusBwLow", "FabricLatencyHigh", "FabricTransportFallback",
           "FabricProbeError")

_WEIGHTS = 16  # contribution weights 1..16 (rank mod 16 + 1)
_EXACT = 1 << 24  # fp32 represents every integer below this exactly
_CHUNK = 1 << 24  # elements per comparison (bounds the temporaries on a 2 GiB buffer)


class ProbeError(Exception):
    """The probe cannot run (launcher environment, settings)."""


# --- launcher environment ------------------------------------------------------------------------


@dataclass(frozen=True)
class LaunchEnv:
    """Where this process sits in the group, from the launcher's environment."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str
    master_port: int
    node: str
    pod: str


def launch_env(environ: Mapping[str, str]) -> LaunchEnv:
    """RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT (torchrun, or an Indexed Job where
    ``JOB_COMPLETION_INDEX`` is the rank when RANK is absent); LOCAL_RANK defaults to 0."""

    def integer(name: str, value: str | None) -> int:
        try:
            return int(str(value))
        except ValueError:
            raise ProbeError(f"{name}={value!r} is not an integer") from None

    rank_text = environ.get("RANK")
    if rank_text is None:
        rank_text = environ.get("JOB_COMPLETION_INDEX")
    missing = [n for n, v in (("RANK (or JOB_COMPLETION_INDEX)", rank_text),
                              ("WORLD_SIZE", environ.get("WORLD_SIZE")),
                              ("MASTER_ADDR", environ.get("MASTER_ADDR")),
                              ("MASTER_PORT", environ.get("MASTER_PORT"))) if v in (None, "")]
    if missing:
        raise ProbeError("not started by a torch.distributed launcher: missing "
                         + ", ".join(missing) + " (run under torchrun or an Indexed Job)")
    rank = integer("RANK", rank_text)
    world = integer("WORLD_SIZE", environ["WORLD_SIZE"])
    if world < 1 or not 0 <= rank < world:
        raise ProbeError(f"rank {rank} is outside a world of {world}")
    local = integer("LOCAL_RANK", environ.get("LOCAL_RANK", "0"))
    local_world = integer("LOCAL_WORLD_SIZE", environ.get("LOCAL_WORLD_SIZE", "1"))
    host = socket.gethostname()
    return LaunchEnv(rank=rank, world_size=world, local_rank=local,
                     local_world_size=local_world, master_addr=environ["MASTER_ADDR"],
                     master_port=integer("MASTER_PORT", environ["MASTER_PORT"]),
                     node=environ.get("NODE_NAME") or host,
                     pod=environ.get("POD_NAME") or environ.get("HOSTNAME") or host)


# --- the test-only fault seam ----------------------------------------------------------------------


@dataclass(frozen=True)
class TestFault:
    """One ``GPU_MONITOR_FABRIC_TEST_FAULT`` entry (test and benchmark use only)."""

    __test__ = False  # not a pytest class
    kind: str  # slow | corrupt
    rank: int
    delay_s: float = 0.05


def parse_test_faults(text: str | None) -> list[TestFault]:
    out: list[TestFault] = []
    for entry in filter(None, (e.strip() for e in re.split(r"[,;]", text or ""))):
        parts = entry.split(":")
        try:
            if parts[0] == "slow" and len(parts) in (2, 3):
                out.append(TestFault("slow", int(parts[1]),
                                     float(parts[2]) if len(parts) == 3 else 0.05))
                continue
            if parts[0] == "corrupt" and len(parts) == 2:
                out.append(TestFault("corrupt", int(parts[1])))
                continue
        except ValueError:
            pass
        raise ProbeError(f"{TEST_FAULT_ENV}: bad entry {entry!r} (slow:RANK[:SECONDS] or "
                         "corrupt:RANK)")
    return out


# --- transports (pure) ---------------------------------------------------------------------------

_VIA = re.compile(r"\bvia\s+(?P<path>\S.*?)\s*$")
_USING_NETWORK = re.compile(r"\bUsing network (?P<name>\S.*?)\s*$")
_ASSIGNED = re.compile(r"\bAssigned NET plugin (?P<name>\S+) to comm")
_NET_DEVICES = re.compile(r"\bNET/(?P<name>[A-Za-z0-9_]+) : Using (?P<devs>\[.*)$")


def _is_rdma(network: str) -> bool | None:
    """IB (and its plugins: IBext, gIB), RoCE through IB, AWS EFA (Libfabric/OFI) are RDMA;
    Socket is not; other plugins (TCPX, FasTrak, ...) are neither: None."""
    low = network.lower()
    if low == "socket":
        return False
    if low.startswith(("ib", "gib")) or "libfabric" in low or low.startswith("ofi"):
        return True
    return None


@dataclass(frozen=True)
class Transport:
    """What carried a group's traffic, from NCCL's INFO lines (or the backend, for gloo).

    ``kind``: ``rdma`` | ``socket`` | ``plugin`` (another network plugin) | ``intra-node``
    (P2P/SHM/NVLS only: nothing crossed a network) | ``gloo`` | ``unknown`` (no evidence).
    ``paths``: channel connections counted by path (``NET/IB``, ``P2P``, ``SHM``...).
    """

    kind: str = "unknown"
    network: str | None = None
    paths: Mapping[str, int] = field(default_factory=dict)
    gdr: int = 0
    evidence: tuple[str, ...] = ()

    @property
    def rdma(self) -> bool | None:
        return None if self.network is None else _is_rdma(self.network)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "network": self.network, "rdma": self.rdma,
                "paths": dict(sorted(self.paths.items())), "gdr_connections": self.gdr,
                "evidence": list(self.evidence)}


def _kind(network: str | None, paths: Mapping[str, int]) -> str:
    if network is not None:
        rdma = _is_rdma(network)
        return "rdma" if rdma else "socket" if rdma is False else "plugin"
    if paths:
        return "intra-node"
    return "unknown"


def parse_nccl_debug(lines: Iterable[str]) -> Transport:
    """The transport NCCL used, from its ``NCCL_DEBUG=INFO`` lines (INIT and NET subsystems).

    Channel lines (``via NET/IB/0``) are what carried traffic and win; then ``Using network
    X`` / ``Assigned NET plugin X to comm``; a ``NET/X : Using [0]...`` device line alone (NCCL
    prints it for every plugin it initialises) only counts when nothing else does.
    """
    paths: Counter[str] = Counter()
    nets_via: Counter[str] = Counter()
    using: str | None = None
    devices: str | None = None
    gdr = 0
    evidence: list[str] = []
    for raw in lines:
        line = raw.rstrip("\n")
        if "NCCL" not in line:
            continue
        m = _VIA.search(line)
        if m and "Channel" in line:
            parts = m.group("path").split("/")
            if parts[0] == "NET" and len(parts) > 1:
                key = f"NET/{parts[1]}"
                nets_via[parts[1]] += 1
                if "GDRDMA" in parts[2:]:
                    gdr += 1
            else:
                key = parts[0]
            if paths[key] == 0 and len(evidence) < 8:
                evidence.append(line.strip()[-200:])
            paths[key] += 1
            continue
        m = _USING_NETWORK.search(line) or _ASSIGNED.search(line)
        if m:
            using = m.group("name")
            if len(evidence) < 8:
                evidence.append(line.strip()[-200:])
            continue
        m = _NET_DEVICES.search(line)
        if m and devices is None and "No device" not in line:
            devices = m.group("name")
            if len(evidence) < 8:
                evidence.append(line.strip()[-200:])
    if nets_via:
        # A socket path anywhere is a fallback, whatever else carried traffic.
        network = "Socket" if "Socket" in nets_via else nets_via.most_common(1)[0][0]
    else:
        network = using or (devices if not paths else None)
    return Transport(kind=_kind(network, paths), network=network, paths=dict(paths), gdr=gdr,
                     evidence=tuple(evidence))


def merge_transports(parts: Sequence[Transport]) -> Transport:
    """One transport for the group: counts add up; any rank on sockets makes it ``socket``."""
    known = [p for p in parts if p.kind != "unknown"]
    if not known:
        return Transport()
    if all(p.kind == "gloo" for p in known):
        return known[0]
    paths: Counter[str] = Counter()
    for p in known:
        paths.update(p.paths)
    networks = [p.network for p in known if p.network]
    if "Socket" in networks:
        network: str | None = "Socket"
    elif networks:
        network = Counter(networks).most_common(1)[0][0]
    else:
        network = None
    evidence: list[str] = []
    for p in known:
        evidence += [e for e in p.evidence if e not in evidence][: max(0, 8 - len(evidence))]
    return Transport(kind=_kind(network, paths), network=network, paths=dict(paths),
                     gdr=sum(p.gdr for p in known), evidence=tuple(evidence))


GLOO_TRANSPORT = Transport(kind="gloo", network="gloo/TCP", paths={"gloo/TCP": 1})


# --- settings ------------------------------------------------------------------------------------


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


# --- judgement (pure) ----------------------------------------------------------------------------


def bus_factor(op: str, n: int) -> float:
    """nccl-tests' bus bandwidth factors: all-reduce 2(n-1)/n, all-gather (n-1)/n."""
    if n <= 1:
        return 0.0
    return 2.0 * (n - 1) / n if op == "all_reduce" else (n - 1) / n


def op_table(op: str, per_rank: Sequence[Sequence[Mapping[str, Any]]]) -> list[dict[str, Any]]:
    """Per size, from every rank's rows (``bytes``, ``times_s``, ``wrong``): p50/p95 of the
    slowest rank per iteration, algbw from the slowest rank's mean, busbw, wrong values."""
    n = len(per_rank)
    rows = []
    for k, first in enumerate(per_rank[0]):
        series = [r[k]["times_s"] for r in per_rank]
        slowest = [max(ts) for ts in zip(*series, strict=True)]
        mean = max(statistics.fmean(ts) for ts in series)
        algbw = first["bytes"] / mean / 1e9 if mean > 0 else 0.0
        rows.append({
            "bytes": int(first["bytes"]),
            "p50_s": percentile(slowest, 50),
            "p95_s": percentile(slowest, 95),
            "time_avg_s": mean,
            "algbw_gb_per_s": algbw,
            "busbw_gb_per_s": algbw * bus_factor(op, n),
            "wrong": sum(int(r[k]["wrong"]) for r in per_rank),
        })
    return rows


def stragglers(per_rank: Sequence[Sequence[Mapping[str, Any]]], min_gap_s: float) -> list[int]:
    """Ranks that arrive late at the collectives: the others wait for them inside the
    collective, so their own time inside it is much shorter than the group's median. A rank
    is named when it is the clear minimum (< half the median, and ``min_gap_s`` below it) at
    a majority of sizes."""
    n = len(per_rank)
    if n < 3 or not per_rank[0]:
        return []
    votes: Counter[int] = Counter()
    sizes = len(per_rank[0])
    for k in range(sizes):
        means = [statistics.fmean(r[k]["times_s"]) for r in per_rank]
        med = statistics.median(means)
        low = min(range(n), key=lambda i: means[i])
        others = sorted(means)[1]
        if means[low] < 0.5 * med and med - means[low] > min_gap_s and \
                means[low] < 0.5 * others:
            votes[low] += 1
    return sorted(r for r, v in votes.items() if v * 2 > sizes)


@dataclass(frozen=True)
class Finding:
    status: Status
    reason: str
    message: str
    op: str | None = None
    ranks: tuple[int, ...] = ()

    def to_dict(self, nodes_of: Mapping[int, str] | None = None) -> dict[str, Any]:
        d: dict[str, Any] = {"status": self.status.value, "reason": self.reason,
                             "message": self.message, "op": self.op, "ranks": list(self.ranks)}
        if nodes_of is not None:
            d["nodes"] = sorted({nodes_of[r] for r in self.ranks if r in nodes_of})
        return d


def judge(tables: Mapping[str, Sequence[Mapping[str, Any]]], world_size: int,
          settings: ProbeSettings, *, wrong_sources: Sequence[int] = (),
          slow_ranks: Sequence[int] = (), transport: Transport | None = None,
          multi_node: bool = True) -> list[Finding]:
    """Findings for the group: wrong data, busbw below the floor (or within the warning band),
    small-message p95 above the limit, and a socket fallback where RDMA was expected."""
    out: list[Finding] = []
    for op, rows in tables.items():
        wrong = sum(r["wrong"] for r in rows)
        if wrong:
            first = next(r["bytes"] for r in rows if r["wrong"])
            who = (f"; the data of rank(s) {', '.join(map(str, wrong_sources))} arrives wrong"
                   if wrong_sources else "")
            out.append(Finding(Status.FAILED, "FabricWrongData",
                               f"{op}: {wrong} wrong values (first at {first} B){who}", op,
                               tuple(wrong_sources)))
        if not rows:
            continue
        floor = settings.busbw_floor_gb_per_s
        if floor and world_size > 1:
            large = [r for r in rows if r["bytes"] >= settings.large_message_min_bytes] or \
                [rows[-1]]
            low = min(large, key=lambda r: r["busbw_gb_per_s"])
            bw = low["busbw_gb_per_s"]
            if bw < floor:
                out.append(Finding(Status.FAILED, "FabricBusBwLow",
                                   f"{op}: busbw {bw:.4g} GB/s at {low['bytes']} B is below the "
                                   f"floor {floor:g} GB/s", op, tuple(slow_ranks)))
            elif bw < floor * (1.0 + settings.warning_band):
                out.append(Finding(Status.DEGRADED, "FabricBusBwLow",
                                   f"{op}: busbw {bw:.4g} GB/s at {low['bytes']} B is within "
                                   f"{settings.warning_band:g} of the floor {floor:g} GB/s",
                                   op, tuple(slow_ranks)))
        limit = settings.small_p95_latency_limit_s
        small = [r for r in rows if r["bytes"] <= settings.small_message_max_bytes]
        if limit and small:
            slow = max(small, key=lambda r: r["p95_s"])
            if slow["p95_s"] > limit:
                out.append(Finding(Status.FAILED, "FabricLatencyHigh",
                                   f"{op}: p95 latency {slow['p95_s'] * 1e6:.1f} us at "
                                   f"{slow['bytes']} B is above the limit {limit * 1e6:.1f} us",
                                   op, tuple(slow_ranks)))
    if (transport is not None and settings.expect_transport == "rdma" and multi_node
            and transport.kind == "socket"):
        out.append(Finding(Status.UNKNOWN, "FabricTransportFallback",
                           "NCCL carried the traffic over sockets (NET/Socket) on a fabric that "
                           "should be RDMA: the numbers measure the wrong path"))
    return out


def verdict_of(findings: Iterable[Finding]) -> str:
    statuses = {f.status for f in findings}
    if Status.FAILED in statuses:
        return "unhealthy"
    if Status.UNKNOWN in statuses:
        return "unknown"
    return "healthy"


VERDICT_EXIT = {"healthy": EXIT_HEALTHY, "unhealthy": EXIT_UNHEALTHY, "unknown": EXIT_UNKNOWN}


def largest(rows: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    return rows[-1] if rows else None


def summarize(result: Mapping[str, Any], node: str | None = None,
              limit: int = TERMINATION_LOG_LIMIT) -> dict[str, Any]:
    """The compact summary for a termination message: verdict, reasons, suspects, the busbw
    at the largest size and the worst small-message p95 per op, the transport; the node
    list is shortened until the JSON fits in ``limit`` bytes."""
    ops: dict[str, Any] = {}
    small_max = (result.get("settings") or {}).get("small_message_max_bytes", 65536)
    for op, data in (result.get("operations") or {}).items():
        rows = data.get("rows") or []
        big = largest(rows)
        small = [r for r in rows if r["bytes"] <= small_max]
        ops[op] = {
            "bytes": big["bytes"] if big else None,
            "busbw_gb_per_s": _round(big["busbw_gb_per_s"]) if big else None,
            "small_p95_s": _round(max(r["p95_s"] for r in small)) if small else None,
            "wrong": sum(r["wrong"] for r in rows),
        }
    s: dict[str, Any] = {
        "schema": RESULT_SCHEMA,
        "kind": SUMMARY_KIND,
        "group": result.get("group"),
        "verdict": result.get("verdict"),
        "reasons": sorted({f["reason"] for f in result.get("findings") or []
                           if f["status"] in ("failed", "unknown", "degraded")}),
        "world_size": result.get("world_size"),
        "node": node,
        "suspect_nodes": result.get("suspect_nodes") or [],
        "ops": ops,
        "limits": {k: (result.get("settings") or {}).get(k)
                   for k in ("busbw_floor_gb_per_s", "small_p95_latency_limit_s")},
        "transport": (result.get("transport") or {}).get("kind"),
        "network": (result.get("transport") or {}).get("network"),
        "finished_at": result.get("finished_at"),
        "nodes": list(result.get("nodes") or []),
    }
    if result.get("error"):
        s["error"] = str(result["error"])[:500]
    if result.get("test_fault"):
        s["test_fault"] = result["test_fault"]
    return termination.fit(s, "nodes", "nodes_truncated", limit)


def parse_summary(text: str | None) -> dict[str, Any] | None:
    """A summary back from a termination message; None if it is not one."""
    return termination.parse(text, SUMMARY_KIND, RESULT_SCHEMA)


def _round(v: Any) -> Any:
    return float(f"{v:.6g}") if isinstance(v, float) and math.isfinite(v) else v


def _rounded(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    return [{k: _round(v) for k, v in r.items()} for r in rows]


# --- NCCL debug capture ----------------------------------------------------------------------------


@dataclass
class NcclLog:
    """Where this process's NCCL INFO lines go, and whether to echo them afterwards."""

    pattern: str | None = None
    echo: bool = False
    owned_dir: str | None = None

    def paths(self) -> list[str]:
        if not self.pattern:
            return []
        host = socket.gethostname().split(".")[0]
        exact = self.pattern.replace("%h", host).replace("%p", str(os.getpid()))
        if os.path.exists(exact):
            return [exact]
        return sorted(glob.glob(self.pattern.replace("%h", "*").replace("%p",
                                                                         str(os.getpid()))))

    def lines(self) -> list[str]:
        out: list[str] = []
        for p in self.paths():
            with contextlib.suppress(OSError), open(p, encoding="utf-8", errors="replace") as fh:
                out += fh.readlines()
        return out


def capture_nccl_debug(environ: dict[str, str], tmp: str | None = None) -> NcclLog:
    """Make NCCL write its INIT/NET INFO lines to a file this process can read back (must run
    before NCCL initialises: it reads the environment once)."""
    user_level = environ.get("NCCL_DEBUG")
    if environ.get("NCCL_DEBUG_FILE"):
        if (user_level or "").upper() not in ("INFO", "TRACE"):
            environ["NCCL_DEBUG"] = "INFO"
        return NcclLog(pattern=environ["NCCL_DEBUG_FILE"], echo=False)
    directory = tempfile.mkdtemp(prefix="gpu-monitor-nccl-", dir=tmp)
    if (user_level or "").upper() not in ("INFO", "TRACE"):
        environ["NCCL_DEBUG"] = "INFO"
    subsys = environ.get("NCCL_DEBUG_SUBSYS")
    if not subsys:
        environ["NCCL_DEBUG_SUBSYS"] = "INIT,NET"
    elif not subsys.startswith("^") and "ALL" not in subsys.upper():
        have = {s.strip().upper() for s in subsys.split(",")}
        environ["NCCL_DEBUG_SUBSYS"] = ",".join([subsys, *sorted({"INIT", "NET"} - have)])
    environ["NCCL_DEBUG_FILE"] = os.path.join(directory, "nccl.%h.%p.log")
    return NcclLog(pattern=environ["NCCL_DEBUG_FILE"], echo=bool(user_level),
                   owned_dir=directory)


# --- one rank (torch from here on; imported lazily) ------------------------------------------------


class ProbeRank:
    """This process's side of the sweep. The benchmark drives it directly, so it measures
    exactly what the probe does."""

    def __init__(self, device: Any, rank: int, world_size: int, top_bytes: int,
                 faults: Sequence[TestFault] = ()):
        import torch

        self.torch_device = device
        self.rank, self.n = rank, world_size
        self.weights = [(r % _WEIGHTS) + 1 for r in range(world_size)]
        self.total = float(sum(self.weights))
        modulus = max(1, min(251, (_EXACT - 1) // int(self.total)))
        top = max(1, top_bytes // 4)
        index = torch.int32 if top < (1 << 31) else torch.int64  # half the temporary
        self.base = (torch.arange(top, dtype=index, device=device)
                     .remainder_(modulus).add_(1).to(torch.float32))
        self.buf = torch.zeros(top, dtype=torch.float32, device=device)
        self.inp = torch.zeros(max(1, top // max(1, world_size)), dtype=torch.float32,
                               device=device)
        self.flag = torch.zeros(1, dtype=torch.float32, device=device)
        self.delay_s = sum(f.delay_s for f in faults if f.kind == "slow" and f.rank == rank)
        self.corrupt = any(f.kind == "corrupt" and f.rank == rank for f in faults)
        self.is_cuda = getattr(device, "type", "cpu") == "cuda"
        self.wrong_sources: set[int] = set()

    # -- time and the seam ----------------------------------------------------------------------

    def now(self) -> float:
        if self.is_cuda:
            import torch

            torch.cuda.synchronize(self.torch_device)
        return time.perf_counter()

    def _contribution(self, out: Any, count: int) -> Any:
        import torch

        t = out[:count]
        torch.mul(self.base[:count], self.weights[self.rank], out=t)
        if self.corrupt:  # test-only: this rank's data leaves it off by one
            t[0] += 1.0
        return t

    # -- the collectives --------------------------------------------------------------------------

    @staticmethod
    def counts(op: str, size: int, n: int) -> tuple[int, int]:
        """(elements per rank, bytes the size stands for) of ``op`` at ``size`` bytes."""
        if op == "all_gather":
            per = max(1, size // (4 * n))
            return per, per * 4 * n
        count = max(1, size // 4)
        return count, count * 4

    def _run(self, op: str, count: int) -> None:
        import torch.distributed as dist

        if op == "all_reduce":
            dist.all_reduce(self.buf[:count])
        else:
            gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
            gather(self.buf[: count * self.n], self.inp[:count])

    def verify(self, op: str, count: int) -> int:
        """One collective on the pattern; the number of wrong values this rank received (and,
        for all-gather, whose chunk they came in)."""
        import torch.distributed as dist

        if op == "all_reduce":
            self._contribution(self.buf, count)
            self._run(op, count)
            wrong = 0
            for start in range(0, count, _CHUNK):
                stop = min(count, start + _CHUNK)
                want = self.base[start:stop] * self.total
                wrong += int((self.buf[start:stop] != want).sum())
        else:
            self._contribution(self.inp, count)
            self._run(op, count)
            wrong = 0
            for j in range(self.n):
                got = self.buf[j * count:(j + 1) * count]
                bad = 0
                for start in range(0, count, _CHUNK):
                    stop = min(count, start + _CHUNK)
                    bad += int((got[start:stop] != self.base[start:stop] * self.weights[j])
                               .sum())
                if bad:
                    self.wrong_sources.add(j)
                wrong += bad
        self.flag.fill_(float(wrong))
        dist.all_reduce(self.flag, op=dist.ReduceOp.MAX)  # keeps the ranks in step
        return wrong

    def timed(self, op: str, count: int, warmup: int, iters: int) -> list[float]:
        """Seconds per collective, each timed on its own (zeros: nothing can overflow)."""
        self.buf[: count * (self.n if op == "all_gather" else 1)].zero_()
        if op == "all_gather":
            self.inp[:count].zero_()
        for _ in range(warmup):
            if self.delay_s:
                time.sleep(self.delay_s)
            self._run(op, count)
        times = []
        for _ in range(iters):
            if self.delay_s:  # test-only: arrive late at every collective
                time.sleep(self.delay_s)
            t0 = self.now()
            self._run(op, count)
            times.append(self.now() - t0)
        return times

    def sweep(self, op: str, sizes: Sequence[int], warmup: int, iters: int
              ) -> list[dict[str, Any]]:
        rows = []
        for size in sizes:
            count, nbytes = self.counts(op, size, self.n)
            wrong = self.verify(op, count)
            times = self.timed(op, count, warmup, iters)
            wrong += self.verify(op, count)
            rows.append({"bytes": nbytes, "times_s": times, "wrong": wrong})
        return rows


def _identity(env: LaunchEnv, device: Any) -> dict[str, Any]:
    ident: dict[str, Any] = {"rank": env.rank, "local_rank": env.local_rank, "node": env.node,
                             "pod": env.pod, "host": socket.gethostname(), "pid": os.getpid(),
                             "device": str(device), "gpu_uuid": None, "gpu_name": None}
    if getattr(device, "type", "cpu") == "cuda":
        import torch

        from gpu_monitor.workers.device import normalize_uuid

        props = torch.cuda.get_device_properties(device)
        ident["gpu_uuid"] = normalize_uuid(props.uuid)
        ident["gpu_name"] = props.name
    return ident


def _pick_device(kind: str, env: LaunchEnv) -> Any:
    import torch

    if kind == "auto":
        kind = "cuda" if torch.cuda.is_available() else "cpu"
    if kind == "cuda":
        if not torch.cuda.is_available():
            raise ProbeError("--device cuda, but CUDA is not available in this process")
        index = env.local_rank % max(1, torch.cuda.device_count())
        torch.cuda.set_device(index)
        return torch.device("cuda", index)
    torch.set_num_threads(1)
    return torch.device("cpu")


def _load_profile(ref: str | None, device: Any) -> Any:
    from gpu_monitor.profiles import load_profile, match_profile

    if ref and ref != "auto":
        return load_profile(ref)
    if getattr(device, "type", "cpu") == "cuda":
        import torch

        found = match_profile([torch.cuda.get_device_name(device)])
        if found is not None:
            return found
    return load_profile("cpu-only")


def run(env: LaunchEnv, *, device_kind: str = "auto", profile_ref: str | None = None,
        overrides: Mapping[str, Any] | None = None, group: str | None = None,
        timeout_s: float = 600.0, faults: Sequence[TestFault] = (),
        fault_text: str | None = None) -> dict[str, Any]:
    """Run this rank's part; every rank returns the group result (rank 0 computes it and
    broadcasts it, so each node can report it)."""
    from datetime import timedelta

    import torch.distributed as dist

    started = utcnow()
    device = _pick_device(device_kind, env)
    backend = "nccl" if device.type == "cuda" else "gloo"
    nccl_log = capture_nccl_debug(os.environ) if backend == "nccl" else NcclLog()
    kwargs: dict[str, Any] = {}
    if backend == "nccl":
        kwargs["device_id"] = device  # eager init: a broken fabric fails here, not mid-sweep
    dist.init_process_group(backend, init_method=f"tcp://{_host_port(env)}", rank=env.rank,
                            world_size=env.world_size, timeout=timedelta(seconds=timeout_s),
                            **kwargs)
    try:
        ident = _identity(env, device)
        identities: list[Any] = [None] * env.world_size
        dist.all_gather_object(identities, ident)
        nodes_in_rank_order = [i["node"] for i in identities]
        multi_node = len(set(nodes_in_rank_order)) > 1
        box: list[Any] = [None]
        if env.rank == 0:
            try:
                profile = _load_profile(profile_ref, device)
                box[0] = resolve_settings(profile, device_type=device.type,
                                          overrides=overrides or {},
                                          multi_node=multi_node).to_dict()
            except Exception as exc:  # noqa: BLE001 - every rank must learn it, not hang
                box[0] = {"error": str(exc)}
        dist.broadcast_object_list(box, src=0)
        if "error" in box[0]:
            raise ProbeError(f"settings: {box[0]['error']}")
        settings = ProbeSettings.from_dict(box[0])
        me = ProbeRank(device, env.rank, env.world_size, max(settings.sizes), faults)
        mine: dict[str, Any] = {"rows": {}}
        for op in settings.ops:
            mine["rows"][op] = me.sweep(op, settings.sizes, settings.warmup,
                                        settings.iterations)
        mine["wrong_sources"] = sorted(me.wrong_sources)
        transport = (parse_nccl_debug(nccl_log.lines()) if backend == "nccl"
                     else GLOO_TRANSPORT)
        mine["transport"] = asdict(transport)
        gathered: list[Any] = [None] * env.world_size
        dist.all_gather_object(gathered, mine)
        out: list[Any] = [None]
        if env.rank == 0:
            out[0] = assemble(gathered, identities, settings, backend=backend,
                              device_type=device.type, group=group, started=started,
                              fault_text=fault_text, multi_node=multi_node)
        dist.broadcast_object_list(out, src=0)
        result = out[0]
    finally:
        with contextlib.suppress(Exception):
            dist.destroy_process_group()
        if nccl_log.echo:
            sys.stderr.writelines(nccl_log.lines())
    return result


def _host_port(env: LaunchEnv) -> str:
    host = env.master_addr
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{host}:{env.master_port}"


def assemble(gathered: Sequence[Mapping[str, Any]], identities: Sequence[Mapping[str, Any]],
             settings: ProbeSettings, *, backend: str, device_type: str, group: str | None,
             started: Any, fault_text: str | None, multi_node: bool) -> dict[str, Any]:
    """The group result (pure: from what every rank measured)."""
    n = len(gathered)
    tables = {op: op_table(op, [g["rows"][op] for g in gathered]) for op in settings.ops}
    wrong_sources = sorted({int(r) for g in gathered for r in g.get("wrong_sources") or []})
    slow: set[int] = set()
    straggle_by_op = {}
    for op in settings.ops:
        found = stragglers([g["rows"][op] for g in gathered], settings.straggler_min_s)
        straggle_by_op[op] = found
        slow.update(found)
    transport = merge_transports([Transport(**{**t, "evidence": tuple(t.get("evidence") or ()),
                                               "paths": dict(t.get("paths") or {})})
                                  for t in (g["transport"] for g in gathered)])
    findings = judge(tables, n, settings, wrong_sources=wrong_sources, slow_ranks=sorted(slow),
                     transport=transport, multi_node=multi_node)
    nodes_of = {int(i["rank"]): str(i["node"]) for i in identities}
    verdict = verdict_of(findings)
    suspects = sorted({nodes_of[r] for f in findings if f.status is Status.FAILED
                       for r in f.ranks if r in nodes_of})
    return {
        "schema": RESULT_SCHEMA,
        "kind": RESULT_KIND,
        "tool_version": _version(),
        "group": group,
        "started_at": iso(started),
        "finished_at": iso(utcnow()),
        "backend": backend,
        "device_type": device_type,
        "world_size": n,
        "nodes": list(dict.fromkeys(nodes_of[r] for r in sorted(nodes_of))),
        "ranks": [dict(i) for i in sorted(identities, key=lambda i: i["rank"])],
        "settings": settings.to_dict(),
        "transport": {**transport.to_dict(), "expected": settings.expect_transport},
        "operations": {op: {"bus_factor": bus_factor(op, n), "rows": _rounded(rows),
                            "stragglers": straggle_by_op.get(op, [])}
                       for op, rows in tables.items()},
        "wrong_sources": wrong_sources,
        "stragglers": sorted(slow),
        "findings": [f.to_dict(nodes_of) for f in findings],
        "suspect_nodes": suspects,
        "verdict": verdict,
        "test_fault": fault_text or None,
    }


def _version() -> str:
    from gpu_monitor import __version__

    return __version__


# --- output ----------------------------------------------------------------------------------------


def render_table(result: Mapping[str, Any]) -> str:
    lines = [f"fabric probe {result.get('group') or ''}: {result['world_size']} ranks on "
             f"{len(result['nodes'])} node(s), {result['backend']}, transport "
             f"{result['transport']['kind']} ({result['transport'].get('network') or '-'})"]
    for op, data in result["operations"].items():
        lines.append(f"{op} (busbw = algbw x {data['bus_factor']:.3g})")
        lines.append(f"  {'bytes':>12} {'p50 us':>10} {'p95 us':>10} {'algbw GB/s':>11} "
                     f"{'busbw GB/s':>11} {'wrong':>6}")
        for r in data["rows"]:
            lines.append(f"  {r['bytes']:>12} {r['p50_s'] * 1e6:>10.1f} {r['p95_s'] * 1e6:>10.1f} "
                         f"{r['algbw_gb_per_s']:>11.4g} {r['busbw_gb_per_s']:>11.4g} "
                         f"{r['wrong']:>6}")
    for f in result["findings"]:
        lines.append(f"{f['status'].upper():<9} {f['reason']:<24} {f['message']}")
    lines.append(f"verdict: {result['verdict']}")
    return "\n".join(lines)


def write_termination_log(path: str, summary: Mapping[str, Any]) -> None:
    data = json.dumps(summary, separators=(",", ":"))
    try:
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(data[:TERMINATION_LOG_LIMIT])
    except OSError as exc:
        log.warning("cannot write the termination message to %s: %s", path, exc)


# --- the command -------------------------------------------------------------------------------------


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--profile", metavar="NAME|FILE", default="auto",
                   help="expectations profile (fabric.* floors, nccl.* sweep); auto: by the GPU "
                        "name, cpu-only without GPUs")
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto",
                   help="cuda (NCCL) or cpu (gloo); auto: cuda when available")
    p.add_argument("--group", metavar="NAME", default=None,
                   help="group label in the result (default $GPU_MONITOR_FABRIC_GROUP)")
    p.add_argument("--min-bytes", type=int, default=None, help="smallest message (nccl."
                                                              "sweep_min_bytes)")
    p.add_argument("--max-bytes", type=int, default=None,
                   help="largest message (nccl.sweep_max_bytes; capped at 16 MiB on CPU)")
    p.add_argument("--factor", type=int, default=None, help="size step (nccl.sweep_factor)")
    p.add_argument("--iterations", type=int, default=None, help="timed iterations per size")
    p.add_argument("--warmup", type=int, default=None, help="warm-up iterations per size")
    p.add_argument("--busbw-floor", type=float, default=None, metavar="GB/S",
                   help="large-message busbw floor (fabric.busbw_floor_gb_per_s)")
    p.add_argument("--latency-limit", type=float, default=None, metavar="SECONDS",
                   help="small-message p95 limit (fabric.small_p95_latency_limit_s)")
    p.add_argument("--ops", default=None, metavar="A,B",
                   help=f"operations to sweep (default {','.join(OPS)})")
    p.add_argument("--expect-transport", choices=("auto", "rdma", "any"), default="auto",
                   help="rdma: traffic over sockets makes the verdict unknown; auto: rdma when "
                        "the profile lists RDMA ports and the group spans nodes")
    p.add_argument("--timeout-s", type=float, default=600.0,
                   help="collective / rendezvous timeout")
    p.add_argument("--output", "-o", choices=("table", "json"), default="table")
    p.add_argument("--result-file", metavar="FILE", help="also write the group result here "
                                                        "(rank 0)")
    p.add_argument("--termination-log", metavar="FILE",
                   help="write a compact summary here (each node's local rank 0), e.g. "
                        "/dev/termination-log")
    p.add_argument("--zero-exit", action="store_true",
                   help="exit 0 whenever a result was produced (the verdict is in it): for Jobs")


def cmd_fabric_probe(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        env = launch_env(os.environ)
        fault_text = os.environ.get(TEST_FAULT_ENV) or None
        faults = parse_test_faults(fault_text)
    except ProbeError as exc:
        print(f"gpu-monitor fabric-probe: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if faults:
        log.warning("%s=%s is set: this run injects faults on purpose (test use only)",
                    TEST_FAULT_ENV, fault_text)
    overrides = {
        "sweep_min_bytes": args.min_bytes, "sweep_max_bytes": args.max_bytes,
        "sweep_factor": args.factor, "iterations": args.iterations,
        "warmup_iterations": args.warmup, "busbw_floor_gb_per_s": args.busbw_floor,
        "small_p95_latency_limit_s": args.latency_limit,
        "expect_transport": args.expect_transport,
        "ops": [o.strip() for o in args.ops.split(",") if o.strip()] if args.ops else None,
    }
    group = args.group or os.environ.get("GPU_MONITOR_FABRIC_GROUP")
    try:
        result = run(env, device_kind=args.device, profile_ref=args.profile,
                     overrides=overrides, group=group, timeout_s=args.timeout_s, faults=faults,
                     fault_text=fault_text)
    except ProbeError as exc:
        print(f"gpu-monitor fabric-probe: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except Exception as exc:  # noqa: BLE001 - a broken fabric surfaces as any error
        message = f"{type(exc).__name__}: {exc}"[:1000]
        print(f"gpu-monitor fabric-probe: rank {env.rank}: {message}", file=sys.stderr)
        if args.termination_log and env.local_rank == 0:
            write_termination_log(args.termination_log, {
                "schema": RESULT_SCHEMA, "kind": SUMMARY_KIND, "group": group,
                "verdict": "unknown", "reasons": ["FabricProbeError"], "node": env.node,
                "rank": env.rank, "error": message, "finished_at": iso(utcnow())})
        return EXIT_UNKNOWN
    if env.local_rank == 0 and args.termination_log:
        write_termination_log(args.termination_log, summarize(result, env.node))
    if env.rank == 0:
        if args.result_file:
            with open(args.result_file, "w", encoding="utf-8") as fh:
                json.dump(result, fh, indent=2)
        if args.output == "json":
            print(json.dumps(result, indent=2))
        else:
            print(render_table(result))
    return EXIT_HEALTHY if args.zero_exit else VERDICT_EXIT[result["verdict"]]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gpu-monitor fabric-probe",
                                description="one rank of a multi-node all-reduce/all-gather "
                                            "sweep (run under torchrun or an Indexed Job)")
    add_arguments(p)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    return cmd_fabric_probe(build_parser().parse_args(argv))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
