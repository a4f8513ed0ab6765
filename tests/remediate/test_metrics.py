"""The remediation collector: every series present from start-up, values from the store."""

from __future__ import annotations

from datetime import datetime, timezone

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpu_monitor.clock import FakeClock
from gpu_monitor.metrics import StoreCollector
from gpu_monitor.remediate.metrics import REMEDIATION_METRICS, remediation_collector
from gpu_monitor.state import Store

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def scrape(store) -> dict[tuple[str, tuple], float]:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(StoreCollector(store, extra=[remediation_collector(store)]))
    out = {}
    for fam in text_string_to_metric_families(generate_latest(reg).decode()):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_every_series_exists_at_zero_on_a_fresh_store():
    m = scrape(Store.open(":memory:", FakeClock(T0)))
    assert m[("gpu_monitor_node_state", (("state", "healthy"),))] == 1.0
    assert m[("gpu_monitor_node_state", (("state", "quarantined"),))] == 0.0
    assert m[("gpu_monitor_breaker_state", (("state", "tripped"),))] == 0.0
    assert m[("gpu_monitor_breaker_slots_used", ())] == 0.0
    assert m[("gpu_monitor_remediation_actions_total", (("action", "cordon"), ("result", "ok")))] \
        == 0.0
    assert m[("gpu_monitor_drain_evictions_total", (("result", "blocked"),))] == 0.0
    assert m[("gpu_monitor_replacements_total", ())] == 0.0
    names = {n for n, _ in m}
    for doc in REMEDIATION_METRICS:
        assert any(n.startswith(doc.name) for n in names), doc.name


def test_values_come_from_the_store_and_the_breaker_snapshot():
    store = Store.open(":memory:", FakeClock(T0))
    store.set_node_state("quarantined", "Xid79", T0)
    for action, result in [("quarantine", "ok"), ("cordon", "ok"), ("eviction", "evicted"),
                           ("eviction", "evicted"), ("eviction", "blocked"),
                           ("replace", "labelled"), ("quarantine", "breaker_tripped")]:
        store.record_action(action, result, T0)
    store.add_health_report("u1", "n", "SdcAlarm", "sdc", T0)
    store.set_kv("remediation", "breaker", {"state": "tripped", "paused": True,
                                            "slots": {"a": {}, "b": {}}, "budget": 10})
    m = scrape(store)
    assert m[("gpu_monitor_node_state", (("state", "quarantined"),))] == 1.0
    assert m[("gpu_monitor_node_state", (("state", "healthy"),))] == 0.0
    assert m[("gpu_monitor_breaker_state", (("state", "tripped"),))] == 1.0
    assert m[("gpu_monitor_breaker_state", (("state", "paused"),))] == 1.0
    assert m[("gpu_monitor_breaker_state", (("state", "closed"),))] == 0.0
    assert m[("gpu_monitor_breaker_slots_used", ())] == 2.0
    assert m[("gpu_monitor_breaker_slots_budget", ())] == 10.0
    assert m[("gpu_monitor_drain_evictions_total", (("result", "evicted"),))] == 2.0
    assert m[("gpu_monitor_drain_evictions_total", (("result", "blocked"),))] == 1.0
    assert m[("gpu_monitor_remediation_actions_total",
              (("action", "quarantine"), ("result", "breaker_tripped")))] == 1.0
    assert not any(k[0] == "gpu_monitor_remediation_actions_total" and
                   dict(k[1]).get("action") == "eviction" for k in m)
    assert m[("gpu_monitor_health_reports_total", (("reason", "SdcAlarm"),))] == 1.0
    assert m[("gpu_monitor_replacements_total", ())] == 1.0
