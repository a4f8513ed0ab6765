"""Every check that lists GPUs through NVML says the same things when it cannot, or when one is lost.

The rules live in checks/_gpus.py; this holds every check that uses them to the rules, through
its own entry point on a simulated node whose fake NVML fails the way the real one does.
"""

from __future__ import annotations

import pytest

from checks._gpus import active_gpus
from checks.burn_in import BurnIn
from checks.ecc_memory import EccMemory
from checks.inventory import Inventory
from checks.nccl_allreduce import NcclAllreduce
from checks.nvlink_peer import NvlinkPeer
from checks.nvlink_state import NvlinkState
from checks.pcie import Pcie
from checks.sdc_probe import SdcProbe
from checks.temperature import Temperature
from checks.throttle import Throttle
from gpu_monitor.check import Check, Context
from gpu_monitor.config import DEFAULT_CONFIG
from gpu_monitor.hw.nvml_reader import NvmlReader
from gpu_monitor.model import Status
from gpu_monitor.profiles import load_profile
from gpu_monitor.sim.fake_nvml import FakeNvml
from gpu_monitor.sim.node import SimulatedNode

PASSIVE = [Inventory, Temperature, Throttle, NvlinkState, EccMemory]
ACTIVE = [Pcie, BurnIn, NvlinkPeer, SdcProbe, NcclAllreduce]


@pytest.fixture
def node():
    n = SimulatedNode(load_profile("h100-sxm-8"), [])
    yield n
    n.close()


def _ctx(node, nvml=None) -> Context:
    host = node.host()
    if nvml is not None:
        host.nvml = nvml
    return Context(host=host, profile=load_profile("h100-sxm-8").for_simulation(),
                   config=DEFAULT_CONFIG)


def _entry(check: Check):
    return check.poll if type(check).poll is not Check.poll else check.run


@pytest.mark.parametrize("cls", PASSIVE + ACTIVE, ids=lambda c: c.name)
def test_gpus_nvml_cannot_list_are_one_unknown_node_result_naming_the_error(node, cls):
    ctx = _ctx(node, NvmlReader(FakeNvml(node.spec, {"nvmlDeviceGetCount": "Unknown"})))
    (res,) = _entry(cls())(ctx)
    assert (res.target, res.status, res.reason) == ("node", Status.UNKNOWN, "NvmlReadError")
    assert res.details["nvml_error_kind"] == "unknown"
    assert "cannot enumerate GPUs" in res.message


@pytest.mark.parametrize("cls", [BurnIn, NvlinkPeer, SdcProbe, NcclAllreduce],
                         ids=lambda c: c.name)
def test_an_active_check_leaves_a_lost_gpu_out_says_so_and_tests_the_rest(node, cls):
    node.spec.gpu(2).lost = True
    results = _entry(cls())(_ctx(node))
    lost = [r for r in results if r.target == "gpu:2"]
    assert [(r.status, r.reason) for r in lost] == [(Status.UNKNOWN, "DeviceUnavailable")]
    assert "NVML reports it lost" in lost[0].message
    rest = [r for r in results if r.target != "gpu:2"]
    assert rest and all(r.status is Status.OK for r in rest), rest  # the others were tested
    assert not [r.target for r in rest if "2" in r.target.split(":")[1:]]  # none with gpu:2


IDENTITY = ["nvmlDeviceGetHandleByIndex", "nvmlDeviceGetUUID", "nvmlDeviceGetName",
            "nvmlDeviceGetPciInfo", "nvmlDeviceGetSerial", "nvmlDeviceGetMemoryInfo"]


@pytest.mark.parametrize("call", IDENTITY)
@pytest.mark.parametrize("cls", PASSIVE, ids=lambda c: c.name)
def test_a_gpu_nvml_cannot_identify_is_unknown_naming_the_call_and_the_rest_are_judged(
        node, cls, call):
    node.spec.gpu(2).nvml_errors[call] = "InsufficientPower"
    results = cls().poll(_ctx(node))
    gpu2 = [r for r in results if r.target == "gpu:2"]
    assert [(r.status, r.reason) for r in gpu2] == [(Status.UNKNOWN, "NvmlReadError")]
    assert call in gpu2[0].message
    assert (gpu2[0].details["nvml_call"], gpu2[0].details["nvml_error_kind"]) == (
        call, "insufficient_power")
    others = [r for r in results if r.target.startswith("gpu:") and r.target != "gpu:2"]
    assert len(others) == 7 and all(r.status is Status.OK for r in others), others


@pytest.mark.parametrize("call", IDENTITY)
def test_an_active_check_leaves_out_a_gpu_nvml_cannot_identify(node, call):
    node.spec.gpu(5).nvml_errors[call] = "Unknown"
    results, usable = active_gpus(BurnIn(), _ctx(node), "not burned")
    assert [g.index for g in usable] == [0, 1, 2, 3, 4, 6, 7]
    assert all(g.uuid for g in usable)  # every worker can prove it opened the right device
    (res,) = results
    assert (res.target, res.status, res.reason) == ("gpu:5", Status.UNKNOWN, "DeviceUnavailable")
    assert call in res.message and res.details["nvml_call"] == call


def test_an_identity_field_a_part_does_not_have_is_no_error(node):
    for g in node.spec.gpus:
        g.nvml_errors.update({"nvmlDeviceGetSerial": "NotSupported",
                              "nvmlDeviceGetMemoryInfo": "NotSupported"})
    results, usable = active_gpus(BurnIn(), _ctx(node), "not burned")
    assert results == [] and len(usable) == 8
    assert all(r.status is Status.OK for r in Temperature().poll(_ctx(node)))
