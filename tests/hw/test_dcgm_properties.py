"""``dcgmi diag`` parsers on arbitrary input: nothing but ``DcgmParseError`` ever escapes.

Inputs are arbitrary text, arbitrary JSON under the real top-level keys, and the recorded real
outputs (tests/fixtures/dcgm_diag) cut, spliced and overwritten at arbitrary places. Whatever
parses must be a well-formed report: GPU ids in DCGM's range, every status one of DCGM's.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_monitor.hw.dcgm import (
    MAX_GPU_ID,
    DcgmParseError,
    DiagStatus,
    parse_diag,
    parse_diag_json,
    parse_diag_text,
)
from tests.conftest import FIXTURES

DIAG = FIXTURES / "dcgm_diag"
JSON_SAMPLES = [
    (DIAG / n).read_text() for n in (
        "dcgm_3.1.0_diag_json_8gpu_pass_realoutput_with_preamble.txt",
        "dcgm_3x_diag_json_4gpu_testfixture_warnings_fail.json",
        "dcgm_4.2.3_diag_r1_json_GB10_software_fail_UNVERIFIED_REPO.json",
        "gcm_testfixture_diag_fail_dcgm2x_compact.json",
    )
]
TEXT_SAMPLES = [
    (DIAG / n).read_text() for n in (
        "aws_efa-cheatsheet_dcgmi_diag_-r2_text_3.3.3_8xA100_20b2_full_pass.txt",
        "issue_DCGM253_dcgmi_diag_text_4.2.3_4xL40S_26b9_TRUNCATED.txt",
        "issue_nccl-tests264_dcgmi_diag_text_3.3.8_8xH100_2330_TRUNCATED.txt",
    )
]
PARSERS = {"any": parse_diag, "json": parse_diag_json, "text": parse_diag_text}

_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**66), 2**66) | st.floats()
    | st.text(max_size=12) | st.sampled_from(["PASS", "Fail", "Not Run", "0,1", "GPU", "-3"]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.sampled_from(["category", "tests", "name", "results", "status", "gpu_ids",
                         "gpu_id", "entity_group", "entity_id", "warnings", "info",
                         "test_summary", "error_id", "warning", "runtime_error", "version",
                         "test_categories", "metadata", "entity_groups", "entities",
                         "device_id"]) | st.text(max_size=6), inner, max_size=5),
    max_leaves=25,
)


@st.composite
def _json_doc(draw) -> str:
    key = draw(st.sampled_from(["DCGM GPU Diagnostic", "DCGM Diagnostic"]))
    body = draw(st.dictionaries(st.sampled_from(["test_categories", "runtime_error",
                                                 "version"]), _json, max_size=3))
    extra = draw(st.dictionaries(st.sampled_from(["metadata", "entity_groups",
                                                  "runtime_error"]), _json, max_size=2))
    return json.dumps({key: body, **extra}, allow_nan=True)


@st.composite
def _mangled(draw, samples: list[str]) -> str:
    """A real output cut, with a stretch overwritten or a piece of another pasted in."""
    text = draw(st.sampled_from(samples))
    cut = draw(st.integers(0, len(text)))
    at = draw(st.integers(0, len(text)))
    junk = draw(st.text(max_size=12) | st.sampled_from(["Banana", "-1", "1e30", "NaN", "}",
                                                        "]", '"', "|", "GPU99999999999: "]))
    how = draw(st.sampled_from(["cut", "overwrite", "insert", "both"]))
    if how in ("overwrite", "both"):
        text = text[:at] + junk + text[at + len(junk):]
    if how == "insert":
        text = text[:at] + junk + text[at:]
    if how in ("cut", "both"):
        text = text[:cut]
    return text


_INPUT = st.one_of(st.text(max_size=200), _json_doc(), _mangled(JSON_SAMPLES),
                   _mangled(TEXT_SAMPLES), st.just("{" * 3000),
                   st.integers(900, 5000).map(lambda n: '{"DCGM Diagnostic": ' + "[" * n))


def _well_formed(diag) -> None:
    for r in diag.results:
        assert isinstance(r.status, DiagStatus)
        assert r.gpu is None or 0 <= r.gpu <= MAX_GPU_ID
        assert r.entity_id is None or 0 <= r.entity_id <= MAX_GPU_ID
    assert all(isinstance(s.status, DiagStatus) for s in diag.summaries)


@pytest.mark.parametrize("which", sorted(PARSERS))
@settings(deadline=None, derandomize=True, max_examples=250)
@given(text=_INPUT)
def test_nothing_but_the_parse_error_escapes(which, text):
    try:
        diag = PARSERS[which](text)
    except DcgmParseError:
        return
    _well_formed(diag)


@pytest.mark.parametrize("doc,needle", [
    ({"DCGM Diagnostic": {"test_categories": [{"category": "Hardware", "tests": [
        {"name": "memory", "results": [{"entity_group": "GPU", "entity_id": -3,
                                        "status": "Pass"}]}]}]}}, "entity_id"),
    ({"DCGM Diagnostic": {"test_categories": [{"category": "Hardware", "tests": [
        {"name": "memory", "results": [{"entity_group": "GPU", "entity_id": 10**30,
                                        "status": "Pass"}]}]}]}}, "entity_id"),
    ({"DCGM GPU Diagnostic": {"test_categories": [{"category": "Hardware", "tests": [
        {"name": "memory", "results": [{"gpu_ids": "0,\u0662", "status": "PASS"}]}]}]}},
     "gpu_ids"),
    ({"DCGM GPU Diagnostic": {"test_categories": [{"category": "Hardware", "tests": [
        {"name": "memory", "results": [{"gpu_ids": "99999", "status": "PASS"}]}]}]}},
     "gpu_ids"),
    ({"DCGM GPU Diagnostic": {"test_categories": [{"category": "Hardware", "tests": [
        {"name": "memory", "results": [{"gpu_ids": "0", "status": "Banana"}]}]}]}},
     "Banana"),
])
def test_gpu_ids_outside_dcgms_range_and_unknown_words_are_refused(doc, needle):
    with pytest.raises(DcgmParseError, match=needle):
        parse_diag_json(json.dumps(doc))


def test_deeply_nested_json_is_a_parse_error_not_a_recursion_error():
    with pytest.raises(DcgmParseError):
        parse_diag('{"DCGM GPU Diagnostic": ' + "[" * 100000 + "]" * 100000 + "}")


def test_a_text_row_naming_an_absurd_gpu_is_refused():
    text = TEXT_SAMPLES[1].replace("GPU0: Pass", "GPU99999999999999999999: Pass", 1)
    assert text != TEXT_SAMPLES[1]
    with pytest.raises(DcgmParseError, match="GPU"):
        parse_diag_text(text)
