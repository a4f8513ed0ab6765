"""Real DDP over gloo on 127.0.0.1 for the SDC tests: processes stand for GPUs, groups for nodes.

One spawn runs a list of scenarios in sequence (starting processes and importing torch is the
slow part on a 2-core machine), each with a fresh tiny model, DDP wrapper and ``attach``. A
scenario is plain data (picklable): schedule, steps, faults. Faults are injected the ways the
issue names: forward hooks on one layer's output (on the rank's own computation only, or also on
the replays it does), parameter gradient hooks (backward-only), and direct weight edits right
after an optimizer update or after a restore.

The faulted layer is ``blocks[1].down``, whose output is added to the residual stream, so a
wrong element always reaches the loss.
"""

from __future__ import annotations

import copy
import os
import pickle
import socket
import time
import traceback
import warnings
from datetime import timedelta
from typing import Any

D_IN, D, H, CLASSES, BATCH = 12, 16, 32, 5, 8


class Ctx:
    """What the current computation is: set by compute_loss, read by the fault hooks."""

    step: int = -1
    own: bool = False


CTX = Ctx()
PER_NODE = 2  # set by ``worker``: ranks per simulated node
COUNTERS = ("steps", "audits", "weight_checks", "last_step", "last_audit_pass",
            "last_weight_check_pass")
LR = 0.05


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_model(unused: bool = False):
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.up = nn.Linear(D, H)
            self.down = nn.Linear(H, D)

        def forward(self, x):
            return x + self.down(torch.tanh(self.up(x)))

    class TinyNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Linear(D_IN, D)
            self.blocks = nn.ModuleList([Block(), Block()])
            self.head = nn.Linear(D, CLASSES)
            if unused:
                self.spare = nn.Linear(D, D)  # never reached by forward

        def forward(self, x):
            h = self.emb(x)
            for b in self.blocks:
                h = b(h)
            return self.head(h)

    torch.manual_seed(1234)
    return TinyNet()


def make_batch(step: int, rank: int, micro: int = 0) -> dict:
    import torch

    g = torch.Generator().manual_seed(10007 * step + 31 * rank + 1 + 1000003 * micro)
    return {
        "x": torch.randn(BATCH, D_IN, generator=g),
        "y": torch.randint(0, CLASSES, (BATCH,), generator=g),
        "step": step,
        "rank": rank,
    }


def step_batch(step: int, rank: int, micro_steps: int = 1):
    """The step's batch: one micro-batch, or the list of ``micro_steps`` of them."""
    if micro_steps == 1:
        return make_batch(step, rank)
    return [make_batch(step, rank, i) for i in range(micro_steps)]


def compute_loss(model, batch):
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel

    CTX.step = batch["step"]
    CTX.own = isinstance(model, DistributedDataParallel)
    return F.cross_entropy(model(batch["x"]), batch["y"])


def _active(f: dict, rank: int) -> bool:
    if rank not in f["ranks"]:
        return False
    if f.get("scope", "all") == "own" and not CTX.own:
        return False
    if "at" in f:
        return CTX.step == f["at"]
    return CTX.step >= f.get("from", 0)


def _corrupt(t, how: str):
    import torch

    t = t.clone()
    if how == "nan":
        t.view(-1)[0] = float("nan")
    else:
        t.view(-1)[0] = t.view(-1)[0] * 1000.0
    del torch
    return t


def _edit_weight(w, how: str) -> None:
    import torch

    with torch.no_grad():
        bits = w.view(-1).view(torch.int32)
        if how == "bitflip22":
            bits[3] ^= 1 << 22
        elif how == "swap":
            flat = w.view(-1)
            a, b = flat[3].clone(), flat[7].clone()
            flat[3], flat[7] = b, a
        elif how == "compensate":
            bits[3] += 4096
            bits[7] -= 4096
        else:
            raise ValueError(how)


