"""gpu-monitor's Kubernetes client (gpu_monitor/kube/client.py) pointed at the fake apiserver."""

from __future__ import annotations

from gpu_monitor.clock import Clock
from tests.kube.fake_apiserver import FakeApiServer


def kube_for(fake: FakeApiServer, clock: Clock | None = None, retry_deadline_s: float = 8.0,
             qps: float = 0.0):
    """A `Kube` on a real `kubernetes.client.ApiClient` pointed at the fake."""
    from kubernetes import client

    from gpu_monitor.kube.client import Kube

    api = client.ApiClient(client.Configuration(host=fake.url))
    return Kube(api, clock or Clock(), retry_deadline_s=retry_deadline_s, qps=qps)
