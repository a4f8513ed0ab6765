"""rdma_ports: how long each RDMA port was down in a sliding window, judged against NCCL.

A training job does not care how often a port flapped; it cares whether the port was gone long
enough for NCCL to give up. NCCL's InfiniBand transport retries a lost packet
``NCCL_IB_RETRY_CNT`` times with a verbs timeout of 4.096 µs × 2^``NCCL_IB_TIMEOUT`` each (the
defaults 7 and 18 give ≈ 7.5 s); a port down for longer has killed any job using it. So the
check records every down interval in the state store (persisted: a restart mid-outage continues
the same interval) and judges, per port:

- one interval longer than the NCCL tolerance → ``failed`` ``PortDownExceededNcclTimeout``
  ("would have killed an NCCL job"), until that interval leaves the window;
- cumulative downtime in the window (default 600 s) above the budget (default 30 s) → ``failed``
  ``PortDowntimeExceeded``; above ``downtime_warning_fraction`` (default 0.5) of it →
  ``degraded`` ``PortDowntimeHigh``;
- down right now, still under the tolerance → ``degraded`` ``PortDown``;
- an expected port (profile ``rdma.ports``) absent → ``failed`` ``PortMissing``; a port up at
  a rate below ``rdma.rate_gbit_per_s`` → ``degraded`` ``PortRateDegraded``;
- a file it judges (``state``, ``phys_state``, ``rate``, ``counters/link_downed``) that cannot
  be read or holds no value of its kind (``banana``, ``-400 Gb/sec``, a directory) →
  ``unknown`` ``SysfsReadError`` naming the file, unless what could be read fails the port.

A flap shorter than the poll period is invisible in ``state`` but increments the port's
``link_downed`` counter; an increase not matched by a down transition we saw is recorded as an
outage of its own, credited with the time since the previous poll (at most one poll period: the
longest it can have lasted). A counter that goes backwards (driver reload, reboot, reset by
``perfquery -R``) rebases silently. docs/checks-notes/rdma_ports.md explains every number.

Cost: the daemon polls every second, so steady-state polls read four small files per port
(state, phys_state, rate, counters/link_downed) and write nothing to the store; the full
``SysfsReader.infiniband_ports()`` walk (every counter file) runs only to discover ports (every
60 s, or when a port vanishes) and when a fast read meets anything unusual, so its error
reporting stays the one source of ``SysfsReadError`` values. That reading, and the store
writes that never break a poll, are checks/_rdma_io.py.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from checks._builtin import BuiltinCheck
from checks._downtime import (
    Track,
    crossing_at,
    intervals_over,
    longest_interval,
    nccl_tolerance_s,
    port_is_down,
    window_stats,
)
from checks._rdma_io import (
    KV_NAMESPACE,
    PortKey,
    PortReader,
    Recorder,
    from_epoch,
    to_epoch,
)
from gpu_monitor.check import ClearTracker, Context, Setting
from gpu_monitor.hw.sysfs_values import IbPort
from gpu_monitor.metric_families import (
    CheckMetric,
    LatestResult,
    MetricsHistory,
    Sample,
    state_set,
)
from gpu_monitor.model import Action, Kind, Result, Status, ib_target
from gpu_monitor.profiles.schema import SECONDS, SECONDS0, Int, Num

log = logging.getLogger(__name__)

LINK_DOWNED_MAX = 255  # LinkDownedCounter is an 8-bit PMA counter that saturates
WATCH_MARK_S = 60.0  # how often the daemon refreshes its "I was watching" marker
# The files of ports/<n>/ this check judges: one it cannot read makes the port unknown.
JUDGED_FILES = ("state", "phys_state", "rate", "link_downed")

@dataclass(frozen=True)
class Settings:
    window_s: float
    budget_s: float
    warning_fraction: float
    ib_timeout: int
    retry_cnt: int
    interval_s: float
    boot_grace_s: float
    expected: tuple[PortKey, ...]
    rate_gbit: float | None

    @property
    def tolerance_s(self) -> float:
        return nccl_tolerance_s(self.ib_timeout, self.retry_cnt)

    @property
    def warning_s(self) -> float:
        return self.budget_s * self.warning_fraction

    @classmethod
    def from_ctx(cls, ctx: Context, name: str, interval: float) -> Settings:
        expected: list[PortKey] = []
        for item in ctx.profile.get("rdma.ports") or ():
            dev, _, port = str(item).rpartition(":")
            expected.append((dev, int(port)))
        rate = ctx.profile.get("rdma.rate_gbit_per_s")
        return cls(
            window_s=float(ctx.setting(name, "window_s")),
            budget_s=float(ctx.setting(name, "downtime_budget_s")),
            warning_fraction=float(ctx.setting(name, "downtime_warning_fraction")),
            ib_timeout=int(ctx.setting(name, "nccl_ib_timeout")),
            retry_cnt=int(ctx.setting(name, "nccl_ib_retry_cnt")),
            interval_s=float(ctx.setting(name, "interval_s", interval) or interval),
            boot_grace_s=float(ctx.setting(name, "boot_grace_s")),
            expected=tuple(expected),
            rate_gbit=None if rate is None else float(rate),
        )


# --- metrics ------------------------------------------------------------------------------------

#: The ``state`` label of ``gpu_monitor_rdma_port_state`` (a port in any other state is unknown).
PORT_STATES = ("active", "down", "init", "armed", "active_defer", "unknown")


def _port_results(results: Sequence[LatestResult]) -> dict[PortKey, LatestResult]:
    out: dict[PortKey, LatestResult] = {}
    for r in results:
        if r.target.startswith("ib:"):
            _, dev, port = r.target.split(":")
            out[(dev, int(port))] = r
    return out


def _known_ports(results: Sequence[LatestResult], history: MetricsHistory) -> list[PortKey]:
    """Every port with a result now or with history in the store (a port that vanished still
    has its counters)."""
    return sorted(set(history.known_ports()) | set(_port_results(results)))


def port_down_samples(results: Sequence[LatestResult], history: MetricsHistory
                      ) -> Iterable[Sample]:
    """Cumulative down seconds per port, from the store's down intervals up to the scrape (a
    port still down keeps counting between polls)."""
    for dev, port in _known_ports(results, history):
        yield (dev, str(port)), history.port_down_seconds(dev, port)


def port_outage_samples(results: Sequence[LatestResult], history: MetricsHistory
                        ) -> Iterable[Sample]:
    for dev, port in _known_ports(results, history):
        yield (dev, str(port)), float(history.port_outages(dev, port))


def port_state_samples(results: Sequence[LatestResult], history: MetricsHistory
                       ) -> Iterable[Sample]:
    for (dev, port), r in sorted(_port_results(results).items()):
        current = str(r.details.get("state") or "unknown").lower()
        if current not in PORT_STATES:
            current = "unknown"
        for state, value in state_set(current, PORT_STATES):
            yield (dev, str(port), state), value


class RdmaPorts(BuiltinCheck):
    kinds = frozenset({Kind.PASSIVE, Kind.BOOTSTRAP})
    summary = "RDMA port downtime in a sliding window vs a budget and NCCL's IB timeout"
    requires = frozenset({"infiniband"})
    interval = 1.0
    reasons = (
        "PortDown",
        "PortDownExceededNcclTimeout",
        "PortDowntimeExceeded",
        "PortDowntimeHigh",
        "PortMissing",
        "PortRateDegraded",
        "PortNotExpected",
        "SysfsReadError",
        "BootGrace",
    )
    sections = ("rdma",)
    settings = {
        "window_s": Setting(SECONDS, 600, "s", "SPEC-CHECKS (10 min)"),
        "downtime_budget_s": Setting(
            SECONDS, 30, "cumulative down seconds in the window",
            "project (GPUd drop = down ≥ 4 min; one NCCL timeout ≈ 7.5 s)"),
        "downtime_warning_fraction": Setting(
            Num(0, 1, lo_open=True), 0.5,
            "fraction of the budget above which downtime in the window is `degraded`",
            "project"),
        "nccl_ib_timeout": Setting(Int(1, 31), 18,
                                   "verbs timeout exponent t: 4.096 µs × 2^t per try; the "
                                   "config's `nccl.ib_timeout` sets it fleet-wide",
                                   "NCCL default (newer releases 20)"),
        "nccl_ib_retry_cnt": Setting(Int(0, 7), 7, "retries; the config's `nccl.ib_retry_cnt` "
                                     "sets it fleet-wide", "NCCL default"),
        "boot_grace_s": Setting(
            SECONDS0, 300,
            "s after boot during which a down port is `unknown` (`BootGrace`) and not recorded",
            "project: links train after boot"),
    }
    condition = "RDMANetworkError"
    metrics = (
        CheckMetric("gpu_monitor_rdma_port_down_seconds_total", "counter", ("device", "port"),
                    "Cumulative time the RDMA port was observed down.",
                    samples=port_down_samples),
        CheckMetric("gpu_monitor_rdma_port_outages_total", "counter", ("device", "port"),
                    "RDMA port outages observed (including link_downed increments between "
                    "polls).", samples=port_outage_samples),
        CheckMetric("gpu_monitor_rdma_port_state", "gauge", ("device", "port", "state"),
                    "Logical state of each RDMA port (1 = current).", details=("state",),
                    samples=port_state_samples),
    )

    def __init__(self) -> None:
        self._reader = PortReader()
        self._tracks: dict[PortKey, Track] = {}
        self._clear = ClearTracker(self.name)
        self._boot_id: str | None = None
        self._boot_known = False
        self._grace_over = False
        self._watch_marked: float | None = None
        self._watch_since: float | None = None
        self._settings_key: tuple[int, int] | None = None
        self._settings_cache: Settings | None = None
        self._wake_at: float | None = None

    # --- entry points ------------------------------------------------------------------

    def _settings(self, ctx: Context) -> Settings:
        """Settings change only with the config or profile object: read them once per pair."""
        key = (id(ctx.config), id(ctx.profile))
        if self._settings_key != key or self._settings_cache is None:
            self._settings_cache = Settings.from_ctx(ctx, self.name, self.interval)
            self._settings_key = key
        return self._settings_cache

    def poll(self, ctx: Context) -> Sequence[Result]:
        s = self._settings(ctx)
        if ctx.one_shot:
            return self._one_shot(ctx, s)
        now = to_epoch(ctx.clock.now())
        ports = self._reader.read(ctx, now, s.expected)
        in_grace = self._in_grace(ctx, s)
        rec = Recorder(ctx, enabled=True)
        self._mark_watch(ctx, rec, now)
        results = self._evaluate(ctx, s, ports, self._tracks, rec, now, in_grace,
                                 {"window": "history"})
        self._wake_at = self._next_crossing(s, now, in_grace)
        return self._clear.track(ctx, results)

    # Polled this long after an outage's crossing instant, so that the outage is measured as
    # longer than the tolerance, not equal to it.
    CROSSING_MARGIN_S = 0.001

    def _next_crossing(self, s: Settings, now: float, in_grace: bool) -> float | None:
        """The earliest instant an open outage outlasts NCCL's tolerance, known while the port
        is down: the daemon polls then (``wake_at``) rather than up to a poll period later."""
        if in_grace:
            return None
        ahead = [at for tr in self._tracks.values()
                 if (at := crossing_at(tr.open_start(), s.tolerance_s, now)) is not None]
        return min(ahead) + self.CROSSING_MARGIN_S if ahead else None

    def wake_at(self) -> float | None:
        return self._wake_at

    def _one_shot(self, ctx: Context, s: Settings) -> list[Result]:
        """Judge with the daemon's history when it watched this window, else what we see.

        Nothing is written. A port down now is watched (sleeping on the context's clock) until
        it is back or has been down longer than NCCL tolerates, so a provisioning run fails a
        dead port without calling a passing blip a failure.
        """
        now = to_epoch(ctx.clock.now())
        history = self._history_present(ctx, s, now)
        tracks: dict[PortKey, Track] = {}
        rec = Recorder(ctx, enabled=False)
        reader = PortReader()
        in_grace = self._in_grace(ctx, s)
        extra: dict[str, Any] = {"window": "history" if history else "instantaneous"}
        cap = min(s.tolerance_s + 2 * s.interval_s, 0.6 * self.timeout)
        started = now
        while True:
            ports = reader.read(ctx, now, s.expected)
            self._observe_all(ctx, s, ports, tracks, rec, now, in_grace, load=history)
            waiting = [k for k, t in tracks.items()
                       if (start := t.open_start()) is not None and now - start <= s.tolerance_s]
            if in_grace or not waiting or now - started + s.interval_s > cap:
                break
            ctx.clock.sleep(s.interval_s)
            now = to_epoch(ctx.clock.now())
        extra["observed_s"] = round(now - started, 3)
        return self._judge_all(ctx, s, ports, tracks, now, in_grace, extra)

    # --- helpers -----------------------------------------------------------------------

    def _in_grace(self, ctx: Context, s: Settings) -> bool:
        """Links train after boot; uptime only grows, so once past the grace it stays past."""
        if self._grace_over:
            return False
        uptime = ctx.host.procfs.uptime_s()
        if uptime is None or uptime >= s.boot_grace_s:
            self._grace_over = True
            return False
        return True

    def _boot(self, ctx: Context) -> str | None:
        if not self._boot_known:
            self._boot_id = ctx.host.procfs.boot_id()
            self._boot_known = True
        return self._boot_id

    def _mark_watch(self, ctx: Context, rec: Recorder, now: float) -> None:
        if self._watch_since is None:
            self._watch_since = now
        if self._watch_marked is None or now - self._watch_marked >= WATCH_MARK_S:
            rec.kv("watch", {"since": self._watch_since, "last_poll": now,
                             "boot_id": self._boot(ctx)})
            self._watch_marked = now

    def _history_present(self, ctx: Context, s: Settings, now: float) -> bool:
        if ctx.store is None:
            return False
        try:
            mark = ctx.store.get_kv(KV_NAMESPACE, "watch")
        except Exception:  # noqa: BLE001
            return False
        if not isinstance(mark, Mapping) or not isinstance(mark.get("last_poll"), (int, float)):
            return False
        return 0 <= now - float(mark["last_poll"]) <= s.window_s

    def _load(self, ctx: Context, key: PortKey, s: Settings, now: float) -> Track:
        tr = Track()
        if ctx.store is None:
            return tr
        try:
            rows = ctx.store.port_intervals(key[0], key[1], since=from_epoch(now - s.window_s))
            saved = ctx.store.get_kv(KV_NAMESPACE, f"port:{key[0]}:{key[1]}") or {}
        except Exception as exc:  # noqa: BLE001 - start without history rather than not at all
            log.warning("rdma_ports: cannot load history of %s:%s: %s", key[0], key[1], exc)
            return tr
        tr.intervals = [[to_epoch(a), None if b is None else to_epoch(b)] for a, b in rows]
        tr.stored_boot = saved.get("boot_id")
        if tr.stored_boot is None or tr.stored_boot == self._boot(ctx):
            downed = saved.get("link_downed")
            tr.link_downed = downed if isinstance(downed, int) else None
        seen = saved.get("last_down_seen")
        tr.last_down_seen = float(seen) if isinstance(seen, (int, float)) else None
        tr.resumed = tr.open_start() is not None
        return tr

    def _close_at(self, tr: Track, now: float, s: Settings) -> float:
        """When an outage ended: now, unless we were not looking (restart, stalled daemon);
        then the last time we saw it down plus one poll period, the most we can vouch for."""
        last = tr.last_down_seen if tr.last_down_seen is not None else tr.open_start() or now
        if now - last <= max(3 * s.interval_s, 10.0):
            return now
        return min(now, last + s.interval_s)

    def _observe(self, ctx: Context, key: PortKey, port: IbPort, tr: Track, rec: Recorder,
                 now: float, s: Settings) -> None:
        down = port_is_down(port)
        downed = port.counter("link_downed")
        delta = 0
        if downed is not None and tr.link_downed is not None and downed >= tr.link_downed:
            delta = downed - tr.link_downed  # else: first sight or reset -> rebase, no alarm
        if tr.resumed:
            tr.resumed = False
            same_boot = tr.stored_boot is None or tr.stored_boot == self._boot(ctx)
            if not (down and same_boot and delta == 0):
                # The outage we were tracking ended (or a reboot / new flap cut it short).
                end = self._close_at(tr, now, s)
                tr.intervals[-1][1] = end
                rec.end(key, end)
        open_start = tr.open_start()
        if down and open_start is None:
            tr.owed += 1
        matched = min(delta, tr.owed)
        tr.owed -= matched
        unseen = delta - matched
        if unseen > 0:
            tr.flaps.extend([now] * unseen)
            if open_start is None:
                credit = s.interval_s if tr.last_poll is None else min(
                    s.interval_s, max(0.0, now - tr.last_poll))
                tr.intervals.append([now - credit, now])
                rec.start(key, now - credit)
                rec.end(key, now)
        was_down = open_start is not None
        if down:
            if open_start is None:
                tr.intervals.append([now, None])
                rec.start(key, now)
            tr.last_down_seen = now
        else:
            tr.owed = 0
            if open_start is not None:
                end = self._close_at(tr, now, s)
                tr.intervals[-1][1] = end
                rec.end(key, end)
            tr.last_down_seen = None
        if downed != tr.link_downed or down or was_down:
            rec.kv(f"port:{key[0]}:{key[1]}", {
                "link_downed": downed if downed is not None else tr.link_downed,
                "boot_id": self._boot(ctx), "last_down_seen": tr.last_down_seen})
        if downed is not None:
            tr.link_downed = downed
        tr.last_poll = now
        horizon = now - s.window_s
        tr.intervals = [iv for iv in tr.intervals if iv[1] is None or iv[1] >= horizon]
        tr.flaps = [t for t in tr.flaps if t >= horizon]

    def _judged(self, s: Settings, ports: Mapping[PortKey, IbPort]) -> list[PortKey]:
        return list(s.expected) if s.expected else sorted(ports)

    def _observe_all(self, ctx: Context, s: Settings, ports: Mapping[PortKey, IbPort],
                     tracks: dict[PortKey, Track], rec: Recorder, now: float, in_grace: bool,
                     load: bool = True) -> None:
        for key in self._judged(s, ports):
            port = ports.get(key)
            if port is None or port.state is None or port.phys_state is None:
                continue
            tr = tracks.get(key)
            if tr is None:
                tr = tracks[key] = self._load(ctx, key, s, now) if load else Track()
            if in_grace:
                # Links train while the node boots: no outage, and no flap owed to it later.
                tr.link_downed = port.counter("link_downed")
                continue
            self._observe(ctx, key, port, tr, rec, now, s)

    def _evaluate(self, ctx: Context, s: Settings, ports: Mapping[PortKey, IbPort],
                  tracks: dict[PortKey, Track], rec: Recorder, now: float, in_grace: bool,
                  extra: Mapping[str, Any]) -> list[Result]:
        self._observe_all(ctx, s, ports, tracks, rec, now, in_grace)
        return self._judge_all(ctx, s, ports, tracks, now, in_grace, extra)

    def _judge_all(self, ctx: Context, s: Settings, ports: Mapping[PortKey, IbPort],
                   tracks: Mapping[PortKey, Track], now: float, in_grace: bool,
                   extra: Mapping[str, Any]) -> list[Result]:
        results: list[Result] = []
        judged = self._judged(s, ports)
        for key in judged:
            results.append(self._judge(ctx, s, key, ports.get(key), tracks.get(key), now,
                                       in_grace, extra))
        for key in sorted(set(ports) - set(judged)):
            p = ports[key]
            results.append(self.result(
                ctx, Status.SKIPPED, ib_target(*key), "PortNotExpected",
                f"{key[0]}:{key[1]} is not in the profile's rdma.ports; not judged",
                {"device": key[0], "port": key[1], "state": p.state, "phys_state": p.phys_state,
                 "link_layer": p.link_layer, "rate_gbit_per_s": p.rate_gbit}))
        return results

    def _judge(self, ctx: Context, s: Settings, key: PortKey, port: IbPort | None,
               tr: Track | None, now: float, in_grace: bool,
               extra: Mapping[str, Any]) -> Result:
        """A port whose judged files (``JUDGED_FILES``) could not all be read is ``unknown``,
        naming them, unless what could be read already fails it: never an unearned ``ok``."""
        res = self._judge_port(ctx, s, key, port, tr, now, in_grace, extra)
        errors = [str(e) for e in port.errors_for(*JUDGED_FILES)] if port is not None else []
        if not errors or res.status in (Status.FAILED, Status.UNKNOWN):
            return res
        verdict = "" if res.status is Status.OK else f" (otherwise {res.reason}: {res.message})"
        return self.result(ctx, Status.UNKNOWN, res.target, "SysfsReadError",
                           f"cannot judge {key[0]}:{key[1]}: {'; '.join(errors)}{verdict}",
                           {**dict(res.details), "pending_reason": res.reason})

    def _judge_port(self, ctx: Context, s: Settings, key: PortKey, port: IbPort | None,
                    tr: Track | None, now: float, in_grace: bool,
                    extra: Mapping[str, Any]) -> Result:
        target, name = ib_target(*key), f"{key[0]}:{key[1]}"
        if port is None:
            status = Status.UNKNOWN if in_grace else Status.FAILED
            return self.result(
                ctx, status, target, "BootGrace" if in_grace else "PortMissing",
                f"expected RDMA port {name} (profile rdma.ports) is not present",
                {"device": key[0], "port": key[1], "expected_ports": [f"{d}:{p}" for d, p
                                                                      in s.expected]},
                Action.NONE if in_grace else Action.REBOOT)
        details: dict[str, Any] = {
            "device": key[0], "port": key[1], "state": port.state,
            "phys_state": port.phys_state, "link_layer": port.link_layer,
            "rate_gbit_per_s": port.rate_gbit, "expected_rate_gbit_per_s": s.rate_gbit,
            "pci_address": port.pci_address, **extra,
        }
        relevant = [str(e) for e in port.errors_for(*JUDGED_FILES)]
        if relevant:
            details["read_errors"] = relevant
        if port.state is None or port.phys_state is None:
            return self.result(ctx, Status.UNKNOWN, target, "SysfsReadError",
                               f"cannot read the state of {name}: "
                               + ("; ".join(relevant) or "state files not exported"), details)
        down = port_is_down(port)
        tr = tr or Track()
        open_start = tr.open_start()
        current = 0.0 if open_start is None else now - open_start
        downtime, longest, outages = window_stats(tr.intervals, now - s.window_s, now)
        details.update(_window_details(s, tr, port, now, current,
                                       (downtime, longest, outages)))
        rate_low = (not down and s.rate_gbit is not None and port.rate_gbit is not None
                    and port.rate_gbit < s.rate_gbit)
        now_txt = (f"{name} is {port.state}/{port.phys_state}" if down else f"{name} is up")
        if in_grace:
            if down or rate_low:
                return self.result(ctx, Status.UNKNOWN, target, "BootGrace",
                                   f"{now_txt} during the boot grace period (links train)",
                                   details)
            return self.ok(ctx, target, now_txt, details)
        if longest > s.tolerance_s:
            ongoing = down and current >= longest
            msg = (f"{name} {'has been' if ongoing else 'was'} down for {longest:.1f} s, longer "
                   f"than NCCL tolerates ({s.tolerance_s:.1f} s = 4.096 µs × 2^{s.ib_timeout} × "
                   f"{s.retry_cnt}): would have killed an NCCL job; {downtime:.1f} s down in the "
                   f"last {s.window_s:g} s")
            action = Action.REPLACE if ongoing and current >= s.window_s else Action.WATCH
            return self.result(ctx, Status.FAILED, target, "PortDownExceededNcclTimeout", msg,
                               details, action)
        summary = (f"{downtime:.1f} s down in the last {s.window_s:g} s over {outages} "
                   f"outage(s) (budget {s.budget_s:g} s)")
        if downtime > s.budget_s:
            return self.result(ctx, Status.FAILED, target, "PortDowntimeExceeded",
                               f"{now_txt}; {summary}", details, Action.WATCH)
        if down:
            return self.result(ctx, Status.DEGRADED, target, "PortDown",
                               f"{now_txt} for {current:.1f} s (NCCL gives up after "
                               f"{s.tolerance_s:.1f} s); {summary}", details, Action.WATCH)
        if downtime > s.warning_s:
            return self.result(ctx, Status.DEGRADED, target, "PortDowntimeHigh",
                               f"{summary}, above {s.warning_fraction:g} of the budget",
                               details, Action.WATCH)
        if rate_low:
            return self.result(ctx, Status.DEGRADED, target, "PortRateDegraded",
                               f"{name} runs at {port.rate_text or port.rate_gbit}, below the "
                               f"expected {s.rate_gbit:g} Gb/s", details, Action.WATCH)
        return self.ok(ctx, target, f"{now_txt}; {summary}", details)


def _window_details(s: Settings, tr: Track, port: IbPort, now: float, current: float,
                    stats: tuple[float, float, int]) -> dict[str, Any]:
    """The downtime window's figures for a port's result: its budget and NCCL's tolerance,
    the outages in it, and the bounds of the longest and of each one NCCL did not survive
    (epoch s; an end is None while the outage is open): each keys one fail-fast notice
    (docs/workloads.md). ``stats``: ``window_stats`` of the window (downtime, longest, count).
    """
    downtime, longest, outages = stats
    worst = longest_interval(tr.intervals, now - s.window_s, now)
    downed = port.counter("link_downed")
    return {
        "downtime_s": round(downtime, 3), "window_s": s.window_s, "budget_s": s.budget_s,
        "warning_s": round(s.warning_s, 3), "nccl_tolerance_s": round(s.tolerance_s, 3),
        "nccl_ib_timeout": s.ib_timeout, "nccl_ib_retry_cnt": s.retry_cnt,
        "longest_outage_s": round(longest, 3), "current_outage_s": round(current, 3),
        "outages_in_window": outages, "flaps_between_polls": len(tr.flaps),
        "link_downed": downed, "link_downed_saturated": downed == LINK_DOWNED_MAX,
        "longest_outage_start": None if worst is None else round(worst[0], 6),
        "longest_outage_end": None if worst is None or worst[1] is None
        else round(worst[1], 6),
        "outages_over_tolerance": [
            [round(a, 6), None if b is None else round(b, 6)]
            for a, b in intervals_over(tr.intervals, s.tolerance_s, now - s.window_s, now)],
    }
