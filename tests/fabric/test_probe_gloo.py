"""The probe for real: four gloo ranks on this machine (the same code as NCCL on GPUs).

One run goes through the command line in fresh interpreters, as torchrun would start it; the
fault runs fork the ranks from this process (torch imported once) to keep them quick on two
cores. The test-only seam makes one rank slow or corrupting; the sweep must flag it."""

from __future__ import annotations

import json
import multiprocessing
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from gpu_monitor.fabric.probe_env import TEST_FAULT_ENV
from gpu_monitor.fabric.probe_result import parse_summary
from gpu_monitor.fabric.probe_settings import CPU_MAX_BYTES

WORLD = 4
REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(rank: int, port: int) -> dict[str, str]:
    return {"RANK": str(rank), "WORLD_SIZE": str(WORLD), "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port), "NODE_NAME": f"node{rank}", "POD_NAME": f"probe-{rank}",
            "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}


def _child(rank: int, port: int, argv: list[str], extra: dict[str, str]) -> None:
    os.environ.update(_env(rank, port))
    os.environ.pop(TEST_FAULT_ENV, None)
    os.environ.update(extra)
    from gpu_monitor.fabric import probe

    try:
        rc = probe.main(argv)
    except BaseException:  # noqa: BLE001
        import traceback

        traceback.print_exc()
        rc = 99
    sys.stdout.flush()
    os._exit(rc)


def run_forked(tmp_path: Path, argv: list[str], fault: str | None = None, timeout: float = 90):
    import torch.distributed  # noqa: F401 - imported once, inherited by the ranks

    ctx = multiprocessing.get_context("fork")
    port = free_port()
    result = tmp_path / "result.json"
    procs = []
    for r in range(WORLD):
        args = [*argv, "--termination-log", str(tmp_path / f"term{r}"), "--output", "json"]
        if r == 0:
            args += ["--result-file", str(result)]
        extra = {TEST_FAULT_ENV: fault} if fault else {}
        p = ctx.Process(target=_child, args=(r, port, args, extra))
        p.start()
        procs.append(p)
    for p in procs:
        p.join(timeout)
    alive = [p for p in procs if p.is_alive()]
    for p in alive:
        p.kill()
    assert not alive, "a rank hung"
    codes = [p.exitcode for p in procs]
    data = json.loads(result.read_text()) if result.exists() else None
    return codes, data


SMALL = ["--device", "cpu", "--min-bytes", "8", "--max-bytes", "2048", "--factor", "4",
         "--iterations", "3", "--warmup", "0"]


def test_clean_run_from_the_command_line(tmp_path):
    port = free_port()
    procs = []
    for r in range(WORLD):
        env = {**os.environ, **_env(r, port), "PYTHONPATH": str(REPO)}
        env.pop(TEST_FAULT_ENV, None)
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "gpu_monitor.fabric.probe", "--device", "cpu",
             "--min-bytes", "8", "--max-bytes", str(64 << 20), "--factor", "64",
             "--iterations", "3", "--warmup", "1", "--busbw-floor", "0.000001",
             "--latency-limit", "2.0", "--group", "rack=test.0", "--output", "json",
             "--termination-log", str(tmp_path / f"term{r}")],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outs = []
    for p in procs:
        try:
            out, err = p.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
        outs.append((p.returncode, out, err))
    assert [rc for rc, _, _ in outs] == [0] * WORLD, outs[0][2][-2000:]
    result = json.loads(outs[0][1])
    assert outs[1][1] == ""  # only rank 0 prints the group result
    assert result["schema"] == 1 and result["kind"] == "FabricProbeResult"
    assert result["verdict"] == "healthy", result["findings"]
    assert result["group"] == "rack=test.0"
    assert result["backend"] == "gloo" and result["world_size"] == WORLD
    assert result["nodes"] == [f"node{r}" for r in range(WORLD)]
    assert [r["pod"] for r in result["ranks"]] == [f"probe-{r}" for r in range(WORLD)]
    assert result["transport"]["kind"] == "gloo"
    ar, ag = result["operations"]["all_reduce"], result["operations"]["all_gather"]
    assert ar["bus_factor"] == 1.5 and ag["bus_factor"] == 0.75
    sizes = [r["bytes"] for r in ar["rows"]]
    assert sizes == [8, 512, 32768, 2097152] and max(sizes) <= CPU_MAX_BYTES
    for op in (ar, ag):
        for row in op["rows"]:
            assert row["wrong"] == 0
            assert row["p50_s"] <= row["p95_s"]
            assert row["busbw_gb_per_s"] > 0
    assert result["test_fault"] is None
    for r in range(WORLD):
        s = parse_summary((tmp_path / f"term{r}").read_text())
        assert s["verdict"] == "healthy" and s["node"] == f"node{r}"
        assert s["ops"]["all_reduce"]["bytes"] == 2097152


def test_a_corrupting_process_fails_the_group_and_is_named(tmp_path):
    codes, result = run_forked(tmp_path, SMALL + ["--latency-limit", "5"], fault="corrupt:3")
    assert codes == [1] * WORLD
    assert result["verdict"] == "unhealthy"
    wrong = [f for f in result["findings"] if f["reason"] == "FabricWrongData"]
    assert {f["op"] for f in wrong} == {"all_reduce", "all_gather"}
    assert all(f["ranks"] == [3] and f["nodes"] == ["node3"] for f in wrong)
    assert result["suspect_nodes"] == ["node3"] and result["wrong_sources"] == [3]
    assert result["test_fault"] == "corrupt:3"
    s = parse_summary((tmp_path / "term1").read_text())
    assert s["suspect_nodes"] == ["node3"] and s["reasons"] == ["FabricWrongData"]


def test_a_slow_process_fails_the_latency_limit_and_is_named(tmp_path):
    codes, result = run_forked(tmp_path, SMALL + ["--latency-limit", "0.075", "--zero-exit"],
                               fault="slow:2:0.15")
    assert codes == [0] * WORLD  # --zero-exit: the verdict is in the result
    assert result["verdict"] == "unhealthy"
    reasons = {f["reason"] for f in result["findings"]}
    assert reasons == {"FabricLatencyHigh"}
    assert result["stragglers"] == [2] and result["suspect_nodes"] == ["node2"]
    assert all(r["wrong"] == 0 for op in result["operations"].values() for r in op["rows"])


def test_a_bad_setting_on_rank_0_stops_every_rank_instead_of_hanging(tmp_path):
    codes, result = run_forked(tmp_path, SMALL + ["--profile", "no-such-profile"], timeout=60)
    assert codes == [2] * WORLD and result is None


@pytest.mark.parametrize("env", [{}, {"RANK": "0"}])
def test_outside_a_launcher_the_command_says_so(env):
    clean = {k: v for k, v in os.environ.items()
             if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                          "JOB_COMPLETION_INDEX")}
    p = subprocess.run([sys.executable, "-m", "gpu_monitor.fabric.probe"],
                       env={**clean, **env, "PYTHONPATH": str(REPO)}, capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 2 and "torchrun or an Indexed Job" in p.stderr
