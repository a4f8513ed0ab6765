"""Fixtures for the fabric tests: the fake apiserver (tests/kube), a ``Kube`` on it, the
shipped probe Job template, and the probe controller that stands in for the Job controller,
kube-scheduler's preemption and the probe itself (fake_cluster.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.kube.fake_apiserver import FakeApiServer

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
TEMPLATE = REPO / "daemonset" / "fabric" / "job-template.yaml"
JOB_NAMESPACE = "gpu-monitor-jobs"  # the scheduler's Jobs, apart from the daemon's namespace


@pytest.fixture
def fake_api() -> Iterator[FakeApiServer]:
    server = FakeApiServer().start()
    server.add_namespace("gpu-monitor")
    server.add_namespace(JOB_NAMESPACE)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def kube(fake_api: FakeApiServer):
    from kubernetes import client

    from gpu_monitor.kube.client import Kube

    k = Kube(client.ApiClient(client.Configuration(host=fake_api.url)), qps=0, burst=1,
             retry_deadline_s=5.0)
    try:
        yield k
    finally:
        k.close()


@pytest.fixture
def fabric_api(kube):
    from gpu_monitor.fabric.api import FabricApi

    return FabricApi(kube)


@pytest.fixture
def template() -> dict:
    from gpu_monitor.fabric.plan import load_template

    return load_template(str(TEMPLATE))


@pytest.fixture
def controller(fake_api: FakeApiServer):
    from tests.fabric.fake_cluster import ProbeController

    ctl = ProbeController(fake_api)
    ctl.start()
    try:
        yield ctl
    finally:
        ctl.stop()
