"""``gpu-monitor explain``: the runbook's words for a reason, from the packaged extract."""

from __future__ import annotations

import json
import re

import pytest

from gpu_monitor.cli import main
from gpu_monitor.nodeview import runbook
from gpu_monitor.nodeview.explain import explain
from tests.conftest import REPO

# Real runbook shapes: a table row with a "how sure" column, a framework row without one, a
# numbered Xid row that also names a reason, an Xid range, and reasons only in prose.
ROWS = [
    ("NvLinkDown", "nvlink_state", "certain", "let the reset run"),
    ("WorkerTimeout", None, "undecided", "run the check again"),
    ("Xid79", "xid", "certain", "reboot"),
    ("GpuFallenOffBus", "xid", "certain", "reboot"),
    ("Xid146", "xid", "", "decode"),
]


@pytest.fixture(scope="module")
def data():
    return runbook.load()


@pytest.mark.parametrize(("reason", "check", "sure", "todo"), ROWS, ids=[r[0] for r in ROWS])
def test_a_reason_is_explained_with_meaning_confidence_and_what_to_do(data, reason, check,
                                                                       sure, todo):
    doc = explain(data, reason)
    assert doc["found"]
    first = doc["answers"][0]
    assert first["check"] == check
    assert first["meaning"] and todo in first["what_to_do"]
    assert sure in first["how_sure"]
    assert first["runbook"].startswith("docs/runbook.md#")


def test_a_reason_two_checks_declare_is_explained_for_each_and_check_slash_reason_picks(data):
    both = {a["check"] for a in explain(data, "NvLinkDown")["answers"]}
    assert both >= {"nvlink_state", "nvlink_peer"}
    one = explain(data, "nvlink_peer/NvLinkDown")["answers"]
    assert [a["check"] for a in one] == ["nvlink_peer"]


def test_a_reason_the_runbook_explains_in_prose_gets_its_section(data):
    doc = explain(data, "HwThermalSlowdown")
    (answer,) = doc["answers"]
    assert answer["check"] == "throttle" and "fraction of the last 10 minutes" in answer["meaning"]
    assert answer["how_sure"].startswith("strong")


def test_every_reason_a_check_declares_is_explained(data):
    from gpu_monitor.check import FRAMEWORK_REASONS
    from gpu_monitor.registry import all_check_classes

    missing = [f"{cls.name}/{reason}" for cls in all_check_classes(plugins=False)
               for reason in (*FRAMEWORK_REASONS, *cls.reasons)
               if not re.fullmatch(r"S?Xid(\d+|<code>)", reason)
               and not explain(data, reason)["found"]]
    assert not missing


def test_an_unknown_reason_exits_1_with_close_matches(capsys):
    rc = main(["explain", "NvLinkDwn"])
    out = capsys.readouterr().out
    assert rc == 1 and "NvLinkDown" in out and "does not know" in out


def test_json_output_is_the_document(capsys):
    assert main(["explain", "PortDowntimeExceeded", "-o", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["found"] and doc["answers"][0]["check"] == "rdma_ports"


def test_the_table_says_what_it_means_how_sure_and_what_to_do(capsys):
    assert main(["explain", "NvLinkDown"]) == 0
    out = capsys.readouterr().out
    for label in ("what it means:", "how sure:", "what to do:", "runbook: docs/runbook.md#"):
        assert label in out


def test_the_extract_reads_table_rows_ranges_and_escaped_bars():
    text = (REPO / "docs" / "runbook.md").read_text(encoding="utf-8")
    entries = {(e["section"], e["reason"]): e for e in runbook.extract(text)["entries"]}
    assert ("xid", "Xid144") in entries and ("xid", "Xid150") in entries
    assert ("xid", "Xid119") in entries and ("xid", "Xid120") in entries
    # `dmesg \\| grep NVRM` in a cell is one cell, not two.
    assert "dmesg | grep NVRM" in entries[("inventory", "NvmlUnavailable")]["what_to_do"]


def test_a_numbered_sxid_is_explained_by_the_nvswitch_rows(data):
    doc = explain(data, "SXid12028")
    assert doc["found"]
    assert {a["check"] for a in doc["answers"]} == {"nvswitch"}
    assert any("fatal" in a["status"] or "reboot" in a["status"] for a in doc["answers"])
