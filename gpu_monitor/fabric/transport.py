"""What carried a probe's traffic: NCCL's own INFO lines, captured and read back.

Why apart: a fabric probe whose traffic fell back to sockets measures the wrong path, and only
NCCL says which path it took. Before NCCL starts, the probe sets ``NCCL_DEBUG=INFO``,
``NCCL_DEBUG_SUBSYS=INIT,NET`` and ``NCCL_DEBUG_FILE`` (unless the user set their own file),
then parses the lines (``... via NET/IB/0/GDRDMA``, ``via NET/Socket/0``, ``via P2P/IPC``,
``via SHM/direct/direct``, ``Using network IB``) to record what carried the traffic. On a
fabric that should be RDMA (the profile lists RDMA ports, or ``--expect-transport rdma``) and
spans nodes, traffic over sockets makes the verdict ``unknown`` (``FabricTransportFallback``,
probe_result.py). The parsing is pure and tested on real lines; only the capture touches the
environment and the files NCCL writes.
"""

from __future__ import annotations

import contextlib
import glob
import os
import re
import socket
import tempfile
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

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

