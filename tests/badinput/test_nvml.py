"""Bad input, NVML: every NVML call each NVML-reading check makes, failing with real NVML errors.

The table is generated from ``OWN`` and the shared calls: per check, every NVML call it makes
on a healthy simulated H100 node (``test_the_plan_covers_every_call_each_check_makes`` records them from the
fake pynvml module and fails when a check makes a call the plan does not cover), each with a
few error kinds rotated over real nvml.h return codes. Each case runs through ``cli.main``
(``check NAME --simulate h100-sxm-8 --inject nvml-error@...``) and the harness holds it to the
rule: the GPU (or the node, for calls that name no GPU) is ``unknown`` or ``failed``, the
message or details name the call and the error kind, and nothing crashes. NotSupported has the
outcome its call's nature gives (``NOT_SUPPORTED``): an identity the GPU must have is
``unknown``, the thing a check measures is ``skipped``, an optional field leaves a healthy GPU
``ok``.

The active torch checks are slow (worker processes), so they get one case per call of their own
and one each for the two shared rules they go through (``_gpus.active_gpus`` for identity, the
runner's invasive gate for MIG mode and processes); those rules have a case per call through
the fast checks (every check for identity, ``dcgm_diag`` and ``rdma_loopback`` for the gate).
"""

from __future__ import annotations

import itertools

import pytest

from gpu_monitor.check import Context
from gpu_monitor.config import DEFAULT_CONFIG
from gpu_monitor.hw.nvml import translate_error
from gpu_monitor.hw.nvml_reader import NvmlReader
from gpu_monitor.profiles import load_profile
from gpu_monitor.registry import all_check_classes
from gpu_monitor.runner import run_check
from gpu_monitor.sim import fake_nvml
from gpu_monitor.sim.fake_nvml import FakeNvml
from gpu_monitor.sim.node import SimulatedNode
from tests.badinput.harness import Case, ids, run_case

PROFILE = "h100-sxm-8"
GPU = "gpu:2"

IDENTITY = ("nvmlDeviceGetHandleByIndex", "nvmlDeviceGetUUID", "nvmlDeviceGetName",
            "nvmlDeviceGetPciInfo", "nvmlDeviceGetSerial", "nvmlDeviceGetMemoryInfo")
ENUMERATION = ("nvmlInitWithFlags", "nvmlDeviceGetCount")
GATE = ("nvmlDeviceGetMigMode", "nvmlDeviceGetComputeRunningProcesses",
        "nvmlDeviceGetGraphicsRunningProcesses")  # the runner's gate for invasive checks
SHARED = IDENTITY + ENUMERATION

#: The calls each check makes beyond SHARED (which every check here makes).
OWN: dict[str, tuple[str, ...]] = {
    "inventory": ("nvmlSystemGetDriverVersion", "nvmlSystemGetCudaDriverVersion",
                  "nvmlSystemGetNVMLVersion"),
    "ecc_memory": ("nvmlDeviceGetEccMode", "nvmlDeviceGetTotalEccErrors",
                   "nvmlDeviceGetRemappedRows", "nvmlDeviceGetRowRemapperHistogram"),
    "temperature": ("nvmlDeviceGetTemperature", "nvmlDeviceGetTemperatureThreshold",
                    "nvmlDeviceGetFieldValues", "NVML_FI_DEV_MEMORY_TEMP",
                    "nvmlDeviceGetPowerUsage", "nvmlDeviceGetEnforcedPowerLimit"),
    "throttle": ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetViolationStatus"),
    "power": ("nvmlDeviceGetPowerUsage", "nvmlDeviceGetEnforcedPowerLimit"),
    "nvlink_state": ("nvmlDeviceGetNvLinkState", "nvmlDeviceGetNvLinkErrorCounter"),
    "nvswitch": ("nvmlDeviceGetGpuFabricInfoV",),
    "pcie": ("nvmlDeviceGetCurrPcieLinkGeneration", "nvmlDeviceGetCurrPcieLinkWidth",
             "nvmlDeviceGetMaxPcieLinkGeneration", "nvmlDeviceGetMaxPcieLinkWidth",
             "nvmlDeviceGetPcieReplayCounter", "nvmlDeviceGetNumaNodeId"),
    "dcgm_diag": GATE,
    "rdma_loopback": GATE,
    "burn_in": (*GATE, "nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetTemperature",
                "nvmlDeviceGetTemperatureThreshold", "nvmlDeviceGetFieldValues"),
    "nvlink_peer": (*GATE, "nvmlDeviceGetNvLinkState", "nvmlDeviceGetNvLinkErrorCounter",
                    "nvmlDeviceGetGpuFabricInfoV"),
    "nccl_allreduce": GATE,
    "sdc_probe": GATE,
}
ACTIVE = ("burn_in", "nvlink_peer", "nccl_allreduce", "sdc_probe")

