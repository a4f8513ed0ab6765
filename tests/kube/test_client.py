"""The Kubernetes client (gpu_monitor/kube/client.py) against the fake apiserver: retries, the
deadline, the metadata-only GPU node count and rate-limited writes."""

from __future__ import annotations

import pytest

from gpu_monitor.clock import FakeClock
from gpu_monitor.kube.errors import KubeError, KubeUnavailable
from gpu_monitor.kube.ratelimit import RateLimiter
from tests.kube.client_helpers import kube_for

NODE = "gpu-node-1"


@pytest.fixture
def fake(fake_api):
    fake_api.add_node(NODE, gpus=8)
    return fake_api


def test_transient_errors_are_retried_and_others_raised(fake):
    kube = kube_for(fake)
    fake.inject("GET", f"/api/v1/nodes/{NODE}", 503, times=2)
    assert kube.get_node(NODE)["metadata"]["name"] == NODE
    with pytest.raises(KubeError) as err:
        kube.get_node("nope")
    assert err.value.status == 404 and "not found" in err.value.message


def test_an_unreachable_api_server_gives_up_at_the_deadline(fake):
    kube = kube_for(fake, retry_deadline_s=0.5)
    fake.stop()
    with pytest.raises(KubeUnavailable):
        kube.get_node(NODE)


def test_gpu_nodes_are_counted_by_label_from_a_metadata_list(fake):
    for i in range(3):
        fake.add_node(f"gpu-{i}", gpus=8)
    fake.add_node("cpu-0")
    kube = kube_for(fake)
    assert kube.count_gpu_nodes() == 4
    lst = [q for q in fake.requests if q.path == "/api/v1/nodes"][-1]
    assert lst.params["labelSelector"] == "nvidia.com/gpu.present=true"


def test_rate_limited_writes_under_a_burst_of_changes(fake):
    clock = FakeClock()
    kube = kube_for(fake, clock, qps=5.0)
    kube.limiter = RateLimiter(5.0, 2, clock)
    start = clock.monotonic()
    for i in range(6):
        kube.patch_node(NODE, {"metadata": {"labels": {"n": str(i)}}})
    assert clock.monotonic() - start == pytest.approx(0.8)
