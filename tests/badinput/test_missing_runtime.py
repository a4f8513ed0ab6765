"""Bad input, class "missing tool or runtime": a bootstrap whose required check cannot run.

The table is generated: for every shipped profile, every built-in bootstrap check that a
bootstrap requires, and every tool or runtime that check needs (its declared requirements, and
the DCGM host engine behind ``dcgmi``), the simulated node loses exactly that one thing
(``--inject missing@node,what=...``) and ``gpu-monitor bootstrap --checks <that check>`` runs.

- Where the profile expects the hardware the check tests (GPUs; RDMA ports for perftest), the
  check is ``unknown`` naming what is missing and the exit code is 3: not a pass.
- Where it does not (``cpu-only``), the check is ``skipped`` as not applicable and the exit
  code is 0: a node is never held back for a tool it has no use for.
"""

from __future__ import annotations

import shutil

import pytest

from gpu_monitor.profiles import list_profiles, load_profile
from gpu_monitor.registry import all_check_classes

from .harness import Case, ids, run_case

# Requirement token -> what ``missing@node`` takes away, and the word the report must say.
TOOLS = {"dcgm": ("dcgmi", "dcgmi"), "perftest": ("ib_write_bw", "ib_write_bw"),
         "torch": ("torch", "torch")}
# Services behind a tool that only the check's own run can find missing (its declared
# ``unavailable_reasons``): DCGM's host engine.
SERVICES = {"dcgm": ("nv-hostengine", "host engine")}
# What the profile must expect for a missing requirement to count (Host.requirement_gap).
EXPECTS = {"dcgm": "gpu.count", "torch": "gpu.count", "perftest": "rdma.ports"}

# A real tool of the same name on this machine would be found after the simulated node's bin
# directory, and the case would not be about a missing tool any more.
_REAL = {w for w in ("dcgmi", "ib_write_bw") if shutil.which(w)}


def _expected(profile, req: str) -> bool:
    value = profile.get(EXPECTS[req])
    return bool(value) if not isinstance(value, (int, float)) else value > 0


def _cases() -> list[Case]:
    cases = []
    checks = [c for c in all_check_classes(plugins=False) if c.required]
    for name in list_profiles():
        profile = load_profile(name)
        for check in checks:
            for req in sorted(check.requires & set(TOOLS)):
                takes = [TOOLS[req]]
                if check.unavailable_reasons and req in SERVICES:
                    takes.append(SERVICES[req])
                for what, says in takes:
                    if what in _REAL:
                        continue
                    argv = ("bootstrap", "--simulate", name, "--inject",
                            f"missing@node,what={what}", "--checks", check.name)
                    if _expected(profile, req):
                        cases.append(Case(id=f"{name}-{check.name}-no-{what}", argv=argv,
                                          check=check.name, target="node", mentions=(says,),
                                          statuses=frozenset({"unknown"}),
                                          exits=frozenset({3})))
                    else:
                        cases.append(Case(id=f"{name}-{check.name}-no-{what}-not-applicable",
                                          argv=argv, check=check.name, target="node",
                                          statuses=frozenset({"skipped"}),
                                          exits=frozenset({0})))
    return cases


CASES = _cases()


def test_the_table_covers_every_required_tool_on_every_profile():
    unknown = [c for c in CASES if c.exits == frozenset({3})]
    skipped = [c for c in CASES if c.exits == frozenset({0})]
    assert len(CASES) >= 24 or _REAL, len(CASES)
    assert unknown and skipped
    assert {c.check for c in unknown} >= {"dcgm_diag", "burn_in", "nccl_allreduce",
                                          "nvlink_peer", "sdc_probe"}


@pytest.mark.parametrize("case", CASES, ids=ids(CASES))
def test_a_missing_tool_of_a_required_check_is_never_a_pass(case, tmp_path, capsys, caplog):
    report = run_case(case, tmp_path, capsys, caplog)
    mine = [r for r in report["results"] if r["check"] == case.check]
    if case.exits == frozenset({3}):
        assert report["verdict"] == "unknown"
        assert all(r["details"].get("required") for r in mine if r["status"] == "unknown")
    else:
        assert report["verdict"] == "healthy"
        assert all(r["details"].get("not_applicable") for r in mine)
