"""The dcgmi diag parser on every recorded output in tests/fixtures/dcgm_diag/."""

from __future__ import annotations

import json

import pytest

from gpu_monitor.hw.dcgm import (
    DcgmParseError,
    DiagStatus,
    connection_error,
    error_name,
    parse_diag,
    parse_diag_json,
    parse_diag_text,
    parse_status,
    worst_diag_status,
)

D = "dcgm_diag"
DEPLOYMENT_3X = ["Denylist", "NVML Library", "CUDA Main Library",
                 "Permissions and OS-related Blocks", "Persistence Mode",
                 "Environmental Variables", "Page Retirement/Row Remap", "Graphics Processes",
                 "Inforom"]


def read(fixtures_dir, name: str) -> str:
    return (fixtures_dir / D / name).read_text()


# --- JSON, DCGM 3.x ----------------------------------------------------------------------------


def test_3_1_real_output_with_garbage_preamble_and_null_entries(fixtures_dir):
    text = read(fixtures_dir, "dcgm_3.1.0_diag_json_8gpu_pass_realoutput_with_preamble.txt")
    assert text.lstrip().startswith("WARNING: THIS SHOULD NOT HAPPEN")
    diag = parse_diag(text)
    assert (diag.shape, diag.version) == ("3.x", "3.1.0")
    assert diag.gpus == tuple(range(8))
    # 9 deployment tests on "0,1,...,7" plus the Custom "software" test once per GPU (int ids)
    assert len(diag.results) == 9 * 8 + 8
    assert list(diag.tests()) == DEPLOYMENT_3X + ["software"]
    assert {r.status for r in diag.results} == {DiagStatus.PASS}
    assert [r.test for r in diag.for_gpu(7)] == DEPLOYMENT_3X + ["software"]
    assert {r.category for r in diag.results} == {"Deployment", "Custom"}


def test_3x_fixture_reports_every_result_of_every_test_per_gpu(fixtures_dir):
    diag = parse_diag(read(fixtures_dir, "dcgm_3x_diag_json_4gpu_testfixture_warnings_fail.json"))
    assert diag.gpus == (0, 1, 2, 3)
    fails = diag.with_status(DiagStatus.FAIL)
    # sm_stress fails on GPUs 0, 2 and 3, not only in the first result
    assert [(r.test, r.gpu) for r in fails] == [("sm_stress", 0), ("sm_stress", 2),
                                                ("sm_stress", 3)]
    w = fails[1].warnings[0]
    assert w.text == ("Max stress level of 1096.5 did not exceed desired stress level of "
                      "3000.0 for GPU 2")
    assert (w.error_id, w.error_category, w.error_severity) == (50, 9, 1)
    assert w.error_name == "DCGM_FR_STRESS_LEVEL"
    assert fails[0].info == ("GPU 0 temperature average:\t31 C",)
    skip_mem = [r for r in diag.for_gpu(0) if r.test == "memory"][0]
    assert skip_mem.status is DiagStatus.SKIP
    assert skip_mem.warnings[0].error_id == 55  # DCGM_FR_ECC_DISABLED
    pcie1 = [r for r in diag.for_gpu(1) if r.test == "pcie"][0]
    assert pcie1.status is DiagStatus.PASS
    assert "GPU 1 Host to GPU bandwidth:\t\t12.13 GB/s" in pcie1.info
    assert len(diag.with_status(DiagStatus.SKIP)) == 1 + 4 + 4 + 4 + 4  # memory, diag, mb, ts, tp


