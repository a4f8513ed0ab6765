"""pcie_aer: PCIe Advanced Error Reporting counters of GPUs, NVSwitches and RDMA NICs.

The kernel counts, per PCI function and since boot, the errors the device reported with
ERR_COR / ERR_NONFATAL / ERR_FATAL (``aer_dev_correctable|nonfatal|fatal``). What they mean
(PCIe base specification, as the kernel's AER guide summarises it):

- **fatal**: the link itself is unreliable; the kernel resets the link and the device's state is
  lost. → ``failed`` ``AerFatal``, action ``reboot``; it stays failed until the counter is reset
  (a reboot or a driver reload rebases it).
- **non-fatal**: one transaction was lost, the link still works. A job may have lost data, the
  hardware may be fine. → ``failed`` ``AerNonFatal``, action ``watch``: the node is taken out
  of service while the evidence is fresh and comes back by itself when no further non-fatal
  error arrives for ``window_s`` (default 900 s).
- **correctable**: fixed by the hardware (replays, retrained lanes); only the rate matters. →
  ``degraded`` ``AerCorrectableRate`` when more than ``correctable_per_min_degraded`` per minute
  (default 32, DCGM's 480 per 15 minutes) arrive over the window.

Baselines: the counters count since boot, so for a boot the store has not seen the baseline is
zero (anything counted is news); the baseline and the time of the last non-fatal increase are
persisted per device with the boot id, so a restart continues, never re-alarms. A counter that
goes backwards rebases without alarm. One-shot runs (bootstrap) report any fatal or non-fatal
count since boot as failed and the correctable totals in details, judging the rate only when the
daemon left samples for this boot. docs/checks-notes/pcie_aer.md explains every number.

Unreadable is never clean: an AER file that does not parse (``TOTAL_ERR_FATAL -1``, 10^30, not
text, a directory), one of the three missing while the others are there (the kernel exports
them together), or a function whose ``vendor``/``class`` cannot be read (it may be one of ours;
it is watched, not dropped) → ``unknown`` ``SysfsReadError`` naming the file, unless a readable
counter already fails the function.

Exported, not judged here (the pcie check judges them in a bootstrap): each function's link
generation and width, current and maximum, from sysfs (``pcie_link``: ``[gen, max gen, width,
max width]``), and each GPU's NVML PCIe replay counter
(``replay_counter``; a read that fails leaves it out and says why in ``replay_counter_error``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from checks._builtin import BuiltinCheck
from gpu_monitor.check import ClearTracker, Context, Setting
from gpu_monitor.hw.nvml import NvmlError
from gpu_monitor.hw.sysfs_values import AER_ATTRS, NVIDIA_VENDOR, AerCounters, PciDevice
from gpu_monitor.metric_families import CheckMetric, LatestResult, MetricsHistory, Sample, number
from gpu_monitor.model import NODE, Action, Kind, Result, Status, canonical_pci, pcie_target
from gpu_monitor.profiles.schema import POSITIVE, SECONDS, SECONDS0

log = logging.getLogger(__name__)

KV_NAMESPACE = "pcie_aer"
UNCORRECTABLE = ("fatal", "nonfatal")
#: The ``severity`` label of the AER counter, in the kernel's order of gravity.
SEVERITIES = ("correctable", "nonfatal", "fatal")
#: The PCIe link readings a result keeps, in ``details["pcie_link"]`` order (one short list,
#: since every result is stored; None where sysfs had no value): PciDevice attributes.
LINK_READINGS = ("current_link_gen", "max_link_gen", "current_link_width", "max_link_width")
_NAMES = ("pci_address", "gpu_index", "uuid")


def _function_labels(r: LatestResult) -> tuple[str, str, str] | None:
    """``(pci_bus_id, gpu, uuid)`` of a ``pcie:<address>`` result (gpu and uuid empty for a
    function that is not a GPU); None for any other target."""
    address = r.details.get("pci_address")
    if not r.target.startswith("pcie:") or not isinstance(address, str):
        return None
    index = r.details.get("gpu_index")
    return address, "" if index is None else str(index), str(r.details.get("uuid") or "")


def _function_value(key: str, index: int | None = None):
    """Samples of each PCI function's ``details[key]`` (its ``index``-th item if given)."""

    def samples(results: Sequence[LatestResult], history: MetricsHistory) -> Iterable[Sample]:
        for r in results:
            value = r.details.get(key)
            if index is not None:
                value = value[index] if isinstance(value, list) and len(value) > index else None
            labels, number_ = _function_labels(r), number(value)
            if labels is not None and number_ is not None:
                yield labels, number_

    samples.__doc__ = f"Each PCI function's ``{key}`` (not read: no sample)."
    return samples


