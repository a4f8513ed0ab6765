"""nvlink_state: every expected NVLink link up, and its error counters quiet.

A down NVLink link halves (or worse) the bandwidth of every collective that crosses it and is
not repaired by the job: ``failed``, suggested action a GPU reset. Error counters (replay,
recovery, CRC flit, CRC data) that climb fast mean a marginal link: ``degraded``.
docs/checks-notes/nvlink_state.md has the sources.

Results: one per GPU (``gpu:<i>``, the worst of its links, link details in ``details``), plus one
per link with a problem (``nvlink:<gpu>:<link>``: down, missing, unreadable or erroring); a link
that had one gets an ``ok`` result (``Cleared``) when it recovers, then is quiet again. An
8 x 18 node thus reports 8 results when healthy, not 144.

Guarantees:

1. Expected links per GPU: ``nvlink.links_per_gpu`` (profile or config). 0 (PCIe SKUs, cpu-only):
   ``skipped``. A GPU reporting fewer links than expected: each missing link is down. NVML
   reporting no NVLink at all on a GPU: ``skipped`` (``NotSupported``), the profile is wrong for
   it and inventory says so.
2. Boot grace: while uptime < ``nvlink.boot_grace_s`` links still train, so a down or missing
   link is ``unknown`` (``BootGrace``), never ``failed``. Unreadable uptime: no grace.
3. Error rates: per link and counter, increase per minute over ``[window_s, 1.1 x window_s]``
   from snapshots taken every ``window_s / 10`` and kept in the store (a restart keeps them);
   degraded at or above ``error_rate_per_min_degraded``. The divisor is at least one minute, so a
   handful of errors right after start is not a storm. A counter that went backwards (GPU reset,
   reboot) rebases the GPU's history and never alarms. No history (one-shot run, first poll):
   only link states are judged, ``details["window"] == "instantaneous"``.
4. NVML errors: ``GpuLost`` / ``NvmlReadError`` make that GPU ``unknown``, and so does a GPU
   NVML cannot identify (checks/_gpus.py); a link whose state reads ``Unknown`` is ``unknown``
   on its own target (every link: the GPU result alone); unsupported counters are left out,
   unreadable ones leave the GPU ``unknown`` unless a link failed it (on the GPU result alone:
   counters are not worth 18 results). Each says the NVML call and error.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from checks._gpus import read_error, unidentified
from checks._nvml_poll import NvmlPollCheck
from gpu_monitor.check import Context, Finding, Setting
from gpu_monitor.hw.nvml import GpuInfo, NvmlError, NvmlErrorKind
from gpu_monitor.metric_families import (
    CheckMetric,
    LatestResult,
    MetricsHistory,
    Sample,
    gpu_labels,
    number,
)
from gpu_monitor.model import (
    NODE,
    STATUS_SEVERITY,
    Action,
    Result,
    Status,
    gpu_target,
    nvlink_target,
)
from gpu_monitor.profiles.schema import POSITIVE, SECONDS

COUNTERS = ("replay", "recovery", "crc_flit", "crc_data")  # ecc_data is corrected: not judged


def link_errors(counters: dict[int, dict[str, int]]) -> dict[str, list[int | None]]:
    """What a GPU result keeps of its links' error counters (``details["link_errors"]``), small
    because every result is stored: ``COUNTERS`` in order for each link with a non-zero or
    unsupported (None) counter; a link read and left out had all of them at 0."""
    out: dict[str, list[int | None]] = {}
    for link, values in sorted(counters.items()):
        row = [values.get(n) for n in COUNTERS]
        if any(v != 0 for v in row):
            out[str(link)] = row
    return out


#: The details keys that say which links a GPU result read and in what state.
_LINK_KEYS = ("uuid", "links_found", "links_expected", "down_links", "missing_links",
              "unknown_links")


def _links(r: LatestResult) -> tuple[tuple[str, str], int, set[int], set[int]] | None:
    """((gpu, uuid), links expected or found, links down or missing, links unreadable) of a GPU
    result that read its links; None for any other result."""
    labels = gpu_labels(r)
    found, expected = r.details.get("links_found"), r.details.get("links_expected")
    if labels is None or not isinstance(found, int) or not isinstance(expected, int):
        return None
    listed = [*(r.details.get("down_links") or ()), *(r.details.get("missing_links") or ())]
    down = {lk for lk in listed if isinstance(lk, int)}
    unknown = {lk for lk in r.details.get("unknown_links") or () if isinstance(lk, int)}
    return labels, max(found, expected), down, unknown


def link_up_samples(results: Sequence[LatestResult], history: MetricsHistory
                    ) -> Iterable[Sample]:
    """Per GPU and link (every expected one, and any more the GPU reports): 1 up, 0 down or
    missing; a link whose state could not be read has no sample."""
    for r in results:
        links = _links(r)
        if links is None:
            continue
        labels, count, down, unknown = links
        for link in range(count):
            if link not in unknown:
                yield (*labels, str(link)), 0.0 if link in down else 1.0


def link_error_samples(results: Sequence[LatestResult], history: MetricsHistory
                       ) -> Iterable[Sample]:
    """Per GPU, link and counter type, the NVML error counter (``link_errors``' encoding); no
    sample for a link down, missing or unreadable, nor for a counter that was not read."""
    for r in results:
        links = _links(r)
        errors = r.details.get("link_errors")
        if links is None or not isinstance(errors, Mapping):
            continue  # a result from before the counters were kept: not read, not 0
        labels, count, down, unknown = links
        unread = {str(lk) for lk in r.details.get("counter_errors") or ()}
        for link in range(count):
            if link in down or link in unknown or str(link) in unread:
                continue
            row = errors.get(str(link)) or [0] * len(COUNTERS)
            for name, value in zip(COUNTERS, row, strict=False):
                v = number(value)
                if v is not None:
                    yield (*labels, str(link), name), v


class NvlinkState(NvmlPollCheck):
    summary = "Every expected NVLink link up (after the boot grace) and its error-counter rates"
    reasons = ("NvLinkDown", "NvLinkErrorRate", "BootGrace", "NvmlReadError", "GpuLost",
               "NotSupported", "NoGpu")
    sections = ("nvlink",)
    settings = {
        "window_s": Setting(SECONDS, 600, "s", "project"),
        "error_rate_per_min_degraded": Setting(
            POSITIVE, 10, "counter increase per minute",
            "project (Imbue warns at ≥ 5 total; NVLink CRC noise is common)"),
    }
    condition = "GPUFabricError"
    metrics = (
        CheckMetric("gpu_monitor_nvlink_link_up", "gauge", ("gpu", "uuid", "link"),
                    "1 if the NVLink link is up, 0 if it is down or missing (the GPU reports "
                    "fewer links than its profile expects); no sample if its state is unreadable.",
                    details=_LINK_KEYS, samples=link_up_samples),
        CheckMetric("gpu_monitor_nvlink_errors_total", "counter", ("gpu", "uuid", "link", "type"),
                    "NVLink error counters per link (NVML; a GPU reset or driver reload resets "
                    "them), by type: replay, recovery, crc_flit, crc_data.",
                    details=(*_LINK_KEYS, "counter_errors", "link_errors"),
                    samples=link_error_samples),
    )

    def __init__(self) -> None:
        super().__init__()
        self._snaps: dict[str, Any] | None = None
        self._open: set[str] | None = None
        self._dirty = False

    def poll(self, ctx: Context) -> Sequence[Result]:
        if self._links_expected(ctx) <= 0:
            return [self.result(ctx, Status.SKIPPED, NODE, "NotSupported",
                                f"profile {ctx.profile.name} expects no NVLink")]
        return super().poll(ctx)

    def _links_expected(self, ctx: Context) -> int:
        """The NVLink links per GPU the profile expects (0: none, nothing to judge)."""
        return int(ctx.setting(self.name, "links_per_gpu", 0) or 0)

    def judge_gpus(self, ctx: Context, gpus: list[GpuInfo]) -> list[Result]:
        expected = self._links_expected(ctx)
        self._load(ctx)
        assert self._snaps is not None and self._open is not None
        before = set(self._open)
        uptime = ctx.host.procfs.uptime_s()
        grace = float(ctx.setting(self.name, "boot_grace_s", 300))
        common = {"links_expected": expected, "uptime_s": uptime, "boot_grace_s": grace,
                  "in_boot_grace": uptime is not None and uptime < grace,
                  "window_s": float(ctx.setting(self.name, "window_s")),
                  "error_rate_per_min_degraded":
                      float(ctx.setting(self.name, "error_rate_per_min_degraded"))}
        results: list[Result] = []
        for gpu in gpus:
            results.extend(self._gpu(ctx, gpu, common))
        if ctx.store is not None and (self._dirty or self._open != before):
            self._dirty = False
            try:
                ctx.store.set_kv(self.name, "snapshots", self._snaps)
                ctx.store.set_kv(self.name, "link_targets", sorted(self._open))
            except Exception as exc:  # noqa: BLE001 - history is best effort, judging is not
                ctx.log.warning("nvlink_state: cannot persist history: %s", exc)
        return results

    # --- one GPU ---------------------------------------------------------------------------

    def _gpu(self, ctx: Context, gpu: GpuInfo, common: dict[str, Any]) -> list[Result]:
        target = gpu_target(gpu.index)
        expected = common["links_expected"]
        base = {"uuid": gpu.uuid, **common}
        unread = unidentified(self, ctx, gpu, base, "NVLink")
        if unread is not None:
            return [unread]
        try:
            read = _read_links(ctx, gpu, expected)
        except NvmlError as err:
            return [read_error(self, ctx, target, base, err, "NVLink")]
        if read.states and all(s is None for s in read.states):
            first = next(iter(read.state_errors.values()), None)
            return [self.result(ctx, Status.UNKNOWN, target, "NvmlReadError",
                                f"no NVLink state of {target} is readable"
                                + (f": {first}" if first else ""),
                                {**base, "state_errors": {str(lk): str(e) for lk, e
                                                          in read.state_errors.items()}})]
        if not read.states:
            why = f" ({read.state_errors[0]})" if 0 in read.state_errors else ""
            return [self.result(ctx, Status.SKIPPED, target, "NotSupported",
                                f"NVML reports no NVLink on {target}{why}; profile "
                                f"{ctx.profile.name} expects {expected} links (wrong profile?)",
                                {**base, "links_found": 0})]
        rates, window = self._rates(ctx, gpu, read.counters, common["window_s"])
        links = _link_findings(read, rates, common)
        states = read.states
        details = {
            **base, "links_found": len(states),
            "links_up": sum(1 for s in states if s),
            "down_links": [lk for lk, s in enumerate(states) if s is False],
            "missing_links": list(range(len(states), expected)),
            "unknown_links": [lk for lk, s in enumerate(states) if s is None],
            "link_errors": link_errors(read.counters),
            "error_rates_per_min": {str(lk): r for lk, r in rates.items() if any(r.values())},
            "max_error_rate_per_min": max((v for r in rates.values() for v in r.values()),
                                          default=0.0),
            "window": window,
        }
        if read.counter_errors:
            details["counter_errors"] = {str(lk): e.kind.value
                                         for lk, e in read.counter_errors.items()}
            details["nvml_error"] = str(next(iter(read.counter_errors.values())))
        out = self._link_results(ctx, gpu, links, rates, common)
        return [self._gpu_result(ctx, target, links, read, details), *out]

    def _link_results(self, ctx: Context, gpu: GpuInfo, links: dict[int, Finding],
                      rates: dict[int, dict[str, float]], common: dict[str, Any]
                      ) -> list[Result]:
        """One result per link with a finding, and ``ok`` for each link reported before and
        fine now (``Cleared``)."""
        assert self._open is not None
        out: list[Result] = []
        for link, f in sorted(links.items()):
            lt = nvlink_target(gpu.index, link)
            self._open.add(lt)
            out.append(self.result(ctx, f.status, lt, f.reason,
                                   f"NVLink {gpu.index}:{link} {f.message}",
                                   {"uuid": gpu.uuid, "gpu": gpu.index, "link": link,
                                    "error_rates_per_min": rates.get(link, {}),
                                    "error_rate_per_min_degraded":
                                        common["error_rate_per_min_degraded"],
                                    "in_boot_grace": common["in_boot_grace"]}, f.action))
        for lt in sorted(self._open):  # links reported before and fine now
            g, link = (int(x) for x in lt.split(":")[1:])
            if g == gpu.index and link not in links:
                self._open.discard(lt)
                out.append(self.ok(ctx, lt, f"NVLink {g}:{link} up, errors quiet",
                                   {"uuid": gpu.uuid, "gpu": g, "link": link}))
        return out

    def _gpu_result(self, ctx: Context, target: str, links: dict[int, Finding],
                    read: _LinkRead, details: dict[str, Any]) -> Result:
        """The GPU's one result: unreadable counters unless a link is worse, else the worst
        link, else ``ok``."""
        worst_link = max((f.status for f in links.values()), key=STATUS_SEVERITY.__getitem__,
                         default=Status.OK)
        if read.counter_errors and STATUS_SEVERITY[worst_link] < STATUS_SEVERITY[Status.UNKNOWN]:
            return self.result(
                ctx, Status.UNKNOWN, target, "NvmlReadError",
                f"{target}: NVLink error counters of link(s) "
                f"{', '.join(map(str, sorted(read.counter_errors)))} unreadable: "
                f"{details['nvml_error']}", details)
        if links:
            top = max(links.values(), key=lambda f: STATUS_SEVERITY[f.status])
            bad = [f"{lk} {f.message}" for lk, f in sorted(links.items())
                   if f.status is top.status]
            return self.result(ctx, top.status, target, top.reason,
                               f"{target} NVLink: link {'; link '.join(bad)}", details,
                               top.action)
        return self.ok(ctx, target, f"{details['links_up']}/{details['links_expected']} "
                       "links up", details)

    def _rates(self, ctx: Context, gpu: GpuInfo, counters: dict[int, dict[str, int]],
               window: float) -> tuple[dict[int, dict[str, float]], str]:
        """Per link and counter, increase per minute since the oldest snapshot in the window."""
        assert self._snaps is not None
        now = ctx.clock.now().timestamp()
        spacing = window / 10
        cur = {str(lk): [c.get(n) for n in COUNTERS] for lk, c in counters.items()}
        entry = self._snaps.get(str(gpu.index))
        if not isinstance(entry, dict) or entry.get("uuid") != gpu.uuid:
            entry = {"uuid": gpu.uuid, "snaps": []}
        snaps = [s for s in entry["snaps"] if now - window - spacing <= s[0] < now]
        if snaps and _went_back(snaps[-1][1], cur):
            snaps = []  # counters reset (GPU reset, reboot): rebase, never alarm
        if not snaps or now - snaps[-1][0] >= spacing:
            snaps.append([round(now, 3), cur])
        self._dirty |= snaps != entry["snaps"]
        entry["snaps"] = snaps
        self._snaps[str(gpu.index)] = entry
        t0, old = snaps[0]
        if t0 >= now:
            return {}, "instantaneous"
        minutes = max(now - t0, 60.0) / 60
        rates: dict[int, dict[str, float]] = {}
        for lk, values in cur.items():
            prev = old.get(lk) or [None] * len(COUNTERS)
            rates[int(lk)] = {n: round((v - p) / minutes, 3)
                              for n, v, p in zip(COUNTERS, values, prev, strict=True)
                              if v is not None and p is not None}
        return rates, "sliding"

    def _load(self, ctx: Context) -> None:
        if self._snaps is not None:
            return
        snaps: Any = None
        links: Any = None
        if ctx.store is not None:
            try:
                snaps = ctx.store.get_kv(self.name, "snapshots")
                links = ctx.store.get_kv(self.name, "link_targets")
            except Exception as exc:  # noqa: BLE001 - start afresh rather than not at all
                ctx.log.warning("nvlink_state: cannot load history: %s", exc)
        self._snaps = snaps if isinstance(snaps, dict) else {}
        self._open = {str(t) for t in links or ()} if isinstance(links, list) else set()


@dataclass(frozen=True)
class _LinkRead:
    """One GPU's NVLink readings: each link's state (None: unreadable) and error counters."""

    states: list[bool | None]
    state_errors: dict[int, NvmlError]
    counters: dict[int, dict[str, int]]
    counter_errors: dict[int, NvmlError]


def _read_links(ctx: Context, gpu: GpuInfo, expected: int) -> _LinkRead:
    """Link states and the counters of every readable link; a lost GPU raises."""
    nvml = ctx.host.nvml
    states, state_errors = nvml.nvlink_states_with_errors(gpu.index, expected)
    counters: dict[int, dict[str, int]] = {}
    counter_errors: dict[int, NvmlError] = {}
    for link, up in enumerate(states):
        if up is None:
            continue
        try:
            counters[link] = nvml.nvlink_errors(gpu.index, link)
        except NvmlError as err:
            if err.kind is NvmlErrorKind.GPU_LOST:
                raise
            counter_errors[link] = err
    return _LinkRead(states, state_errors, counters, counter_errors)


def _link_findings(read: _LinkRead, rates: dict[int, dict[str, float]],
                   common: dict[str, Any]) -> dict[int, Finding]:
    """Per expected link: unreadable, down or missing (``BootGrace`` while links may still be
    training), or erroring at or above the rate limit; quiet links have no finding."""
    limit = common["error_rate_per_min_degraded"]
    links: dict[int, Finding] = {}
    for link in range(common["links_expected"]):
        up = read.states[link] if link < len(read.states) else False
        if up is None:
            why = f": {read.state_errors[link]}" if link in read.state_errors else ""
            links[link] = Finding(Status.UNKNOWN, "NvmlReadError", f"state unreadable{why}")
        elif not up:
            what = "down" if link < len(read.states) else "missing (GPU reports fewer links)"
            links[link] = (Finding(Status.UNKNOWN, "BootGrace", f"{what} during the boot grace "
                                   "(links may still be training)")
                           if common["in_boot_grace"]
                           else Finding(Status.FAILED, "NvLinkDown", what, Action.RESET_GPU))
        else:
            hot = {c: r for c, r in rates.get(link, {}).items() if r >= limit}
            if hot:
                text = ", ".join(f"{c} {r:g}/min" for c, r in hot.items())
                links[link] = Finding(Status.DEGRADED, "NvLinkErrorRate",
                                      f"error rate {text} >= {limit:g}/min", Action.WATCH)
    return links


def _went_back(old: dict[str, list[int | None]], cur: dict[str, list[int | None]]) -> bool:
    return any(p is not None and v is not None and v < p
               for lk, values in cur.items()
               for v, p in zip(values, old.get(lk) or [None] * len(values), strict=True))
