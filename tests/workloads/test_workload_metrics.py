"""The attribution families as a scrape shows them: pods per GPU, freshness, read health."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from gpu_monitor.metrics import StoreCollector
from gpu_monitor.state import Store
from gpu_monitor.workloads.attribution import GpuIdentity, Refresher, resolve
from gpu_monitor.workloads.kubelet import DeviceAssignment, KubeletUnavailable
from gpu_monitor.workloads.metrics import MAX_PODS_PER_GPU, workload_collector

GPUS = (GpuIdentity(0, "GPU-a"), GpuIdentity(3, "GPU-d"))


def _scrape(refresher: Refresher) -> str:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(StoreCollector(Store.open(":memory:"), extra=[workload_collector(refresher)]))
    return generate_latest(reg).decode()


def _refresher(rows, fail_after: int | None = None):
    calls = {"n": 0}

    def read():
        calls["n"] += 1
        if fail_after is not None and calls["n"] > fail_after:
            raise KubeletUnavailable("timeout", "DEADLINE_EXCEEDED")
        return resolve(rows, GPUS, {}, ("nvidia.com/gpu",), (), read_at=1.0)

    return Refresher(read, 30, source="kubelet")


def test_pod_info_series_per_gpu_and_container_and_read_health():
    r = _refresher([DeviceAssignment("ml", "trainer", "main", "nvidia.com/gpu", "GPU-d"),
                    DeviceAssignment("ml", "x", "c", "nvidia.com/gpu", "GPU-zzz")], fail_after=1)
    r.refresh_once()
    r.refresh_once()
    text = _scrape(r)
    assert ('gpu_monitor_gpu_pod_info{container="main",gpu="3",namespace="ml",pod="trainer",'
            'uuid="GPU-d"} 1.0') in text
    assert text.count("gpu_monitor_gpu_pod_info{") == 1  # the unknown device is not a series
    assert 'gpu_monitor_workloads_state{state="stale"} 1.0' in text
    assert 'gpu_monitor_workloads_reads_total{result="ok"} 1.0' in text
    assert 'gpu_monitor_workloads_reads_total{result="timeout"} 1.0' in text


def test_pods_per_gpu_are_capped():
    rows = [DeviceAssignment("ml", f"p{i}", "c", "nvidia.com/gpu", f"GPU-a::{i}")
            for i in range(MAX_PODS_PER_GPU + 10)]
    r = _refresher(rows)
    r.refresh_once()
    assert _scrape(r).count("gpu_monitor_gpu_pod_info{") == MAX_PODS_PER_GPU


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
def test_promtool_check_metrics_is_clean():
    r = _refresher([DeviceAssignment("ml", "trainer", "main", "nvidia.com/gpu", "GPU-a")])
    r.refresh_once()
    out = subprocess.run(["promtool", "check", "metrics"], input=_scrape(r), text=True,
                         capture_output=True, timeout=60)
    assert out.returncode == 0 and not out.stdout.strip() and not out.stderr.strip(), (
        out.stdout + out.stderr)