def run_scenario(sc: dict, rank: int, world: int) -> dict:
    """Build, inject, train; what this rank saw."""
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    from gpu_monitor.sdc import Schedule, attach, fingerprints, rank_map, train, write_report

    if sc.get("kind") == "divergent":
        return run_divergent(sc, rank)
    if sc.get("kind") == "equivalence":
        return run_equivalence(sc, rank)
    if sc.get("kind") == "double_attach":
        return run_double_attach()

    model = make_model(unused=sc.get("unused", False))
    ddp = DDP(model, find_unused_parameters=sc.get("unused", False))
    stats = attach(ddp)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    layer = model.blocks[1].down
    out: dict[str, Any] = {"applied": [], "saves": [], "edits": {}, "saved_fp": {}, "lrs": [],
                           "events": []}
    faults = sc.get("faults", [])

    def fwd_hook(mod, inp, output):
        for f in faults:
            if f["type"] == "forward" and _active(f, rank):
                return _corrupt(output, f.get("value", "x1000"))
        return None

    def grad_hook(g):
        for f in faults:
            if f["type"] == "grad" and _active(f, rank):
                return _corrupt(g, "x1000")
        return None

    layer.register_forward_hook(fwd_hook)
    layer.weight.register_hook(grad_hook)

    def post_step(optimizer, args, kwargs):
        out["applied"].append(CTX.step)
        out["lrs"].append(optimizer.param_groups[0]["lr"])
        for f in faults:
            if f["type"] == "weight" and rank in f["ranks"] and CTX.step == f["at"]:
                before = fingerprints([layer.weight])[0].tolist()
                _edit_weight(layer.weight, f["edit"])
                out["edits"][CTX.step] = (before, fingerprints([layer.weight])[0].tolist())

    opt.register_step_post_hook(post_step)
    _patch_reduction(faults, rank)
    checkpoints: dict[int, Any] = {}

    def save_checkpoint(step, tags):
        out["events"].append(("save", step))
        out["saves"].append((step, dict(tags)))
        out["saved_fp"][step] = fingerprints([p for p in model.parameters()]).sum(0).tolist()
        checkpoints[step] = (copy.deepcopy(model.state_dict()), copy.deepcopy(opt.state_dict()))

    micro = sc.get("micro", 1)
    if sc.get("rebuild") == "different":
        def rebuild(step, r):
            return step_batch(step, r + 1000, micro)
    elif sc.get("rebuild") == "raises_on_2":
        def rebuild(step, r):
            if rank == 2:
                raise OSError("the data loader of rank 2 lost its shard")
            return step_batch(step, r, micro)
    else:
        def rebuild(step, r):
            return step_batch(step, r, micro)
    scaler = torch.amp.GradScaler("cpu") if sc.get("scaler") else None
    where = rank_map() if sc.get("report") else None
    sched = Schedule(**sc["sched"])
    steps = sc["steps"]
    start = sc.get("start_step", 0)

    def batches(a, b):
        return (step_batch(s, rank, micro) for s in range(a, b))

    def on_step(step, loss):  # a learning-rate schedule and the loss log, as a loop has them
        out["events"].append(("on_step", step, float(loss),
                              {k: getattr(stats, k) for k in COUNTERS}))
        for group in opt.param_groups:
            group["lr"] = LR * 0.5 ** (step + 1)

    det_before = torch.are_deterministic_algorithms_enabled()
    with _scenario_env(sc.get("env", {}), rank), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        alarm = train(ddp, stats, opt, batches(start, start + steps), compute_loss, rebuild,
                      save_checkpoint, sched, start_step=start, scaler=scaler,
                      micro_steps=micro, on_step=on_step if sc.get("on_step") else None)
    out["counters"] = {k: getattr(stats, k) for k in COUNTERS}
    # train's guarantee 4: nothing it started is in flight when it returns
    out["in_flight_after"] = stats._norms is not None or (
        stats._held is not None and not stats._held[0].is_completed())
    out["warnings"] = [str(w.message) for w in caught if "gpu_monitor.sdc" in str(w.message)]
    out["alarm"] = alarm
    out["det_restored"] = torch.are_deterministic_algorithms_enabled() == det_before
    restore = sc.get("restore")
    if restore and alarm is None:
        # resume from the last checkpoint, corrupt one replica's weight, resume training
        ckpt_step = max(checkpoints)
        state, opt_state = checkpoints[ckpt_step]
        model.load_state_dict(state)
        opt.load_state_dict(opt_state)
        if rank in restore["ranks"]:
            _edit_weight(layer.weight, restore["edit"])
        out["applied_before_restore"] = list(out["applied"])
        out["applied"] = []
        out["alarm"] = train(ddp, stats, opt, batches(ckpt_step + 1, ckpt_step + 1 + steps),
                             compute_loss, rebuild, save_checkpoint, sched,
                             start_step=ckpt_step + 1, micro_steps=micro)
    if where is not None and rank == 0 and out["alarm"] is not None:
        out["report_path"] = write_report(out["alarm"], where, path=sc["report"])
    return out