def aer_samples(results: Sequence[LatestResult], history: MetricsHistory) -> Iterable[Sample]:
    """Each function's AER totals since boot by severity; an unreadable counter has none."""
    for r in results:
        labels = _function_labels(r)
        if labels is None:
            continue
        for severity in SEVERITIES:
            value = number(r.details.get(f"{severity}_total"))
            if value is not None:
                yield (*labels, severity), value


_LABELS = ("pci_bus_id", "gpu", "uuid")
#: The link families, in ``LINK_READINGS`` order: (name, help).
_LINK_FAMILIES = (
    ("gpu_monitor_pcie_link_generation",
     "PCIe link generation the function trained at (sysfs current_link_speed)."),
    ("gpu_monitor_pcie_link_max_generation",
     "Highest PCIe generation the function supports (sysfs max_link_speed)."),
    ("gpu_monitor_pcie_link_width",
     "PCIe lanes the function's link trained at (sysfs current_link_width)."),
    ("gpu_monitor_pcie_link_max_width", "PCIe lanes the function supports (sysfs max_link_width)."),
)
#: gpu/uuid are empty for an NVSwitch or NIC function (one label set per family).
METRICS = (
    CheckMetric("gpu_monitor_pcie_aer_errors_total", "counter", (*_LABELS, "severity"),
                "PCIe AER errors the function reported since boot (sysfs aer_dev_*), by "
                "severity: correctable, nonfatal, fatal.",
                details=(*_NAMES, *(f"{s}_total" for s in SEVERITIES)), samples=aer_samples),
    CheckMetric("gpu_monitor_pcie_replays_total", "counter", _LABELS,
                "PCIe replays of the GPU's link since the driver loaded (NVML replay counter).",
                details=(*_NAMES, "replay_counter"), samples=_function_value("replay_counter")),
    *(CheckMetric(name, "gauge", _LABELS, help_, details=(*_NAMES, "pcie_link"),
                  samples=_function_value("pcie_link", i))
      for i, (name, help_) in enumerate(_LINK_FAMILIES)),
)


@dataclass(frozen=True)
class Watched:
    """One PCI function we watch, and what it is to the operator."""

    device: PciDevice
    kind: str  # gpu | nvswitch | nic
    names: Mapping[str, Any]  # gpu_index/uuid, or rdma_devices


def _totals(dev: PciDevice) -> dict[str, AerCounters | None]:
    return {"fatal": dev.aer_fatal, "nonfatal": dev.aer_nonfatal,
            "correctable": dev.aer_correctable}


def _nonzero(c: AerCounters | None) -> dict[str, int]:
    return {} if c is None else {k: v for k, v in c.counters.items() if v}


def correctable_increase(samples: Sequence[Sequence[float]], window_start: float,
                         current: float) -> tuple[float, float]:
    """(increase over the window, seconds of the window the samples cover).

    ``samples`` are change points ``[time, value]``, oldest first: the value at the window's
    start is the last point at or before it, else the oldest point (we were not watching yet).
    """
    if not samples:
        return 0.0, 0.0
    start_value, start_time = samples[0][1], samples[0][0]
    for t, v in samples:
        if t <= window_start:
            start_value, start_time = v, window_start
        else:
            break
    return max(0.0, current - start_value), max(start_time, window_start)


