"""perftest rows have a domain, reports have an end: what ``parse_report`` refuses, and that on
arbitrary input nothing but ``PerftestParseError`` escapes it."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_monitor.hw.perftest import PerftestParseError, parse_report
from tests.conftest import FIXTURES

P = FIXTURES / "ib_perftest"
LOOPBACK_8M = (P / "superbench_ib_write_bw_loopback_8M.log").read_text()
ALL_SIZES = (P / "superbench_ib_write_bw_loopback_all_sizes.log").read_text()
ROCE = (P / "issue_perftest273_ib_write_bw_postlist_RoCE_report_gbits_8B.txt").read_text()
HEADER = " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]\n"
RULE = "-" * 87 + "\n"


def report(row: str, header: str = HEADER) -> str:
    return header + row + "\n" + RULE


@pytest.mark.parametrize("text", [LOOPBACK_8M, ALL_SIZES, ROCE], ids=["8M", "all-sizes", "roce"])
def test_every_recorded_report_ends_with_its_closing_line(text):
    assert parse_report(text).complete


@pytest.mark.parametrize("row,needle", [
    (" 8388608    5000             nan                 nan                  0.0", "finite"),
    (" 8388608    5000             -5.00               -5.00                0.0", "finite"),
    (" 8388608    5000             inf                 inf                  0.0", "finite"),
    (" 8388608    5000             393.10              392.55               -0.1", "finite"),
    (" 8388608    5000             393.10              1e30                 0.1", "finite"),
    (" 8388608    5000             " + "1" + "0" * 30 + ".00   392.55    0.1", "faster than"),
    (" 8388608    5000             393.10              3200.01              0.1", "faster than"),
], ids=["nan", "negative", "inf", "negative-rate", "exponent", "peak-1e30", "above-any-link"])
def test_a_row_outside_the_domain_is_a_parse_error_naming_it(row, needle):
    with pytest.raises(PerftestParseError, match=needle) as err:
        parse_report(report(row))
    assert "8388608" in str(err.value)


def test_mib_per_sec_is_bounded_after_conversion():
    # 400,000 MiB/s is 3355 Gbit/s: more than any link, in the unit perftest printed it
    mib = HEADER.replace("Gb/sec", "MiB/sec")
    with pytest.raises(PerftestParseError, match="faster than"):
        parse_report(report(" 8388608    5000   400000.00   400000.00   0.05", mib))
    assert parse_report(report(" 8388608    5000   46821.50   46821.50   0.005", mib)).rows


@pytest.mark.parametrize("cut", [
    " 8388608    5000             393.10              39",  # inside the average column
    " 8388608    5000             393.10              392.55               0.005850",  # no rule
], ids=["mid-row", "before-rule"])
def test_a_report_cut_before_its_closing_line_is_incomplete(cut):
    assert parse_report(HEADER + cut + "\n").complete is False


def test_a_row_cut_to_three_fields_is_no_row():
    with pytest.raises(PerftestParseError, match="no result row"):
        parse_report(HEADER + " 8388608    5000             393.1\n")


_LINE = st.one_of(
    st.text(max_size=60),
    st.sampled_from([HEADER, RULE, "\n", " #bytes #iterations BW peak[KB/sec] BW average[KB/sec]\n"]),
    st.builds(lambda nums: " " + "    ".join(nums) + "\n",
              st.lists(st.one_of(st.integers(-5, 2**70).map(str), st.floats().map(repr),
                                 st.sampled_from(["nan", "inf", "-0.00", "1e30", "392.55"])),
                       min_size=2, max_size=6)),
)


@st.composite
def _mangled(draw) -> str:
    text = draw(st.sampled_from([LOOPBACK_8M, ALL_SIZES, ROCE]))
    at = draw(st.integers(0, len(text)))
    junk = draw(st.text(max_size=10) | st.sampled_from(["nan", "-", "1e30", "9" * 40, "\n"]))
    return (text[:at] + junk + text[at:])[: draw(st.integers(0, len(text) + 10))]


_VALUE = st.one_of(st.integers(-5, 2**70).map(str), st.floats().map(repr),
                   st.floats(0, 1e6).map(lambda f: f"{f:.2f}"),
                   st.sampled_from(["nan", "inf", "-0.00", "1e30", "392.55"]))
_ROW = st.builds(lambda size, iters, vals: f" {size}    {iters}    {'    '.join(vals)}\n",
                 st.integers(1, 2**23), st.integers(0, 10**6),
                 st.lists(_VALUE, min_size=2, max_size=3))
_REPORT = st.builds(lambda head, rows, tail: head + "".join(rows) + tail,
                    st.sampled_from([HEADER, HEADER.replace("Gb/sec", "MB/sec")]),
                    st.lists(_ROW, min_size=1, max_size=4), st.sampled_from(["", RULE]))


@settings(deadline=None, derandomize=True, max_examples=400)
@given(text=st.one_of(st.lists(_LINE, max_size=12).map("".join), _mangled(), _REPORT))
def test_nothing_but_the_parse_error_escapes(text):
    try:
        rep = parse_report(text)
    except PerftestParseError:
        return
    for row in rep.rows:
        assert 0 <= row.gbit_per_s <= 3200 and 0 <= row.peak_gbit_per_s <= 3200
        assert row.bytes > 0 and row.iterations >= 0
