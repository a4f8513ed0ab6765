"""nccl_allreduce: an all-reduce across the node's devices, checked exactly and timed per size.

One worker process per device joins a torch.distributed group (NCCL on GPUs, gloo on CPU
devices: the same code). For every size of the sweep (``sweep_min_bytes`` to
``sweep_max_bytes`` by ``sweep_factor``) each rank first proves the data right — rank r
contributes (r + 1) x a pattern of small integers in fp32, so the sum is exactly representable
and checked for equality, not closeness — then times ``warmup_iterations`` + ``iterations``
all-reduces, and checks the data again. Per size the parent reports p50/p95 latency (of the
slowest rank in each iteration, as nccl-tests' per-iteration timing does), algbw = bytes / the
slowest rank's mean iteration time and busbw = algbw x 2(n-1)/n (nccl-tests' all-reduce bus
bandwidth).

Pass: no wrong data; busbw at the large sizes (>= ``large_message_min_bytes``, else the largest
size swept) >= the profile floor; p95 latency at the small sizes (<= ``small_message_max_bytes``)
<= the profile limit. When a sum is wrong, the ranks all-gather their contributions once to see
whose data arrives wrong, and that device is named; a rank that hangs is killed at the timeout
and named by its progress (the others were waiting for it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from checks._device import DEVICE_REASONS, DeviceCheck
from checks._gpus import worker_budget
from gpu_monitor.check import Context, Finding, Setting
from gpu_monitor.model import NODE, Action, Result, Status, gpu_target
from gpu_monitor.nccl import (
    ALL_REDUCE,
    SweepLimits,
    busbw_breach,
    latency_breach,
    rounded,
    sweep_sizes,
    sweep_table,
)
from gpu_monitor.profiles.schema import COUNT, FRACTION, POSITIVE_INT
from gpu_monitor.workers.pool import Outcome, Task, WorkerPool

_PATTERN_MOD = 251  # pattern values 1..251; x n(n+1)/2 stays below 2**24 up to n = 364
_DIAGNOSE_CHUNK = 1 << 22  # elements per all_gather when naming a bad contributor


# --- the worker (runs in a subprocess; torch only here) ---------------------------------------


class AllReduceRank:
    """One rank's side of the sweep: the exact data check and the timed loop. The benchmark
    drives it directly (bench/bench_nccl.py), so it measures exactly what the check does."""

    def __init__(self, dev: Any, rank: int, world_size: int, top_count: int,
                 step: Any = None):
        import torch

        self.dev, self.rank, self.n = dev, rank, world_size
        self.step = step or (lambda phase=None: None)
        self.base = (torch.arange(top_count, dtype=torch.int32, device=dev.torch)
                     .remainder_(_PATTERN_MOD).add_(1).to(torch.float32))
        self.work = torch.zeros(top_count, dtype=torch.float32, device=dev.torch)
        self.send = torch.empty_like(self.work)
        self.flag = torch.zeros(1, dtype=torch.float32, device=dev.torch)
        self.total = float(world_size * (world_size + 1) // 2)
        self.suspects: list[int] | None = None
        self.diagnosed_at: int | None = None

    def contribution(self, count: int) -> Any:
        import torch

        s = self.send[:count]
        torch.mul(self.base[:count], self.rank + 1, out=s)
        return self.dev.outgoing(s)

    def diagnose(self, count: int) -> list[int]:
        """Whose contribution arrives wrong: all-gather them and compare with the pattern."""
        import torch
        import torch.distributed as dist

        bad: set[int] = set()
        for start in range(0, count, _DIAGNOSE_CHUNK):
            stop = min(count, start + _DIAGNOSE_CHUNK)
            mine = self.contribution(count)[start:stop].contiguous()
            gathered = [torch.empty_like(mine) for _ in range(self.n)]
            dist.all_gather(gathered, mine)
            for j, got in enumerate(gathered):
                if not torch.equal(got, self.base[start:stop] * (j + 1)):
                    bad.add(j)
        return sorted(bad)

    def verify(self, count: int) -> int:
        """All-reduce the pattern once; the number of wrong values this rank received."""
        import torch.distributed as dist

        self.step(f"verify {count * 4} B")
        s = self.contribution(count)
        dist.all_reduce(s)
        wrong = int((s != self.base[:count] * self.total).sum())
        self.flag.fill_(float(wrong))
        dist.all_reduce(self.flag, op=dist.ReduceOp.MAX)  # every rank learns if anyone saw it
        if float(self.flag.item()) > 0 and self.suspects is None:
            self.step(f"diagnose {count * 4} B")
            self.suspects, self.diagnosed_at = self.diagnose(count), count * 4
        return wrong

    def timed(self, count: int, warmup: int, iters: int) -> list[float]:
        """Seconds per all-reduce of ``count`` fp32 values, each timed on its own."""
        import torch.distributed as dist

        z = self.work[:count]
        z.zero_()  # zeros stay zeros: timing loops cannot overflow
        for _ in range(warmup):
            self.step(f"all_reduce {count * 4} B (warm-up)")
            dist.all_reduce(z)
        times = []
        for _ in range(iters):
            self.step(f"all_reduce {count * 4} B")
            t0 = self.dev.now()
            dist.all_reduce(z)
            times.append(self.dev.now() - t0)
        return times


def allreduce_worker(ctx: Any) -> dict[str, Any]:
    import torch.distributed as dist

    dev, a = ctx.device, ctx.args
    iters, warmup = int(a["iterations"]), int(a["warmup_iterations"])
    counts = [max(1, int(s) // 4) for s in a["sizes"]]
    backend = dev.init_process_group(ctx.rank, ctx.world_size, ctx.rendezvous, ctx.timeout_s)
    me = AllReduceRank(dev, ctx.rank, ctx.world_size, max(counts), ctx.step)
    rows = []
    for _turn in ctx.turns():
        for count in counts:
            wrong = me.verify(count)
            times = me.timed(count, warmup, iters)
            wrong += me.verify(count)
            rows.append({"bytes": count * 4, "times_s": times, "wrong": wrong})
    dist.destroy_process_group()
    return {"backend": backend, "rows": rows, "suspects": me.suspects,
            "diagnosed_at_bytes": me.diagnosed_at}


# --- judgement (pure) --------------------------------------------------------------------------


def sweep_findings(rows: Sequence[Mapping[str, Any]], suspects: Sequence[int] | None,
                   wrong_ranks: Sequence[int], limits: SweepLimits) -> list[Finding]:
    """What the sweep's table shows: wrong sums (on the suspect devices, else the node), bus
    bandwidth at the large sizes below or near the floor, p95 latency of the small ones above
    the limit."""
    findings: list[Finding] = []
    wrong = sum(r["wrong"] for r in rows)
    if wrong:
        first = next(r["bytes"] for r in rows if r["wrong"])
        if suspects:
            for k in suspects:
                findings.append(Finding(
                    Status.FAILED, "NcclWrongData",
                    f"all-reduce sums were wrong ({wrong} wrong values, first at {first} B); "
                    f"the data {gpu_target(k)} contributes arrives wrong at its peers",
                    Action.REPLACE, target=gpu_target(k)))
        else:
            names = ", ".join(gpu_target(k) for k in wrong_ranks) or "every rank"
            findings.append(Finding(
                Status.FAILED, "NcclWrongData",
                f"all-reduce sums were wrong ({wrong} wrong values, first at {first} B) on "
                f"{names}; no single device's contribution was wrong", Action.REPLACE))
    if not rows:
        return findings
    low = busbw_breach(rows, limits)
    if low is not None:
        findings.append(Finding(low.status, "NcclBusBwLow", low.message, Action.WATCH))
    slow = latency_breach(rows, limits)
    if slow is not None:
        findings.append(Finding(slow.status, "NcclLatencyHigh", slow.message, Action.WATCH))
    return findings


# --- the check ---------------------------------------------------------------------------------


class NcclAllreduce(DeviceCheck):
    summary = ("all-reduce over every local device (NCCL; gloo on CPU): exact data check and "
               "a size sweep of p50/p95 latency, algbw and busbw vs the profile")
    timeout = 1200.0
    reasons = ("NcclWrongData", "NcclBusBwLow", "NcclLatencyHigh", "NothingToReduce",
               *DEVICE_REASONS)
    sections = ("nccl",)
    settings = {
        "iterations": Setting(POSITIVE_INT, 20, "timed iterations per size",
                              "nccl-tests `-n` default"),
        "warmup_iterations": Setting(COUNT, 5, "iterations",
                                     "nccl-tests (older releases' `-w` default; SuperBench 5)"),
        "warning_band": Setting(
            FRACTION, 0.01, "fraction",
            "project: the floors were set at 16 GiB, the sweep stops at 2 GiB where busbw is "
            "~1.5% lower (`nccl.large_message_min_bytes`), which would eat a 5% band on healthy "
            "nodes"),
    }

    def run(self, ctx: Context) -> Sequence[Result]:
        results, refs = self.devices(ctx, "left out of the all-reduce")
        if refs is None:
            return results
        if len(refs) < 2:
            results.append(self.result(ctx, Status.SKIPPED, NODE, "NothingToReduce",
                                       f"{len(refs)} usable device(s): nothing to all-reduce"))
            return results

        def get(key: str, default: Any = None) -> Any:
            return ctx.setting(self.name, key, default)

        sizes = sweep_sizes(int(get("sweep_min_bytes", 8)),
                            int(get("sweep_max_bytes", 2 ** 31)), int(get("sweep_factor", 4)))
        limits = SweepLimits(
            busbw_floor_gb_per_s=_opt_float(get("allreduce_busbw_floor_gb_per_s")),
            large_message_min_bytes=int(get("large_message_min_bytes", sizes[-1])),
            small_message_max_bytes=int(get("small_message_max_bytes", 65536)),
            small_p95_latency_limit_s=_opt_float(get("small_p95_latency_limit_s")),
            warning_band=float(get("warning_band", 0.0) or 0.0),
        )
        args = {"sizes": sizes, "iterations": int(get("iterations")),
                "warmup_iterations": int(get("warmup_iterations"))}
        budget = worker_budget(self, ctx)
        pool = WorkerPool(ctx.host.worker)
        outcomes = pool.run([Task("checks.nccl_allreduce:allreduce_worker", (r,), args)
                             for r in refs], timeout_s=600.0, budget_s=budget, gang=True)
        base = {"world_size": len(refs), "sizes": sizes, "iterations": args["iterations"],
                "warmup_iterations": args["warmup_iterations"],
                "busbw_floor_gb_per_s": limits.busbw_floor_gb_per_s,
                "large_message_min_bytes": limits.large_message_min_bytes,
                "small_message_max_bytes": limits.small_message_max_bytes,
                "small_p95_latency_limit_s": limits.small_p95_latency_limit_s}
        if not all(o.ok for o in outcomes):
            return results + self._worker_failures(ctx, outcomes, base)
        values = [o.value or {} for o in outcomes]
        rows = sweep_table(ALL_REDUCE, [v["rows"] for v in values])
        suspects = next((v["suspects"] for v in values if v.get("suspects") is not None), None)
        wrong_ranks = [refs[k].index for k, v in enumerate(values)
                       if any(r["wrong"] for r in v["rows"])]
        # Ranks are positions in ``refs``; targets are NVML indices.
        suspects = None if suspects is None else [refs[k].index for k in suspects]
        findings = sweep_findings(rows, suspects, wrong_ranks, limits)
        details = {**base, "backend": values[0].get("backend"), "table": rounded(rows),
                   "mode": "concurrent (one process per device)"}
        diagnosis = {"suspects": suspects,
                     "diagnosed_at_bytes": next((v.get("diagnosed_at_bytes") for v in values
                                                 if v.get("diagnosed_at_bytes")), None),
                     "wrong_by_size": {str(r["bytes"]): r["wrong"] for r in rows if r["wrong"]},
                     "world_size": len(refs), "backend": details["backend"]}
        on_devices = [f for f in findings if f.target != NODE]
        for f in on_devices:
            results.append(self.result(ctx, f.status, f.target, f.reason, f.message, diagnosis,
                                       f.action))
        node = [f for f in findings if f.target == NODE]
        if node:
            top = max(node, key=lambda f: f.status is Status.FAILED)
            if len(node) > 1:
                details["findings"] = [{"status": f.status.value, "reason": f.reason,
                                        "message": f.message} for f in node]
            results.append(self.result(ctx, top.status, NODE, top.reason, top.message,
                                       details, top.action))
        else:
            big = rows[-1]
            data = (f"wrong data from {', '.join(f.target for f in on_devices)}" if on_devices
                    else f"data exact at {len(rows)} sizes")
            results.append(self.ok(
                ctx, NODE,
                f"{len(refs)} devices ({details['backend']}): {data}; "
                f"busbw {big['busbw_gb_per_s']:.4g} GB/s at {big['bytes']} B", details))
        return results

    def _worker_failures(self, ctx: Context, outcomes: Sequence[Outcome],
                         base: Mapping[str, Any]) -> list[Result]:
        """Culprits get ``unknown`` on their device; ranks stopped because of them are listed."""
        culprits = [o for o in outcomes if not o.ok and o.cause != "aborted"]
        stopped = [o.task.name for o in outcomes if o.cause == "aborted"]
        out = []
        for o in culprits:
            out.append(self.result(ctx, Status.UNKNOWN, o.task.name, o.reason, o.message,
                                   {**base, **o.details, "stopped_ranks": stopped}))
        if not culprits:  # every rank was stopped: say so once, on the node
            first = next(o for o in outcomes if not o.ok)
            out.append(self.result(ctx, Status.UNKNOWN, NODE, first.reason, first.message,
                                   {**base, **first.details}))
        return out


def _opt_float(value: Any) -> float | None:
    return None if value is None else float(value)
