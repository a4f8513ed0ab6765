"""gpu_monitor/nccl.py: nccl-tests' formulas held to real nccl-tests outputs (all-reduce and
all-gather, one node and two), the nearest-rank percentile, the sweep's sizes, and the two
limits a sweep is held to."""

from __future__ import annotations

import re

import pytest

from gpu_monitor.model import Status
from gpu_monitor.nccl import (
    SweepLimits,
    bus_factor,
    busbw_breach,
    latency_breach,
    percentile,
    sweep_sizes,
    sweep_table,
)
from tests.nccl_tests_tables import nccl_tests_rows

# --- nccl-tests' numbers ------------------------------------------------------------------------


_ROW = re.compile(r"^\s+(\d+)\s+(\d+)\s+float\s+sum\s+(?:-?\d+\s+)?([\d.]+)\s+([\d.]+)\s+([\d.]+)")


def _fixture_rows(path):
    text = path.read_text()
    ranks = len(re.findall(r"^#\s+Rank\s+\d+", text, re.M))
    rows = [tuple(float(x) for x in m.groups()) for m in map(_ROW.match, text.splitlines())
            if m]
    return ranks, [r for r in rows if r[3] >= 1.0]  # algbw printed with 2 decimals: skip tiny


@pytest.mark.parametrize("name", [
    "superbench_all_reduce_perf_8xA100-SXM4-40GB.log",
    "gcp-a3mega_all_reduce_perf_2node_16xH100_mpirun.txt",
])
def test_algbw_and_busbw_match_nccl_tests_on_recorded_runs(fixtures_dir, name):
    ranks, rows = _fixture_rows(fixtures_dir / "nccl_tests" / name)
    assert ranks in (8, 16) and len(rows) > 5
    for size, _count, time_us, algbw, busbw in rows:
        per_rank = [{"rows": [{"bytes": int(size), "times_s": [time_us * 1e-6] * 3,
                               "wrong": 0}]}] * ranks
        (row,) = sweep_table("all_reduce", [r["rows"] for r in per_rank])
        assert row["algbw_gb_per_s"] == pytest.approx(algbw, abs=0.006, rel=0.003)
        assert row["busbw_gb_per_s"] == pytest.approx(busbw, abs=0.006, rel=0.003)


def test_bus_factor_is_two_n_minus_one_over_n():
    assert (bus_factor("all_reduce", 8) == 1.75 and bus_factor("all_reduce", 16) == 1.875
            and bus_factor("all_reduce", 2) == 1.0)


def test_latency_is_the_slowest_rank_per_iteration_and_bandwidth_the_slowest_rank_mean():
    per_rank = [{"rows": [{"bytes": 8, "times_s": [1.0, 5.0, 2.0], "wrong": 0}]},
                {"rows": [{"bytes": 8, "times_s": [3.0, 1.0, 1.0], "wrong": 1}]}]
    (row,) = sweep_table("all_reduce", [r["rows"] for r in per_rank])
    assert (row["p50_s"], row["p95_s"]) == (3.0, 5.0)
    assert row["time_avg_s"] == pytest.approx(8 / 3)
    assert row["algbw_gb_per_s"] == pytest.approx(8 / (8 / 3) / 1e9)
    assert row["wrong"] == 1


@pytest.mark.parametrize("values, q, expected", [
    ([5, 1, 3, 2, 4], 50, 3), ([5, 1, 3, 2, 4], 95, 5), (list(range(1, 101)), 95, 95),
    ([7], 95, 7),
])
def test_percentile_is_nearest_rank(values, q, expected):
    assert percentile(values, q) == expected


def test_sweep_sizes_step_by_the_factor_and_stop_at_the_maximum():
    assert sweep_sizes(8, 16 << 20, 4)[-1] == 8 << 20
    assert sweep_sizes(8, 128, 2) == [8, 16, 32, 64, 128]
    assert len(sweep_sizes(8, 2 ** 31, 4)) == 15


