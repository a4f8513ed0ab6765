"""The pure policy, as tables: results + node labels + settings -> operation, reason, conditions."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from gpu_monitor.config import parse_config
from gpu_monitor.model import Action, Result, Status
from gpu_monitor.remediate.conditions import PROBLEM_CLASSES, condition_type
from gpu_monitor.remediate.policy import (
    EXCLUDE_LABEL,
    Op,
    PolicySettings,
    PolicyState,
    decide,
    gpu_indices,
    observe,
    op_for,
)

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
SETTINGS = PolicySettings(hysteresis_polls=3, hysteresis_s=300.0,
                          problem_classes=PROBLEM_CLASSES)


def r(check="xid", status=Status.FAILED, target="gpu:3", reason="Xid79", action=Action.REBOOT,
      at=T0, message=""):
    return Result(check=check, status=status, target=target, reason=reason, action=action,
                  observed_at=at, message=message)


def state_of(*batches):
    st = PolicyState()
    for b in batches:
        st = observe(st, b if isinstance(b, list) else [b])
    return st


# --- one result -> one operation ------------------------------------------------------------------

ONE_RESULT = [
    # (id, result, expected op)
    ("failed reboot xid reboots", r(), Op.REBOOT),
    ("failed reset_gpu resets", r(reason="Xid48", action=Action.RESET_GPU), Op.RESET_GPU),
    ("failed replace replaces", r(reason="Xid64", action=Action.REPLACE), Op.REPLACE),
    ("failed with no suggestion still cordons", r(check="inventory", target="node",
                                                   reason="DriverTooOld", action=Action.NONE),
     Op.CORDON),
    ("failed watch is an event", r(reason="Xid94", action=Action.WATCH), Op.EVENT),
    ("degraded watch is an event", r(status=Status.DEGRADED, reason="Xid92", action=Action.WATCH),
     Op.EVENT),
    ("degraded none is an event", r(status=Status.DEGRADED, reason="Hot", action=Action.NONE),
     Op.EVENT),
    ("degraded reset waits (event) on first sight",
     r(check="ecc_memory", status=Status.DEGRADED, reason="RowRemapPending",
       action=Action.RESET_GPU), Op.EVENT),
    ("unknown never acts", r(status=Status.UNKNOWN, reason="NvmlReadError", action=Action.REPLACE),
     None),
    ("ok clears", r(status=Status.OK, reason="Ok", action=Action.NONE), None),
    ("skipped clears", r(status=Status.SKIPPED, reason="Ok", action=Action.NONE), None),
]


@pytest.mark.parametrize("result,want", [c[1:] for c in ONE_RESULT], ids=[c[0] for c in ONE_RESULT])
def test_one_result_maps_to_its_operation(result, want):
    d = decide(state_of(result), SETTINGS, T0)
    assert d.op == want
    assert d.quarantine == (want is not None and want.quarantines)


def test_unknown_alone_never_acts_but_a_failure_next_to_it_does():
    unknown = r(check="nvlink_state", status=Status.UNKNOWN, target="nvlink:0:1",
                reason="NvmlReadError", action=Action.RESET_GPU)
    d = decide(state_of(unknown), SETTINGS, T0)
    assert d.op is None and d.suppressed[0][1].startswith("unknown")
    d = decide(state_of([unknown, r()]), SETTINGS, T0)
    assert d.op is Op.REBOOT and d.reason == "Xid79"


# --- hysteresis ------------------------------------------------------------------------------------

def remap(at):
    return r(check="ecc_memory", status=Status.DEGRADED, target="gpu:1", reason="RowRemapPending",
             action=Action.RESET_GPU, at=at)


HYSTERESIS = [
    # (id, observation offsets in seconds, decide at, expected op)
    ("3 polls over 300 s escalate", [0, 150, 300], 300, Op.RESET_GPU),
    ("3 polls in 10 s wait for the time", [0, 5, 10], 10, Op.EVENT),
    ("3 polls, decided after 300 s, escalate", [0, 5, 10], 301, Op.RESET_GPU),
    ("2 polls over an hour wait for the count", [0, 3600], 3600, Op.EVENT),
    ("1 poll never escalates", [0], 10_000, Op.EVENT),
]


@pytest.mark.parametrize("offsets,at,want", [c[1:] for c in HYSTERESIS],
                         ids=[c[0] for c in HYSTERESIS])
def test_degraded_signal_escalates_only_after_n_polls_and_t_seconds(offsets, at, want):
    st = state_of(*[remap(T0 + timedelta(seconds=s)) for s in offsets])
    d = decide(st, SETTINGS, T0 + timedelta(seconds=at))
    assert d.op is want
    assert d.triggers[0].wanted is Op.RESET_GPU


def test_a_clean_poll_restarts_the_hysteresis():
    st = state_of(remap(T0), remap(T0 + timedelta(seconds=200)),
                  Result(check="ecc_memory", status=Status.OK, target="gpu:1",
                         observed_at=T0 + timedelta(seconds=250)),
                  remap(T0 + timedelta(seconds=300)), remap(T0 + timedelta(seconds=400)))
    assert st.signals["ecc_memory|gpu:1|RowRemapPending"].polls == 2
    assert decide(st, SETTINGS, T0 + timedelta(seconds=700)).op is Op.EVENT


def test_a_failed_result_skips_the_hysteresis():
    assert decide(state_of(r(reason="Xid48", action=Action.RESET_GPU)), SETTINGS, T0).op \
        is Op.RESET_GPU


# --- standing results ------------------------------------------------------------------------------

def test_an_observation_replaces_only_its_own_check_and_target():
    st = state_of(r(target="gpu:3"), r(target="gpu:5", reason="Xid48", action=Action.RESET_GPU))
    st = observe(st, [r(status=Status.OK, target="gpu:5", reason="Ok", action=Action.NONE)])
    assert [(x.target, x.reason) for x in st.standing] == [("gpu:3", "Xid79")]
    assert st.seen == {"xid"}


def test_several_reasons_of_one_target_stand_together_and_clear_together():
    a = r(check="ecc_memory", reason="RowRemapPending", action=Action.RESET_GPU, target="gpu:0")
    b = r(check="ecc_memory", reason="RetiredPagesPending", action=Action.REBOOT, target="gpu:0")
    st = state_of([a, b])
    assert len(st.standing) == 2 and decide(st, SETTINGS, T0).op is Op.REBOOT
    st = observe(st, [a])
    assert [x.reason for x in st.standing] == ["RowRemapPending"]


def test_state_round_trips_through_json():
    st = state_of(remap(T0), remap(T0 + timedelta(seconds=5)), r())
    again = PolicyState.from_json(st.to_json())
    assert again.to_json() == st.to_json()
    assert decide(again, SETTINGS, T0).op is Op.REBOOT


def test_without_forgets_results_and_signals_of_the_named_checks():
    st = state_of(remap(T0), r())
    assert [x.check for x in st.without(["xid"]).standing] == ["ecc_memory"]
    assert st.without(["ecc_memory"]).signals == {}
    assert st.without().standing == () and st.without().seen == st.seen


# --- configuration ---------------------------------------------------------------------------------

OVERRIDES = [
    # (id, overrides, result, expected op)
    ("check/reason beats the action", {"xid/Xid79": "drain"}, r(), Op.DRAIN),
    ("reason beats check", {"Xid79": "cordon", "xid": "replace"}, r(), Op.CORDON),
    ("check-wide setting", {"xid": "event"}, r(), Op.EVENT),
    ("check/reason beats reason", {"xid/Xid79": "replace", "Xid79": "event"}, r(), Op.REPLACE),
    ("ignore drops the finding", {"Xid79": "ignore"}, r(), None),
    ("another reason is untouched", {"Xid48": "ignore"}, r(), Op.REBOOT),
]


@pytest.mark.parametrize("overrides,result,want", [c[1:] for c in OVERRIDES],
                         ids=[c[0] for c in OVERRIDES])
def test_configuration_overrides_most_specific_first(overrides, result, want):
    settings = PolicySettings(overrides=overrides)
    assert op_for(result, settings) == want
    assert decide(state_of(result), settings, T0).op == want


def test_unknown_operation_in_the_configuration_is_refused():
    with pytest.raises(ValueError, match="unknown remediation operation"):
        PolicySettings(overrides={"Xid79": "nuke"})


def test_settings_come_from_the_config_file():
    cfg = parse_config({"remediation": {"hysteresis_polls": 5, "hysteresis_s": 30},
                        "checks": {"throttle": {"observe_only": True},
                                   "xid": {"remediation": {"Xid79": "drain"}},
                                   "pcie": {"remediation": "event"}}}, env={})
    s = PolicySettings.from_config(cfg)
    assert (s.hysteresis_polls, s.hysteresis_s) == (5, 30.0)
    assert s.observe_only == {"throttle"}
    assert dict(s.overrides) == {"xid/Xid79": "drain", "pcie": "event"}


def test_observe_only_check_is_reported_but_never_acts():
    settings = PolicySettings(observe_only=frozenset({"xid"}))
    d = decide(state_of(r()), settings, T0)
    assert d.op is None and d.suppressed[0][1] == "observe-only check"


def test_excluded_node_is_capped_at_an_event():
    d = decide(state_of(r()), SETTINGS, T0, node_labels={EXCLUDE_LABEL: "true"})
    assert d.excluded and d.op is Op.EVENT and not d.quarantine and not d.clear
    d = decide(state_of(r()), SETTINGS, T0, node_labels={EXCLUDE_LABEL: "false"})
    assert d.op is Op.REBOOT


# --- what the decision carries ---------------------------------------------------------------------

def test_most_severe_finding_names_the_reason_and_comes_first():
    st = state_of([r(target="gpu:1", reason="Xid48", action=Action.RESET_GPU),
                   r(target="gpu:2", reason="Xid64", action=Action.REPLACE),
                   r(target="gpu:3", reason="Xid94", action=Action.WATCH)])
    d = decide(st, SETTINGS, T0)
    assert d.op is Op.REPLACE and d.reason == "Xid64"
    assert [f.result.reason for f in d.triggers] == ["Xid64", "Xid48", "Xid94"]
    assert [f.result.reason for f in d.at_least(Op.RESET_GPU)] == ["Xid64", "Xid48"]


def test_conditions_one_per_problem_class_true_while_present_false_once_cleared():
    st = state_of([r(), r(check="pcie_aer", target="pcie:0000:3b:00.0", reason="AerFatal",
                          action=Action.RESET_GPU)],
                  [Result(check="temperature", status=Status.OK, target="gpu:0", observed_at=T0)])
    conds = {c.type: c for c in decide(st, SETTINGS, T0).conditions}
    assert (conds["GPUXidError"].status, conds["GPUXidError"].reason) == ("True", "Xid79")
    assert conds["GPUPCIeError"].status == "True"
    assert (conds["GPUThermalProblem"].status, conds["GPUThermalProblem"].reason) == \
        ("False", "NoProblem")
    st = observe(st, [r(status=Status.OK, reason="Ok", action=Action.NONE)])
    conds = {c.type: c for c in decide(st, SETTINGS, T0).conditions}
    assert conds["GPUXidError"].status == "False"


def test_a_pending_degraded_signal_does_not_set_its_condition_yet():
    conds = {c.type: c for c in decide(state_of(remap(T0)), SETTINGS, T0).conditions}
    assert conds["GPUMemoryError"].status == "False"


def test_unlisted_checks_share_the_generic_condition():
    assert condition_type("my_plugin") == "GPUProblem"
    assert condition_type("nvswitch") == condition_type("nvlink_state") == "GPUFabricError"


GPUS = [
    ("gpu targets", ["gpu:3", "gpu:1", "gpu:3"], [1, 3]),
    ("a node-wide finding means every GPU", ["gpu:3", "node"], None),
    ("an nvswitch finding means every GPU", ["nvswitch:0"], None),
]


@pytest.mark.parametrize("targets,want", [c[1:] for c in GPUS], ids=[c[0] for c in GPUS])
def test_gpu_indices_of_the_findings(targets, want):
    st = state_of([r(target=t, reason="Xid48", action=Action.RESET_GPU) for t in targets])
    assert gpu_indices(decide(st, SETTINGS, T0).triggers) == want


def test_the_op_ladder_follows_the_action_ladder():
    """One order: ``Op``'s declaration order is its severity, and a result suggesting a more
    severe action (model.ACTION_SEVERITY, from ``watch`` up) never gets a lesser op. (``none``
    on a failed result is the one rule apart: it still cordons.)"""
    from gpu_monitor.model import ACTION_SEVERITY

    assert [op.severity for op in Op] == list(range(1, len(Op) + 1))
    ladder = sorted((a for a in Action if ACTION_SEVERITY[a] >= ACTION_SEVERITY[Action.WATCH]),
                    key=ACTION_SEVERITY.__getitem__)
    for status in (Status.FAILED, Status.DEGRADED):
        ops = [op_for(Result(check="xid", status=status, target="gpu:0", reason="Xid79",
                             action=a), PolicySettings()) for a in ladder]
        assert [o.severity for o in ops] == sorted(o.severity for o in ops), (status, ops)