class _scenario_env:
    """Environment variables for one scenario (``{node}`` in a value: this rank's node index;
    ``None``: unset), restored afterwards."""

    def __init__(self, env: dict, rank: int) -> None:
        self.env = {k: None if v is None else v.format(node=rank // PER_NODE)
                    for k, v in env.items()}
        self.saved: dict = {}

    def __enter__(self):
        for k, v in self.env.items():
            self.saved[k] = os.environ.get(k)
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        return self

    def __exit__(self, *exc):
        for k, v in self.saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        return False


def _forbid_object_collectives() -> None:
    """Make torch's object collectives fail as they do without numpy (the CPU torch wheel does
    not bring it): the library must not use them."""
    import torch.distributed as dist

    def refused(*args, **kwargs):
        raise RuntimeError("Numpy is not available (object collectives are refused in the SDC "
                           "tests: gpu_monitor.sdc must use tensor collectives)")

    for name in ("all_gather_object", "broadcast_object_list", "gather_object",
                 "scatter_object_list"):
        setattr(dist, name, refused)


def _patch_reduction(faults: list, rank: int) -> None:
    """A fault in the all-reduce's result on one rank: wrap the all-reduce the SDC hook calls.

    Only gradient buckets are hit (the checks' own 1-element flags are left alone); the NaN lands
    in the bucket's first element once the sum has arrived.
    """
    import torch.distributed as dist

    original = getattr(dist, "_sdc_original_all_reduce", dist.all_reduce)
    dist._sdc_original_all_reduce = original
    wanted = [f for f in faults if f["type"] == "reduced" and rank in f["ranks"]]
    if not wanted:
        dist.all_reduce = original
        return

    class Poisoned:
        def __init__(self, work, tensor):
            self.work, self.tensor = work, tensor

        def get_future(self):
            def poison(f):
                self.tensor.view(-1)[0] = float("nan")
                return f.value()

            return self.work.get_future().then(poison)

    def corrupted(tensor, *args, **kwargs):
        work = original(tensor, *args, **kwargs)
        hit = any(CTX.step == f["at"] for f in wanted)
        if not hit or tensor.numel() < 2 or not kwargs.get("async_op"):
            return work
        return Poisoned(work, tensor)

    dist.all_reduce = corrupted


def run_equivalence(sc: dict, rank: int) -> dict:
    """The same steps through plain DDP (+ clip_grad_norm_) and through ``train``: the weights.

    Then one backward through each outside ``train``: the caller's own loop must get averaged
    gradients from the attached model again. Also whether a half-precision model would have the
    division folded (it must not: its sums could overflow).
    """
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    from gpu_monitor.sdc import Schedule, attach, train

    max_norm = sc.get("max_norm", 1.0)
    steps = sc["steps"]
    micro = sc.get("micro", 1)
    plain_m, checked_m = make_model(), make_model()
    plain, checked = DDP(plain_m), DDP(checked_m)
    stats = attach(checked)
    opt_p = torch.optim.SGD(plain_m.parameters(), lr=0.5, momentum=0.9)
    opt_c = torch.optim.SGD(checked_m.parameters(), lr=0.5, momentum=0.9)
    for s in range(steps):
        opt_p.zero_grad(set_to_none=True)
        if micro == 1:
            compute_loss(plain, make_batch(s, rank)).backward()
        for i in range(micro if micro > 1 else 0):  # nanoGPT's accumulation loop
            plain.require_backward_grad_sync = i == micro - 1
            (compute_loss(plain, make_batch(s, rank, i)) / micro).backward()
        if max_norm is not None:
            torch.nn.utils.clip_grad_norm_(plain_m.parameters(), max_norm)
        opt_p.step()
    sched = Schedule(**sc["sched"], max_grad_norm=max_norm)
    alarm = train(checked, stats, opt_c, (step_batch(s, rank, micro) for s in range(steps)),
                  compute_loss, lambda s, r: step_batch(s, r, micro), None, sched,
                  micro_steps=micro)
    pairs = list(zip(plain_m.parameters(), checked_m.parameters(), strict=True))
    out = {
        "alarm": alarm,
        "exact": all(torch.equal(a, b) for a, b in pairs),
        "max_diff": max(float((a - b).abs().max()) for a, b in pairs),
        "max_abs": max(float(a.abs().max()) for a, _ in pairs),
        "can_fold": stats.can_fold,
        "in_train_after": stats.in_train,
    }
    for m in (plain, checked):
        m.zero_grad(set_to_none=True)
        compute_loss(m, make_batch(steps, rank)).backward()
    out["own_loop_grads_equal"] = all(torch.equal(a.grad, b.grad) for a, b in pairs)
    out["own_loop_max_diff"] = max(float((a.grad - b.grad).abs().max()) for a, b in pairs)
    out["can_fold_half"] = attach(DDP(make_model().to(torch.bfloat16))).can_fold
    return out


def run_double_attach() -> dict:
    """attach twice on one model, and attach on a model with another communication hook."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    from torch.nn.parallel import DistributedDataParallel as DDP

    from gpu_monitor.sdc import attach

    out = {}
    ddp = DDP(make_model())
    attach(ddp)
    other = DDP(make_model())
    other.register_comm_hook(None, allreduce_hook)
    for key, model in (("twice", ddp), ("other_hook", other)):
        try:
            attach(model)
            out[key] = None
        except RuntimeError as e:
            out[key] = str(e)
    return out


def run_divergent(sc: dict, rank: int) -> dict:
    """find_divergent_ranks on a mix of dtypes, with optional per-rank differences."""
    import torch

    from gpu_monitor.sdc import find_divergent_ranks

    tensors = [
        torch.arange(40, dtype=torch.float32) * 0.5,
        torch.arange(10, dtype=torch.float16),
        torch.arange(9, dtype=torch.int64).reshape(3, 3),
        torch.tensor([True, False, True]),
        torch.arange(6, dtype=torch.bfloat16),
        torch.arange(4, dtype=torch.uint8),
        torch.arange(12, dtype=torch.float64).reshape(3, 4).t(),  # not contiguous
    ]
    for r, index, value in sc.get("differ", []):
        if rank == r:
            tensors[index].view(-1)[0] = value
    if sc.get("extra_tensor_on") == rank:
        tensors.append(torch.zeros(3))
    if sc.get("complex128"):
        tensors.append(torch.zeros(2, dtype=torch.complex128))
    return {"result": find_divergent_ranks(tensors)}


def worker(rank: int, world: int, port: int, scenarios: list, outdir: str, per_node: int) -> None:
    import torch
    import torch.distributed as dist

    global PER_NODE
    PER_NODE = per_node
    torch.set_num_threads(1)
    _forbid_object_collectives()
    if os.environ.get("SDC_HARNESS_DUMP"):
        import faulthandler

        faulthandler.dump_traceback_later(int(os.environ["SDC_HARNESS_DUMP"]), exit=False)
    os.environ["NODE_NAME"] = f"node{rank // per_node}"
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
        timeout=timedelta(seconds=int(os.environ.get("SDC_HARNESS_TIMEOUT", "90"))),
    )
    results = {}
    try:
        for sc in scenarios:
            t0 = time.perf_counter()
            try:
                results[sc["name"]] = run_scenario(sc, rank, world)
                results[sc["name"]]["seconds"] = time.perf_counter() - t0
            except Exception as e:  # recorded; the test on this scenario fails with it
                results[sc["name"]] = {"error": f"{type(e).__name__}: {e}",
                                       "trace": traceback.format_exc()}
            dist.barrier()
    finally:
        with open(os.path.join(outdir, f"rank{rank}.pkl"), "wb") as f:
            pickle.dump(results, f)
        dist.destroy_process_group()


def spawn_with_port(fn, world: int, *args) -> None:
    """``mp.spawn(fn, (world, port, *args))`` on a fresh port, retried when the group could
    not form (see below)."""
    import torch.multiprocessing as mp

    for attempt in range(3):
        try:
            mp.spawn(fn, args=(world, free_port(), *args), nprocs=world, join=True)
            return
        except mp.ProcessRaisedException as e:
            # Another test may take the free port before rank 0 binds it.
            if "address already in use" not in str(e).lower() or attempt == 2:
                raise
        except mp.ProcessExitedException as e:
            # gloo aborts the process (SIGABRT) when a peer's connection breaks while the
            # group forms, e.g. after that port race; a run that really aborts does so on
            # every attempt and still fails.
            if e.signal_name != "SIGABRT" or attempt == 2:
                raise


def spawn(scenarios: list, outdir: str, world: int = 6, per_node: int = 2) -> dict:
    """Run ``scenarios`` on ``world`` processes; ``{name: [result of rank 0, 1, ...]}``."""
    spawn_with_port(worker, world, scenarios, outdir, per_node)
    per_rank = []
    for r in range(world):
        with open(os.path.join(outdir, f"rank{r}.pkl"), "rb") as f:
            per_rank.append(pickle.load(f))
    return {sc["name"]: [per_rank[r][sc["name"]] for r in range(world)] for sc in scenarios}
