"""dcgm_diag through the simulated node's fake dcgmi, and against misbehaving dcgmi programs."""

from __future__ import annotations

import json
import shutil

import pytest

from checks.dcgm_diag import DcgmDiag
from gpu_monitor.config import DEFAULT_CONFIG, Config
from gpu_monitor.model import Action, Status
from tests.checks.rig import (
    all_ok,
    fake_tool,
    judged_fixture,
    not_ok,
    run_once,
)


def run(ctx):
    return run_once(DcgmDiag(), ctx, succeed=False)


judged = judged_fixture(DcgmDiag, succeed=False)


def test_healthy_node_passes_every_test_on_every_gpu(judged):
    res = judged()
    all_ok(res, [f"gpu:{i}" for i in range(8)])
    d = res["gpu:3"].details
    assert d["level"] == 2 and d["command"] == "dcgmi diag -r 2 -j"
    assert len(d["tests"]) == 12 and set(d["tests"].values()) == {"pass"}
    assert d["dcgm_version"] == "3.3.9" and d["uuid"].startswith("GPU-")


def test_injected_failure_fails_the_named_gpu_with_test_warning_and_error_id(judged):
    res = judged("dcgm-fail@gpu:2,test=memtest")
    assert not_ok(res) == {"gpu:2": (Status.FAILED, "DcgmDiagFail")}
    r = res["gpu:2"]
    (failure,) = r.details["failures"]
    assert failure["test"] == "memtest"
    (w,) = failure["warnings"]
    assert w["error_id"] == 58 and w["error_name"] == "DCGM_FR_MEMORY_MISMATCH"
    assert w["warning"].startswith("A memory mismatch was detected on GPU 2")
    assert r.action is Action.REPLACE  # DCGM severity ISOLATE
    assert "memtest" in r.message and "error_id 58" in r.message


def test_failures_on_several_gpus_and_tests_are_all_reported(judged):
    res = judged("dcgm-fail@gpu:1,test=memory", "dcgm-fail@gpu:6,test=pcie",
                 "dcgm-fail@gpu:6,test=targeted_power")
    assert not_ok(res) == {"gpu:1": (Status.FAILED, "DcgmDiagFail"),
                           "gpu:6": (Status.FAILED, "DcgmDiagFail")}
    assert [f["test"] for f in res["gpu:6"].details["failures"]] == ["pcie", "targeted_power"]
    assert res["gpu:6"].action is Action.NONE  # TRIAGE severities: a person decides


def test_level_comes_from_config(judged):
    r = judged(config=Config(checks={"dcgm_diag": {"level": 3}}))["gpu:0"]
    assert r.details["command"] == "dcgmi diag -r 3 -j"
    assert len(r.details["tests"]) == 16


def test_no_host_engine_is_skipped_never_failed(node):
    sim, ctx = node()
    sim.spec.dcgm_available = False
    sim.advance(0.0)
    (r,) = run(ctx).values()
    assert (r.status, r.reason) == (Status.SKIPPED, "DcgmUnavailable")
    assert "host engine" in r.message


def test_unreachable_configured_host_engine_is_unknown(judged):
    (r,) = judged(config=Config(checks={"dcgm_diag": {"host": "10.9.8.7:5555"}})).values()
    assert (r.status, r.reason) == (Status.UNKNOWN, "DcgmHostEngineUnreachable")
    assert "10.9.8.7" in r.message
    assert r.details["command"] == "dcgmi diag -r 2 -j --host 10.9.8.7:5555"


def test_a_foreign_gpu_process_stops_the_invasive_run(judged):
    res = judged("gpu-process@gpu:0,pid=4242")
    assert (res["gpu:0"].status, res["gpu:0"].reason) == (Status.UNKNOWN, "GpuBusy")


@pytest.mark.skipif(shutil.which("dcgmi") is not None, reason="this host has a real dcgmi")
def test_without_dcgmi_the_check_is_skipped(without_tools):
    without_tools(run)


# --- misbehaving dcgmi ---------------------------------------------------------------------------


def fake_dcgmi(tmp_path, stdout="", stderr="", code=0, sleep=0.0):
    """A dcgmi that prints fixed output (read from files beside it) and exits ``code``."""
    return fake_tool(tmp_path, "dcgmi", f"""\
        import sys, time
        time.sleep({sleep})
        sys.stdout.write(open(os.path.join(here, "out.txt")).read())
        sys.stderr.write(open(os.path.join(here, "err.txt")).read())
        sys.exit({code})
        """, files={"out.txt": stdout, "err.txt": stderr})


@pytest.fixture
def bad(node, tmp_path):
    def build(config=DEFAULT_CONFIG, **tool):
        _, ctx = node(config=config)
        ctx.host.commands = fake_dcgmi(tmp_path, **tool)
        return run(ctx)
    return build


def fixture_text(fixtures_dir, name):
    return (fixtures_dir / "dcgm_diag" / name).read_text()


@pytest.mark.parametrize("stdout, code, reason", [
    ("Segmentation fault\n\x00\x01garbage{{", 0, "DcgmBadOutput"),
    ("", 0, "DcgmBadOutput"),
    ("Error: Diagnostic could not be run: the GPU is in use by another process\n", 255,
     "DcgmError"),
    ("", 1, "DcgmError"),
])
def test_garbage_and_errors_are_unknown(bad, stdout, code, reason):
    (r,) = bad(stdout=stdout, code=code).values()
    assert (r.status, r.reason) == (Status.UNKNOWN, reason)
    assert r.target == "node"


