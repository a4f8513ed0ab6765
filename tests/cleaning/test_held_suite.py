"""HeldSuite: the cleaner's run of the bootstrap suite, on stand-in checks and a fake clock.
Only a run that ran every check and found it healthy is a pass."""

from __future__ import annotations

from gpu_monitor.check import Check
from gpu_monitor.cleaning.suite import (
    STOPPED_BUDGET,
    STOPPED_DAEMON,
    STOPPED_HOLD_LOST,
    STOPPED_NO_RUNTIME,
    HeldSuite,
)
from gpu_monitor.clock import FakeClock
from gpu_monitor.model import Kind, Status, Verdict
from tests.test_runner import ctx as runner_ctx


class Step(Check):
    """A bootstrap check that takes ``seconds`` of the fake clock and answers ``status``."""

    kinds = frozenset({Kind.BOOTSTRAP})
    reasons = ("Fine", "Broken")

    def __init__(self, name: str, clock: FakeClock, seconds: float = 10.0,
                 status: Status = Status.OK) -> None:
        self.name = name
        self.clock, self.seconds, self.status = clock, seconds, status
        self.runs = 0

    def run(self, c):
        self.runs += 1
        self.clock.advance(self.seconds)
        if self.status is Status.OK:
            return [self.ok(c, "gpu:0", "fine")]
        return [self.result(c, self.status, "gpu:0", "Broken", "broken")]


def suite(*checks: Check, clock: FakeClock, **kw) -> tuple[HeldSuite, list]:
    recorded: list = []
    s = HeldSuite(checks, lambda: runner_ctx(clock=clock), record=recorded.append, clock=clock,
                  **kw)
    return s, recorded


def test_every_check_run_and_healthy_is_a_pass_each_outcome_recorded() -> None:
    clock = FakeClock()
    a, b = Step("a", clock), Step("b", clock)
    s, recorded = suite(a, b, clock=clock)
    assert s(100, lambda: True) is Verdict.HEALTHY
    assert [o.check for o in recorded] == ["a", "b"]
    assert (s.last.checks_run, s.last.stopped, s.last.seconds) == (2, "", 20.0)


def test_a_failed_check_fails_the_run_and_is_named() -> None:
    clock = FakeClock()
    s, _ = suite(Step("a", clock, status=Status.FAILED), Step("b", clock), clock=clock)
    assert s(100, lambda: True) is Verdict.UNHEALTHY
    assert s.last.problems == "a/Broken@gpu:0" and s.last.checks_run == 2


def test_the_budget_is_checked_between_checks_and_an_unfinished_run_is_unknown() -> None:
    clock = FakeClock()
    a, b = Step("a", clock, seconds=30), Step("b", clock)
    s, recorded = suite(a, b, clock=clock)
    assert s(30, lambda: True) is Verdict.UNKNOWN
    assert (b.runs, s.last.stopped, [o.check for o in recorded]) == (0, STOPPED_BUDGET, ["a"])


def test_a_lost_hold_stops_the_run_before_the_next_check() -> None:
    clock = FakeClock()
    a, b = Step("a", clock), Step("b", clock)
    held = iter([True, False])
    s, _ = suite(a, b, clock=clock)
    assert s(100, lambda: next(held)) is Verdict.UNKNOWN
    assert (a.runs, b.runs, s.last.stopped) == (1, 0, STOPPED_HOLD_LOST)


def test_a_stopping_daemon_stops_the_run_and_it_is_no_pass() -> None:
    clock = FakeClock()
    a = Step("a", clock)
    s, _ = suite(a, clock=clock, stopping=lambda: True)
    assert s(100, lambda: True) is Verdict.UNKNOWN
    assert (a.runs, s.last.stopped) == (0, STOPPED_DAEMON)


def test_an_image_without_the_active_runtime_runs_nothing_and_says_what_it_lacks() -> None:
    clock = FakeClock()
    a = Step("a", clock)
    s, _ = suite(a, clock=clock, runtime_missing=lambda: "torch is not installed")
    assert s(100, lambda: True) is Verdict.UNKNOWN
    assert (a.runs, s.last.stopped, s.last.problems) == (0, STOPPED_NO_RUNTIME,
                                                         "torch is not installed")


def test_a_crashing_check_is_unknown_and_a_failing_record_loses_no_verdict() -> None:
    clock = FakeClock()

    class Crashes(Step):
        def run(self, c):
            raise ZeroDivisionError("boom")

    def record(_outcome):
        raise OSError("disk full")

    s = HeldSuite([Crashes("c", clock), Step("b", clock)], lambda: runner_ctx(clock=clock),
                  record=record, clock=clock)
    assert s(100, lambda: True) is Verdict.UNKNOWN
    assert "c/CheckCrashed@node" in s.last.problems and s.last.checks_run == 2


def test_a_disabled_check_is_reported_not_run() -> None:
    clock = FakeClock()
    a = Step("a", clock)
    s, recorded = suite(a, clock=clock, disabled={"a": "disabled_checks"})
    assert s(100, lambda: True) is Verdict.HEALTHY
    (o,) = recorded
    assert a.runs == 0 and o.results[0].reason == "DisabledByConfig"


def test_the_run_waits_for_another_suite_to_finish() -> None:
    import threading

    from gpu_monitor.runner import ACTIVE_SUITE

    clock = FakeClock()
    a = Step("a", clock)
    s, _ = suite(a, clock=clock)
    holding, release = threading.Event(), threading.Event()

    def other_suite() -> None:  # the bootstrap gate's, say
        with ACTIVE_SUITE:
            holding.set()
            release.wait(60)

    other = threading.Thread(target=other_suite)
    other.start()
    assert holding.wait(60)
    verdicts: list = []
    ours = threading.Thread(target=lambda: verdicts.append(s(100, lambda: True)))
    ours.start()
    ours.join(0.2)  # blocked on the lock whatever the load: a check never ran beside it
    assert ours.is_alive() and a.runs == 0
    release.set()
    ours.join(60)
    other.join(60)
    assert verdicts == [Verdict.HEALTHY] and a.runs == 1
