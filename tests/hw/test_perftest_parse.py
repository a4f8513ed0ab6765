"""The perftest bandwidth-report parser on the recorded ib_write_bw outputs."""

from __future__ import annotations

import pytest

from gpu_monitor.hw.perftest import PerftestParseError, parse_report

P = "ib_perftest"


def read(fixtures_dir, name: str) -> str:
    return (fixtures_dir / P / name).read_text()


def test_loopback_8m_interleaved_server_and_client_mb_per_sec(fixtures_dir):
    report = parse_report(read(fixtures_dir, "superbench_ib_write_bw_loopback_8M.log"))
    assert len(report.rows) == 2  # the server's and the client's identical lines
    row = report.row_for(8388608)
    assert (row.bytes, row.iterations, row.bw_peak, row.bw_average, row.msg_rate_mpps) == (
        8388608, 20000, 24056.74, 24056.72, 0.003007)
    assert row.unit == "MB/sec"
    # perftest's MB/sec is 2^20 bytes/s: 24056.72 MiB/s = 201.80 Gbit/s
    assert row.gbit_per_s == pytest.approx(24056.72 * 1048576 * 8 / 1e9)
    assert round(row.gbit_per_s, 2) == 201.80


def test_loopback_all_sizes(fixtures_dir):
    report = parse_report(read(fixtures_dir, "superbench_ib_write_bw_loopback_all_sizes.log"))
    sizes = report.sizes()
    assert sizes == tuple(2 ** k for k in range(1, 24))  # 2 B .. 8 MiB
    assert report.row_for(2).bw_average == 5.30
    assert report.row_for(65536).bw_average == 21167.79
    row = report.row_for(8388608)
    assert (row.iterations, row.bw_peak, row.bw_average, row.msg_rate_mpps) == (
        2000, 23240.68, 23240.68, 0.002905)
    assert round(row.gbit_per_s, 2) == 194.96
    assert report.largest.bytes == 8388608


def test_report_gbits_post_list_roce(fixtures_dir):
    report = parse_report(
        read(fixtures_dir, "issue_perftest273_ib_write_bw_postlist_RoCE_report_gbits_8B.txt"))
    (row,) = report.rows
    assert (row.bytes, row.iterations, row.unit) == (8, 224958464, "Gb/sec")
    assert (row.bw_peak, row.bw_average, row.msg_rate_mpps) == (0.00, 0.48, 7.498617)
    assert row.gbit_per_s == 0.48  # Gb/sec is already Gbit/s


# Newer perftest labels the same 2^20 unit "MiB/sec" and may print a CPU-frequency warning
# between the header and the row (composed in that layout for this test).
NEWER = """ #bytes     #iterations    BW peak[MiB/sec]    BW average[MiB/sec]   MsgRate[Mpps]
Conflicting CPU frequency values detected: 1846.550000 != 2596.396000. CPU Frequency is not max.
 8388608    5000             47000.12            46821.50              0.005853
---------------------------------------------------------------------------------------
deallocating GPU buffer 00007f3a2c000000
destroying current CUDA Ctx
"""


def test_mib_per_sec_label_and_interleaved_warning():
    row = parse_report(NEWER).row_for(8388608)
    assert row.unit == "MiB/sec"
    assert round(row.gbit_per_s, 2) == round(46821.50 * 1048576 * 8 / 1e9, 2) == 392.77


@pytest.mark.parametrize("name", [
    "gpud_ibstat_47.0_H100_MT4129_all_active_0.txt",
    "issue_DeepEP38_ibv_devinfo_mlx5_2_CX7_4129_PORT_ACTIVE_RoCE.txt",
    "issue_gpud-pr752_ibstat_partial_then_ibpanic_redacted.txt",
])
def test_other_rdma_tools_output_is_not_a_report(fixtures_dir, name):
    with pytest.raises(PerftestParseError, match="no perftest bandwidth header"):
        parse_report(read(fixtures_dir, name))


def test_header_without_rows_is_a_run_that_ended_early(fixtures_dir):
    text = read(fixtures_dir, "superbench_ib_write_bw_loopback_8M.log")
    cut = text[: text.index(" 8388608    20000")]
    with pytest.raises(PerftestParseError, match="no result row"):
        parse_report(cut)


@pytest.mark.parametrize("text", [
    "",
    "Couldn't connect to 127.0.0.1:18510\nUnable to open file descriptor for socket connection",
    "\x00\xff garbage 8388608 5000 1.0 2.0\n",
    " 8388608    5000             100.04              100.00          0.001490\n",  # no header
])
def test_garbage_is_refused(text):
    with pytest.raises(PerftestParseError):
        parse_report(text)


def test_unknown_unit_is_refused():
    text = " #bytes     #iterations    BW peak[KB/sec]    BW average[KB/sec]   MsgRate[Mpps]\n" \
           " 65536      1000             1.00               1.00                 0.1\n"
    with pytest.raises(PerftestParseError, match="unknown perftest bandwidth unit"):
        parse_report(text)
