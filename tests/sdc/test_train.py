"""What ``train`` does to the gradients: exactly what plain DDP and ``clip_grad_norm_`` do.

Inside ``train`` the hook all-reduces fp32 buckets as sums and the clipping multiply divides
them (a Python hook cannot use DDP's fused copy-and-divide). These runs hold that to plain DDP
over real gloo: bit for bit when the group size is a power of two (division by it is exact),
within rounding otherwise, with and without clipping, with audits and weight checks in between.
"""

from __future__ import annotations

import pytest

from tests.sdc import sdc_harness as H

pytestmark = pytest.mark.timeout(600)

S = {"audit_every": 3, "check_every": 4, "ckpt_every": 0, "peer_offset": 1}

SCENARIOS = [
    {"name": "clipped", "kind": "equivalence", "sched": S, "steps": 9},
    {"name": "unclipped", "kind": "equivalence", "sched": S, "steps": 9, "max_norm": None},
    {"name": "loss_only_audits", "kind": "equivalence",
     "sched": dict(S, deterministic_audits=False), "steps": 9, "max_norm": 0.05},
    # nanoGPT's loop (require_backward_grad_sync on the last of 3 micro-steps, loss / 3) against
    # train(micro_steps=3), deterministic audits on every third step
    {"name": "accumulated", "kind": "equivalence", "sched": S, "steps": 6, "micro": 3},
]


# A loop's per-step work through on_step: audits at 2, 5; weight checks at 3, 7 and before the
# checkpoint at 5; a fault in rank 1's own forward at the audit step 8 raises the alarm there.
HOOKED = [
    {"name": "hooked", "sched": {"audit_every": 3, "check_every": 4, "ckpt_every": 6,
                                 "peer_offset": 1}, "steps": 10, "on_step": True,
     "faults": [{"type": "forward", "ranks": [1], "scope": "own", "at": 8}]},
]


@pytest.fixture(scope="module")
def four(tmp_path_factory):
    return H.spawn(SCENARIOS + HOOKED, str(tmp_path_factory.mktemp("grad4")), world=4,
                   per_node=1)


@pytest.fixture(scope="module")
def three(tmp_path_factory):
    return H.spawn(SCENARIOS[:2], str(tmp_path_factory.mktemp("grad3")), world=3, per_node=1)


def _ok(per_rank):
    for r, res in enumerate(per_rank):
        assert "error" not in res, f"rank {r}: {res.get('trace')}"
        assert res["alarm"] is None
    return per_rank


@pytest.mark.parametrize("name", [s["name"] for s in SCENARIOS])
def test_a_power_of_two_world_trains_bit_for_bit_like_plain_ddp(four, name):
    for res in _ok(four[name]):
        assert res["can_fold"] is True
        assert res["exact"], res["max_diff"]


@pytest.mark.parametrize("name", ["clipped", "unclipped"])
def test_other_world_sizes_agree_with_plain_ddp_within_rounding(three, name):
    for res in _ok(three[name]):
        assert res["max_diff"] <= 1e-5 * max(1.0, res["max_abs"]), res


def test_after_train_the_callers_own_loop_gets_averaged_gradients_again(four, three):
    for res in _ok(four["clipped"]):
        assert res["in_train_after"] is False
        assert res["own_loop_grads_equal"], res["own_loop_max_diff"]
    for res in _ok(three["clipped"]):
        assert res["own_loop_max_diff"] <= 1e-6


def test_half_precision_gradients_are_divided_before_the_sum(four):
    assert all(res["can_fold_half"] is False for res in _ok(four["clipped"]))


def test_on_step_runs_last_in_every_step_without_an_alarm_and_sees_the_counters(four):
    for res in four["hooked"]:
        assert "error" not in res, res.get("trace")
        hooks = [e for e in res["events"] if e[0] == "on_step"]
        assert [e[1] for e in hooks] == list(range(8))  # not at the alarm step 8
        # the checkpoint of step 5 is written before that step's on_step
        i = res["events"].index(("save", 5))
        assert res["events"][i + 1][:2] == ("on_step", 5)
        # counters include the step on_step is called for
        at = {e[1]: e[3] for e in hooks}
        assert at[2] == {"steps": 3, "audits": 1, "weight_checks": 1, "last_step": 2,
                         "last_audit_pass": 2, "last_weight_check_pass": None}
        assert at[7] == {"steps": 8, "audits": 2, "weight_checks": 4, "last_step": 7,
                         "last_audit_pass": 5, "last_weight_check_pass": 7}
        assert all(e[2] > 0 for e in hooks)  # the loss, as a number to log
        # a learning-rate schedule set in on_step applies to the next step's update
        assert res["lrs"] == [H.LR * 0.5 ** s for s in range(8)]
        a = res["alarm"]
        assert a["step"] == 8 and a["check"] == "compute"
        # after train: the alarm step's audit counted, the last passes as they were
        assert res["counters"] == {"steps": 8, "audits": 3, "weight_checks": 4, "last_step": 7,
                                   "last_audit_pass": 5, "last_weight_check_pass": 7}


