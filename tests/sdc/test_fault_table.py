"""SPEC-SDC.md's fault table, reproduced on the CPU: 6 gloo processes = 3 nodes x 2 GPUs.

Scaled as the issue says: ranks -> processes, nodes -> pairs of processes (``NODE_NAME``),
``peer_offset = 2``, audits and weight checks every 10 steps, checkpoints every 20 unless a row
says otherwise. Step s is an audit step when (s + 1) % 10 == 0 (steps 9, 19, 29). The ring:
rank r replays rank r + 2; the confirming third of pair (t, r) is t + 2.

All scenarios run in one spawn (process start-up dominates on a 2-core machine); each test
asserts one row: the step, the check, the named ranks, the pairs and verdict kinds, the suspect
window, which steps were applied and which checkpoints were saved.
"""

from __future__ import annotations

import json

import pytest

from tests.sdc import sdc_harness as H

pytestmark = pytest.mark.timeout(600)

S = {"audit_every": 10, "check_every": 10, "ckpt_every": 20, "peer_offset": 2}
LOSS_ONLY = dict(S, deterministic_audits=False)


def fwd(ranks, value="x1000", scope="all", **when):
    return {"type": "forward", "ranks": ranks, "value": value, "scope": scope, **when}


SCENARIOS = [
    {"name": "nan_once", "sched": S, "steps": 30,
     "faults": [fwd([3], "nan", scope="own", at=13)], "report": None},
    {"name": "x1000_persistent", "sched": S, "steps": 30, "faults": [fwd([3], **{"from": 12})]},
    {"name": "x1000_persistent_loss_only", "sched": LOSS_ONLY, "steps": 30,
     "faults": [fwd([3], **{"from": 12})]},
    {"name": "x1000_on_audit_step", "sched": S, "steps": 30,
     "faults": [fwd([3], scope="own", at=19)]},
    {"name": "faulty_replayer", "sched": S, "steps": 30, "faults": [fwd([2], **{"from": 12})]},
    {"name": "backward_only_deterministic", "sched": S, "steps": 30,
     "faults": [{"type": "grad", "ranks": [3], "from": 12}]},
    {"name": "backward_only_loss_only", "sched": LOSS_ONLY, "steps": 30,
     "faults": [{"type": "grad", "ranks": [3], "from": 12}]},
    {"name": "two_faulty", "sched": S, "steps": 30, "faults": [fwd([1, 4], **{"from": 12})]},
    {"name": "bitflip_forced_check", "sched": dict(S, ckpt_every=5), "steps": 30,
     "faults": [{"type": "weight", "ranks": [3], "at": 11, "edit": "bitflip22"}]},
    {"name": "bitflip_no_forced_check",
     "sched": dict(S, ckpt_every=5, check_on_checkpoint=False), "steps": 30,
     "faults": [{"type": "weight", "ranks": [3], "at": 11, "edit": "bitflip22"}]},
    {"name": "swap", "sched": dict(S, audit_every=0), "steps": 30,
     "faults": [{"type": "weight", "ranks": [3], "at": 13, "edit": "swap"}]},
    {"name": "compensating", "sched": dict(S, audit_every=0), "steps": 30,
     "faults": [{"type": "weight", "ranks": [3], "at": 13, "edit": "compensate"}]},
    {"name": "reduced_nan", "sched": S, "steps": 30,
     "faults": [{"type": "reduced", "ranks": [3], "at": 13}]},
    {"name": "corrupt_after_restore", "sched": dict(S, ckpt_every=10), "steps": 10,
     "restore": {"ranks": [3], "edit": "bitflip22"}},
]

WORLD = 6


ACCUMULATED = "+accumulated"  # the same scenario with 2 micro-steps per step (no_sync first)


@pytest.fixture(scope="module")
def spawned(tmp_path_factory):
    """Every row twice in one spawn: one micro-batch per step, and gradient accumulation."""
    out = tmp_path_factory.mktemp("fault_table")
    scenarios = [dict(sc) for sc in SCENARIOS]
    scenarios[0]["report"] = str(out)
    scenarios += [dict(sc, name=sc["name"] + ACCUMULATED, micro=2, report=None)
                  for sc in SCENARIOS]
    results = H.spawn(scenarios, str(out), world=WORLD, per_node=2)
    for name, per_rank in results.items():
        for r, res in enumerate(per_rank):
            assert "error" not in res, f"{name} rank {r}: {res.get('trace')}"
    return results


