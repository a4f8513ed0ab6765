"""Bad input: clear errors or documented verdicts, never a hang.

Real gloo processes again (a hang would show up as the pytest-timeout and the gloo timeout, not
as a pass). Every error a scenario expects must be raised on *every* rank: a rank that raised
alone would leave the others waiting in a collective.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from gpu_monitor.sdc import Schedule, attach, train
from tests.sdc import sdc_harness as H

pytestmark = pytest.mark.timeout(600)

S = {"audit_every": 10, "check_every": 10, "ckpt_every": 20, "peer_offset": 2}

SIX = [
    {"name": "rebuild_returns_other_data", "sched": S, "steps": 12, "rebuild": "different"},
    {"name": "unused_params_deterministic", "sched": dict(S, audit_every=2), "steps": 12,
     "unused": True},
    {"name": "replay_raises_on_one_rank", "sched": S, "steps": 12, "rebuild": "raises_on_2"},
    {"name": "same_node_layout", "sched": dict(S, peer_offset=1), "steps": 3},
    {"name": "single_node_transient", "env": {"NODE_NAME": "gpu-node"},
     "sched": dict(S, audit_every=5, peer_offset=6), "steps": 6,
     "faults": [{"type": "forward", "ranks": [3], "scope": "own", "at": 4}]},
    {"name": "slurm_layout_refused", "env": {"NODE_NAME": None, "SLURMD_NODENAME": "slurm{node}"},
     "sched": dict(S, peer_offset=1), "steps": 2},
    {"name": "peer_offset_not_ranks_per_node", "sched": dict(S, peer_offset=4), "steps": 2},
    {"name": "scaler_skips_nan_step", "sched": S, "steps": 12, "scaler": True,
     "faults": [{"type": "forward", "ranks": [3], "value": "nan", "scope": "own", "at": 5}]},
    {"name": "double_attach", "kind": "double_attach"},
    {"name": "dtype_mix_agree", "kind": "divergent"},
    {"name": "dtype_mix_rank4_differs", "kind": "divergent", "differ": [(4, 1, 7.0)]},
    {"name": "dtype_mix_split", "kind": "divergent",
     "differ": [(0, 0, 9.0), (1, 0, 9.0), (2, 0, 9.0)]},
    {"name": "unequal_tensor_counts", "kind": "divergent", "extra_tensor_on": 5},
    {"name": "unsupported_dtype", "kind": "divergent", "complex128": True},
]

TWO = [
    {"name": "w2_weight_corruption", "sched": {"audit_every": 0, "check_every": 5,
                                               "ckpt_every": 0, "peer_offset": 1},
     "steps": 10, "faults": [{"type": "weight", "ranks": [1], "at": 2, "edit": "bitflip22"}]},
    {"name": "w2_persistent_compute_fault", "sched": {"audit_every": 5, "check_every": 5,
                                                      "ckpt_every": 0, "peer_offset": 1},
     "steps": 10, "faults": [{"type": "forward", "ranks": [1], "from": 2}]},
    {"name": "w2_nan_once", "sched": {"audit_every": 5, "check_every": 5, "ckpt_every": 0,
                                      "peer_offset": 1},
     "steps": 10, "faults": [{"type": "forward", "ranks": [1], "value": "nan", "scope": "own",
                              "at": 2}]},
]


@pytest.fixture(scope="module")
def six(tmp_path_factory):
    return H.spawn(SIX, str(tmp_path_factory.mktemp("bad6")), world=6, per_node=2)


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    return H.spawn(TWO, str(tmp_path_factory.mktemp("bad2")), world=2, per_node=1)


def ok(per_rank):
    for r, res in enumerate(per_rank):
        assert "error" not in res, f"rank {r}: {res.get('trace')}"
    first = per_rank[0]
    return first


def errors(per_rank):
    return [res.get("error") for res in per_rank]


def test_rebuild_batch_returning_other_data_names_no_rank_and_says_software(six):
    runs = six["rebuild_returns_other_data"]
    a = ok(runs)["alarm"]
    assert all(res["alarm"] == a for res in runs)
    assert a["step"] == 9 and a["check"] == "compute"
    assert len(a["mismatched_pairs"]) == 6
    assert a["culprits"] == [] and a["named"] == []
    assert "software" in a["note"] and "rebuild_batch" in a["note"]


def test_unused_parameters_in_deterministic_mode_raise_no_false_alarm(six):
    runs = six["unused_params_deterministic"]
    assert ok(runs)["alarm"] is None
    assert all(res["applied"] == list(range(12)) for res in runs)


def test_a_replay_that_raises_on_one_rank_raises_on_every_rank(six):
    errs = errors(six["replay_raises_on_one_rank"])
    assert all(e and e.startswith("ReplayFailed") and "[2]" in e for e in errs), errs
    assert "lost its shard" in errs[2]


def test_replayer_on_the_targets_node_is_refused_on_every_rank(six):
    errs = errors(six["same_node_layout"])
    assert all(e and e.startswith("ValueError: SDC ring layout refused") for e in errs), errs
    assert all("node0" in e for e in errs)


def test_the_refusal_says_where_the_node_names_came_from(six):
    errs = errors(six["same_node_layout"])
    assert all("node names from $NODE_NAME" in e for e in errs), errs
    errs = errors(six["slurm_layout_refused"])
    assert all(e and e.startswith("ValueError: SDC ring layout refused") for e in errs), errs
    assert all("node names from $SLURMD_NODENAME" in e and "slurm0" in e for e in errs), errs


def test_the_refusal_names_the_host_name_fallback_and_the_downward_api():
    from gpu_monitor.sdc.topology import HOSTNAME_SOURCE, node_identity, refusal_message

    assert node_identity({"NODE_NAME": "n1", "SLURMD_NODENAME": "s1"}) == ("n1", "$NODE_NAME")
    assert node_identity({"SLURMD_NODENAME": "s1"}) == ("s1", "$SLURMD_NODENAME")
    assert node_identity({})[1] == HOSTNAME_SOURCE
    text = refusal_message(["rank 1 would replay rank 0"], [HOSTNAME_SOURCE] * 2, 2, 1)
    assert "host name ($NODE_NAME and $SLURMD_NODENAME unset)" in text
    assert "downward API" in text


def test_a_group_on_one_node_is_audited_across_its_gpus_and_says_so(six):
    runs = six["single_node_transient"]
    a = ok(runs)["alarm"]
    assert all(res["alarm"] == a for res in runs)
    # peer_offset=6 on 6 ranks would replay themselves: on one node the ring goes to the next GPU
    assert a["step"] == 4 and a["check"] == "compute" and a["single_node"] is True
    assert a["mismatched_pairs"] == [(3, 2)]
    assert a["verdicts"] == [{"pair": (3, 2), "third": 4, "suspect": 3, "kind": "transient"}]
    assert a["named"] == [3]
    assert "not independent across nodes" in a["note"]


def test_a_peer_offset_other_than_the_ranks_per_node_warns_but_runs(six):
    runs = six["peer_offset_not_ranks_per_node"]
    assert ok(runs)["alarm"] is None
    assert any("peer_offset=4" in w and "2 ranks per node" in w for w in runs[0]["warnings"])
    assert all(res["applied"] == [0, 1] for res in runs)


def test_a_step_the_grad_scaler_skips_is_not_an_alarm(six):
    runs = six["scaler_skips_nan_step"]
    assert ok(runs)["alarm"] is None
    for res in runs:
        assert 5 not in res["applied"] and len(res["applied"]) == 11


def test_mixed_dtypes_and_layouts_agree(six):
    res = ok(six["dtype_mix_agree"])["result"]
    assert res == {"diverged": False, "suspects": [], "tensors": []}


def test_one_rank_differing_in_a_fp16_tensor_is_the_suspect(six):
    runs = six["dtype_mix_rank4_differs"]
    res = ok(runs)["result"]
    assert all(r["result"] == res for r in runs)
    assert res == {"diverged": True, "suspects": [4], "tensors": [1]}


def test_an_even_split_has_no_strict_majority_and_no_suspect(six):
    res = ok(six["dtype_mix_split"])["result"]
    assert res == {"diverged": True, "suspects": None, "tensors": [0]}


def test_unequal_tensor_counts_raise_on_every_rank(six):
    errs = errors(six["unequal_tensor_counts"])
    assert all(e and e.startswith("ValueError") and "different numbers" in e for e in errs), errs


def test_unsupported_dtype_raises_before_any_collective(six):
    errs = errors(six["unsupported_dtype"])
    assert all(e and e.startswith("TypeError") and "complex128" in e for e in errs), errs


def test_world_of_two_weight_divergence_has_no_majority_and_no_suspect(two):
    runs = two["w2_weight_corruption"]
    a = ok(runs)["alarm"]
    assert a["check"] == "weights" and a["step"] == 4
    assert a["suspects"] is None and a["named"] == []
    assert "no strict majority" in a["note"]


def test_world_of_two_compute_fault_is_unattributable(two):
    a = ok(two["w2_persistent_compute_fault"])["alarm"]
    assert a["check"] == "compute" and a["step"] == 4
    assert a["mismatched_pairs"] == [(0, 1), (1, 0)]
    assert a["culprits"] == []  # a ring of two cannot single out one rank
    assert [v["kind"] for v in a["verdicts"]] == ["unattributable", "unattributable"]
    assert all(v["third"] is None and v["suspect"] is None for v in a["verdicts"])
    assert "unattributable" in a["note"]


def test_world_of_two_nan_is_still_named_by_the_nonfinite_check(two):
    a = ok(two["w2_nan_once"])["alarm"]
    assert a["step"] == 2 and a["nonfinite"] == [1] and a["named"] == [1]
    assert a["verdicts"] == [{"pair": (1, 0), "third": None, "suspect": None,
                              "kind": "unattributable"}]


def test_attaching_twice_or_over_another_hook_says_what_to_do(six):
    for res in six["double_attach"]:
        assert "error" not in res, res.get("trace")
        assert res["twice"].startswith("gpu_monitor.sdc.attach: this DDP model is already attached")
        assert "keep the GradStats" in res["twice"]
        assert "already has one" in res["other_hook"] and "only be called once" in res["other_hook"]


def test_attach_refuses_a_model_that_is_not_ddp():
    with pytest.raises(TypeError, match="DistributedDataParallel"):
        attach(nn.Linear(2, 2))


def test_train_refuses_a_model_that_is_not_ddp():
    m = nn.Linear(2, 2)
    with pytest.raises(TypeError, match="DistributedDataParallel"):
        train(m, None, torch.optim.SGD(m.parameters(), lr=0.1), [], None, None, None, Schedule())
