"""The bisection planner, table-tested against oracles that know the bad nodes."""

from __future__ import annotations

import itertools

import pytest

from gpu_monitor.fabric.bisect import (
    ABANDONED,
    FAIL,
    PASS,
    Bisection,
    PlannedProbe,
    bisect,
    probe_bound,
)

NODES8 = tuple(f"n{i}" for i in range(8))


def oracle_for(bad, log=None):
    def oracle(nodes):
        if log is not None:
            log.append(tuple(nodes))
        return not (set(nodes) & set(bad))
    return oracle


@pytest.mark.parametrize("bad", [(n,) for n in NODES8])
@pytest.mark.parametrize("known_good", [(), ("g0",)])
def test_one_bad_node_among_eight_is_named_within_the_bound(bad, known_good):
    probes = []
    res = bisect(NODES8, oracle_for(bad, probes), known_good=known_good)
    assert res.bad == bad
    assert res.inconclusive == ()
    assert set(res.cleared) == set(NODES8) - set(bad)
    assert len(probes) <= probe_bound(8) == 6
    # Every probe crosses nodes, and a node is blamed only by a pair with a cleared node.
    assert all(len(p) >= 2 for p in probes)
    blamer = [r for r in res.probes if r.outcome == FAIL and r.probe.is_pair]
    assert blamer and blamer[-1].probe.subject == bad
    assert blamer[-1].probe.partner in set(known_good) | set(res.cleared)


@pytest.mark.parametrize("n", [2, 3, 5, 8, 13, 16, 32])
def test_the_bound_holds_for_any_group_size_and_position(n):
    nodes = [f"x{i}" for i in range(n)]
    for b in nodes:
        probes = []
        res = bisect(nodes, oracle_for({b}, probes), known_good=["good"])
        assert res.bad == (b,)
        assert len(probes) <= probe_bound(n)


@pytest.mark.parametrize("bad", list(itertools.combinations(NODES8, 2))[::5])
def test_two_bad_nodes_are_both_named(bad):
    probes = []
    res = bisect(NODES8, oracle_for(bad, probes), known_good=["g"])
    assert set(res.bad) == set(bad)
    assert len(probes) <= probe_bound(8, bad=2)


def test_every_node_failing_costs_at_most_the_whole_split_tree():
    probes = []
    res = bisect(NODES8, oracle_for(NODES8, probes), known_good=["g"])
    assert len(probes) <= 2 * 8 - 2
    assert res.bad == ()  # nothing passed: the partner is as suspect as anyone


def test_seven_bad_of_eight_are_named_when_one_passes():
    bad = set(NODES8) - {"n4"}
    res = bisect(NODES8, oracle_for(bad), known_good=["g"])
    assert set(res.bad) == bad and res.cleared == ("n4",)


def test_suspects_named_by_the_probe_are_confirmed_first():
    probes = []
    res = bisect(NODES8, oracle_for({"n6"}, probes), known_good=["g"], suspects=["n6"])
    assert res.bad == ("n6",)
    assert probes == [("n6", "g"), ("n0", "n1", "n2", "n3", "n4", "n5", "n7", "g")]


def test_a_wrong_suspect_does_not_hide_the_real_bad_node():
    res = bisect(NODES8, oracle_for({"n1"}), known_good=["g"], suspects=["n6"])
    assert res.bad == ("n1",)
    assert "n6" in res.cleared


def test_without_any_partner_a_two_node_group_is_inconclusive_never_blamed():
    res = bisect(("a", "b"), oracle_for({"a"}))
    assert res.bad == () and set(res.inconclusive) == {"a", "b"}
    assert res.probes == ()


def test_a_failure_the_halves_do_not_reproduce_blames_nobody():
    """The fault needs the whole group (or was transient): every half passes."""
    res = bisect(NODES8, lambda nodes: True, known_good=["g"])
    assert res.bad == () and res.inconclusive == ()
    assert len(res.probes) == 2


def test_abandoned_probes_are_retried_then_left_inconclusive():
    calls = []

    def oracle(nodes):
        calls.append(nodes)
        return ABANDONED if "n0" in nodes else True

    res = bisect(("n0", "n1"), oracle, known_good=["g"], retries=1)
    assert res.bad == ()
    assert res.inconclusive == ("n0",)
    assert "n1" in res.cleared
    assert sum(1 for c in calls if "n0" in c) == 2  # tried, retried once


def test_the_cap_leaves_the_rest_inconclusive():
    res = bisect(NODES8, oracle_for({"n3"}), known_good=["g"], max_probes=2)
    assert res.bad == ()
    assert "n3" in res.inconclusive
    assert len(res.probes) == 2


def test_the_planner_waits_for_an_available_partner():
    plan = Bisection(("a", "b"), known_good=["g"])
    assert plan.next_probe(available={"a", "b"}) is None  # g is busy
    assert not plan.done
    p = plan.next_probe(available={"a", "b", "g"})
    assert p == PlannedProbe(("a",), "g")
    assert plan.next_probe() is None  # one probe at a time
    plan.record(p, FAIL)
    p = plan.next_probe()
    plan.record(p, PASS)
    assert plan.done and plan.result().bad == ("a",)


def test_record_refuses_unknown_outcomes_and_stray_probes():
    plan = Bisection(NODES8, known_good=["g"])
    p = plan.next_probe()
    with pytest.raises(ValueError):
        plan.record(p, "maybe")
    with pytest.raises(ValueError):
        plan.record(PlannedProbe(("zz",), "g"), PASS)


def test_abort_marks_what_is_left_inconclusive():
    plan = Bisection(NODES8, known_good=["g"])
    plan.next_probe()
    plan.abort()
    res = plan.result()
    assert plan.done and set(res.inconclusive) == set(NODES8) and res.bad == ()


def test_when_nothing_passes_nobody_is_blamed():
    """A broken partner (or probe) fails every pair: that must not blame every node."""
    res = bisect(("a", "b", "c", "d"), lambda nodes: False, known_good=["g"])
    assert res.bad == ()
    assert set(res.inconclusive) == {"a", "b", "c", "d"}
