"""The GPU↔NIC pairing (gpu_monitor/hw/topology.py) on the simulated HGX node and by hand."""

from __future__ import annotations

from gpu_monitor.hw.topology import (
    GpuPlacement,
    NicFunction,
    gpus_paired_to,
    nearest_nic,
    read_pairing,
)
from gpu_monitor.profiles import load_profile
from gpu_monitor.sim.node import SimulatedNode


def test_each_gpu_of_the_simulated_hgx_node_is_paired_with_its_own_nic():
    node = SimulatedNode(load_profile("h100-sxm-8"))
    host = node.host()
    try:
        pairing = read_pairing(host.nvml, host.sysfs)
    finally:
        host.close()
        node.close()
    assert {dev: gpus for dev, gpus in pairing.items() if dev.startswith("mlx5_")} == {
        f"mlx5_{i}": [i] for i in range(8)}


def test_nearest_nic_is_the_closest_bus_in_the_same_domain_and_numa_node():
    nics = [NicFunction("0000:4f:00.0", ("mlx5_0",), 0), NicFunction("0000:5d:00.0",
                                                                       ("mlx5_1",), 0),
            NicFunction("0000:9c:00.0", ("mlx5_2", "mlx5_3"), 1)]
    assert nearest_nic("0000:53:00.0", 0, nics) == "mlx5_0"
    assert nearest_nic("0000:9d:00.0", 1, nics) == "mlx5_2"
    assert nearest_nic("0000:9d:00.0", 0, nics) == "mlx5_1"  # NUMA first, then the bus
    assert nearest_nic(None, 0, nics) is None
    gpus = [GpuPlacement(0, "0000:53:00.0", 0), GpuPlacement(1, "0000:9d:00.0", 1)]
    assert gpus_paired_to("mlx5_3", gpus, nics) == [1]  # a second device of one function
    assert gpus_paired_to("mlx5_1", gpus, nics) == []  # a port that serves no GPU
    assert gpus_paired_to("mlx5_9", gpus, nics) == []