@pytest.fixture(scope="module", params=["", ACCUMULATED], ids=["one-micro-batch", "accumulated"])
def table(request, spawned):
    """The rows of one variant, under the plain scenario names."""
    suffix = request.param
    return {sc["name"]: spawned[sc["name"] + suffix] for sc in SCENARIOS
            if sc["name"] + suffix in spawned}


def same_on_all_ranks(per_rank, key="alarm"):
    first = per_rank[0][key]
    assert all(res[key] == first for res in per_rank), [res[key] for res in per_rank]
    return first


def applied(per_rank):
    steps = per_rank[0]["applied"]
    assert all(res["applied"] == steps for res in per_rank)
    return steps


def test_nan_in_forward_once_is_named_by_the_nonfinite_check_and_confirmed_transient(table):
    runs = table["nan_once"]
    a = same_on_all_ranks(runs)
    assert a["step"] == 13 and a["check"] == "compute"
    assert a["nonfinite"] == [3]
    assert a["mismatched_pairs"] == [(3, 1)]  # the ring replay ran on a non-audit step too
    assert a["culprits"] == []
    assert a["verdicts"] == [{"pair": (3, 1), "third": 5, "suspect": 3, "kind": "transient"}]
    # from the step after the last passing audit (9): finite corruption before the NaN passes
    # check 1, so only an audit excludes it
    assert a["suspect_window"] == [10, 13] and a["last_audit_pass"] == 9
    assert a["named"] == [3]
    assert 13 not in applied(runs) and applied(runs) == list(range(13))
    assert all(res["saves"] == [] for res in runs)


def test_nan_alarm_report_names_the_node_of_rank_3(spawned):
    path = spawned["nan_once"][0]["report_path"]
    with open(path) as f:
        report = json.load(f)
    assert report["schema"] == 1 and report["check"] == "compute" and report["step"] == 13
    assert report["nodes"] == ["node1"]
    assert report["ranks"] == [
        {"rank": 3, "node": "node1", "gpu_uuid": None,
         "roles": ["nonfinite", "suspect:transient"]}
    ]
    assert report["suspect_window"] == [10, 13]


@pytest.mark.parametrize("name, audit", [("x1000_persistent", "deterministic"),
                                         ("x1000_persistent_loss_only", "loss")])
def test_persistent_x1000_passes_until_the_audit_which_names_the_rank(table, name, audit):
    runs = table[name]
    a = same_on_all_ranks(runs)
    assert a["step"] == 19 and a["check"] == "compute" and a["audit"] == audit
    assert a["mismatched_pairs"] == [(3, 1), (5, 3)]
    assert a["culprits"] == [3] and a["verdicts"] == [] and a["nonfinite"] == []
    assert a["suspect_window"] == [10, 19]
    assert a["last_audit_pass"] == 9
    assert applied(runs) == list(range(19))  # 12..18 were applied: finite faults pass check 1


def test_x1000_only_on_the_audit_step_gives_one_pair_confirmed_transient(table):
    runs = table["x1000_on_audit_step"]
    a = same_on_all_ranks(runs)
    assert a["step"] == 19 and a["check"] == "compute"
    assert a["mismatched_pairs"] == [(3, 1)]
    assert a["culprits"] == []
    assert a["verdicts"] == [{"pair": (3, 1), "third": 5, "suspect": 3, "kind": "transient"}]
    assert a["suspect_window"] == [10, 19]
    assert 19 not in applied(runs)


def test_persistent_fault_on_the_replayer_names_the_replayer_not_the_target(table):
    runs = table["faulty_replayer"]
    a = same_on_all_ranks(runs)
    # rank 2 replays rank 4: a single replay would have blamed the healthy rank 4
    assert a["step"] == 19
    assert a["mismatched_pairs"] == [(2, 0), (4, 2)]
    assert a["culprits"] == [2] and a["named"] == [2]
    assert 4 not in a["named"]


