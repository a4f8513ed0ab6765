"""The pure ring/vote logic: tables of outcomes, no processes, no torch."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gpu_monitor.sdc import localize as L


def ring_results(n, off, faulty=(), transient=(), replay_only=()):
    """Own and replay results as a world with the given faulty ranks would produce them.

    A healthy computation of rank t's micro-batch gives ``("ok", t)``; a faulty rank gives
    ``("bad", rank, t)`` for whatever it computes (persistent), its own work only (transient),
    or its replays only.
    """
    own, rep = [], []
    for r in range(n):
        own.append(("bad", r, r) if r in faulty or r in transient else ("ok", r))
        t = L.target_of(r, n, off)
        rep.append(("bad", r, t) if r in faulty or r in replay_only else ("ok", t))
    return own, rep


def test_ring_pairs_replayer_with_the_rank_peer_offset_ahead():
    assert [L.target_of(r, 6, 2) for r in range(6)] == [2, 3, 4, 5, 0, 1]
    assert [L.replayer_of(t, 6, 2) for t in range(6)] == [4, 5, 0, 1, 2, 3]


@pytest.mark.parametrize(
    "faulty, transient, replay_only, pairs, culprits, ambiguous",
    [
        ((), (), (), [], [], []),
        ((3,), (), (), [(3, 1), (5, 3)], [3], []),
        ((), (3,), (), [(3, 1)], [], [(3, 1)]),
        ((), (), (2,), [(4, 2)], [], [(4, 2)]),  # a wrong replay alone: ambiguous
        ((1, 4), (), (), [(0, 4), (1, 5), (3, 1), (4, 2)], [1, 4], []),
        ((3,), (0,), (), [(0, 4), (3, 1), (5, 3)], [3], [(0, 4)]),
    ],
    ids=["healthy", "persistent", "transient", "replay-only", "two-faulty", "mixed"],
)
def test_localize_six_ranks_offset_two(faulty, transient, replay_only, pairs, culprits, ambiguous):
    own, rep = ring_results(6, 2, faulty, transient, replay_only)
    got = L.mismatched_pairs(own, rep, 2)
    assert got == pairs
    loc = L.localize(got, 6, 2)
    assert list(loc.culprits) == culprits
    assert list(loc.ambiguous) == ambiguous
    assert loc.note is None


def test_more_than_half_culprits_names_nobody_and_blames_software():
    own = [("own", r) for r in range(6)]
    rep = [("other data", r) for r in range(6)]
    loc = L.localize(L.mismatched_pairs(own, rep, 2), 6, 2)
    assert len(loc.pairs) == 6 and loc.culprits == () and loc.ambiguous == ()
    assert "software" in loc.note


def test_documented_limit_two_faulty_ranks_two_ring_steps_apart_implicate_the_one_between():
    # ring 0 -> 2 -> 4 -> 0 (n=6, offset 2): faulty 0 and 2 make healthy 4 look like a culprit,
    # because its replayer (2) and its target (0) both computed wrong (docs/sdc.md)
    own, rep = ring_results(6, 2, faulty=(0, 2))
    loc = L.localize(L.mismatched_pairs(own, rep, 2), 6, 2)
    assert list(loc.culprits) == [0, 2, 4]


def test_a_ring_cycle_of_two_cannot_single_out_a_rank():
    own, rep = ring_results(2, 1, faulty=(1,))
    loc = L.localize(L.mismatched_pairs(own, rep, 1), 2, 1)
    assert loc.culprits == () and list(loc.ambiguous) == [(0, 1), (1, 0)]


@pytest.mark.parametrize(
    "target, replayer, n, off, nodes, third",
    [
        (3, 1, 6, 2, ["a", "a", "b", "b", "c", "c"], 5),  # target + offset: a third node
        (0, 4, 6, 2, ["a", "a", "b", "b", "c", "c"], 2),
        (0, 2, 4, 2, ["a", "a", "b", "b"], 3),  # t+2 is the replayer: any rank off t's node
        (0, 1, 2, 1, ["a", "b"], None),  # a world of 2 has no third
        (0, 1, 3, 1, None, 2),  # probe: every device its own node
        (0, 2, 3, 1, ["a", "a", "b"], None),  # the only other rank shares the target's node
    ],
)
def test_choose_third(target, replayer, n, off, nodes, third):
    assert L.choose_third(target, replayer, n, off, nodes) == third


@pytest.mark.parametrize(
    "original, replay, third, recompute, expected",
    [
        ("o", "r", "o", "o", ("replayer", "replayer computed wrong")),
        ("o", "r", "r", "o", ("target", "persistent")),
        ("o", "r", "r", "r", ("target", "transient")),
        ("o", "r", "r", "x", ("target", "unclear")),
        ("o", "r", "x", "o", (None, "unattributable")),
    ],
)
def test_classify_a_confirmed_pair(original, replay, third, recompute, expected):
    assert L.classify(original, replay, third, recompute) == expected


def test_confirmation_round_end_to_end_for_a_transient_and_a_faulty_replayer():
    n, off = 6, 2
    nodes = ["a", "a", "b", "b", "c", "c"]
    own, rep = ring_results(n, off, transient=(3,), replay_only=(0,))
    loc = L.localize(L.mismatched_pairs(own, rep, off), n, off)
    assert list(loc.ambiguous) == [(2, 0), (3, 1)]
    plans = L.plan_confirmations(loc.ambiguous, n, off, nodes)
    assert plans == [L.Confirmation((2, 0), 4), L.Confirmation((3, 1), 5)]
    work = {r: L.confirmation_work(plans, r) for r in range(n)}
    assert work == {0: [], 1: [], 2: [("recompute", 2)], 3: [("recompute", 3)],
                    4: [("replay", 2)], 5: [("replay", 3)]}
    healthy = {(r, k, t): ("ok", t) for r, w in work.items() for k, t in w}
    got = L.verdicts(plans, own, rep, healthy, n, off)
    assert got == [
        {"pair": (2, 0), "third": 4, "suspect": 0, "kind": "replayer computed wrong"},
        {"pair": (3, 1), "third": 5, "suspect": 3, "kind": "transient"},
    ]


def test_a_pair_without_a_third_is_unattributable_and_costs_no_work():
    plans = L.plan_confirmations([(0, 1)], 2, 1, ["a", "b"])
    assert L.confirmation_work(plans, 0) == [] and L.confirmation_work(plans, 1) == []
    assert L.verdicts(plans, ["o", "o2"], ["r", "r2"], {}, 2, 1) == [
        {"pair": (0, 1), "third": None, "suspect": None, "kind": "unattributable"}
    ]


@pytest.mark.parametrize(
    "values, winner",
    [([1, 1, 2], 1), ([1, 2], None), ([1, 1, 2, 2], None), ([3], 3), ([], None),
     ([1, 2, 1, 2, 1], 1)],
)
def test_strict_majority(values, winner):
    assert L.majority(values) == winner


def test_divergent_ranks_names_minority_holders_per_tensor():
    ok = [("a", "b", "c")] * 5
    rows = [list(r) for r in ok]
    rows[1][0] = "x"  # rank 1 differs on tensor 0
    rows[4][2] = "y"  # rank 4 differs on tensor 2
    assert L.divergent_ranks(rows) == (True, [1, 4], [0, 2])
    assert L.divergent_ranks(ok) == (False, [], [])
    assert L.divergent_ranks([["a"], ["b"]]) == (True, None, [0])


def test_divergent_ranks_refuses_ragged_input():
    with pytest.raises(ValueError, match="different numbers"):
        L.divergent_ranks([["a"], ["a", "b"]])


@pytest.mark.parametrize(
    "nodes, off, fragment",
    [
        (["a", "a", "b", "b", "c", "c"], 2, None),
        (["a", "a", "b", "b", "c", "c"], 1, "both are on node 'a'"),
        (["a", "a", "b", "b"], 4, "multiple of the world size"),
        (["a"], 1, "at least 2 ranks"),
        (["a", "b"], 1, None),
        (["a"] * 8, 8, None),  # one node: accepted, the ring runs across its GPUs
        (["a", "a", "a", "b"], 1, "both are on node 'a'"),
    ],
)
def test_topology_problems(nodes, off, fragment):
    problems = L.topology_problems(nodes, off)
    if fragment is None:
        assert problems == []
    else:
        assert any(fragment in p for p in problems), problems


def test_on_one_node_the_ring_goes_to_the_next_gpu_when_peer_offset_would_replay_itself():
    assert L.single_node(["a"] * 8) and not L.single_node(["a"]) and not L.single_node(["a", "b"])
    assert L.ring_offset(["a"] * 8, 8) == 1 and L.ring_offset(["a"] * 8, 3) == 3
    assert L.ring_offset(["a", "a", "b", "b"], 2) == 2
    assert L.ranks_per_node(["a", "a", "b", "b"]) == 2 and L.ranks_per_node(["a", "b", "b"]) is None


def test_software_problem_threshold():
    assert not L.software_problem([1, 2, 3], 6)
    assert L.software_problem([0, 1, 2, 3], 6)


def test_the_pure_modules_do_not_import_torch():
    code = (
        "import sys, gpu_monitor, gpu_monitor.sdc, gpu_monitor.sdc.localize, "
        "gpu_monitor.sdc.report, gpu_monitor.sdc.schedule; print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
