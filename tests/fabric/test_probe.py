"""The probe's pure parts: launcher environment, the test-fault seam, NCCL transport lines,
the busbw arithmetic held to real nccl-tests tables, judgement and the summary."""

from __future__ import annotations

import json
import re

import pytest

from gpu_monitor.fabric.probe import (
    CPU_MAX_BYTES,
    TERMINATION_LOG_LIMIT,
    LaunchEnv,
    ProbeError,
    ProbeRank,
    ProbeSettings,
    TestFault,
    Transport,
    bus_factor,
    capture_nccl_debug,
    judge,
    launch_env,
    merge_transports,
    op_table,
    parse_nccl_debug,
    parse_summary,
    parse_test_faults,
    resolve_settings,
    stragglers,
    summarize,
    verdict_of,
)
from gpu_monitor.profiles import load_profile

# --- launcher -------------------------------------------------------------------------------------


def test_torchrun_environment():
    env = launch_env({"RANK": "9", "WORLD_SIZE": "16", "LOCAL_RANK": "1",
                      "LOCAL_WORLD_SIZE": "8", "MASTER_ADDR": "job-0.svc", "MASTER_PORT": "29500",
                      "NODE_NAME": "gpu-node-7", "POD_NAME": "job-1-abc"})
    assert env == LaunchEnv(9, 16, 1, 8, "job-0.svc", 29500, "gpu-node-7", "job-1-abc")


def test_indexed_job_index_stands_in_for_a_missing_rank():
    env = launch_env({"JOB_COMPLETION_INDEX": "3", "WORLD_SIZE": "4", "MASTER_ADDR": "m",
                      "MASTER_PORT": "1"})
    assert env.rank == 3 and env.local_rank == 0


@pytest.mark.parametrize("environ, words", [
    ({}, "RANK (or JOB_COMPLETION_INDEX), WORLD_SIZE, MASTER_ADDR, MASTER_PORT"),
    ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "m"}, "MASTER_PORT"),
    ({"RANK": "2", "WORLD_SIZE": "2", "MASTER_ADDR": "m", "MASTER_PORT": "1"}, "outside"),
    ({"RANK": "x", "WORLD_SIZE": "2", "MASTER_ADDR": "m", "MASTER_PORT": "1"}, "integer"),
])
def test_a_missing_or_bad_launcher_environment_is_a_usage_error(environ, words):
    with pytest.raises(ProbeError, match=re.escape(words)):
        launch_env(environ)


@pytest.mark.parametrize("text, want", [
    ("", []),
    ("slow:2", [TestFault("slow", 2, 0.05)]),
    ("slow:1:0.2, corrupt:3", [TestFault("slow", 1, 0.2), TestFault("corrupt", 3)]),
])
def test_fault_seam_entries(text, want):
    assert parse_test_faults(text) == want


@pytest.mark.parametrize("text", ["hang:1", "slow", "corrupt:x", "slow:1:fast"])
def test_fault_seam_rejects_garbage(text):
    with pytest.raises(ProbeError):
        parse_test_faults(text)


# --- transports -------------------------------------------------------------------------------------

# Lines as NCCL prints them with NCCL_DEBUG=INFO (formats from public NCCL issue reports).
IB_LINES = [
    "node-a:120890:121560 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB ; OOB eth0:10.0.0.1<0>",
    "node-a:120890:121560 [0] NCCL INFO Using network IB",
    "node-a:120890:121560 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC",
    "node-a:120890:121560 [0] NCCL INFO Channel 01 : 2[c7000] -> 0[87000] [receive] via NET/IB/5/GDRDMA",
    "node-a:120890:121563 [3] NCCL INFO Channel 01 : 3[ca000] -> 2[c7000] [send] via NET/IB/2/GDRDMA",
    "node-a:120890:121563 [3] NCCL INFO Channel 02 : 3[3] -> 4[4] via SHM/direct/direct",
]
SOCKET_LINES = [
    "nccl-benchmark-csgjr:1:1 [0] NCCL INFO NET/IB : No device found.",
    "nccl-benchmark-csgjr:1:1 [0] NCCL INFO Failed to initialize NET plugin IB",
    "nccl-benchmark-csgjr:1:1 [0] NCCL INFO NET/Socket : Using [0]eth0:10.56.0.6<0>",
    "nccl-benchmark-csgjr:1:1 [0] NCCL INFO Initialized NET plugin Socket",
    "nccl-benchmark-csgjr:1:1 [0] NCCL INFO Assigned NET plugin Socket to comm",
    "nccl-benchmark-csgjr:1:1 [0] NCCL INFO Using network Socket",
    "h:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 8[0] [send] via NET/Socket/0",
]
IBEXT_LINES = [
    "hostname-test:987:1260 [7] NCCL INFO Channel 03/0 : 47[7] -> 39[7] [receive] via NET/IBext_v8/2",
    "hostname-test:986:1254 [6] NCCL INFO Channel 00/0 : 6[6] -> 38[6] [receive] via NET/IBext_v8/1",
]
INTRA_LINES = [
    "w-0:5663:5809 [0] NCCL INFO Channel 04/0 : 0[0] -> 7[7] via P2P/CUMEM",
    "w-0:5663:5809 [0] NCCL INFO Channel 05/0 : 0[0] -> 7[7] via P2P/CUMEM",
]


