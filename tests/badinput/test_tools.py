"""Bad input, tool outputs: ``dcgmi diag`` and ``ib_write_bw`` printing what no passing run prints.

Every case runs ``gpu-monitor check`` in-process on the simulated HGX H100 node, whose fake tools
print the recorded real formats (gpu_monitor/sim/tools.py) and are garbled at that boundary:

- ``dcgm-output@node,...``: JSON or the text table (whatever ``-j`` says) × a non-zero exit
  after an all-pass report, cut before every section, each GPU left out, status words DCGM does
  not use; and the recorded real 8-GPU DCGM 3.1 JSON, malformed, printed through ``file=``;
- ``ib-bw@ib:...,gbit=X`` with absurd, negative and NaN bandwidths, and ``ib-bw-output`` cutting
  the report short (no header, no row, inside the row, no closing line) or exiting non-zero.

No GPU or port may come out ``ok`` from such a run, and none may fail: a garbled report is no
evidence of a fault (``unknown``, naming what was wrong).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from tests.badinput.harness import Case, ids, run_case
from tests.conftest import FIXTURES

SIM = ("--simulate", "h100-sxm-8")
UNKNOWN = frozenset({"unknown"})
GPUS = 8
RECORDED = (FIXTURES / "dcgm_diag"
            / "dcgm_3.1.0_diag_json_8gpu_pass_realoutput_with_preamble.txt").read_text()


def dcgm(id: str, inject: str, target: str, mentions: tuple[str, ...], setup=None) -> Case:
    return Case(id=f"dcgmi:{id}", argv=("check", "dcgm_diag", *SIM, "--inject",
                                        f"dcgm-output@node,{inject}"),
                check="dcgm_diag", target=target, mentions=mentions, statuses=UNKNOWN,
                exits=frozenset({3}), setup=setup)


def _nonzero_exit() -> list[Case]:
    out = []
    for fmt in ("json", "text"):
        for i, code in enumerate((1, 3, 226, 255)):
            # JSON names every GPU (each must not be ok); the text table says "Pass - All".
            target = f"gpu:{(2 * i + 1) % GPUS}" if fmt == "json" else "node"
            out.append(dcgm(f"{fmt}:all-pass-exit-{code}", f"format={fmt},exit={code}", target,
                            (f"exited {code}", "cannot be trusted")))
    return out


def _truncated() -> list[Case]:
    out = []
    sections = {"json": ("Deployment", "Integration", "Hardware", "end"),
                "text": ("Metadata", "Deployment", "Integration", "Hardware", "end")}
    for fmt, names in sections.items():
        for name in names:
            said = ("truncated" if fmt == "json" else
                    "holds no rows" if name == "Metadata" else "cut short")
            out.append(dcgm(f"{fmt}:cut-before-{name}", f"format={fmt},cut={name}", "node",
                            (said,)))
    return out


def _missing_gpu() -> list[Case]:
    out = []
    for fmt in ("json", "text"):
        for gpu in range(GPUS):
            said = f"no result for gpu:{gpu}" if fmt == "json" else "dcgmi detected 7 GPU(s)"
            out.append(dcgm(f"{fmt}:gpu-{gpu}-left-out", f"format={fmt},drop={gpu}",
                            f"gpu:{gpu}", (said,)))
    return out


def _unknown_words() -> list[Case]:
    return [dcgm(f"{fmt}:status-{word}", f"format={fmt},status={word}", "node",
                 ("not a diagnostic report", word))
            for fmt in ("json", "text") for word in ("Banana", "Passed", "OK", "Partial")]


# Malformed copies of the recorded real DCGM 3.1 output: (id, edit of the text, exit status).
MALFORMED = [
    ("unquoted-key", lambda t: t.replace('"category" : "Deployment"',
                                         'category : "Deployment"', 1), 0),
    ("missing-comma", lambda t: t.replace('"gpu_ids" : "0,1,2,3,4,5,6,7",',
                                          '"gpu_ids" : "0,1,2,3,4,5,6,7"', 1), 0),
    ("single-quotes", lambda t: t.replace('"status" : "PASS"', "'status' : 'PASS'", 1), 0),
    ("stray-brace", lambda t: t.replace('"results" :', '"results" : }', 1), 0),
    ("trailing-comma", lambda t: t.replace('"version" : "3.1.0"', '"version" : "3.1.0",', 1),
     0),
    ("cut-mid-string", lambda t: t[: t.index('"Graphics Processes"') + 5], 0),
    ("cut-mid-string-exit-226", lambda t: t[: t.index('"Graphics Processes"') + 5], 226),
]


def _malformed() -> list[Case]:
    out = []
    for name, edit, code in MALFORMED:
        text = edit(RECORDED)
        assert text != RECORDED, name

        def setup(tmp: Path, text: str = text) -> None:
            (tmp / "dcgmi-out.json").write_text(text)

        said = ("exited 226",) if code else ("not a diagnostic report",)
        out.append(dcgm(f"json:recorded-{name}", f"file={{tmp}}/dcgmi-out.json,exit={code}",
                        "node", said, setup))
    return out


# --- ib_write_bw --------------------------------------------------------------------------------

OTHER_PORTS_DOWN = tuple(a for i in range(1, 8) for a in ("--inject", f"port-down@ib:mlx5_{i}:1"))


def perftest(id: str, inject: str, mentions: tuple[str, ...]) -> Case:
    return Case(id=f"ib_write_bw:{id}",
                argv=("check", "rdma_loopback", *SIM, *OTHER_PORTS_DOWN, "--inject", inject),
                check="rdma_loopback", target="ib:mlx5_0:1", mentions=mentions,
                statuses=UNKNOWN, exits=frozenset({3}))


ABSURD = [("1e30", "faster than any RDMA link"), ("1e6", "faster than any RDMA link"),
          ("3201", "faster than any RDMA link"), ("1000", "above the port's rate of 400"),
          ("-5", "not a finite, non-negative"), ("-0.5", "not a finite, non-negative"),
          ("nan", "not a finite, non-negative"), ("inf", "not a finite, non-negative")]
CUTS = [("before-report", "no perftest bandwidth header"), ("after-header", "no result row"),
        ("mid-row", "cut short"), ("before-rule", "cut short")]


def _perftest() -> list[Case]:
    out = [perftest(f"bandwidth-{v}", f"ib-bw@ib:mlx5_0:1,gbit={v}", ("ib_write_bw", said))
           for v, said in ABSURD]
    out += [perftest(f"report-{cut}", f"ib-bw-output@ib:mlx5_0:1,cut={cut}", (said,))
            for cut, said in CUTS]
    out += [perftest(f"exit-{code}", f"ib-bw-output@ib:mlx5_0:1,exit={code}",
                     (f"exited {code}",)) for code in (1, 2, 255)]
    # a report both cut short and with no rows, from a client that also exits non-zero
    out.append(perftest("no-rows-exit-1", "ib-bw-output@ib:mlx5_0:1,cut=after-header,exit=1",
                        ("exited 1",)))
    return out


CASES = _nonzero_exit() + _truncated() + _missing_gpu() + _unknown_words() + _malformed() \
    + _perftest()
# Cases where no result of the check may be ok, whatever its target: the whole report is suspect.
WHOLE_RUN = {c.id for c in CASES if "exit-" in c.id or "cut-" in c.id or "status-" in c.id
             or "recorded-" in c.id or c.id.startswith("ib_write_bw:")}


def test_the_table_is_generated_over_every_shape():
    assert len(CASES) >= 50 and len(set(ids(CASES))) == len(CASES)
    assert {c.check for c in CASES} == {"dcgm_diag", "rdma_loopback"}
    assert sum(c.id.startswith("dcgmi:") for c in CASES) >= 40


@pytest.mark.parametrize("case", CASES, ids=ids(CASES))
def test_a_tool_output_that_is_not_a_clean_report_is_never_ok(case, tmp_path, capsys, caplog):
    report = run_case(case, tmp_path, capsys, caplog)
    mine = [r for r in report["results"] if r["check"] == case.check]
    if case.id in WHOLE_RUN:
        oks = [r["target"] for r in mine if r["status"] == "ok"]
        assert not oks, f"{case.id}: {oks} ok from a report that cannot be trusted"
    if case.check == "dcgm_diag" and "-left-out" in case.id:
        others = {r["target"]: r["status"] for r in mine if r["target"] != case.target}
        if case.id.startswith("dcgmi:json:"):
            assert set(others.values()) == {"ok"}, others  # the GPUs it did cover still pass


def test_the_same_runs_without_garbling_pass(tmp_path, capsys, caplog):
    """Healthy twins of the cases: they fail because of the garbling, not the rig."""
    healthy = [
        replace(CASES[0], id="dcgmi-healthy", argv=("check", "dcgm_diag", *SIM),
                statuses=frozenset({"ok"}), exits=frozenset({0}), mentions=()),
        replace(CASES[-1], id="ib_write_bw-healthy",
                argv=("check", "rdma_loopback", *SIM, *OTHER_PORTS_DOWN),
                statuses=frozenset({"ok"}), exits=frozenset({0}), mentions=()),
        replace(CASES[0], id="dcgmi-recorded-healthy",
                argv=("check", "dcgm_diag", *SIM, "--inject",
                      "dcgm-output@node,file={tmp}/dcgmi-out.json"),
                setup=lambda tmp: (tmp / "dcgmi-out.json").write_text(RECORDED),
                statuses=frozenset({"ok"}), exits=frozenset({0}), mentions=()),
    ]
    for case in healthy:
        run_case(case, tmp_path, capsys, caplog)
