"""One fabric-probe rank: the exact data check and the timed collectives, under torch.

Why apart: this is the only part of the probe that imports torch (lazily, when a rank runs),
so the command, the settings and the judgement stay importable and testable without it. Per
operation (all-reduce, all-gather) and per message size every rank

1. proves the data right: rank r contributes w_r x a pattern of small integers in fp32
   (w_r = r mod 16 + 1, pattern values 1..m with m chosen so that every partial sum stays
   below 2**24), so the reduced and gathered values are exactly representable and compared for
   equality, not closeness; an all-gather names whose contribution arrives wrong;
2. times ``warmup`` + ``iterations`` collectives, each on its own (synchronised on CUDA);
3. checks the data again.

NCCL on GPUs, gloo on CPU (the tests): the same code. ``run`` joins the group, lets rank 0
resolve the settings, sweeps, gathers every rank's rows and returns the group result that rank
0 assembled (probe_result.py).
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from datetime import timedelta
from typing import Any

from gpu_monitor.fabric.probe_env import LaunchEnv, ProbeError, TestFault
from gpu_monitor.fabric.probe_result import assemble
from gpu_monitor.fabric.probe_settings import ProbeSettings, resolve_settings
from gpu_monitor.fabric.transport import (
    GLOO_TRANSPORT,
    NcclLog,
    capture_nccl_debug,
    parse_nccl_debug,
)
from gpu_monitor.model import utcnow
from gpu_monitor.profiles import load_profile, match_profile
from gpu_monitor.workers.device import normalize_uuid

_WEIGHTS = 16  # contribution weights 1..16 (rank mod 16 + 1)
_EXACT = 1 << 24  # fp32 represents every integer below this exactly
_CHUNK = 1 << 24  # elements per comparison (bounds the temporaries on a 2 GiB buffer)


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
