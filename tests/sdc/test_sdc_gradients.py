"""What ``train`` does to the gradients: exactly what plain DDP and ``clip_grad_norm_`` do.

Inside ``train`` the hook all-reduces fp32 buckets as sums and the clipping multiply divides
them (a Python hook cannot use DDP's fused copy-and-divide). These runs hold that to plain DDP
over real gloo: bit for bit when the group size is a power of two (division by it is exact),
within rounding otherwise, with and without clipping, with audits and weight checks in between.
"""

from __future__ import annotations

import pytest
import sdc_harness as H

pytestmark = pytest.mark.timeout(600)

S = {"audit_every": 3, "check_every": 4, "ckpt_every": 0, "peer_offset": 1}

SCENARIOS = [
    {"name": "clipped", "kind": "equivalence", "sched": S, "steps": 9},
    {"name": "unclipped", "kind": "equivalence", "sched": S, "steps": 9, "max_norm": None},
    {"name": "loss_only_audits", "kind": "equivalence",
     "sched": dict(S, deterministic_audits=False), "steps": 9, "max_norm": 0.05},
]


@pytest.fixture(scope="module")
def four(tmp_path_factory):
    return H.spawn(SCENARIOS, str(tmp_path_factory.mktemp("grad4")), world=4, per_node=1)


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
