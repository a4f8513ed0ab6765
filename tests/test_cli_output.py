"""What the one-shot commands print: the table's counts, the progress ETA, list-faults -o json."""

from __future__ import annotations

import io
import json
import re
import sys
from datetime import timedelta

import pytest

from gpu_monitor.check import Context
from gpu_monitor.cli import main
from gpu_monitor.clock import FakeClock
from gpu_monitor.config import DEFAULT_CONFIG
from gpu_monitor.model import Kind, Report, Result, RunOutcome, Status
from gpu_monitor.profiles import load_profile
from gpu_monitor.progress import Progress, expected_durations
from gpu_monitor.registry import all_check_classes, select
from gpu_monitor.report_output import render_table
from gpu_monitor.sim.inject import KINDS, parse
from gpu_monitor.state import Store


class Terminal(io.StringIO):
    """stderr as a terminal (Progress writes only to one)."""

    def isatty(self) -> bool:
        return True


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# --- the table ---------------------------------------------------------------------------------


def report_of(statuses: dict[Status, int]) -> Report:
    clock = FakeClock()
    results = tuple(
        Result("pcie", status, f"gpu:{i}-{status.value}", reason="R", observed_at=clock.now())
        for status, n in statuses.items() for i in range(n))
    return Report("n", "p", clock.now(), clock.now() + timedelta(seconds=1), results)


@pytest.mark.parametrize(("statuses", "line"), [
    ({Status.OK: 14, Status.SKIPPED: 2, Status.FAILED: 1}, "14 ok, 2 skipped, 1 failed"),
    ({Status.OK: 16, Status.SKIPPED: 1}, "16 ok, 1 skipped"),
    ({Status.SKIPPED: 3}, "3 skipped"),
    ({Status.FAILED: 1, Status.OK: 2, Status.UNKNOWN: 1, Status.DEGRADED: 1},
     "2 ok, 1 degraded, 1 unknown, 1 failed"),
], ids=["ok-skipped-failed", "ok-and-skipped", "all-skipped", "every-status"])
def test_the_table_counts_each_status_apart(statuses, line):
    head = render_table(report_of(statuses)).splitlines()[1]
    assert head.split(None, 2)[2] == line
    assert "not ok" not in head


def test_a_skipped_copy_test_is_counted_as_skipped_on_a_simulated_node(capsys):
    code, out, _ = run(capsys, "check", "pcie", "--simulate", "h100-sxm-8", "--log-level", "error")
    assert code == 0
    assert re.search(r"^ok +pcie +16 ok, 1 skipped$", out, re.M), out
    assert re.search(r"^  skipped +node +CopyTestSkipped", out, re.M), out


# --- the progress ETA --------------------------------------------------------------------------


def suite_and_ctx(store):
    profile = load_profile("h100-sxm-8").for_simulation()
    classes = select(all_check_classes(plugins=False), kinds={Kind.BOOTSTRAP, Kind.PASSIVE})
    checks = [c() for c in classes]
    ctx = Context(host=None, profile=profile, config=DEFAULT_CONFIG, clock=FakeClock(),
                  store=store)
    return checks, ctx


def record(store, name: str, seconds: float, success: bool = True) -> None:
    clock = FakeClock()
    store.record_run(RunOutcome(name, (), clock.now(), seconds, success,
                                "" if success else "timeout"))


def eta_lines(checks, expected) -> dict[str, str]:
    term = Terminal()
    progress = Progress(term, expected)
    for i, check in enumerate(checks):
        progress.start(check, i, len(checks))
    return {m.group(1): m.group(2)
            for m in re.finditer(r"\] (\w+) \(elapsed \d+ s(?:, ETA (.+?))?\)", term.getvalue())}


def test_the_eta_adds_up_each_remaining_checks_recorded_duration():
    """The case from the issue: at [14/16] burn_in the passive checks' average said ~3 s."""
    with Store.open(":memory:") as store:
        checks, ctx = suite_and_ctx(store)
        slow = {"burn_in": 33.0, "nccl_allreduce": 20.0, "sdc_probe": 8.0}
        for c in checks:
            record(store, c.name, slow.get(c.name, 0.2))
        names = [c.name for c in checks]
        etas = eta_lines(checks, expected_durations(checks, ctx))
    rest = names[names.index("burn_in"):]
    want = sum(slow.get(n, 0.2) for n in rest)
    assert etas["burn_in"] == f"~{want:.0f} s"
    assert want >= 61
    assert etas[names[-1]] == f"~{slow.get(names[-1], 0.2):.0f} s"


def test_without_a_recorded_run_the_eta_is_the_time_budget_and_says_so():
    with Store.open(":memory:") as store:
        checks, ctx = suite_and_ctx(store)
        record(store, "inventory", 0.5)
        record(store, "burn_in", 12.0, success=False)  # a timeout is no measure of a run
        expected = expected_durations(checks, ctx)
    by_name = dict(zip([c.name for c in checks], expected, strict=True))
    assert by_name["inventory"] == (0.5, True)
    burn_in = next(c for c in checks if c.name == "burn_in")
    assert by_name["burn_in"] == (float(burn_in.timeout), False)
    etas = eta_lines(checks, expected)
    assert all(v.startswith("<= ") for v in etas.values())


def test_a_configured_timeout_is_the_budget(tmp_path):
    from gpu_monitor.config import load_config

    cfg = tmp_path / "c.yaml"
    cfg.write_text("checks:\n  burn_in:\n    timeout_s: 90\n")
    with Store.open(":memory:") as store:
        checks, ctx = suite_and_ctx(store)
        ctx = Context(host=None, profile=ctx.profile, config=load_config(str(cfg)),
                      clock=ctx.clock, store=store)
        expected = dict(zip([c.name for c in checks], expected_durations(checks, ctx),
                            strict=True))
    assert expected["burn_in"] == (90.0, False)


def test_progress_is_silent_off_a_terminal():
    out = io.StringIO()
    progress = Progress(out, [(1.0, True)])
    progress.start(type("C", (), {"name": "x"})(), 0, 1)
    assert out.getvalue() == ""


def test_a_second_run_on_a_kept_store_shows_the_measured_eta(capsys, tmp_path, monkeypatch):
    state = str(tmp_path / "state.db")
    argv = ["check", "inventory", "--simulate", "h100-sxm-8", "--state", state,
            "--log-level", "error"]
    etas = []
    for _ in range(2):
        term = Terminal()
        monkeypatch.setattr(sys, "stderr", term)
        assert main(argv) == 0
        etas.append(re.search(r"ETA ([^)]+)\)", term.getvalue()).group(1))
    capsys.readouterr()
    assert etas[0] == "<= 30 s"  # inventory's declared timeout: nothing recorded yet
    assert etas[1].startswith("~")


# --- list-faults -------------------------------------------------------------------------------


def test_list_faults_json_lists_every_fault_kind(capsys):
    code, out, err = run(capsys, "list-faults", "-o", "json")
    assert code == 0, err
    rows = json.loads(out)
    assert [r["name"] for r in rows] == list(KINDS)
    for r in rows:
        # The example is one the parser takes, for this kind (its target fits the kind's).
        assert parse(r["example"]).kind == r["name"], r
        assert set(r) == {"name", "target", "params", "timed", "example", "summary"}
    assert next(r for r in rows if r["name"] == "port-down")["timed"] is True


def test_list_faults_table_is_the_help_text(capsys):
    from gpu_monitor.sim.inject import help_text

    code, out, _ = run(capsys, "list-faults")
    assert code == 0 and out.strip() == help_text().strip()