@pytest.mark.parametrize("name, op, n", [
    ("aws_all_reduce_perf_2node_2xp5.48xlarge_16xH100_srun-prefix.txt", "all_reduce", 16),
    ("aws_all_reduce_perf_2node_2xp4de.24xlarge_16xA100-80GB_srun-prefix.txt", "all_reduce", 16),
    ("gcp-a3mega_all_reduce_perf_2node_16xH100_mpirun.txt", "all_reduce", 16),
    ("superbench_all_reduce_perf_8xA100-SXM4-40GB.log", "all_reduce", 8),
    ("superbench_allgather_perf_8xA100-SXM4-40GB.log", "all_gather", 8),
])
def test_busbw_matches_nccl_tests_on_real_runs(fixtures_dir, name, op, n):
    rows = nccl_tests_rows(fixtures_dir / "nccl_tests" / name)
    assert len(rows) > 8
    per_rank = [[{"bytes": s, "times_s": [t * 1e-6], "wrong": 0} for s, t, _, _ in rows]] * n
    table = sweep_table(op, per_rank)
    for got, (size, _, algbw, busbw) in zip(table, rows, strict=True):
        assert got["bytes"] == size
        assert got["algbw_gb_per_s"] == pytest.approx(algbw, rel=0.01, abs=0.006)
        assert got["busbw_gb_per_s"] == pytest.approx(busbw, rel=0.01, abs=0.006)


def test_bus_factors():
    assert bus_factor("all_reduce", 8) == 1.75 and bus_factor("all_reduce", 16) == 1.875
    assert bus_factor("all_gather", 8) == 0.875 and bus_factor("all_reduce", 1) == 0.0


# --- the limits ---------------------------------------------------------------------------------

LIMITS = SweepLimits(busbw_floor_gb_per_s=100.0, large_message_min_bytes=1 << 20,
                     small_message_max_bytes=1024, small_p95_latency_limit_s=1e-4,
                     warning_band=0.05)


def _row(size, busbw=200.0, p95=5e-5):
    return {"bytes": size, "p95_s": p95, "busbw_gb_per_s": busbw}


@pytest.mark.parametrize("rows, want", [
    ([_row(8), _row(1 << 20), _row(1 << 22)], None),
    # the lowest of the large sizes counts, a small size's busbw never does
    ([_row(8, busbw=1.0), _row(1 << 20, busbw=90.0), _row(1 << 22)],
     (Status.FAILED, "busbw 90 GB/s at 1048576 B is below the floor 100 GB/s")),
    ([_row(8), _row(1 << 20, busbw=103.0)],
     (Status.DEGRADED, "busbw 103 GB/s at 1048576 B is within 0.05 of the floor 100 GB/s")),
    # no size reaches large_message_min_bytes: the largest swept stands in
    ([_row(8), _row(512, busbw=1.0)],
     (Status.FAILED, "busbw 1 GB/s at 512 B is below the floor 100 GB/s")),
    ([], None),
])
def test_busbw_is_held_to_the_floor_at_the_large_sizes(rows, want):
    got = busbw_breach(rows, LIMITS)
    assert (None if got is None else (got.status, got.message)) == want


@pytest.mark.parametrize("rows, want", [
    ([_row(8), _row(1024), _row(1 << 20, p95=1.0)], None),  # only small sizes count
    ([_row(8, p95=2e-4), _row(1024, p95=3e-4)],
     (Status.FAILED, "p95 latency 300.0 us at 1024 B is above the limit 100.0 us")),
    ([_row(1 << 20, p95=1.0)], None),  # no small size swept
])
def test_p95_latency_is_held_to_the_limit_at_the_small_sizes(rows, want):
    got = latency_breach(rows, LIMITS)
    assert (None if got is None else (got.status, got.message)) == want


def test_a_limit_that_is_not_set_is_not_judged():
    unset = SweepLimits(busbw_floor_gb_per_s=None, large_message_min_bytes=1 << 20,
                        small_message_max_bytes=1024, small_p95_latency_limit_s=None,
                        warning_band=0.05)
    rows = [_row(8, p95=10.0), _row(1 << 20, busbw=0.0)]
    assert busbw_breach(rows, unset) is None and latency_breach(rows, unset) is None