@pytest.mark.parametrize("lines, kind, network, rdma, paths", [
    (IB_LINES, "rdma", "IB", True, {"P2P": 1, "NET/IB": 2, "SHM": 1}),
    (SOCKET_LINES, "socket", "Socket", False, {"NET/Socket": 1}),
    (SOCKET_LINES[:-1], "socket", "Socket", False, {}),  # no channel line: "Using network"
    (IBEXT_LINES, "rdma", "IBext_v8", True, {"NET/IBext_v8": 2}),
    (INTRA_LINES, "intra-node", None, None, {"P2P": 2}),
    (["just a line", "NCCL INFO Bootstrap : Using eth0:10.0.0.1<0>"], "unknown", None, None, {}),
])
def test_nccl_debug_lines_name_the_transport(lines, kind, network, rdma, paths):
    t = parse_nccl_debug(lines)
    assert (t.kind, t.network, t.rdma, dict(t.paths)) == (kind, network, rdma, paths)


def test_gdrdma_connections_are_counted():
    assert parse_nccl_debug(IB_LINES).gdr == 2


def test_one_rank_on_sockets_makes_the_group_a_socket_fallback():
    ib, sock = parse_nccl_debug(IB_LINES), parse_nccl_debug(SOCKET_LINES)
    merged = merge_transports([ib, ib, sock, Transport()])
    assert merged.kind == "socket" and merged.paths["NET/IB"] == 4
    assert merge_transports([ib, ib]).kind == "rdma"
    assert merge_transports([Transport(), Transport()]).kind == "unknown"


def test_capture_sets_info_init_net_and_a_private_file(tmp_path):
    env: dict[str, str] = {}
    log = capture_nccl_debug(env, str(tmp_path))
    assert env["NCCL_DEBUG"] == "INFO" and env["NCCL_DEBUG_SUBSYS"] == "INIT,NET"
    assert env["NCCL_DEBUG_FILE"].endswith("nccl.%h.%p.log") and not log.echo
    path = env["NCCL_DEBUG_FILE"].replace("%h", "anyhost").replace("%p", str(__import__("os").getpid()))
    with open(path, "w") as fh:
        fh.write("\n".join(IB_LINES) + "\n")
    assert parse_nccl_debug(log.lines()).kind == "rdma"
    # A user's own subsystems are kept, ours added; their file is read, not replaced.
    env = {"NCCL_DEBUG": "WARN", "NCCL_DEBUG_SUBSYS": "COLL"}
    log = capture_nccl_debug(env, str(tmp_path))
    assert env["NCCL_DEBUG"] == "INFO" and env["NCCL_DEBUG_SUBSYS"] == "COLL,INIT,NET"
    assert log.echo
    env = {"NCCL_DEBUG_FILE": "/var/log/nccl.%h.%p"}
    assert capture_nccl_debug(env).pattern == "/var/log/nccl.%h.%p"


# --- busbw held to real nccl-tests tables ------------------------------------------------------------

_PREFIX = re.compile(r"^(?:\d+: |\[\d+,\d+\]<stdout>:)")


def nccl_tests_rows(path):
    """(size, out-of-place time us, algbw, busbw) from an nccl-tests table."""
    rows = []
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = _PREFIX.sub("", raw).strip()
        if not line or line.startswith("#") or "NCCL" in line or line.startswith("..."):
            continue
        cols = line.split()
        if not cols[0].isdigit() or int(cols[0]) == 0:
            continue
        t = len(cols) - 8  # 13 columns (redop, root), 12 (redop), 11 (neither)
        rows.append((int(cols[0]), float(cols[t]), float(cols[t + 1]), float(cols[t + 2])))
    return rows