@pytest.mark.parametrize("name, statuses", [
    ("gcm_testfixture_diag_pass_dcgm2x_compact.json", {"Persistence Mode": DiagStatus.PASS}),
    ("gcm_testfixture_diag_fail_dcgm2x_compact.json",
     {"Persistence Mode": DiagStatus.FAIL, "Environment Variables": DiagStatus.WARN}),
    ("gcm_testfixture_diag_warn_dcgm2x_compact.json", {"Persistence Mode": DiagStatus.WARN}),
])
def test_2x_compact_results_have_no_gpu_and_are_node_wide(fixtures_dir, name, statuses):
    diag = parse_diag(read(fixtures_dir, name))
    assert diag.gpus == ()
    assert len(diag.node_wide()) == 9
    assert diag.tests()[0] == "Blacklist"  # the pre-3.0 name
    by_test = {r.test: r.status for r in diag.results}
    for test, status in statuses.items():
        assert by_test[test] is status
    others = {t: s for t, s in by_test.items() if t not in statuses}
    assert set(others.values()) == {DiagStatus.PASS}


# --- JSON, DCGM 4.x ----------------------------------------------------------------------------


def test_4_2_3_software_fail_with_entity_ids_metadata_and_summary(fixtures_dir):
    diag = parse_diag(read(fixtures_dir,
                           "dcgm_4.2.3_diag_r1_json_GB10_software_fail_UNVERIFIED_REPO.json"))
    assert (diag.shape, diag.version, diag.driver_version) == ("4.x", "4.2.3", "580.82.09")
    assert diag.device_ids == ("2e12",)
    (r,) = diag.results
    assert (r.test, r.category, r.gpu, r.entity_group, r.status) == (
        "software", "Deployment", 0, "GPU", DiagStatus.FAIL)
    w = r.warnings[0]
    assert (w.error_id, w.error_category, w.error_severity) == (29, 8, 5)
    assert w.error_name == "DCGM_FR_PERSISTENCE_MODE"
    assert w.text.startswith("Persistence Mode: Persistence mode for GPU 0 is disabled.")
    (s,) = diag.summaries
    assert s.status is DiagStatus.FAIL
    assert s.info[0].startswith("Error getting the SRAM Threshold Count for GPU 0.")


def test_4x_fragment_is_not_a_document_but_parses_inside_one(fixtures_dir):
    fragment = read(fixtures_dir, "dcgm_4.x_diag_r3_json_FRAGMENT_8gpu_diagnostic_test_issue215.json")
    with pytest.raises(DcgmParseError):
        parse_diag(fragment)
    doc = ('{"DCGM Diagnostic": {"test_categories": [{"category": "Hardware", "tests": ['
           + fragment.strip().rstrip(",") + "]}]}, \"metadata\": {\"version\": \"4.1.1\"}}")
    diag = parse_diag(doc)
    assert diag.shape == "4.x"
    assert diag.gpus == tuple(range(8))
    assert {r.status for r in diag.results} == {DiagStatus.PASS}
    assert diag.for_gpu(1)[0].info[2] == "GPU 1 calculated at approximately 859.08 gigaflops " \
                                         "during this test"
    assert diag.summaries[0].status is DiagStatus.PASS


def test_4x_runtime_error_is_kept():
    diag = parse_diag_json('{"DCGM Diagnostic": {"runtime_error": "Unable to create the '
                           'diagnostic: the GPU is in use"}, "metadata": {"version": "4.2.3"}}')
    assert diag.runtime_error.startswith("Unable to create the diagnostic")
    assert diag.results == ()


def test_4x_non_gpu_entities_are_not_gpus():
    doc = {"DCGM Diagnostic": {"test_categories": [{"category": "Hardware", "tests": [
        {"name": "cpu_eud", "results": [{"entity_group": "CPU", "entity_group_id": 7,
                                         "entity_id": 0, "status": "Fail"}],
         "test_summary": {"status": "Fail"}}]}]}}
    (r,) = parse_diag(json.dumps(doc)).results
    assert (r.gpu, r.entity_group, r.entity_id, r.status) == (None, "CPU", 0, DiagStatus.FAIL)


