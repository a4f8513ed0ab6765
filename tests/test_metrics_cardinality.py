"""Cardinality is bounded: one scrape of the simulated 8-GPU node (h100-sxm-8: 18 NVLinks per
GPU, 8 RDMA ports) stays under the bound docs/metrics.md states, and the measured count the docs
state is still about right. The golden files are the scrapes (tests/test_metrics_golden.py holds
them byte-equal to the daemon's /metrics), so counting their samples counts the daemon's."""

from __future__ import annotations

import pytest

from gpu_monitor.metrics import SERIES_BOUND_8GPU, SERIES_MEASURED_8GPU
from tests.conftest import REPO

GOLDEN = REPO / "tests" / "golden"


def samples(name: str) -> int:
    return sum(1 for line in (GOLDEN / name).read_text().splitlines()
               if line and not line.startswith("#"))


@pytest.mark.parametrize("scenario", ["h100_healthy.prom", "h100_faulty.prom"])
def test_the_8gpu_node_stays_under_the_documented_bound(scenario):
    assert samples(scenario) < SERIES_BOUND_8GPU


def test_the_documented_measurement_is_current_within_ten_percent():
    measured = samples("h100_faulty.prom")
    assert abs(measured - SERIES_MEASURED_8GPU) <= SERIES_MEASURED_8GPU * 0.1, (
        f"{measured} samples, docs say {SERIES_MEASURED_8GPU}: update SERIES_MEASURED_8GPU "
        "in gpu_monitor/metrics.py and regenerate docs/metrics.md")


def test_the_docs_state_both_numbers():
    text = (REPO / "docs" / "metrics.md").read_text()
    assert f"under {SERIES_BOUND_8GPU:,} samples" in text
    assert f"measured: {SERIES_MEASURED_8GPU:,}" in text
