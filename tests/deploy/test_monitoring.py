"""Scraping and alerting: the ServiceMonitor finds the daemons, the alerts are correct PromQL,
cover what an operator must be paged for, read only metrics that exist, and behave as intended
under ``promtool test rules``.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
from pathlib import Path

import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.deploy.deploy_helpers import (
    DOCS,
    GOLDEN,
    NAMESPACE,
    base_objects,
    collector_metric_names,
    find,
    golden_metric_names,
    heading_anchors,
    installed_tool,
    iter_rules,
    promql_metric_names,
)

PROMTOOL_TESTS = Path(__file__).resolve().parent / "promtool" / "alerts_test.yaml"

#: What the issue requires an alert for -> the alert(s) that cover it.
REQUIRED_ALERTS = {
    "node quarantined": {"GPUNodeQuarantined"},
    "breaker tripped": {"GPUMonitorBreakerTripped"},
    "hardware XID": {"GPUHardwareXid"},
    "RDMA downtime over budget": {"GPURdmaDowntimeOverBudget"},
    "one RDMA outage longer than NCCL's IB timeout": {"GPURdmaOutageExceededNcclTimeout"},
    "sustained throttling": {"GPUThrottlingSustained"},
    "SDC alarm": {"GPUSilentDataCorruption"},
    "daemon down or not scraped": {"GPUMonitorDown", "GPUMonitorNotScraped"},
    "a check failing to run": {"GPUMonitorCheckNotRunning"},
    "bootstrap failed": {"GPUBootstrapFailed"},
}
#: Metrics that come from elsewhere: Prometheus itself and kube-state-metrics.
EXTERNAL_METRICS = {"up", "kube_daemonset_status_number_unavailable", "kube_node_spec_taint"}
SEVERITIES = {"critical", "warning", "info"}


def _rule_object():
    return find(base_objects(), "PrometheusRule", "gpu-monitor")


def _alerts() -> dict[str, dict]:
    return {r["alert"]: r for _g, r in iter_rules(_rule_object())}


def _promtool() -> str:
    return installed_tool("promtool", "promtool is not installed (Debian package prometheus): "
                          "the alert rules are not unit-tested")


def _extract(tmp_path: Path) -> Path:
    """The PrometheusRule's groups as a plain Prometheus rules file, beside the test file."""
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump({"groups": _rule_object()["spec"]["groups"]},
                                    sort_keys=False))
    shutil.copy(PROMTOOL_TESTS, tmp_path / PROMTOOL_TESTS.name)
    return rules


def _anchors(markdown: str) -> set[str]:
    """The headings' anchors and the explicit ones (``<a id=...>``)."""
    return heading_anchors(markdown) | set(re.findall(r'<a (?:id|name)="([^"]+)"', markdown))


# --- ServiceMonitor ------------------------------------------------------------------------------


