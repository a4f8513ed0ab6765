"""The Grafana dashboard parses, shows what the issue asks for, and queries only real metrics.

Every query's metric names must appear in the golden ``/metrics`` expositions
(tests/golden/*.prom) or in the remediation collector's declaration; every query must be valid
PromQL once Grafana's variables are substituted (checked by ``promtool check rules`` on the
queries written as recording rules).
"""

from __future__ import annotations

import json
import re
import subprocess

import yaml

from tests.deploy.deploy_helpers import (
    DEPLOY,
    collector_metric_names,
    find,
    golden_metric_names,
    installed_tool,
    promql_metric_names,
    render,
)

DASHBOARD = DEPLOY / "dashboards" / "gpu-monitor.json"
#: What the issue wants to see -> words one of the dashboard's titles must contain.
SECTIONS = {
    "fleet health": "fleet health",
    "per-node GPU status": "per-node gpu status",
    "XID rates": "xid",
    "RDMA downtime": "rdma port downtime",
    "throttle time": "throttle time",
    "quarantine states": "quarantine state",
    "breaker": "breaker",
    "check durations and last runs": "check duration and last run",
    "ECC errors": "ecc errors",
    "row remapping": "row remaps",
    "NVLink link state": "nvlink links down",
    "NVLink error counters": "nvlink errors",
    "PCIe link width and generation": "pcie links trained below",
    "PCIe AER and replays": "pcie aer errors and replays",
}
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "1h",
                     "$node": ".*", "${node}": ".*"}


def _dashboard() -> dict:
    return json.loads(DASHBOARD.read_text(encoding="utf-8"))


def _panels(d: dict):
    for p in d["panels"]:
        yield p
        yield from p.get("panels", [])


def _queries(d: dict) -> list[tuple[str, str]]:
    return [(p["title"], t["expr"]) for p in _panels(d) for t in p.get("targets", [])]


def test_the_dashboard_parses_and_has_a_stable_identity():
    d = _dashboard()
    assert d["uid"] == "gpu-monitor" and d["title"]
    ids = [p["id"] for p in _panels(d)]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    names = {v["name"] for v in d["templating"]["list"]}
    assert {"datasource", "node"} <= names


def test_the_dashboard_shows_every_section_the_issue_asks_for():
    titles = " | ".join(p["title"].lower() for p in _panels(_dashboard()))
    for what, words in SECTIONS.items():
        assert words in titles, f"no panel for {what}"


def test_every_query_reads_only_metrics_gpu_monitor_exposes():
    known = golden_metric_names() | collector_metric_names()
    d = _dashboard()
    queries = _queries(d)
    assert len(queries) >= 20
    node_query = next(v for v in d["templating"]["list"] if v["name"] == "node")["definition"]
    m = re.fullmatch(r"label_values\((.+),\s*node\)", node_query)
    assert m, f"the node variable should list the node label of a metric: {node_query}"
    for title, expr in [*queries, ("node variable", m.group(1))]:
        used = promql_metric_names(expr)
        assert used, f"{title}: no metric in {expr!r}"
        assert used <= known, f"{title}: unknown metrics {sorted(used - known)}"


def test_every_query_filters_by_the_node_variable_or_is_fleet_wide():
    fleet_wide = {"gpu_monitor_breaker_state", "gpu_monitor_breaker_slots_used",
                  "gpu_monitor_breaker_slots_budget"}
    for title, expr in _queries(_dashboard()):
        if promql_metric_names(expr) <= fleet_wide:
            continue
        assert 'node=~"$node"' in expr, f"{title}: ignores the node selector"


def test_every_query_is_valid_promql(tmp_path):
    promtool = installed_tool("promtool", "promtool is not installed (Debian package prometheus)")
    rules = []
    for i, (_title, expr) in enumerate(_queries(_dashboard())):
        for var, value in GRAFANA_VARIABLES.items():
            expr = expr.replace(var, value)
        assert not re.search(r"\$\w", expr), f"unsubstituted variable in {expr!r}"
        rules.append({"record": f"dashboard:query_{i}", "expr": expr})
    path = tmp_path / "dashboard_queries.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    out = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_dashboard_config_map_carries_the_raw_json_unchanged():
    cm = find(render(DEPLOY), "ConfigMap", "gpu-monitor-dashboard")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(cm["data"]["gpu-monitor.json"]) == _dashboard()
