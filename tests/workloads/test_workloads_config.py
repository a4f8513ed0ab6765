"""The workloads config block is validated at load, each problem naming its field."""

from __future__ import annotations

import pytest

from gpu_monitor.config import ConfigError, parse_config


def test_defaults_and_a_full_block():
    assert parse_config({}).workloads.source == "auto"
    w = parse_config({"workloads": {"source": "kubelet", "socket": "/run/k.sock", "refresh_s": 10,
                                    "timeout_s": 1, "rdma_resources": ["rdma/hca_shared"]}},
                     env={}).workloads
    assert (w.source, w.socket, w.refresh_s, w.timeout_s) == ("kubelet", "/run/k.sock", 10, 1)
    assert w.rdma_resources == ("rdma/hca_shared",) and w.gpu_resources == ("nvidia.com/gpu",)


@pytest.mark.parametrize("block, field", [
    ({"source": "k8s"}, "workloads.source"),
    ({"refresh_s": 0}, "workloads.refresh_s"),
    ({"timeout_s": -1}, "workloads.timeout_s"),
    ({"timeout_s": 60, "refresh_s": 30}, "workloads.timeout_s"),
    ({"gpu_resources": ["gpu"]}, "workloads.gpu_resources[0]"),
    ({"rdma_resources": "rdma/x"}, "workloads.rdma_resources"),
    ({"sockets": "/x"}, "workloads.sockets"),
])
def test_invalid_values_fail_naming_the_field(block, field):
    with pytest.raises(ConfigError) as raised:
        parse_config({"workloads": block}, env={})
    assert f"{field}:" in str(raised.value)