@pytest.mark.parametrize("name, op, n", [
    ("aws_all_reduce_perf_2node_2xp5.48xlarge_16xH100_srun-prefix.txt", "all_reduce", 16),
    ("aws_all_reduce_perf_2node_2xp4de.24xlarge_16xA100-80GB_srun-prefix.txt", "all_reduce", 16),
    ("gcp-a3mega_all_reduce_perf_2node_16xH100_mpirun.txt", "all_reduce", 16),
    ("superbench_all_reduce_perf_8xA100-SXM4-40GB.log", "all_reduce", 8),
    ("superbench_allgather_perf_8xA100-SXM4-40GB.log", "all_gather", 8),
])
def test_busbw_matches_nccl_tests_on_real_runs(fixtures_dir, name, op, n):
    rows = nccl_tests_rows(fixtures_dir / "nccl_tests" / name)
    assert len(rows) > 8
    per_rank = [[{"bytes": s, "times_s": [t * 1e-6], "wrong": 0} for s, t, _, _ in rows]] * n
    table = op_table(op, per_rank)
    for got, (size, _, algbw, busbw) in zip(table, rows, strict=True):
        assert got["bytes"] == size
        assert got["algbw_gb_per_s"] == pytest.approx(algbw, rel=0.01, abs=0.006)
        assert got["busbw_gb_per_s"] == pytest.approx(busbw, rel=0.01, abs=0.006)


def test_bus_factors():
    assert bus_factor("all_reduce", 8) == 1.75 and bus_factor("all_reduce", 16) == 1.875
    assert bus_factor("all_gather", 8) == 0.875 and bus_factor("all_reduce", 1) == 0.0


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
    findings = judge({"all_reduce": op_table("all_reduce", per_rank)}, 16, settings)
    assert verdict_of(findings) == verdict
    assert [f.reason for f in findings] == reasons


def test_settings_come_from_the_profile_and_cpu_caps_the_sweep():
    h100 = load_profile("h100-sxm-8")
    s = resolve_settings(h100, device_type="cuda", overrides={}, multi_node=True)
    assert s.sizes[0] == 8 and s.sizes[-1] == 1 << 31 and s.expect_transport == "rdma"
    assert s.busbw_floor_gb_per_s == 250 and s.small_p95_latency_limit_s == 0.001
    assert s.warning_band == 0.05
    s = resolve_settings(h100, device_type="cpu", overrides={}, multi_node=True)
    assert s.sizes[-1] <= CPU_MAX_BYTES and s.expect_transport == "any"
    s = resolve_settings(h100, device_type="cuda", overrides={"expect_transport": "auto"},
                         multi_node=False)
    assert s.expect_transport == "any"  # one node: nothing crosses the fabric
    s = resolve_settings(load_profile("cpu-only"), device_type="cpu",
                         overrides={"busbw_floor_gb_per_s": 2.0}, multi_node=True)
    assert s.busbw_floor_gb_per_s == 2.0 and s.small_p95_latency_limit_s is None
    assert ProbeSettings.from_dict(s.to_dict()) == s


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
    got = judge({"all_reduce": rows}, 4, SET, transport=transport)
    assert [(f.status.value, f.reason) for f in got] == want


def test_sockets_on_one_node_or_where_rdma_is_not_expected_are_fine():
    sock = Transport(kind="socket", network="Socket")
    assert judge({"all_reduce": _rows()}, 4, SET, transport=sock, multi_node=False) == []
    any_ = ProbeSettings(**{**SET.to_dict(), "sizes": SET.sizes, "ops": SET.ops,
                            "expect_transport": "any"})
    assert judge({"all_reduce": _rows()}, 4, any_, transport=sock) == []


def test_verdicts():
    assert verdict_of([]) == "healthy"
    assert verdict_of(judge({"x": _rows(wrong=1)}, 4, SET)) == "unhealthy"
    sock = Transport(kind="socket", network="Socket")
    assert verdict_of(judge({"x": _rows()}, 4, SET, transport=sock)) == "unknown"


def test_a_rank_that_arrives_late_is_named_a_straggler():
    def ranks(times):
        return [[{"bytes": 8 << k, "times_s": [t] * 3, "wrong": 0} for k in range(4)]
                for t in times]

    assert stragglers(ranks([0.05, 0.05, 0.0004, 0.05]), 0.001) == [2]
    assert stragglers(ranks([0.0011, 0.0010, 0.0009, 0.0012]), 0.001) == []
    assert stragglers(ranks([0.05, 0.0004, 0.0004, 0.05]), 0.001) == []  # no single one


def test_all_gather_sizes_are_the_gathered_total():
    assert ProbeRank.counts("all_gather", 8, 4) == (1, 16)
    assert ProbeRank.counts("all_gather", 1 << 20, 4) == (1 << 16, 1 << 20)
    assert ProbeRank.counts("all_reduce", 8, 4) == (2, 8)


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
    assert len(json.dumps(s, separators=(",", ":")).encode()) <= TERMINATION_LOG_LIMIT
    assert s["nodes_truncated"] and s["suspect_nodes"] == [nodes[0]]