# --- refusals ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", [
    "dcgm_4x_diag_json_schema.json",
    "gcm_testfixture_nvlink_error_fail_dcgmi_nvlink_-e_-j.json",
    "gcm_testfixture_nvlink_status_pass_dcgmi_nvlink_-s_excerpt.txt",
    "nvsentinel_dcgmerrorsmapping.csv",
])
def test_documents_that_are_not_a_diag_run_are_refused(fixtures_dir, name):
    with pytest.raises(DcgmParseError):
        parse_diag(read(fixtures_dir, name))


@pytest.mark.parametrize("cut", [0.2, 0.5, 0.9, 0.99])
def test_truncated_json_is_refused_as_truncated(fixtures_dir, cut):
    text = read(fixtures_dir, "dcgm_3x_diag_json_4gpu_testfixture_warnings_fail.json")
    with pytest.raises(DcgmParseError, match="truncated"):
        parse_diag(text[: int(len(text) * cut)])


@pytest.mark.parametrize("text", [
    "",
    "Segmentation fault (core dumped)\n",
    "\x00\x01\x02garbage{{{",
    '{"DCGM GPU Diagnostic": "not an object"}',
    '{"DCGM GPU Diagnostic": {"test_categories": [{"category": "X", "tests": [{"name": "t", '
    '"results": [{"gpu_ids": "0", "status": "MAYBE"}]}]}]}}',
    '{"DCGM GPU Diagnostic": {"test_categories": {}}}',
    '{"DCGM GPU Diagnostic": {"test_categories": []}}',
])
def test_garbage_is_refused(text):
    with pytest.raises(DcgmParseError):
        parse_diag(text)


# --- text tables -------------------------------------------------------------------------------


def test_complete_text_table_3_3_3(fixtures_dir):
    diag = parse_diag(read(fixtures_dir,
                           "aws_efa-cheatsheet_dcgmi_diag_-r2_text_3.3.3_8xA100_20b2_full_pass.txt"))
    assert diag.shape == "text" and diag.complete
    assert (diag.version, diag.driver_version) == ("3.3.3", "535.104.12")
    assert diag.device_ids == ("20b2",) * 8
    assert [(r.category, r.test) for r in diag.results][-2:] == [("Integration", "PCIe"),
                                                                 ("Hardware", "GPU Memory")]
    assert len(diag.results) == 11 and diag.gpus == ()
    assert {r.status for r in diag.results} == {DiagStatus.PASS}


@pytest.mark.parametrize("name, version, n", [
    ("issue_DCGM253_dcgmi_diag_text_4.2.3_4xL40S_26b9_TRUNCATED.txt", "4.2.3", 4),
    ("issue_DCGM55_dcgmi_diag_text_3.0.4_no_metadata_TRUNCATED.txt", None, 9),
    ("issue_go-dcgm52_dcgmi_diag_text_3.3.1_1xA16_1eb8_TRUNCATED.txt", "3.3.1", 6),
    ("issue_nccl-tests264_dcgmi_diag_text_3.3.8_8xH100_2330_TRUNCATED.txt", "3.3.8", 5),
])
def test_truncated_text_tables_parse_but_say_incomplete(fixtures_dir, name, version, n):
    diag = parse_diag(read(fixtures_dir, name))
    assert diag.shape == "text" and not diag.complete
    assert diag.version == version
    assert len(diag.results) == n


def test_4x_text_per_gpu_rows_replace_the_summary_row(fixtures_dir):
    diag = parse_diag(read(fixtures_dir,
                           "issue_DCGM253_dcgmi_diag_text_4.2.3_4xL40S_26b9_TRUNCATED.txt"))
    assert [(r.test, r.gpu, r.status) for r in diag.results] == [
        ("software", g, DiagStatus.PASS) for g in range(4)]
    assert diag.device_ids == ("26b9",) * 4


