"""Every family's labels come from the fixed vocabulary (gpu_monitor/metric_families.py
``LABELS``), the families served are the families documented, and no renamed name is served or
queried any more."""

from __future__ import annotations

import re

import pytest

from gpu_monitor.cleaning.metrics import CLEANING_METRICS
from gpu_monitor.failfast.metrics import FAILFAST_METRICS
from gpu_monitor.metric_families import LABELS
from gpu_monitor.metrics import RENAMED, documented_metrics
from gpu_monitor.remediate.metrics import REMEDIATION_METRICS
from gpu_monitor.workloads.metrics import WORKLOAD_METRICS
from tests.conftest import REPO

GOLDEN = REPO / "tests" / "golden"
#: The families every daemon of the golden scenarios serves (remediation and fail-fast are on by
#: default) ...
SERVED = (*documented_metrics(), *REMEDIATION_METRICS, *FAILFAST_METRICS)
#: ... and every family any daemon serves (attribution and cleaning have tests of their own
#: scrapes: tests/workloads, tests/cleaning).
FAMILIES = (*SERVED, *WORKLOAD_METRICS, *CLEANING_METRICS)


@pytest.mark.parametrize("family", FAMILIES, ids=lambda m: m.name)
def test_every_label_is_in_the_vocabulary(family):
    assert set(family.labels) <= set(LABELS), set(family.labels) - set(LABELS)


@pytest.mark.parametrize("family", FAMILIES, ids=lambda m: m.name)
def test_names_follow_the_prometheus_conventions(family):
    assert re.fullmatch(r"gpu_monitor(_[a-z0-9]+)+", family.name), family.name
    assert family.name.endswith("_total") == (family.type == "counter"), family.name
    assert family.type in ("counter", "gauge", "info")


def _served() -> set[str]:
    """Family names in the golden scrapes (text 0.0.4 names them as documented)."""
    return {line.split()[2] for path in GOLDEN.glob("*.prom")
            for line in path.read_text().splitlines() if line.startswith("# TYPE ")}


def test_every_documented_family_is_in_a_golden_file_and_the_reverse():
    documented = {m.name for m in SERVED}
    served = _served()
    assert documented == served, (f"documented only: {sorted(documented - served)}; "
                                  f"served only: {sorted(served - documented)}")


def test_architecture_doc_lists_the_label_vocabulary():
    text = (REPO / "docs" / "architecture.md").read_text()
    section = text.split("### Metric labels", 1)[1].split("\n## ", 1)[0]
    for label in LABELS:
        assert f"`{label}`" in section, label


@pytest.mark.parametrize("old", sorted(RENAMED))
def test_a_renamed_family_is_neither_served_nor_queried(old):
    assert old not in _served()
    for path in [REPO / "daemonset" / "prometheusrule.yaml",
                 REPO / "daemonset" / "dashboards" / "gpu-monitor.json",
                 *sorted((REPO / "tests" / "deploy" / "promtool").glob("*"))]:
        assert old not in path.read_text(), path