#: Calls a check makes that this table does not judge for it, and why: their errors decide
#: none of its results, or a unit test beside the check holds them.
ELSEWHERE: dict[str, dict[str, str]] = {
    "xid": dict.fromkeys(SHARED, "maps kernel-log PCI addresses to GPU targets; the XIDs "
                         "themselves come from the kernel log"),
    "pcie_aer": {**dict.fromkeys(SHARED, "names the sysfs devices it watches; the AER "
                                 "counters come from sysfs"),
                 "nvmlDeviceGetPcieReplayCounter": "exported, not judged (the pcie check judges "
                 "replays): an error leaves gpu_monitor_pcie_replays_total without a sample and "
                 "names itself in details, tests/checks/test_health_series.py"},
    "dcgm_diag": dict.fromkeys(SHARED, "UUIDs for details; DCGM's diag reads the GPUs itself"),
    "rdma_loopback": {**dict.fromkeys(SHARED, "picks the GPU for the CUDA buffers (an "
                                      "unidentified GPU is not picked)"),
                      "nvmlDeviceGetNumaNodeId": "ranks GPUs for the CUDA buffers"},
    "nvswitch": {"nvmlInitWithFlags": "without NVML the fabric part says nothing; inventory "
                                      "fails the node",
                 "nvmlDeviceGetCount": "one node unknown beside the fabric manager's node "
                                       "result: tests/checks/test_nvswitch.py"},
}

# Error kinds every call answers with as a real error (kinds with call-specific meanings,
# FunctionNotFound, InvalidArgument and ArgumentVersionMismatch, are not rotated in). The
# first of each case pair comes from MAIN, the second from OTHER.
MAIN = ("Unknown", "GpuIsLost", "InsufficientPower")
OTHER = ("Timeout", "NoPermission", "IrqIssue", "CorruptedInforom", "ResetRequired",
         "NotReady", "OperatingSystem", "Memory", "InsufficientResources", "NoData",
         "InUse", "Uninitialized", "DriverNotLoaded", "LibRmVersionMismatch", "GpuNotFound")

OK_ONLY = frozenset({"ok"})
SKIPPED = frozenset({"skipped"})
NOT_OK = frozenset({"unknown", "failed"})

#: What NotSupported on a call gives the judged target: identity the GPU must have and the
#: node's versions are unknown; what a check measures is skipped; an optional field (a part
#: without it exists) leaves a healthy GPU ok.
NOT_SUPPORTED: dict[str, frozenset[str]] = {
    **dict.fromkeys(("nvmlDeviceGetHandleByIndex", "nvmlDeviceGetUUID", "nvmlDeviceGetName",
                     "nvmlDeviceGetPciInfo", "nvmlDeviceGetCount"), NOT_OK),
    **dict.fromkeys(OWN["inventory"], NOT_OK),
    **dict.fromkeys(("nvmlDeviceGetSerial", "nvmlDeviceGetMemoryInfo"), OK_ONLY),
    **dict.fromkeys(OWN["ecc_memory"], OK_ONLY),  # listed in details["not_supported"]
    "nvmlDeviceGetTemperature": SKIPPED,
    **dict.fromkeys(OWN["temperature"][1:], OK_ONLY),
    "nvmlDeviceGetCurrentClocksEventReasons": SKIPPED,
    "nvmlDeviceGetViolationStatus": OK_ONLY,  # the sampled bits alone
    "nvmlDeviceGetNvLinkState": SKIPPED,
    "nvmlDeviceGetNvLinkErrorCounter": OK_ONLY,
    "nvmlDeviceGetGpuFabricInfoV": SKIPPED,
    **dict.fromkeys(OWN["pcie"], OK_ONLY),  # sysfs has the link and the NUMA node
}

#: Where a check measures what another only reads on the side: its own NotSupported outcome.
NOT_SUPPORTED_BY_CHECK: dict[str, dict[str, frozenset[str]]] = {
    "power": dict.fromkeys(OWN["power"], SKIPPED),  # no draw, or no limit to hold it to
}

NODE_CALLS = fake_nvml.SYSTEM_FUNCTIONS
CALL_OF: dict[str, str] = {}  # case id -> the NVML call it fails


def _kind(error: str) -> str:
    """The NvmlErrorKind the reader gives pynvml's ``NVMLError_<error>`` (held to pynvml's
    codes in tests/hw/test_nvml.py)."""
    err = translate_error(fake_nvml.error_class(error)(), "call")
    assert err is not None
    return err.kind.value


def _case(check: str, call: str, error: str, statuses: frozenset[str] | None = None,
          slow: bool = False):
    node = call in NODE_CALLS
    if statuses is None:
        statuses = (NOT_SUPPORTED_BY_CHECK.get(check, {}).get(call, NOT_SUPPORTED[call])
                    if error == "NotSupported" else NOT_OK)
    passes = statuses <= {"ok", "skipped"}
    named = "nvmlInit" if call.startswith("nvmlInit") else call  # nvmlInit calls ...WithFlags
    case = Case(
        id=f"{check}-{call}-{error}",
        argv=("check", check, "--simulate", PROFILE,
              "--inject", f"nvml-error@{'node' if node else GPU},call={call},error={error}"),
        check=check,
        target="node" if node else GPU,
        mentions=() if statuses == OK_ONLY else (named, _kind(error)),
        statuses=statuses,
        exits=frozenset({0}) if passes else frozenset({1, 3}),
    )
    CALL_OF[case.id] = call
    return pytest.param(case, id=case.id, marks=[pytest.mark.slow] if slow else [])