def test_wrapped_info_row_is_attached_to_its_test(fixtures_dir):
    diag = parse_diag(read(fixtures_dir,
                           "issue_nccl-tests264_dcgmi_diag_text_3.3.8_8xH100_2330_TRUNCATED.txt"))
    last = diag.results[-1]
    assert last.test == "Persistence Mode"
    assert last.info == ("Persistence mode for GPU 0 is disabled. Enabl",)


# The row layout of dcgmi's table (ml-engineering's capture of an r2 run on a faulty node),
# rebuilt here around our own words to exercise "Pass - GPUs:", "Fail - GPU:" and a warning
# wrapped mid-word.
FAIL_TABLE = """Successfully ran diagnostic for group.
+---------------------------+------------------------------------------------+
| Diagnostic                | Result                                         |
+===========================+================================================+
|-----  Deployment  --------+------------------------------------------------|
| Denylist                  | Pass                                           |
+-----  Hardware  ----------+------------------------------------------------+
| GPU Memory                | Pass - GPUs: 1, 2, 3, 4, 5, 6, 7               |
|                           | Fail - GPU: 0                                  |
| Warning                   | GPU 0 Thermal violations totaling 13.3 second  |
|                           | s started at 9.7 seconds into the test for GP  |
|                           | U 0                                            |
+---------------------------+------------------------------------------------+
"""


def test_text_table_with_a_failed_gpu_and_a_wrapped_warning():
    diag = parse_diag_text(FAIL_TABLE)
    assert diag.complete
    mem = [r for r in diag.results if r.test == "GPU Memory"]
    assert [(r.gpu, r.status) for r in mem] == [(g, DiagStatus.PASS) for g in range(1, 8)] + [
        (0, DiagStatus.FAIL)]
    assert mem[-1].warnings[0].text == ("GPU 0 Thermal violations totaling 13.3 seconds "
                                        "started at 9.7 seconds into the test for GPU 0")
    deny = diag.results[0]
    assert (deny.test, deny.gpu, deny.status) == ("Denylist", None, DiagStatus.PASS)


def test_text_table_with_an_unknown_status_is_refused():
    bad = FAIL_TABLE.replace("| Denylist                  | Pass  ",
                             "| Denylist                  | Maybe ")
    with pytest.raises(DcgmParseError, match="not a DCGM status"):
        parse_diag_text(bad)


# --- helpers -----------------------------------------------------------------------------------


@pytest.mark.parametrize("line", [
    "Error: unable to establish a connection to the specified host: localhost",
    "Error: Unable to connect to host engine. Host engine connection invalid/disconnected.",
])
def test_connection_errors_are_recognised(line):
    assert connection_error("noise\n" + line + "\n") == line


def test_other_errors_are_not_connection_errors():
    assert connection_error("Error: Diagnostic could not be run while the GPU is busy") is None


def test_statuses_of_every_release():
    assert [parse_status(s) for s in ("PASS", "Pass", "fail", "Warn", "SKIP", "Not Run")] == [
        DiagStatus.PASS, DiagStatus.PASS, DiagStatus.FAIL, DiagStatus.WARN, DiagStatus.SKIP,
        DiagStatus.NOT_RUN]
    assert worst_diag_status([DiagStatus.PASS, DiagStatus.SKIP, DiagStatus.WARN]) is DiagStatus.WARN
    assert worst_diag_status([DiagStatus.SKIP, DiagStatus.FAIL]) is DiagStatus.FAIL
    assert worst_diag_status([]) is None


def test_error_names_are_dcgm_failure_codes(fixtures_dir):
    """Every name our id table gives is a DCGM_FR_* code NVSentinel's mapping also knows."""
    known = {line.split(",")[0] for line in read(fixtures_dir,
                                                  "nvsentinel_dcgmerrorsmapping.csv").splitlines()}
    assert error_name(58) == "DCGM_FR_MEMORY_MISMATCH"
    assert error_name(999) is None
    ours = {error_name(i) for i in range(1, 112)}  # 0 is OK, not a failure code
    assert ours - known == set()