def test_truncated_json_is_unknown_and_says_truncated(bad, fixtures_dir):
    text = fixture_text(fixtures_dir, "dcgm_3x_diag_json_4gpu_testfixture_warnings_fail.json")
    (r,) = bad(stdout=text[: len(text) // 2]).values()
    assert (r.status, r.reason) == (Status.UNKNOWN, "DcgmBadOutput")
    assert "truncated" in r.message


def test_hang_past_the_timeout_is_unknown(bad):
    (r,) = bad(config=Config(checks={"dcgm_diag": {"timeout_s": 0.5}}), sleep=30).values()
    assert (r.status, r.reason) == (Status.UNKNOWN, "DcgmTimeout")
    assert r.details["timeout_s"] == 0.5


def test_runtime_error_is_unknown(bad):
    doc = {"DCGM Diagnostic": {"runtime_error": "Couldn't create the test plan"},
           "metadata": {"version": "4.2.3"}}
    (r,) = bad(stdout=json.dumps(doc), code=226).values()
    assert (r.status, r.reason) == (Status.UNKNOWN, "DcgmError")
    assert "Couldn't create the test plan" in r.message


def test_real_4x_failure_with_garbage_preamble_and_nonzero_exit(bad, fixtures_dir):
    text = fixture_text(fixtures_dir,
                        "dcgm_4.2.3_diag_r1_json_GB10_software_fail_UNVERIFIED_REPO.json")
    res = bad(stdout="WARNING: something odd\n" + text, code=226)
    # The GB10 report covers one GPU; the simulated node has eight.
    assert not_ok(res) == {"gpu:0": (Status.FAILED, "DcgmDiagFail"),
                           **{f"gpu:{i}": (Status.UNKNOWN, "DcgmGpuNotReported")
                              for i in range(1, 8)}}
    f = res["gpu:0"].details["failures"][0]
    assert f["test"] == "software" and f["warnings"][0]["error_id"] == 29
    assert res["gpu:0"].details["dcgm_version"] == "4.2.3"


def test_every_failing_result_not_just_the_first(bad, fixtures_dir):
    res = bad(stdout=fixture_text(fixtures_dir,
                                  "dcgm_3x_diag_json_4gpu_testfixture_warnings_fail.json"),
              code=226)
    assert not_ok(res) == {**{f"gpu:{i}": (Status.FAILED, "DcgmDiagFail") for i in (0, 2, 3)},
                           **{f"gpu:{i}": (Status.UNKNOWN, "DcgmGpuNotReported")
                              for i in range(4, 8)}}
    assert res["gpu:1"].status is Status.OK  # the exit status is explained by the failures
    assert list(res["gpu:5"].details["gpus_reported"]) == [0, 1, 2, 3]
    assert "dcgmi diag reported no result for gpu:5" in res["gpu:5"].message
    assert "memory" in res["gpu:0"].details["skipped_tests"]


def test_warn_degrades_and_node_wide_results_go_to_node(bad, fixtures_dir):
    res = bad(stdout=fixture_text(fixtures_dir, "gcm_testfixture_diag_warn_dcgm2x_compact.json"))
    assert not_ok(res) == {"node": (Status.DEGRADED, "DcgmDiagWarn")}
    assert res["node"].action is Action.WATCH
    res = bad(stdout=fixture_text(fixtures_dir, "gcm_testfixture_diag_fail_dcgm2x_compact.json"),
              code=226)
    assert not_ok(res) == {"node": (Status.FAILED, "DcgmDiagFail")}


def test_gpu_with_only_skipped_tests_is_skipped(bad):
    doc = {"DCGM Diagnostic": {"test_categories": [{"category": "Hardware", "tests": [
        {"name": "memory", "results": [
            {"entity_group": "GPU", "entity_group_id": 1, "entity_id": 0, "status": "Skip"},
            {"entity_group": "GPU", "entity_group_id": 1, "entity_id": 1, "status": "Pass"}],
         "test_summary": {"status": "Pass"}}]}]}, "metadata": {"version": "4.2.3"}}
    res = bad(stdout=json.dumps(doc))
    assert (res["gpu:0"].status, res["gpu:0"].reason) == (Status.SKIPPED, "DcgmDiagSkipped")
    assert res["gpu:1"].status is Status.OK


def test_nonzero_exit_without_any_failure_is_not_ok(bad, fixtures_dir):
    res = bad(stdout=fixture_text(fixtures_dir,
                                  "dcgm_3.1.0_diag_json_8gpu_pass_realoutput_with_preamble.txt"),
              code=3)
    assert not_ok(res) == {t: (Status.UNKNOWN, "DcgmError")
                           for t in ["node", *(f"gpu:{i}" for i in range(8))]}
    assert "exited 3 although no test failed" in res["gpu:7"].message
    assert res["gpu:7"].details["pending_reason"] == "Ok"


def test_text_output_that_is_cut_short_is_unknown(bad, fixtures_dir):
    res = bad(stdout=fixture_text(fixtures_dir,
                                  "issue_DCGM253_dcgmi_diag_text_4.2.3_4xL40S_26b9_TRUNCATED.txt"))
    assert not_ok(res) == {**{t: (Status.UNKNOWN, "DcgmIncomplete")
                              for t in ["node", *(f"gpu:{i}" for i in range(4))]},
                           **{f"gpu:{i}": (Status.UNKNOWN, "DcgmGpuNotReported")
                              for i in range(4, 8)}}
    assert "cut short" in res["gpu:3"].message


def test_connection_error_on_stdout_with_nonzero_exit_is_skipped(bad):
    out = ("Error: unable to establish a connection to the specified host: localhost\n"
           "Error: Unable to connect to host engine. Host engine connection "
           "invalid/disconnected.\n")
    (r,) = bad(stdout=out, code=236).values()
    assert (r.status, r.reason) == (Status.SKIPPED, "DcgmUnavailable")
