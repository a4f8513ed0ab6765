"""fabric/probe_result.py: the group's judgement (real nccl-tests runs against the profile
floors, tables of rows), stragglers, and the termination-message summary."""

from __future__ import annotations

import json

import pytest

from gpu_monitor.fabric import termination
from gpu_monitor.fabric.probe_result import (
    group_findings,
    parse_summary,
    stragglers,
    summarize,
    verdict_of,
)
from gpu_monitor.fabric.probe_settings import ProbeSettings, resolve_settings
from gpu_monitor.fabric.transport import Transport
from gpu_monitor.nccl import sweep_table
from gpu_monitor.profiles import load_profile
from tests.nccl_tests_tables import nccl_tests_rows

# --- real runs against the profile floors ---------------------------------------------------------


def _settings_for(profile_name, cap=1 << 31):
    s = resolve_settings(load_profile(profile_name), device_type="cuda",
                         overrides={"sweep_max_bytes": cap}, multi_node=True)
    return s


@pytest.mark.parametrize("name, profile, verdict, reasons", [
    # 2 x p5 (16 H100, EFA): 443.7 GB/s at 2 GiB, ~70 us small messages vs 250 GB/s / 1 ms.
    ("aws_all_reduce_perf_2node_2xp5.48xlarge_16xH100_srun-prefix.txt", "h100-sxm-8",
     "healthy", []),
    # 2 x p4de (16 A100 on 400 Gb/s EFA): 78.3 GB/s, under the A100 IB profile's 100 GB/s.
    ("aws_all_reduce_perf_2node_2xp4de.24xlarge_16xA100-80GB_srun-prefix.txt", "a100-sxm-8",
     "unhealthy", ["FabricBusBwLow"]),
    # The same H100 numbers held to the H100 floor pass; the A100 ones fail it too.
    ("aws_all_reduce_perf_2node_2xp4de.24xlarge_16xA100-80GB_srun-prefix.txt", "h100-sxm-8",
     "unhealthy", ["FabricBusBwLow"]),
])
def test_real_runs_judged_against_the_profile_floors(fixtures_dir, name, profile, verdict,
                                                     reasons):
    settings = _settings_for(profile)
    rows = [r for r in nccl_tests_rows(fixtures_dir / "nccl_tests" / name)
            if r[0] in settings.sizes]
    assert rows[-1][0] == 1 << 31
    per_rank = [[{"bytes": s, "times_s": [t * 1e-6], "wrong": 0} for s, t, _, _ in rows]] * 16
    findings = group_findings({"all_reduce": sweep_table("all_reduce", per_rank)}, 16, settings)
    assert verdict_of(findings) == verdict
    assert [f.reason for f in findings] == reasons



# --- judgement ---------------------------------------------------------------------------------------

SET = ProbeSettings(sizes=(8, 1 << 20), busbw_floor_gb_per_s=10.0,
                    small_p95_latency_limit_s=0.001, large_message_min_bytes=1 << 20,
                    small_message_max_bytes=64, warning_band=0.05, expect_transport="rdma")


def _rows(p95=2e-4, bw=20.0, wrong=0):
    return [{"bytes": 8, "p95_s": p95, "busbw_gb_per_s": 0.0, "wrong": 0},
            {"bytes": 1 << 20, "p95_s": 1e-3, "busbw_gb_per_s": bw, "wrong": wrong}]


@pytest.mark.parametrize("rows, transport, want", [
    (_rows(), Transport(kind="rdma", network="IB"), []),
    (_rows(bw=5.0), None, [("failed", "FabricBusBwLow")]),
    (_rows(bw=10.2), None, [("degraded", "FabricBusBwLow")]),
    (_rows(p95=0.01), None, [("failed", "FabricLatencyHigh")]),
    (_rows(wrong=3), None, [("failed", "FabricWrongData")]),
    (_rows(), Transport(kind="socket", network="Socket"), [("unknown", "FabricTransportFallback")]),
])
def test_judge(rows, transport, want):
    got = group_findings({"all_reduce": rows}, 4, SET, transport=transport)
    assert [(f.status.value, f.reason) for f in got] == want


def test_sockets_on_one_node_or_where_rdma_is_not_expected_are_fine():
    sock = Transport(kind="socket", network="Socket")
    assert group_findings({"all_reduce": _rows()}, 4, SET, transport=sock, multi_node=False) == []
    any_ = ProbeSettings(**{**SET.to_dict(), "sizes": SET.sizes, "ops": SET.ops,
                            "expect_transport": "any"})
    assert group_findings({"all_reduce": _rows()}, 4, any_, transport=sock) == []


def test_verdicts():
    assert verdict_of([]) == "healthy"
    assert verdict_of(group_findings({"x": _rows(wrong=1)}, 4, SET)) == "unhealthy"
    sock = Transport(kind="socket", network="Socket")
    assert verdict_of(group_findings({"x": _rows()}, 4, SET, transport=sock)) == "unknown"


def test_a_rank_that_arrives_late_is_named_a_straggler():
    def ranks(times):
        return [[{"bytes": 8 << k, "times_s": [t] * 3, "wrong": 0} for k in range(4)]
                for t in times]

    assert stragglers(ranks([0.05, 0.05, 0.0004, 0.05]), 0.001) == [2]
    assert stragglers(ranks([0.0011, 0.0010, 0.0009, 0.0012]), 0.001) == []
    assert stragglers(ranks([0.05, 0.0004, 0.0004, 0.05]), 0.001) == []  # no single one



# --- summary ------------------------------------------------------------------------------------------


def _result(nodes):
    return {"group": "rack=r1.0", "verdict": "unhealthy", "world_size": 8 * len(nodes),
            "nodes": nodes, "suspect_nodes": [nodes[0]],
            "findings": [{"status": "failed", "reason": "FabricBusBwLow", "message": "m"},
                         {"status": "ok", "reason": "Ok", "message": ""}],
            "settings": {"small_message_max_bytes": 64, "busbw_floor_gb_per_s": 250.0,
                         "small_p95_latency_limit_s": 0.001},
            "operations": {"all_reduce": {"rows": _rows(bw=12.5)}},
            "transport": {"kind": "rdma", "network": "IB"}, "finished_at": "t"}


def test_summary_round_trips_and_carries_the_numbers():
    s = summarize(_result(["a", "b"]), node="b")
    back = parse_summary(json.dumps(s))
    assert back["verdict"] == "unhealthy" and back["reasons"] == ["FabricBusBwLow"]
    assert back["ops"]["all_reduce"] == {"bytes": 1 << 20, "busbw_gb_per_s": 12.5,
                                         "small_p95_s": 2e-4, "wrong": 0}
    assert back["limits"]["busbw_floor_gb_per_s"] == 250.0
    assert back["node"] == "b" and back["transport"] == "rdma"
    assert parse_summary("not json") is None and parse_summary('{"kind": "x"}') is None


def test_summary_fits_a_termination_message_for_a_big_group():
    nodes = [f"a-rather-long-gpu-node-name-{i:04d}.cluster.example.com" for i in range(512)]
    s = summarize(_result(nodes))
    assert len(json.dumps(s, separators=(",", ":")).encode()) <= termination.TERMINATION_LOG_LIMIT
    assert s["nodes_truncated"] and s["suspect_nodes"] == [nodes[0]]
