"""nvlink_peer: every expected NVLink up, no new link errors, and every device pair copying
correct data fast enough.

First NVML: the state of each of the profile's ``links_per_gpu`` links per GPU, the fabric
registration on NVSwitch systems (Hopper+: must be completed/success), and the link error
counters. Then one worker process that sees every device copies a known pattern from each
device to each other device (every ordered pair), verifies it word for word at the destination
and times ``repeats`` copies of ``copy_bytes``; the bandwidth (median repeat) is held to
``p2p_floor_gb_per_s``. Last, the error counters are read again: increases during the copies
are degraded/failed by the profile's counts.

On CPU devices (the simulated node, tests) a "peer copy" is a copy between two host buffers
that stand for the two devices, in one process: it exercises the same code and the same data
check, and measures host memory bandwidth, nothing about NVLink (the simulated floors are set
for that). The simulated node's NVLink faults reach this check through the fake NVML.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from checks._device import DeviceCheck
from checks._gpus import error_details, worker_budget
from gpu_monitor.check import Context, Setting
from gpu_monitor.hw.nvml import NvmlError, NvmlErrorKind
from gpu_monitor.model import NODE, Action, Result, Status, gpu_target, nvlink_target
from gpu_monitor.model import p2p_target as p2p
from gpu_monitor.profiles.schema import BYTES, POSITIVE_INT
from gpu_monitor.workers.pool import WORKER_REASONS, DeviceRef, Outcome, Task, WorkerPool

# --- the worker (one process, every device; torch only here) ----------------------------------


def pattern_key(src: int, dst: int) -> int:
    """A per-pair value mixed into the pattern, so data from another pair cannot pass."""
    return 0x5A000000 ^ (src << 12) ^ (dst << 4)


def peer_worker(ctx: Any) -> dict[str, Any]:
    import torch

    devs = ctx.devices
    count = max(1, int(ctx.args["copy_bytes"]) // 4)
    repeats = max(1, int(ctx.args["repeats"]))
    pairs = [(a, b) for a in range(len(devs)) for b in range(len(devs)) if a != b]

    def pattern(key: int, device: Any) -> Any:
        return torch.bitwise_xor(torch.arange(count, dtype=torch.int32, device=device), key)

    out = []
    for _turn in ctx.turns():
        for a, b in pairs:
            src_dev, dst_dev = devs[a], devs[b]
            ctx.step(f"copy gpu:{src_dev.index} -> gpu:{dst_dev.index}")
            key = pattern_key(src_dev.index, dst_dev.index)
            src = pattern(key, src_dev.torch)
            expected = pattern(key, dst_dev.torch)
            dst = torch.empty(count, dtype=torch.int32, device=dst_dev.torch)
            dst.copy_(src)  # warm-up: peer mappings, allocator
            times, mismatches = [], 0
            for _ in range(repeats):
                dst.fill_(-1)  # a copy that does nothing must not pass
                src_dev.synchronize()
                dst_dev.synchronize()
                t0 = src_dev.now()
                dst.copy_(src)
                dst_dev.synchronize()
                t1 = src_dev.now()
                times.append(t1 - t0)
                mismatches = max(mismatches, int((dst != expected).sum()))
            peer = (bool(torch.cuda.can_device_access_peer(src_dev.torch, dst_dev.torch))
                    if src_dev.is_cuda and dst_dev.is_cuda else None)
            med = statistics.median(times)
            out.append({"src": src_dev.index, "dst": dst_dev.index, "bytes": count * 4,
                        "gb_per_s": count * 4 / med / 1e9 if med > 0 else 0.0,
                        "times_s": times, "mismatches": mismatches, "words": count,
                        "peer_access": peer})
            del src, dst, expected
    return {"pairs": out, "kind": devs[0].kind if devs else None}


# --- the check ---------------------------------------------------------------------------------


class NvlinkPeer(DeviceCheck):
    summary = ("NVLink state and error counters, NVSwitch fabric state, and a data-checked "
               "copy with bandwidth for every ordered device pair")
    timeout = 900.0
    reasons = ("NvLinkDown", "NvLinkMissing", "NvLinkErrors", "NvLinkReadError",
               "FabricNotReady", "P2pDataMismatch", "P2pBandwidthLow", "P2pUnavailable",
               "DeviceUnavailable", "NvmlReadError", "PairsNotCopied", *WORKER_REASONS)
    sections = ("nvlink",)
    settings = {
        "copy_bytes": Setting(BYTES, 268435456, "bytes per pair copy", "project"),
        "repeats": Setting(POSITIVE_INT, 5, "copies per pair",
                           "project (Azure NHC runs nvbandwidth `-i 10`)"),
        "error_increase_degraded": Setting(
            POSITIVE_INT, 1, "CRC/replay/recovery counter increase during the test",
            "Meta GCM (any NVLink error → critical)", at_most="error_increase_failed"),
        "error_increase_failed": Setting(
            POSITIVE_INT, 100, "CRC/replay/recovery counter increase during the test",
            "DCGM `pcie` plugin `crc_error_threshold` 100"),
    }

    def run(self, ctx: Context) -> Sequence[Result]:
        results, refs = self.devices(ctx, "not tested")
        if refs is None:
            return results

        def get(key: str, default: Any = None) -> Any:
            return ctx.setting(self.name, key, default)

        expected = int(get("links_per_gpu", 0) or 0)
        floor = get("p2p_floor_gb_per_s")
        floor = None if floor is None else float(floor)
        band = float(get("warning_band", 0.0) or 0.0)
        links: dict[int, int] = {}
        for ref in refs:
            results += self._links(ctx, ref.index, expected, links)
        if get("nvswitch", False):
            for ref in refs:
                results += self._fabric(ctx, ref.index)
        before, before_errors = self._counters(ctx, links)

        matrix: list[list[float | None]] = [[None] * len(refs) for _ in refs]
        pos = {r.index: k for k, r in enumerate(refs)}
        copied = 0
        if len(refs) >= 2:
            args = {"copy_bytes": int(get("copy_bytes")), "repeats": int(get("repeats"))}
            pool = WorkerPool(ctx.host.worker)
            budget = worker_budget(self, ctx)  # the rest is for the counters and judging
            task = Task("checks.nvlink_peer:peer_worker", tuple(refs), args,
                        label="peer copies")
            (outcome,) = pool.run([task], timeout_s=600.0, budget_s=budget, rounds=1)
            if outcome.ok and outcome.value:
                for pair in outcome.value["pairs"]:
                    matrix[pos[pair["src"]]][pos[pair["dst"]]] = round(pair["gb_per_s"], 4)
                    results.append(self._pair(ctx, pair, floor, band, expected))
                    copied += 1
            else:
                results.append(self._failed_worker(ctx, outcome, refs))
        after, after_errors = self._counters(ctx, links)
        results += self._counter_increases(ctx, before, after)
        for index, err in sorted({**after_errors, **before_errors}.items()):
            results.append(self.result(
                ctx, Status.UNKNOWN, gpu_target(index), "NvLinkReadError",
                f"cannot read the NVLink error counters of {gpu_target(index)}: {err}",
                error_details(err)))

        details = {"bandwidth_gb_per_s": matrix, "devices": [r.index for r in refs],
                   "p2p_floor_gb_per_s": floor, "links_per_gpu": expected,
                   "links_seen": {gpu_target(i): n for i, n in links.items()},
                   "pairs_copied": copied}
        bad = sorted({r.target for r in results if r.status is not Status.OK})
        if bad:
            message = f"{copied} pairs copied; findings on {', '.join(bad[:12])}" + (
                f" and {len(bad) - 12} more" if len(bad) > 12 else "")
        else:
            message = f"{copied} pairs copied, data verified, links up"
        wanted = len(refs) * (len(refs) - 1)
        if copied < wanted:
            # The summary is only as good as the copies behind it: pairs the worker never
            # reported were not verified, so the node's peer copies are undecided.
            details["pairs_expected"] = wanted
            results.append(self.result(ctx, Status.UNKNOWN, NODE, "PairsNotCopied",
                                       f"{message}; {wanted - copied} of {wanted} pairs were "
                                       "not copied", details))
        else:
            results.append(self.ok(ctx, NODE, message, details))
        return results

    # -- NVML ---------------------------------------------------------------------------------

    def _links(self, ctx: Context, index: int, expected: int,
               links: dict[int, int]) -> list[Result]:
        if expected <= 0:
            return []
        try:
            states, errors = ctx.host.nvml.nvlink_states_with_errors(
                index, max_links=max(expected, 18))
        except NvmlError as err:
            return [self.result(ctx, Status.UNKNOWN, gpu_target(index), "NvLinkReadError",
                                f"cannot read NVLink state of {gpu_target(index)}: {err}",
                                error_details(err))]
        links[index] = min(len(states), expected)
        out = []
        for link, up in enumerate(states[:expected]):
            if up is False:
                out.append(self.result(
                    ctx, Status.FAILED, nvlink_target(index, link), "NvLinkDown",
                    f"{gpu_target(index)} NVLink {link} is down", {"link": link},
                    Action.RESET_GPU))
            elif up is None:
                err = errors.get(link)
                out.append(self.result(
                    ctx, Status.UNKNOWN, nvlink_target(index, link), "NvLinkReadError",
                    f"{gpu_target(index)} NVLink {link} state could not be read"
                    + (f": {err}" if err else ""),
                    {"link": link, **(error_details(err) if err else {})}))
        if len(states) < expected:
            out.append(self.result(
                ctx, Status.FAILED, gpu_target(index), "NvLinkMissing",
                f"{gpu_target(index)} reports {len(states)} NVLink links; the profile expects "
                f"{expected}", {"links_seen": len(states), "links_expected": expected},
                Action.RESET_GPU))
        return out

    def _fabric(self, ctx: Context, index: int) -> list[Result]:
        try:
            info = ctx.host.nvml.fabric(index)
        except NvmlError as err:
            if err.kind is NvmlErrorKind.FUNCTION_NOT_FOUND:
                return []  # a driver without fabric info (pre-R525): nothing to check
            return [self.result(ctx, Status.UNKNOWN, gpu_target(index), "NvmlReadError",
                                f"cannot read the fabric state of {gpu_target(index)}: {err}",
                                error_details(err))]
        if not info.supported or info.completed:
            return []
        return [self.result(
            ctx, Status.FAILED, gpu_target(index), "FabricNotReady",
            f"{gpu_target(index)} NVSwitch fabric registration is not complete (state "
            f"{info.state}, status {info.status}): is the fabric manager running?",
            {"fabric_state": info.state, "fabric_status": info.status}, Action.REBOOT)]

    def _counters(self, ctx: Context, links: Mapping[int, int]
                  ) -> tuple[dict[tuple[int, int], dict[str, int] | None], dict[int, NvmlError]]:
        """Error counters per (GPU, link), None where unreadable; and per GPU the first read
        error (unsupported counters are simply absent)."""
        out: dict[tuple[int, int], dict[str, int] | None] = {}
        errors: dict[int, NvmlError] = {}
        for index, n in links.items():
            for link in range(n):
                try:
                    out[(index, link)] = ctx.host.nvml.nvlink_errors(index, link)
                except NvmlError as err:
                    out[(index, link)] = None
                    errors.setdefault(index, err)
        return out, errors

    def _counter_increases(self, ctx: Context, before: Mapping, after: Mapping) -> list[Result]:
        degraded = int(ctx.setting(self.name, "error_increase_degraded"))
        failed = int(ctx.setting(self.name, "error_increase_failed"))
        out = []
        for (index, link), old in before.items():
            new = after.get((index, link))
            if old is None or new is None:
                continue
            grew = {k: new[k] - old.get(k, 0) for k in new if new[k] > old.get(k, 0)}
            total = sum(grew.values())
            if total >= failed or total >= degraded:
                status = Status.FAILED if total >= failed else Status.DEGRADED
                out.append(self.result(
                    ctx, status, nvlink_target(index, link), "NvLinkErrors",
                    f"{gpu_target(index)} NVLink {link} error counters rose by {total} during "
                    f"the copies ({', '.join(f'{k} +{v}' for k, v in sorted(grew.items()))})",
                    {"increase": grew, "degraded_at": degraded, "failed_at": failed},
                    Action.WATCH if status is Status.DEGRADED else Action.RESET_GPU))
        return out

    # -- copies -------------------------------------------------------------------------------

    def _pair(self, ctx: Context, pair: Mapping[str, Any], floor: float | None, band: float,
              expected_links: int) -> Result:
        s, d = pair["src"], pair["dst"]
        target = p2p(s, d)
        bw = float(pair["gb_per_s"])
        details = {"gb_per_s": round(bw, 4), "bytes": pair["bytes"], "floor_gb_per_s": floor,
                   "mismatched_words": pair["mismatches"], "peer_access": pair["peer_access"]}
        if pair["mismatches"]:
            return self.result(
                ctx, Status.FAILED, target, "P2pDataMismatch",
                f"copy gpu:{s} -> gpu:{d}: {pair['mismatches']} of {pair['words']} words "
                "arrived wrong", details, Action.RESET_GPU)
        if pair["peer_access"] is False and expected_links > 0:
            return self.result(
                ctx, Status.FAILED, target, "P2pUnavailable",
                f"gpu:{s} cannot access gpu:{d} directly (no peer access) on an NVLink "
                "system", details, Action.RESET_GPU)
        if floor is not None and bw < floor:
            return self.result(
                ctx, Status.FAILED, target, "P2pBandwidthLow",
                f"copy gpu:{s} -> gpu:{d} at {bw:.4g} GB/s is below the floor {floor:g} GB/s",
                details, Action.RESET_GPU)
        if floor is not None and bw < floor * (1.0 + band):
            return self.result(
                ctx, Status.DEGRADED, target, "P2pBandwidthLow",
                f"copy gpu:{s} -> gpu:{d} at {bw:.4g} GB/s is within {band:g} of the floor "
                f"{floor:g} GB/s", details, Action.WATCH)
        return self.ok(ctx, target, f"gpu:{s} -> gpu:{d}: {bw:.4g} GB/s, data verified",
                       details)

    def _failed_worker(self, ctx: Context, outcome: Outcome,
                       refs: Sequence[DeviceRef]) -> Result:
        """Name the pair the worker was copying when it hung or died (one step per pair)."""
        pairs = [(a.index, b.index) for a in refs for b in refs if a != b]
        target = NODE
        if outcome.cause in ("timeout", "signal") and 0 < outcome.steps <= len(pairs):
            target = p2p(*pairs[outcome.steps - 1])
        return self.result(ctx, Status.UNKNOWN, target, outcome.reason, outcome.message,
                           outcome.details)