def test_the_service_monitor_selects_the_metrics_service_and_labels_series_with_the_node():
    docs = base_objects()
    sm = find(docs, "ServiceMonitor", "gpu-monitor")
    service = find(docs, "Service", "gpu-monitor")
    assert sm["apiVersion"] == "monitoring.coreos.com/v1"
    assert sm["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert sm["spec"]["namespaceSelector"]["matchNames"] == [NAMESPACE]
    (endpoint,) = sm["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert endpoint["path"] == "/metrics"
    relabel = {r.get("targetLabel"): r for r in endpoint["relabelings"]}
    for label in ("node", "instance"):
        assert relabel[label]["sourceLabels"] == ["__meta_kubernetes_pod_node_name"]
    # the alerts select job="gpu-monitor": the Prometheus Operator's job label is the Service name
    assert "jobLabel" not in sm["spec"] and service["metadata"]["name"] == "gpu-monitor"


# --- PrometheusRule: structure --------------------------------------------------------------------


def test_every_alert_has_severity_summary_description_and_a_runbook_section():
    runbook = DOCS / "runbook.md"
    assert runbook.is_file(), "docs/runbook.md is missing"
    anchors = _anchors(runbook.read_text(encoding="utf-8"))
    rule = _rule_object()
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    for name, alert in _alerts().items():
        assert alert["labels"]["severity"] in SEVERITIES, name
        ann = alert["annotations"]
        assert ann["summary"] and ann["description"], name
        doc, _, anchor = ann["runbook_url"].partition("#")
        assert doc == "docs/runbook.md", f"{name}: runbook_url {ann['runbook_url']}"
        assert anchor in anchors, f"{name}: docs/runbook.md has no section #{anchor}"


def test_every_required_alarm_has_an_alert():
    alerts = set(_alerts())
    for what, names in REQUIRED_ALERTS.items():
        assert names <= alerts, f"no alert for {what}: missing {sorted(names - alerts)}"


def test_alerts_read_only_metrics_that_exist():
    known = golden_metric_names() | collector_metric_names() | EXTERNAL_METRICS
    for name, alert in _alerts().items():
        used = promql_metric_names(alert["expr"])
        assert used, f"{name}: no metric found in its expression"
        unknown = used - known
        assert not unknown, f"{name} reads metrics gpu-monitor does not expose: {sorted(unknown)}"


def test_the_metric_name_extraction_sees_through_promql_syntax():
    expr = ('sum by (node, code) (increase(foo_total{code=~"4[0-9]", a="b c"}[15m] offset 1h)) '
            '> 0.25 or on (node) bar unless baz offset 5m and time() - 1e3')
    assert promql_metric_names(expr) == {"foo_total", "bar", "baz"}


# --- PrometheusRule: promtool -----------------------------------------------------------------------


def test_promtool_accepts_the_extracted_rule_groups(tmp_path):
    promtool = _promtool()
    rules = _extract(tmp_path)
    out = subprocess.run([promtool, "check", "rules", str(rules)], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


def test_promtool_unit_tests_of_every_alert_pass(tmp_path):
    promtool = _promtool()
    _extract(tmp_path)
    out = subprocess.run([promtool, "test", "rules", PROMTOOL_TESTS.name], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr


def test_promtool_unit_tests_fail_when_an_alert_is_broken(tmp_path):
    promtool = _promtool()
    rules = _extract(tmp_path)
    broken = yaml.safe_load(rules.read_text())
    for group in broken["groups"]:
        for rule in group["rules"]:
            if rule["alert"] == "GPUHardwareXid":
                rule["expr"] = rule["expr"].replace("|79|", "|")
    rules.write_text(yaml.safe_dump(broken, sort_keys=False))
    out = subprocess.run([promtool, "test", "rules", PROMTOOL_TESTS.name], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "GPUHardwareXid" in out.stdout + out.stderr


def test_every_alert_has_a_firing_case_and_a_quiet_case():
    spec = yaml.safe_load(PROMTOOL_TESTS.read_text())
    assert spec["rule_files"] == ["rules.yaml"]
    firing, quiet = set(), set()
    for case in spec["tests"]:
        for t in case.get("alert_rule_test", []):
            (firing if t["exp_alerts"] else quiet).add(t["alertname"])
    alerts = set(_alerts())
    assert alerts - firing == set(), f"alerts never shown firing: {sorted(alerts - firing)}"
    assert alerts - quiet == set(), f"alerts never shown quiet: {sorted(alerts - quiet)}"
    assert (firing | quiet) <= alerts, "the test file names alerts that do not exist"


# --- every check's failed state reaches an alert ----------------------------------------------------


def _failed_state_case(check_names) -> dict:
    """A promtool case: node ``n-<check>`` has one target of that check failed for 15 minutes
    (nothing else: no remediation series, so it holds in dry-run too), node ``n-ok`` has every
    check ok; at 15m a warning or critical alert must fire for each ``n-<check>`` node and none
    for ``n-ok``."""
    nodes = [f"n-{c}" for c in check_names] + ["n-ok"]
    series = [{"series": f'{name}{{job="gpu-monitor", instance="{n}", node="{n}"{extra}}}',
               "values": "1x20"}
              for n in nodes
              for name, extra in (("up", ""), ("gpu_monitor_build_info", ', version="0.1.0"'))]
    for check in check_names:
        for node, current in ((f"n-{check}", "failed"), ("n-ok", "ok")):
            for status in ("ok", "degraded", "failed", "unknown", "skipped"):
                series.append({
                    "series": f'gpu_monitor_check_status{{job="gpu-monitor", instance="{node}", '
                              f'node="{node}", check="{check}", target="gpu:0", '
                              f'status="{status}"}}',
                    "values": "1x20" if status == current else "0x20"})
    return {
        "name": "every check's failed state raises a warning or critical alert",
        "interval": "1m",
        "input_series": series,
        "promql_expr_test": [{
            "expr": 'group by (node) (ALERTS{alertstate="firing", '
                    'severity=~"warning|critical"})',
            "eval_time": "15m",
            "exp_samples": [{"labels": f'{{node="n-{c}"}}', "value": 1}
                            for c in sorted(check_names)],
        }],
    }


def _run_failed_state_case(tmp_path: Path, groups: list[dict]) -> subprocess.CompletedProcess:
    from checks import ALL_CHECKS

    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
    case = {"rule_files": ["rules.yaml"], "evaluation_interval": "1m",
            "tests": [_failed_state_case([c.name for c in ALL_CHECKS])]}
    (tmp_path / "coverage_test.yaml").write_text(yaml.safe_dump(case, sort_keys=False))
    return subprocess.run([_promtool(), "test", "rules", "coverage_test.yaml"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)


def test_every_check_in_all_checks_has_an_alert_for_its_failed_state(tmp_path):
    out = _run_failed_state_case(tmp_path, _rule_object()["spec"]["groups"])
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_coverage_check_fails_when_a_check_loses_its_alert(tmp_path):
    groups = _rule_object()["spec"]["groups"]
    for group in groups:
        group["rules"] = [r for r in group["rules"] if r.get("alert") != "GPUEccMemoryFailed"]
    out = _run_failed_state_case(tmp_path, groups)
    assert out.returncode != 0 and 'n-ecc_memory' in out.stdout + out.stderr


def test_each_check_alert_links_the_runbook_section_of_its_check():
    (group,) = [g for g in _rule_object()["spec"]["groups"] if g["name"] == "gpu-monitor.checks"]
    for rule in group["rules"]:
        (check,) = set(re.findall(r'check="([a-z_]+)"', rule["expr"]))
        assert rule["annotations"]["runbook_url"] == f"docs/runbook.md#{check}", rule["alert"]
        assert f"`{rule['alert']}`" in (DOCS / "runbook.md").read_text(encoding="utf-8")


def test_the_runbooks_inhibit_rules_name_alerts_that_exist():
    """The Alertmanager example that keeps one notification per fault (docs/runbook.md)."""
    text = (DOCS / "runbook.md").read_text(encoding="utf-8")
    (block,) = [b for b in re.findall(r"```yaml\n(.*?)```", text, re.S) if "inhibit_rules" in b]
    alerts = set(_alerts())
    for rule in yaml.safe_load(block)["inhibit_rules"]:
        assert rule["equal"] == ["node"]
        for matcher in rule["source_matchers"] + rule["target_matchers"]:
            _op, value = re.fullmatch(r'alertname(=~?)"([^"]+)"', matcher).groups()
            assert set(value.split("|")) <= alerts, matcher


# --- the daemon's real exposition, healthy then faulty ---------------------------------------------

#: What a node in the h100_faulty golden scenario (tests/test_metrics_golden.py: Xid 79 on GPU 3,
#: a row remap pending on GPU 2, a fatal SXid, port mlx5_0 down 10 s, non-fatal AER on GPU 2, GPU 6
#: hot, NVLink 4 of GPU 0 down, ...) pages for, two minutes after it was healthy. Thermal slowdown
#: on GPU 5 is too recent for GPUThrottlingSustained (10 minutes) and only degraded in the check.
FAULTY_NODE_ALERTS = [
    ("GPUEccMemoryFailed", "critical", {"check": "ecc_memory", "target": "gpu:2"}),
    ("GPUHardwareXid", "warning", {"code": "63"}),
    ("GPUHardwareXid", "warning", {"code": "79"}),
    ("GPUNvSwitchFailed", "warning", {"check": "nvswitch", "target": "nvswitch:0"}),
    ("GPUNvlinkStateFailed", "warning", {"check": "nvlink_state", "target": "gpu:0"}),
    ("GPUNvlinkStateFailed", "warning", {"check": "nvlink_state", "target": "nvlink:0:4"}),
    ("GPUPcieAerFailed", "warning", {"check": "pcie_aer", "target": "pcie:0000:75:00.0"}),
    ("GPURdmaOutageExceededNcclTimeout", "warning", {"check": "rdma_ports"}),
    ("GPURdmaPortsFailed", "warning", {"check": "rdma_ports", "target": "ib:mlx5_0:1"}),
    ("GPUTemperatureFailed", "critical", {"check": "temperature", "target": "gpu:6"}),
    ("GPUXidFailed", "warning", {"check": "xid", "target": "gpu:2"}),
    ("GPUXidFailed", "warning", {"check": "xid", "target": "gpu:3"}),
]


def _golden_samples(name: str) -> dict[str, float]:
    """A golden exposition's samples as promtool series selectors, with the labels the
    ServiceMonitor adds (job, instance, node)."""
    text = (GOLDEN / f"{name}.prom").read_text(encoding="utf-8")
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if math.isnan(sample.value):
                continue
            labels = {**sample.labels, "job": "gpu-monitor", "instance": "n1", "node": "n1"}
            body = ", ".join(f"{k}={json.dumps(v)}" for k, v in sorted(labels.items()))
            out[f"{sample.name}{{{body}}}"] = sample.value
    return out


def test_the_daemons_own_exposition_of_a_node_turning_faulty_raises_the_expected_alerts(tmp_path):
    """Twenty minutes of the healthy golden scrape, then the faulty one: nothing warning or
    critical fires while healthy, and the faulty node raises exactly ``FAULTY_NODE_ALERTS``
    (with no remediation series at all: dry-run or remediation off)."""
    healthy, faulty = _golden_samples("h100_healthy"), _golden_samples("h100_faulty")
    series = [{"series": "up{job=\"gpu-monitor\", instance=\"n1\", node=\"n1\"}",
               "values": " ".join(["1"] * 41)}]
    for selector in sorted(set(healthy) | set(faulty)):
        before, after = healthy.get(selector), faulty.get(selector)
        series.append({"series": selector, "values": " ".join(
            ["_" if before is None else repr(before)] * 20
            + ["_" if after is None else repr(after)] * 21)})
    query = ('group by (alertname, severity, check, target, code) '
             '(ALERTS{alertstate="firing", severity=~"warning|critical"})')
    expected = []
    for alert, severity, labels in FAULTY_NODE_ALERTS:
        body = ", ".join(f"{k}={json.dumps(v)}" for k, v in
                         {"alertname": alert, "severity": severity, **labels}.items())
        expected.append({"labels": f"{{{body}}}", "value": 1})
    spec = {"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": [{
        "interval": "1m", "input_series": series, "promql_expr_test": [
            {"expr": query, "eval_time": "19m", "exp_samples": []},
            {"expr": query, "eval_time": "22m", "exp_samples": expected}]}]}
    _extract(tmp_path)
    (tmp_path / "golden_test.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    out = subprocess.run([_promtool(), "test", "rules", "golden_test.yaml"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
