"""What rdma_ports reads and writes: the ports in sysfs, found by a full walk now and then and
polled four files at a time in between, and its outages and state in the store.

Apart from the check (checks/rdma_ports.py, which judges) so that the judgement reads whole. A
full ``SysfsReader.infiniband_ports()`` walk runs to discover ports (every ``REDISCOVER_S``, every
``MISSING_REDISCOVER_S`` while an expected port is missing) and whenever a fast read meets
anything unusual, so its error reporting stays the one source of ``SysfsReadError`` values.
Store writes never break a poll: a failure is logged and the poll goes on.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

from gpu_monitor.check import Context
from gpu_monitor.hw.sysfs_values import IbPort

log = logging.getLogger("checks.rdma_ports")

KV_NAMESPACE = "rdma_ports"
REDISCOVER_S = 60.0  # full sysfs walk at most this often in steady state
MISSING_REDISCOVER_S = 10.0  # ... and this often while an expected port is missing

PortKey = tuple[str, int]


def to_epoch(ts: datetime) -> float:
    return ts.timestamp()


def from_epoch(epoch: float) -> datetime:
    return datetime.fromtimestamp(epoch, tz=timezone.utc)


class Recorder:
    """Store writes that never break a poll; disabled for one-shot runs (read-only)."""

    def __init__(self, ctx: Context, enabled: bool):
        self.store = ctx.store if enabled else None

    def _call(self, what: str, fn: Any, *args: Any) -> None:
        if self.store is None:
            return
        try:
            fn(*args)
        except Exception as exc:  # noqa: BLE001 - history is best effort, the poll goes on
            log.warning("rdma_ports: cannot %s in the state store: %s", what, exc)

    def start(self, key: PortKey, at: float) -> None:
        if self.store is not None:
            self._call("open an outage", self.store.port_down_start, key[0], key[1], from_epoch(at))

    def end(self, key: PortKey, at: float) -> None:
        if self.store is not None:
            self._call("close an outage", self.store.port_down_end, key[0], key[1], from_epoch(at))

    def kv(self, key: str, value: Any) -> None:
        if self.store is not None:
            self._call("save state", self.store.set_kv, KV_NAMESPACE, key, value)


class PortReader:
    """Discovery through ``SysfsReader.infiniband_ports``; steady-state polls through
    ``SysfsReader.poll_ib_port`` (the same parsers, four files per port)."""

    def __init__(self) -> None:
        self._known: dict[PortKey, IbPort] = {}
        self._discovered_at: float | None = None

    def _discover(self, ctx: Context, now: float) -> dict[PortKey, IbPort]:
        ports = ctx.host.sysfs.infiniband_ports()
        self._known = {(p.device, p.port): p for p in ports}
        self._discovered_at = now
        return dict(self._known)

    def read(self, ctx: Context, now: float, expected: Sequence[PortKey]) -> dict[PortKey, IbPort]:
        age = None if self._discovered_at is None else now - self._discovered_at
        if (age is None or age >= REDISCOVER_S or age < 0
                or (age >= MISSING_REDISCOVER_S and any(k not in self._known for k in expected))):
            return self._discover(ctx, now)
        out: dict[PortKey, IbPort] = {}
        for key, base in self._known.items():
            port = ctx.host.sysfs.poll_ib_port(base)
            if port.errors:
                # Vanished, unreadable or junk: the full walk says which, with every error.
                return self._discover(ctx, now)
            out[key] = port
        return out
