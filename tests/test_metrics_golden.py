"""Golden end-to-end test of /metrics: the real daemon on simulated nodes, scraped over loopback.

Non-determinism is removed by injecting the clock (a FakeClock: fixed timestamps, zero
durations) and a fixed node name (the simulated UUIDs derive from it), never by masking values.
Rewrite the files with ``python -m pytest tests/test_metrics_golden.py --update-golden``
and review the diff: it shows every metric change.
"""

from __future__ import annotations

import shutil
import subprocess
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from gpu_monitor.check import Context
from gpu_monitor.clock import FakeClock
from gpu_monitor.config import DEFAULT_CONFIG, FailfastConfig
from gpu_monitor.daemon import Daemon, build_registry
from gpu_monitor.exporter import Exporter
from gpu_monitor.failfast.metrics import failfast_collector
from gpu_monitor.failfast.records import NoticeBook
from gpu_monitor.model import Kind
from gpu_monitor.profiles import load_profile
from gpu_monitor.registry import all_check_classes, select
from gpu_monitor.remediate.breaker import BreakerStatus, Slot
from gpu_monitor.remediate.metrics import remediation_collector
from gpu_monitor.remediate.record import KV_BREAKER, KV_NAMESPACE
from gpu_monitor.sim.inject import parse
from gpu_monitor.sim.node import SimulatedNode
from gpu_monitor.state import Store
from tests.conftest import REPO

GOLDEN = REPO / "tests" / "golden"

SCENARIOS = {
    "h100_healthy": ("h100-sxm-8", []),
    "h100_faulty": ("h100-sxm-8", [
        "xid@gpu:3,code=79", "xid@gpu:1,code=13", "sxid@nvswitch:0,code=20034,fatal=1",
        "port-down@ib:mlx5_0:1,after=0,for=20", "aer@gpu:2,kind=nonfatal",
        "throttle@gpu:5,event=hw_thermal_slowdown", "hot@gpu:6,core=95,memory=99",
        "nvlink-down@gpu:0,link=4", "row-remap-pending@gpu:2",
    ]),
    "cpu_only": ("cpu-only", []),
}


def _dry_run_remediation(store: Store, clock: FakeClock) -> None:
    """What a dry-run remediator records on the faulty node, written through the store's API as
    gpu_monitor/remediate/lifecycle.py writes it: the node suspect, the GPU reset it would have
    done, and the breaker as last seen (another node holds a slot)."""
    now = clock.now()
    store.set_node_state("suspect", "Xid79", now)
    store.record_action("reset_gpu", "dry_run", now, {"reason": "Xid79"})
    breaker = BreakerStatus(slots={"gpu-node-17": Slot("2026-01-01T00:00:00Z",
                                                      "2026-01-01T00:00:00Z", "NvLinkDown")},
                            budget=3, gpu_nodes=64)
    store.set_kv(KV_NAMESPACE, KV_BREAKER, breaker.to_dict())
    # The fail-fast notice of mlx5_0:1's outage past NCCL's tolerance, in dry-run (the default
    # actions, event and file, on the one pod holding a paired GPU), counted through the
    # notifier's own book.
    book = NoticeBook(store)
    book.count("notice", "would_notify")
    for action in FailfastConfig.actions:
        book.count(action, "dry_run")


#: The scenarios whose store also holds a remediator's and the fail-fast notifier's records;
#: every scenario serves the remediation and fail-fast families, as a daemon with remediation
#: enabled (dry-run by default) and fail-fast on (its default) does.
REMEDIATION = {"h100_faulty": _dry_run_remediation}