def _iso(epoch: float | None) -> str | None:
    if epoch is None:
        return None
    return datetime.fromtimestamp(epoch, tz=timezone.utc).isoformat().replace("+00:00", "Z")


class PcieAer(BuiltinCheck):
    kinds = frozenset({Kind.PASSIVE, Kind.BOOTSTRAP})
    summary = "PCIe AER counters of GPUs, NVSwitches and RDMA NICs: uncorrectable and rates"
    interval = 30.0
    timeout = 30.0
    reasons = ("AerFatal", "AerNonFatal", "AerCorrectableRate", "NotSupported", "NoDevice",
               "SysfsReadError", "BootGrace")
    sections = ("pcie",)
    settings = {
        "window_s": Setting(SECONDS, 900, "s", "DCGM AER threshold window (15 min)"),
        "correctable_per_min_degraded": Setting(POSITIVE, 32, "correctable AER errors per minute",
                                                "DCGM `pcie` plugin (480 = 32/min × 15 min)"),
        "boot_grace_s": Setting(
            SECONDS0, 300,
            "s after boot during which an AER finding is `unknown` (`BootGrace`), not degraded "
            "or failed", "project: devices train and retrain links at boot"),
    }
    condition = "GPUPCIeError"
    metrics = METRICS

    def __init__(self) -> None:
        self._states: dict[str, dict[str, Any]] = {}
        self._clear = ClearTracker(self.name)

    # --- discovery ---------------------------------------------------------------------

    def _watched(self, ctx: Context) -> list[Watched]:
        sysfs = ctx.host.sysfs
        gpu_names: dict[str, dict[str, Any]] = {}
        try:
            if ctx.host.nvml.available():
                for g in ctx.host.nvml.gpus():
                    if g.pci_bus_id:
                        gpu_names[canonical_pci(g.pci_bus_id)] = {"gpu_index": g.index,
                                                                  "uuid": g.uuid}
        except Exception as exc:  # noqa: BLE001 - names are a courtesy; counters still count
            log.debug("pcie_aer: no GPU names from NVML: %s", exc)
        out: list[Watched] = []
        for d in sysfs.pci_devices(NVIDIA_VENDOR):
            if d.is_nvidia_gpu or d.address in gpu_names:
                out.append(Watched(d, "gpu", gpu_names.get(d.address, {})))
            elif d.is_nvswitch:
                out.append(Watched(d, "nvswitch", {}))
            elif d.unidentified:
                # Vendor or class unreadable: it may be a GPU or NVSwitch; never drop it quietly.
                out.append(Watched(d, "unidentified", {}))
        nics: dict[str, list[str]] = {}
        for p in sysfs.infiniband_ports():
            if p.pci_address and p.device not in nics.setdefault(p.pci_address, []):
                nics[p.pci_address].append(p.device)
        for addr, rdma in sorted(nics.items()):
            d = sysfs.pci_device(addr)
            if d is not None:
                out.append(Watched(d, "nic", {"rdma_devices": rdma}))
        return out

    # --- state -------------------------------------------------------------------------

    def _state(self, ctx: Context, addr: str, boot: str | None, persist: bool
               ) -> dict[str, Any]:
        st = self._states.get(addr) if persist else None
        if st is None:
            st = {}
            if ctx.store is not None:
                try:
                    st = dict(ctx.store.get_kv(KV_NAMESPACE, addr) or {})
                except Exception as exc:  # noqa: BLE001
                    log.warning("pcie_aer: cannot load the baseline of %s: %s", addr, exc)
            if persist:
                self._states[addr] = st
        if st.get("boot_id") != boot:
            # A boot we have not seen: the kernel's counts are all news (baseline zero).
            st.clear()
            st.update({"boot_id": boot, "base": {"fatal": 0, "nonfatal": 0}, "last": {},
                       "nonfatal_at": None, "corr": []})
        return st

    def _save(self, ctx: Context, addr: str, st: Mapping[str, Any]) -> None:
        if ctx.store is None:
            return
        try:
            ctx.store.set_kv(KV_NAMESPACE, addr, dict(st))
        except Exception as exc:  # noqa: BLE001 - the poll goes on without history
            log.warning("pcie_aer: cannot save the baseline of %s: %s", addr, exc)

    # --- entry point -------------------------------------------------------------------

    def poll(self, ctx: Context) -> Sequence[Result]:
        if not ctx.host.sysfs.pci_available():
            return [self.result(ctx, Status.UNKNOWN, NODE, "SysfsReadError",
                                f"PCI devices not readable: "
                                f"{ctx.host.sysfs.pci_unavailable_reason()}")]
        watched = self._watched(ctx)
        if not watched:
            return [self.result(ctx, Status.SKIPPED, NODE, "NoDevice",
                                "no NVIDIA GPU, NVSwitch or RDMA NIC on the PCI bus")]
        now = ctx.clock.now().timestamp()
        uptime = ctx.host.procfs.uptime_s()
        grace = uptime is not None and uptime < float(ctx.setting(self.name, "boot_grace_s"))
        boot = ctx.host.procfs.boot_id()
        results = [self._judge(ctx, w, now, boot, grace) for w in watched]
        return results if ctx.one_shot else self._clear.track(ctx, results)

    @staticmethod
    def _readings(ctx: Context, w: Watched, window_s: float, per_min: float,
                  errors: list[str]) -> dict[str, Any]:
        """The details every result of ``w`` carries: identity, counter totals, link, replays
        (what the metric families export) and the read errors."""
        dev = w.device
        counters = _totals(dev)
        details: dict[str, Any] = {"pci_address": dev.address, "device_kind": w.kind,
                                   **w.names, "window_s": window_s,
                                   "correctable_per_min_degraded": per_min}
        for k, c in counters.items():
            details[f"{k}_total"] = None if c is None else c.total
            if _nonzero(c):
                details[f"{k}_counters"] = _nonzero(c)
        link = [getattr(dev, attr) for attr in LINK_READINGS]
        if any(v is not None for v in link):
            details["pcie_link"] = link
        if w.kind == "gpu" and isinstance(w.names.get("gpu_index"), int):
            try:
                details["replay_counter"] = ctx.host.nvml.pcie_replay_counter(w.names["gpu_index"])
            except NvmlError as err:
                details["replay_counter_error"] = str(err)
        if errors:
            details["read_errors"] = errors
        return details

    def _judge(self, ctx: Context, w: Watched, now: float, boot: str | None,
               grace: bool) -> Result:
        dev = w.device
        target = pcie_target(dev.address)
        window_s = float(ctx.setting(self.name, "window_s"))
        per_min = float(ctx.setting(self.name, "correctable_per_min_degraded"))
        totals = {k: (None if c is None else c.total) for k, c in _totals(dev).items()}
        errors = [str(e) for e in dev.errors_for(*AER_ATTRS, "vendor", "class")]
        details = self._readings(ctx, w, window_s, per_min, errors)
        if all(v is None for v in totals.values()) and not errors:
            return self.result(ctx, Status.SKIPPED, target, "NotSupported",
                               f"{target} exports no AER counters (no AER capability)", details)

        persist = not ctx.one_shot
        st = self._state(ctx, dev.address, boot, persist)
        before = repr(st)
        problems: list[tuple[Status, str, str, Action]] = []
        if ctx.one_shot:
            details["window"] = "instantaneous"
            for k in UNCORRECTABLE:
                if totals[k]:
                    details[f"{k}_increase"] = totals[k]
                    problems.append(self._uncorrectable(k, target, totals[k] or 0, "since boot"))
        else:
            details["window"] = "history"
            for k in UNCORRECTABLE:
                cur = totals[k]
                if cur is None:
                    continue
                inc = self._increase(st, k, cur, now, window_s)
                details[f"{k}_baseline"] = st["base"].get(k, 0)
                details[f"{k}_increase"] = inc
                if inc > 0:
                    problems.append(self._uncorrectable(k, target, inc, "since the baseline"))
            details["nonfatal_last_increase_at"] = _iso(st.get("nonfatal_at"))
        cur = totals["correctable"]
        if cur is not None:
            if persist:
                self._sample(st, cur, now, window_s)
            if st.get("corr"):
                inc, covered_from = correctable_increase(st["corr"], now - window_s, cur)
                rate = inc / (window_s / 60.0)
                details.update({"correctable_increase": inc,
                                "correctable_per_min": round(rate, 3),
                                "observed_s": round(now - covered_from, 3), "window": "history"})
                if rate > per_min:
                    problems.append((Status.DEGRADED, "AerCorrectableRate",
                                     f"{target}: {inc:g} correctable AER errors in the last "
                                     f"{window_s:g} s ({rate:.1f}/min, limit {per_min:g}/min)",
                                     Action.WATCH))
        if persist and repr(st) != before:
            self._save(ctx, dev.address, st)
        if errors and not any(s is Status.FAILED for s, *_ in problems):
            what = "identity" if w.kind == "unidentified" else "AER counters"
            problems.insert(0, (Status.UNKNOWN, "SysfsReadError",
                                f"cannot read the {what} of {target}: {'; '.join(errors)}",
                                Action.NONE))
        if not problems:
            return self.ok(ctx, target, f"{target}: no new AER errors", details)
        status, reason, message, action = problems[0]
        if len(problems) > 1:
            message += "; also " + "; ".join(p[2] for p in problems[1:])
        if grace and status in (Status.FAILED, Status.DEGRADED):
            return self.result(ctx, Status.UNKNOWN, target, "BootGrace",
                               f"during the boot grace period: {message}", details)
        return self.result(ctx, status, target, reason, message, details, action)

    # --- the judgements ----------------------------------------------------------------

    @staticmethod
    def _uncorrectable(kind: str, target: str, count: int, since: str
                       ) -> tuple[Status, str, str, Action]:
        if kind == "fatal":
            return (Status.FAILED, "AerFatal",
                    f"{target}: {count} fatal uncorrectable AER error(s) {since}: the link was "
                    "unreliable and was reset", Action.REBOOT)
        return (Status.FAILED, "AerNonFatal",
                f"{target}: {count} non-fatal uncorrectable AER error(s) {since}: a transaction "
                "was lost", Action.WATCH)

    @staticmethod
    def _increase(st: dict[str, Any], kind: str, cur: int, now: float, window_s: float) -> int:
        """Increase over the baseline; going backwards rebases; non-fatal evidence ages out."""
        bases, lasts = st["base"], st.setdefault("last", {})
        bases.setdefault(kind, 0)
        last = lasts.get(kind)
        if last is not None and cur < last:
            bases[kind] = cur  # reset (driver reload, reboot): no alarm
            if kind == "nonfatal":
                st["nonfatal_at"] = None
        elif kind == "nonfatal" and cur > (bases[kind] if last is None else last):
            st["nonfatal_at"] = now
        lasts[kind] = cur
        at = st.get("nonfatal_at")
        if kind == "nonfatal" and at is not None and now - at >= window_s:
            bases[kind] = cur  # no new non-fatal error for a whole window: evidence aged out
            st["nonfatal_at"] = None
        return cur - bases[kind]

    @staticmethod
    def _sample(st: dict[str, Any], cur: int, now: float, window_s: float) -> None:
        """Keep correctable change points: the one at/before the window start, and later."""
        corr: list[list[float]] = st.setdefault("corr", [])
        if corr and cur < corr[-1][1]:
            corr.clear()  # reset: start over from here
        if not corr or cur != corr[-1][1]:
            corr.append([now, cur])
        start = now - window_s
        while len(corr) > 1 and corr[1][0] <= start:
            corr.pop(0)
