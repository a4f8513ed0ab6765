"""nvlink_peer: link state, fabric, error counters and data-checked copies per ordered pair."""

from __future__ import annotations

import pytest

from checks.nvlink_peer import NvlinkPeer, pattern_key
from gpu_monitor.check import Context
from gpu_monitor.config import parse_config
from gpu_monitor.model import Status
from gpu_monitor.profiles import load_profile
from gpu_monitor.runner import run_check
from gpu_monitor.workers.faults import TEST_FAULT_ENV
from tests.checks.cuda_helpers import cuda_count
from tests.checks.rig import run_simulated, simulated_rig


def run_sim(count: int, checks=None, **kw):
    return run_simulated(NvlinkPeer(), count, settings=checks, **kw)


def test_every_ordered_pair_is_copied_verified_and_put_in_the_matrix():
    res = run_sim(3)
    pairs = sorted(t for t in res if t.startswith("p2p:"))
    assert pairs == ["p2p:0:1", "p2p:0:2", "p2p:1:0", "p2p:1:2", "p2p:2:0", "p2p:2:1"]
    for t in pairs:
        assert res[t].status is Status.OK, res[t].message
        assert res[t].details["mismatched_words"] == 0 and res[t].details["gb_per_s"] > 0
    node = res["node"]
    matrix = node.details["bandwidth_gb_per_s"]
    assert [m[k] for k, m in enumerate(matrix)] == [None, None, None]
    assert all(isinstance(v, float) for i, m in enumerate(matrix) for j, v in enumerate(m)
               if i != j)
    assert matrix[1][2] == res["p2p:1:2"].details["gb_per_s"]
    assert node.details["links_seen"] == {"gpu:0": 18, "gpu:1": 18, "gpu:2": 18}


def test_a_down_link_and_an_unfinished_fabric_fail_their_targets():
    def fabric_in_progress(spec):
        spec.gpus[0].fabric_state = 2

    res = run_sim(2, faults=["nvlink-down@gpu:1,link=7"], spec_edit=fabric_in_progress)
    assert res["nvlink:1:7"].status is Status.FAILED and res["nvlink:1:7"].reason == "NvLinkDown"
    assert res["gpu:0"].reason == "FabricNotReady" and res["gpu:0"].action.value == "reboot"
    assert "findings on gpu:0, nvlink:1:7" in res["node"].message


class _CountersRise:
    """NVML whose replay counter on gpu:1 link 2 jumps between the first and later reads."""

    def __init__(self, inner, jump):
        self.inner, self.jump, self.reads = inner, jump, 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def nvlink_errors(self, index, link):
        out = dict(self.inner.nvlink_errors(index, link))
        if (index, link) == (1, 2):
            self.reads += 1
            if self.reads > 1:
                out["replay"] = out.get("replay", 0) + self.jump
        return out


@pytest.mark.parametrize("jump, status", [(3, Status.DEGRADED), (150, Status.FAILED)])
def test_link_errors_that_rise_during_the_copies_are_degraded_or_failed(jump, status):
    res = run_sim(2, nvml_wrapper=lambda n: _CountersRise(n, jump))
    r = res["nvlink:1:2"]
    assert (r.status, r.reason) == (status, "NvLinkErrors")
    assert dict(r.details["increase"]) == {"replay": jump}


def test_copies_below_the_floor_fail_each_pair():
    res = run_sim(2, checks={"p2p_floor_gb_per_s": 1.0e6})
    for t in ("p2p:0:1", "p2p:1:0"):
        assert res[t].status is Status.FAILED and res[t].reason == "P2pBandwidthLow"


def _pair(**kw):
    base = {"src": 0, "dst": 1, "bytes": 4096, "gb_per_s": 400.0, "times_s": [1e-5],
            "mismatches": 0, "words": 1024, "peer_access": True}
    return {**base, **kw}


@pytest.mark.parametrize("pair, reason, status", [
    (_pair(), "Ok", Status.OK),
    (_pair(mismatches=3), "P2pDataMismatch", Status.FAILED),
    (_pair(peer_access=False), "P2pUnavailable", Status.FAILED),
    (_pair(gb_per_s=340.0), "P2pBandwidthLow", Status.DEGRADED),
    (_pair(gb_per_s=100.0), "P2pBandwidthLow", Status.FAILED),
], ids=["ok", "data", "no-peer-access", "warning-band", "below-floor"])
def test_each_pair_is_judged_on_data_then_peer_access_then_bandwidth(pair, reason, status):
    rig = simulated_rig(NvlinkPeer(), 1)
    try:
        r = rig.check._pair(rig.ctx(), pair, floor=335.0, band=0.05, expected_links=18)
    finally:
        rig.close()
    assert (r.target, r.reason, r.status) == ("p2p:0:1", reason, status)


def test_a_hung_copy_worker_is_unknown_on_the_pair_it_was_copying():
    # at=3: stuck before announcing the third pair, i.e. still in the second one (gpu:0->2).
    # The worker must reach the hang before the pool's start-up limit (a third of the budget)
    # ends, or it is named as hung while starting up: 45 s (15 s of start-up) failed beside two
    # busy suites, so 90 s (30 s of start-up; the hung turn waits out 30 s).
    res = run_sim(3, checks={"timeout_s": 90}, env={TEST_FAULT_ENV: "hang@peer copies,at=3"})
    r = res["p2p:0:2"]
    assert r.status is Status.UNKNOWN and r.reason == "WorkerTimeout"
    assert r.message.startswith("worker for peer copies timed out after ")
    assert r.message.endswith(" s (at copy gpu:0 -> gpu:2)")
    assert not [t for t in res if t.startswith("p2p:") and t != "p2p:0:2"]
    # No pair was verified: the node's summary is not an ok.
    assert (res["node"].status, res["node"].reason) == (Status.UNKNOWN, "PairsNotCopied")
    assert res["node"].details["pairs_expected"] == 6


def test_pattern_keys_differ_for_every_ordered_pair():
    keys = {pattern_key(a, b) for a in range(8) for b in range(8) if a != b}
    assert len(keys) == 56



@pytest.mark.gpu
@pytest.mark.skipif(cuda_count() < 2, reason="needs two CUDA devices")
def test_peer_copies_on_real_gpus_are_verified():
    from gpu_monitor.host import Host
    from gpu_monitor.hw.paths import HostPaths

    host = Host.real(HostPaths())
    config = parse_config({"checks": {"nvlink_peer": {"p2p_floor_gb_per_s": 1.0,
                                                      "copy_bytes": 64 << 20}}})
    ctx = Context(host=host, profile=load_profile("h100-sxm-8"), config=config, force=True)
    try:
        outcome = run_check(NvlinkPeer(), ctx)
    finally:
        host.close()
    pairs = [r for r in outcome.results if r.target.startswith("p2p:")]
    assert pairs and all(r.details["mismatched_words"] == 0 for r in pairs)