# --- the same on a device: CPU here, CUDA where there is one ------------------------------------


def _device_worker(rank: int, world: int, port: int, device: str, outdir: str) -> None:
    """Plain DDP vs ``train`` with checks on ``device``: NCCL with one GPU per rank when there
    are enough GPUs, else gloo (which moves CUDA tensors through the host: two ranks may then
    share one GPU)."""
    import os
    import pickle
    import traceback
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from gpu_monitor.sdc import Schedule, attach, train

    os.environ["NODE_NAME"] = f"node{rank}"
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before any cuBLAS call
    torch.set_num_threads(1)
    if device == "cuda":
        dev = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(dev)
        backend = "nccl" if torch.cuda.device_count() >= world else "gloo"
    else:
        dev, backend = torch.device("cpu"), "gloo"
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=120))
    try:
        def batch(step, r):
            b = H.make_batch(step, r)
            return dict(b, x=b["x"].to(dev), y=b["y"].to(dev))

        ids = [dev.index] if backend == "nccl" else None
        plain_m, checked_m = H.make_model().to(dev), H.make_model().to(dev)
        plain, checked = DDP(plain_m, device_ids=ids), DDP(checked_m, device_ids=ids)
        stats = attach(checked)
        opt_p = torch.optim.SGD(plain_m.parameters(), lr=0.5, momentum=0.9)
        opt_c = torch.optim.SGD(checked_m.parameters(), lr=0.5, momentum=0.9)
        for s in range(9):
            opt_p.zero_grad(set_to_none=True)
            H.compute_loss(plain, batch(s, rank)).backward()
            torch.nn.utils.clip_grad_norm_(plain_m.parameters(), 1.0)
            opt_p.step()
        sched = Schedule(audit_every=3, check_every=4, ckpt_every=0, peer_offset=1)
        alarm = train(checked, stats, opt_c, (batch(s, rank) for s in range(9)), H.compute_loss,
                      batch, None, sched)
        pairs = [(a.detach(), b.detach())
                 for a, b in zip(plain_m.parameters(), checked_m.parameters(), strict=True)]
        result = {"alarm": alarm, "backend": backend, "folded": stats.can_fold,
                  "exact": all(torch.equal(a, b) for a, b in pairs),
                  "max_diff": max(float((a - b).abs().max()) for a, b in pairs)}
    except Exception:  # noqa: BLE001 - reported to the test
        result = {"error": traceback.format_exc()}
    with open(os.path.join(outdir, f"rank{rank}.pkl"), "wb") as f:
        pickle.dump(result, f)
    # gloo aborts a process whose peer tears the group down under it: leave together.
    dist.barrier()
    dist.destroy_process_group()


def _run_on(device: str, tmp_path) -> list[dict]:
    import pickle

    H.spawn_with_port(_device_worker, 2, device, str(tmp_path))
    out = []
    for r in range(2):
        with open(tmp_path / f"rank{r}.pkl", "rb") as f:
            out.append(pickle.load(f))
    return out


def _check(results: list[dict], exact: bool) -> None:
    for r, res in enumerate(results):
        assert "error" not in res, f"rank {r}: {res['error']}"
        assert res["alarm"] is None and res["folded"] is True
        if exact:
            assert res["exact"], res
        else:  # default CUDA kernels need not pick the same algorithms in both runs
            assert res["max_diff"] <= 1e-5, res


def test_the_device_run_matches_plain_ddp_on_cpu(tmp_path):
    _check(_run_on("cpu", tmp_path), exact=True)


@pytest.mark.gpu
def test_the_device_run_matches_plain_ddp_on_cuda(tmp_path):
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    _check(_run_on("cuda", tmp_path), exact=False)