def test_backward_only_fault_is_caught_by_deterministic_audit_through_gradients(table):
    runs = table["backward_only_deterministic"]
    a = same_on_all_ranks(runs)
    assert a["step"] == 19 and a["check"] == "compute" and a["audit"] == "deterministic"
    assert a["mismatched_pairs"] == [(3, 1), (5, 3)]
    assert a["culprits"] == [3]
    assert a["suspect_window"] == [10, 19]


def test_backward_only_fault_passes_loss_only_audits_and_checkpoints_say_passed(table):
    runs = table["backward_only_loss_only"]
    assert same_on_all_ranks(runs) is None
    assert applied(runs) == list(range(30))
    for res in runs:  # by design: every replica applied the same wrong update
        assert res["saves"] == [(19, {"last_audit_pass": 19, "last_weight_check_pass": 19})]


def test_two_simultaneously_faulty_ranks_are_both_named(table):
    a = same_on_all_ranks(table["two_faulty"])
    assert a["step"] == 19
    assert a["mismatched_pairs"] == [(0, 4), (1, 5), (3, 1), (4, 2)]
    assert a["culprits"] == [1, 4]


def test_bit_flip_after_update_is_named_by_the_forced_check_and_the_save_is_blocked(table):
    runs = table["bitflip_forced_check"]
    a = same_on_all_ranks(runs)
    assert a["step"] == 14 and a["check"] == "weights"
    assert a["suspects"] == [3] and a["named"] == [3]
    assert a["suspect_window"] == [10, 14]
    assert a["applied"] is True and 14 in applied(runs)
    for res in runs:
        assert [s for s, _ in res["saves"]] == [4, 9]  # no save at 14


def test_without_the_forced_check_the_corrupted_save_happens_and_the_next_audit_names_it(table):
    runs = table["bitflip_no_forced_check"]
    for res in runs:
        assert [s for s, _ in res["saves"]] == [4, 9, 14]
    # the step-14 checkpoint of rank 3 holds different weights from every other replica's
    fp14 = [res["saved_fp"][14] for res in runs]
    assert fp14[3] != fp14[0] and fp14.count(fp14[0]) == 5
    a = same_on_all_ranks(runs)
    assert a["step"] == 19 and a["check"] == "compute"
    assert a["mismatched_pairs"] == [(3, 1), (5, 3)] and a["culprits"] == [3]
    assert a["suspect_window"] == [10, 19]


@pytest.mark.parametrize("name", ["swap", "compensating"])
def test_swap_or_compensating_weight_change_is_named_though_the_plain_sum_is_unchanged(table, name):
    runs = table[name]
    before, after = runs[3]["edits"][13]
    assert before[0] == after[0]  # plain bit-sum unchanged
    assert before[1] != after[1] and before[2] != after[2]
    a = same_on_all_ranks(runs)
    assert a["step"] == 19 and a["check"] == "weights"
    assert a["suspects"] == [3]
    assert a["suspect_window"] == [10, 19]


def test_weight_corrupted_after_restore_is_named_before_the_first_step(table):
    runs = table["corrupt_after_restore"]
    assert all(res["applied_before_restore"] == list(range(10)) for res in runs)
    a = same_on_all_ranks(runs)
    assert a["step"] == 10 and a["check"] == "weights"
    assert a["suspects"] == [3]
    assert a["suspect_window"] == [10, 10]
    assert a["applied"] is False
    assert applied(runs) == []  # nothing trained on the corrupted replica


def test_a_nan_in_one_ranks_reduced_gradient_names_no_rank_and_is_not_applied(table):
    runs = table["reduced_nan"]
    a = same_on_all_ranks(runs)
    assert a["step"] == 13 and a["check"] == "reduced gradient"
    assert a["nonfinite"] == [] and a["named"] == [] and a["mismatched_pairs"] == []
    assert a["suspect_window"] == [13, 13]
    assert applied(runs) == list(range(13))  # no rank stepped, not even the healthy ones


def test_no_collective_of_train_is_in_flight_when_it_returns(table):
    for name, runs in table.items():
        assert not any(res["in_flight_after"] for res in runs), name


def test_deterministic_settings_are_restored_after_every_run(table):
    for name, runs in table.items():
        assert all(res["det_restored"] for res in runs), name