@contextmanager
def serving(scenario: str, tmp_path: Path) -> Iterator[tuple[CollectorRegistry, str]]:
    """The daemon's registry for ``scenario`` after two rounds of polls, and the URL of its
    ``/metrics`` served by the real exporter on loopback (tests/test_exporter_formats.py
    scrapes the same node in every format)."""
    profile_name, faults = SCENARIOS[scenario]
    profile = load_profile(profile_name)
    node = SimulatedNode(profile, [parse(f) for f in faults], hostname="golden-node")
    clock = FakeClock()
    store = Store.open(str(tmp_path / "state.db"), clock=clock)
    classes = [c for c in select(all_check_classes(plugins=False), kinds={Kind.PASSIVE})]
    ctx = Context(host=node.host(), profile=profile.for_simulation(), config=DEFAULT_CONFIG,
                  node="golden-node", clock=clock, store=store, one_shot=False)
    daemon = Daemon([c() for c in classes], ctx)
    exporter = None
    try:
        daemon.open_kmsg()
        daemon.tick(wait=True)
        # Ten seconds later (an outage in progress, windows filling), a second round of polls.
        clock.advance(10)
        node.advance(10)
        daemon.pump_kmsg()
        for check in daemon.poll_checks:
            daemon.next_due[check.name] = clock.monotonic()
        daemon.tick(wait=True)
        if scenario in REMEDIATION:
            REMEDIATION[scenario](store, clock)
        registry = build_registry(daemon, store, classes, clock,
                                  extra=[remediation_collector(store),
                                         failfast_collector(store, FailfastConfig.actions)])
        exporter = Exporter(registry, daemon.health)
        host, port = exporter.start("127.0.0.1:0")
        yield registry, f"http://{host}:{port}/metrics"
    finally:
        if exporter:
            exporter.stop()
        daemon.shutdown()
        store.close()
        node.close()


def scrape(scenario: str, tmp_path: Path) -> str:
    """``/metrics`` as a scraper that asks for nothing in particular gets it (text 0.0.4)."""
    with serving(scenario, tmp_path) as (_registry, url), \
            urllib.request.urlopen(url, timeout=10) as resp:
        assert resp.status == 200
        return resp.read().decode()


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_metrics_match_golden(scenario, tmp_path, update_golden):
    text = scrape(scenario, tmp_path)
    path = GOLDEN / f"{scenario}.prom"
    if update_golden or not path.exists():
        if not update_golden:
            pytest.fail(f"{path} is missing: run with --update-golden and commit it")
        path.write_text(text)
    assert text == path.read_text(), (
        f"/metrics differs from {path.name}; if the change is intended, rerun with "
        "--update-golden and review the diff")


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_golden_files_pass_promtool(scenario):
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (Debian package prometheus)")
    path = GOLDEN / f"{scenario}.prom"
    out = subprocess.run([promtool, "check", "metrics"], input=path.read_bytes(),
                         capture_output=True, timeout=60)
    assert out.returncode == 0 and not out.stdout.strip() and not out.stderr.strip(), (
        out.stdout.decode() + out.stderr.decode())


def test_faulty_scenario_shows_the_faults():
    text = (GOLDEN / "h100_faulty.prom").read_text()
    assert 'gpu_monitor_xid_events_total{code="79",gpu="3"' in text
    assert 'gpu_monitor_check_status{check="xid",status="failed",target="gpu:3"} 1.0' in text
    assert 'gpu_monitor_rdma_port_state{device="mlx5_0",port="1",state="down"} 1.0' in text
    assert 'gpu_monitor_rdma_port_down_seconds_total{device="mlx5_0",port="1"} 10.0' in text


def test_remediation_families_are_in_the_goldens():
    from gpu_monitor.remediate.metrics import REMEDIATION_METRICS

    healthy = (GOLDEN / "h100_healthy.prom").read_text()
    faulty = (GOLDEN / "h100_faulty.prom").read_text()
    for doc in REMEDIATION_METRICS:
        assert f"# TYPE {doc.name.removesuffix('_total')}" in healthy, doc.name
    assert 'gpu_monitor_node_state{state="suspect"} 1.0' in faulty
    assert 'gpu_monitor_remediation_actions_total{action="reset_gpu",result="dry_run"} 1.0' \
        in faulty
    assert "gpu_monitor_breaker_slots_budget 3.0" in faulty
    assert "gpu_monitor_breaker_slots_used 1.0" in faulty
    assert "gpu_monitor_breaker_slots_budget NaN" in healthy  # never computed: unknown, not 0


def test_every_declared_reason_is_present_at_start():
    text = (GOLDEN / "h100_healthy.prom").read_text()
    for cls in select(all_check_classes(plugins=False), kinds={Kind.PASSIVE}):
        for reason in cls.all_reasons():
            assert f'gpu_monitor_check_results_total{{check="{cls.name}",reason="{reason}"}}' \
                in text