def _plan() -> list:
    """The generated table: pytest params of ``Case``, ids ``check-call-error``."""
    turn = itertools.count()
    anything = MAIN + OTHER

    def pair() -> tuple[str, str]:
        n = next(turn)
        return MAIN[n % len(MAIN)], OTHER[n % len(OTHER)]

    def one(kinds: tuple[str, ...] = anything) -> str:
        return kinds[next(turn) % len(kinds)]

    out = []
    for check, own in OWN.items():
        if check in ACTIVE:
            # Slow: one case per call of its own, one through each shared rule.
            out += [_case(check, call, one(MAIN), slow=True) for call in own if call not in GATE]
            out.append(_case(check, IDENTITY[next(turn) % len(IDENTITY)], one(), slow=True))
            out.append(_case(check, GATE[next(turn) % len(GATE)], one(MAIN), slow=True))
            continue
        if check in ("dcgm_diag", "rdma_loopback"):  # the runner's gate, call by call
            out += [_case(check, call, error) for call in own for error in pair()]
            continue
        for call in IDENTITY:
            if check == "inventory":  # the check that judges identity: the full treatment
                out += [_case(check, call, error) for error in (*pair(), "NotSupported")]
            else:  # the shared rule (checks/_gpus.unidentified): one error per call and check
                out.append(_case(check, call, one()))
        for call in ("nvmlDeviceGetCount", *own):
            if call not in ELSEWHERE.get(check, {}):
                out += [_case(check, call, error) for error in (*pair(), "NotSupported")]
        if check == "inventory":  # a GPU node whose NVML will not start is failed
            out += [_case(check, "nvmlInitWithFlags", error)
                    for error in ("Unknown", "DriverNotLoaded", "LibRmVersionMismatch")]
        elif check not in ELSEWHERE or "nvmlInitWithFlags" not in ELSEWHERE[check]:
            # The requirement gate: skipped with NVML's reason, never ok.
            out.append(_case(check, "nvmlInitWithFlags", "Unknown", SKIPPED))
    return out


TABLE = _plan()


def test_the_table_is_big_enough_and_its_ids_are_unique():
    cases = [p.values[0] for p in TABLE]
    assert len(cases) >= 60
    assert len(set(ids(cases))) == len(cases)


@pytest.mark.parametrize("case", TABLE)
def test_an_nvml_error_is_never_ok_and_never_a_crash(case, tmp_path, capsys, caplog):
    run_case(case, tmp_path, capsys, caplog)


# --- the plan covers what the checks really call -------------------------------------------------


def _recorded_calls(name: str) -> set[str]:
    """The NVML functions the check calls, through the runner, on a healthy simulated node."""
    cls = next(c for c in all_check_classes() if c.name == name)
    node = SimulatedNode(load_profile(PROFILE), [])
    host = node.host()
    fake = FakeNvml(node.spec)
    host.nvml = NvmlReader(fake)
    try:
        ctx = Context(host=host, profile=load_profile(PROFILE).for_simulation(),
                      config=DEFAULT_CONFIG)
        outcome = run_check(cls(), ctx, method="run")
        assert outcome.success, outcome
        assert all(r.status.value in ("ok", "skipped") for r in outcome.results), outcome
        return set(fake.calls)  # before close(): nvmlShutdown is the host's, not the check's
    finally:
        host.close()


def _planned(check: str) -> set[str]:
    calls = {CALL_OF[p.values[0].id] for p in TABLE if p.values[0].check == check}
    if check in ACTIVE:  # identity through active_gpus, the gate through the runner
        calls |= set(SHARED) | set(GATE)
    return calls


@pytest.mark.parametrize("name", [
    pytest.param(c.name, marks=[pytest.mark.slow] if c.name in ACTIVE else [])
    for c in all_check_classes()])
def test_the_plan_covers_every_call_each_check_makes(name):
    recorded = _recorded_calls(name)
    left_alone = set(ELSEWHERE.get(name, {}))
    assert recorded - _planned(name) - left_alone == set(), (
        f"{name} makes NVML calls no case covers: add them to OWN (or ELSEWHERE, with why)")
    stale = set(OWN.get(name, ())) - recorded - fake_nvml.FIELD_NAMES
    assert not stale, f"{name} no longer calls {sorted(stale)}: drop them from OWN"


def test_the_shared_rules_have_a_case_per_call_through_the_fast_checks():
    fast = {CALL_OF[p.values[0].id] for p in TABLE if p.values[0].check not in ACTIVE}
    assert set(IDENTITY) | set(GATE) | set(ENUMERATION) <= fast
