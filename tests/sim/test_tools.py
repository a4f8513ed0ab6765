"""The simulated node's fake dcgmi and ib_write_bw print what the real parsers read."""

from __future__ import annotations

import json
import os
import socket
import sys
import time

import pytest

from gpu_monitor.hw.command import CommandRunner, kill_group
from gpu_monitor.hw.dcgm import DiagStatus, connection_error, parse_diag
from gpu_monitor.hw.perftest import parse_report
from gpu_monitor.profiles import load_profile
from gpu_monitor.sim.inject import parse
from gpu_monitor.sim.node import SimulatedNode
from gpu_monitor.sim.tools import install_tools


def state(**over):
    base = {
        "hostname": "sim-node-0", "driver_version": "550.90.07", "dcgm_available": True,
        "gpus": [{"index": i, "uuid": f"GPU-{i}", "name": "NVIDIA H100 80GB HBM3",
                  "pci_bus_id": f"0000:{0x53 + 17 * i:02x}:00.0", "missing": False,
                  "lost": False, "dcgm_failures": []} for i in range(4)],
        "ib_ports": [{"device": f"mlx5_{i}", "port": 1, "state": "ACTIVE",
                      "loopback_gbit": 392.0 - i, "rate_gbit": 400, "link_layer": "InfiniBand"}
                     for i in range(2)],
    }
    base.update(over)
    return base


@pytest.fixture
def tools(tmp_path):
    """(runner, write_state) over freshly installed fake tools."""
    bin_dir = tmp_path / "bin"
    state_file = tmp_path / "sim-state.json"

    def write(data):
        state_file.write_text(json.dumps(data))

    write(state())
    install_tools(str(bin_dir), str(state_file))
    return CommandRunner(search_path=[str(bin_dir)]), write


def with_dcgm_failure(tools, gpu: int, test: str):
    """The fake tools' runner, with dcgmi's ``test`` failing on GPU ``gpu``."""
    runner, write = tools
    s = state()
    s["gpus"][gpu]["dcgm_failures"] = [test]
    write(s)
    return runner


def dcgmi_diag(runner, level: int, json: bool = True):
    """``dcgmi diag -r LEVEL`` (``-j`` for its JSON unless ``json`` is False), run as a check
    runs it."""
    return runner.run(["dcgmi", "diag", "-r", str(level), *(["-j"] if json else [])], timeout=30)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_install_writes_executables_for_this_python(tmp_path):
    paths = install_tools(str(tmp_path / "bin"), str(tmp_path / "state.json"))
    assert sorted(os.path.basename(p) for p in paths) == ["dcgmi", "ib_write_bw"]
    for p in paths:
        assert os.access(p, os.X_OK)
        with open(p) as fh:
            assert fh.readline().strip() == f"#!{sys.executable}"


# --- dcgmi ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("level, tests", [(1, 10), (2, 12), (3, 16), (4, 18)])
def test_dcgmi_diag_levels_pass_on_every_gpu(tools, level, tests):
    runner, _ = tools
    out = dcgmi_diag(runner, level)
    assert out.returncode == 0, out.stderr
    diag = parse_diag(out.stdout)
    assert (diag.shape, diag.version) == ("3.x", "3.3.9")
    assert diag.gpus == (0, 1, 2, 3)
    assert len(diag.tests()) == tests
    assert {r.status for r in diag.results} == {DiagStatus.PASS}
    assert len(diag.for_gpu(3)) == tests


def test_dcgmi_reports_an_injected_failure_with_dcgm_error_fields(tools):
    runner = with_dcgm_failure(tools, 2, "memory")
    out = dcgmi_diag(runner, 2)
    assert out.returncode == 205  # NVVS_ISOLATE_ERROR: memory failures isolate the GPU
    diag = parse_diag(out.stdout)
    (bad,) = diag.with_status(DiagStatus.FAIL)
    assert (bad.test, bad.gpu) == ("memory", 2)
    w = bad.warnings[0]
    assert (w.error_id, w.error_name, w.error_severity) == (52, "DCGM_FR_FAULTY_MEMORY", 2)
    assert w.text == "Found 1 faulty memory elements on GPU 2"
    assert all(r.status is DiagStatus.PASS for r in diag.for_gpu(1))


def test_a_failing_test_outside_the_level_is_still_run(tools):
    runner = with_dcgm_failure(tools, 1, "memtest")
    out = dcgmi_diag(runner, 1)
    diag = parse_diag(out.stdout)
    assert [(r.test, r.gpu, r.status) for r in diag.results if r.test == "memtest"] == [
        ("memtest", g, DiagStatus.FAIL if g == 1 else DiagStatus.PASS) for g in range(4)]


def test_a_failing_deployment_test_splits_the_shared_result(tools):
    runner = with_dcgm_failure(tools, 3, "Persistence Mode")
    out = dcgmi_diag(runner, 1)
    assert out.returncode == 226  # NVVS_ERROR
    diag = parse_diag(out.stdout)
    pm = [r for r in diag.results if r.test == "Persistence Mode"]
    assert [(r.gpu, r.status) for r in pm] == [(0, DiagStatus.PASS), (1, DiagStatus.PASS),
                                               (2, DiagStatus.PASS), (3, DiagStatus.FAIL)]
    assert pm[-1].warnings[0].error_id == 29


def test_dcgmi_text_table_round_trips_through_the_text_parser(tools):
    runner = with_dcgm_failure(tools, 0, "pcie")
    out = dcgmi_diag(runner, 2, json=False)
    diag = parse_diag(out.stdout)
    assert diag.shape == "text" and diag.complete
    assert diag.driver_version == "550.90.07"
    pcie = [r for r in diag.results if r.test == "PCIe"]
    assert [(r.gpu, r.status) for r in pcie] == [(1, DiagStatus.PASS), (2, DiagStatus.PASS),
                                                 (3, DiagStatus.PASS), (0, DiagStatus.FAIL)]
    assert pcie[-1].warnings[0].text.startswith("GPU 0 Bandwidth of GPU 0 in direction host to")


def test_dcgmi_without_host_engine_says_so_and_fails(tools):
    runner, write = tools
    write(state(dcgm_available=False))
    out = dcgmi_diag(runner, 2)
    assert out.returncode != 0
    assert connection_error(out.stdout) == ("Error: unable to establish a connection to the "
                                            "specified host: localhost")


def test_dcgmi_with_a_remote_host_cannot_connect(tools):
    runner, _ = tools
    out = runner.run(["dcgmi", "diag", "--host", "10.1.2.3:5555", "-r", "1", "-j"], timeout=30)
    assert out.returncode != 0
    assert "10.1.2.3" in connection_error(out.stdout)


def test_dcgmi_bad_level_and_unknown_subsystem_fail(tools):
    runner, _ = tools
    assert dcgmi_diag(runner, 9).returncode != 0
    assert runner.run(["dcgmi", "nvlink", "-s"], timeout=30).returncode != 0


# --- ib_write_bw ---------------------------------------------------------------------------------


def loopback(runner, args, client_args=()):
    server = runner.popen(["ib_write_bw", *args])
    try:
        deadline = time.monotonic() + 10
        line = ""
        while "Waiting for client" not in line and time.monotonic() < deadline:
            line = server.stdout.readline()
        client = runner.run(["ib_write_bw", *args, *client_args, "127.0.0.1"], timeout=30)
        out, err = server.communicate(timeout=10)
    finally:
        if server.poll() is None:
            kill_group(server)
    return client, server.returncode, out


def test_server_and_client_report_the_simulated_bandwidth_in_gbits(tools):
    runner, _ = tools
    port = free_port()
    args = ["-d", "mlx5_1", "-i", "1", "-p", str(port), "-s", "8388608", "-n", "5000", "-F",
            "--report_gbits"]
    client, server_rc, server_out = loopback(runner, args)
    assert client.returncode == 0, client.stderr
    assert server_rc == 0
    row = parse_report(client.stdout).row_for(8388608)
    assert (row.unit, row.bw_average, row.iterations) == ("Gb/sec", 391.0, 5000)
    assert parse_report(server_out).row_for(8388608).bw_average == 391.0
    assert "Device         : mlx5_1" in client.stdout


def test_without_report_gbits_the_unit_is_mib_per_second(tools):
    runner, _ = tools
    args = ["-d", "mlx5_0", "-p", str(free_port()), "-s", "8388608"]
    client, _, _ = loopback(runner, args)
    row = parse_report(client.stdout).row_for(8388608)
    assert row.unit == "MB/sec"
    assert row.bw_average == round(392.0e9 / 8 / 1048576, 2)
    assert round(row.gbit_per_s) == 392


def test_use_cuda_prints_perftest_cuda_setup_and_still_parses(tools):
    runner, _ = tools
    args = ["-d", "mlx5_0", "-p", str(free_port()), "-s", "8388608", "--report_gbits",
            "--use_cuda_bus_id=0000:64:00.0"]
    client, _, _ = loopback(runner, args)
    assert "Picking device No. 1" in client.stdout
    assert parse_report(client.stdout).row_for(8388608).bw_average == 392.0


def test_client_without_server_fails_like_perftest(tools):
    runner, _ = tools
    port = free_port()
    out = runner.run(["ib_write_bw", "-d", "mlx5_0", "-p", str(port), "127.0.0.1"], timeout=30)
    assert out.returncode == 1
    assert f"Couldn't connect to 127.0.0.1:{port}" in out.stderr


@pytest.mark.parametrize("args, needle", [
    (["-d", "mlx5_9"], "IB device mlx5_9 not found"),
    (["-d", "mlx5_0", "--use_cuda=7"], "No CUDA device 7"),
])
def test_bad_device_or_gpu_fails(tools, args, needle):
    runner, _ = tools
    out = runner.run(["ib_write_bw", *args, "-p", str(free_port()), "127.0.0.1"], timeout=30)
    assert out.returncode == 1
    assert needle in out.stdout + out.stderr


def test_port_not_active_fails(tools):
    runner, write = tools
    s = state()
    s["ib_ports"][0]["state"] = "DOWN"
    write(s)
    out = runner.run(["ib_write_bw", "-d", "mlx5_0", "-p", str(free_port())], timeout=30)
    assert out.returncode == 1
    assert "state is Down" in out.stderr


def test_help_lists_the_cuda_options(tools):
    runner, _ = tools
    out = runner.run(["ib_write_bw", "--help"], timeout=30)
    assert "--use_cuda=<cuda device id>" in out.stdout
    assert "--use_cuda_bus_id" in out.stdout


# --- through the simulated node ----------------------------------------------------------------


def test_simulated_node_faults_reach_the_tools():
    sim = SimulatedNode(load_profile("h100-sxm-8"),
                        [parse("dcgm-fail@gpu:2,test=memtest"), parse("ib-bw@ib:mlx5_1:1,gbit=100")])
    try:
        runner = sim.host().commands
        diag = parse_diag(dcgmi_diag(runner, 2).stdout)
        assert [(r.test, r.gpu) for r in diag.with_status(DiagStatus.FAIL)] == [("memtest", 2)]
        assert diag.gpus == tuple(range(8))
        args = ["-d", "mlx5_1", "-p", str(free_port()), "-s", "8388608", "--report_gbits"]
        client, _, _ = loopback(runner, args)
        assert parse_report(client.stdout).row_for(8388608).gbit_per_s == 100.0
    finally:
        sim.close()


# --- output faults: the same formats, gone wrong ------------------------------------------------


def test_dcgm_output_drops_a_gpu_from_every_result_and_the_detected_ids(tools):
    runner, write = tools
    write(state(dcgm_output={"drop": [2]}))
    diag = parse_diag(dcgmi_diag(runner, 2).stdout)
    assert diag.gpus == (0, 1, 3)
    text = parse_diag(dcgmi_diag(runner, 2, json=False).stdout)
    assert len(text.device_ids) == 3


def test_dcgm_output_text_despite_j_cut_after_lines_other_exit_and_status(tools):
    runner, write = tools
    write(state(dcgm_output={"format": "text", "lines": 12, "exit": 3}))
    out = dcgmi_diag(runner, 2)
    assert out.returncode == 3 and len(out.stdout.splitlines()) == 12
    diag = parse_diag(out.stdout)
    assert diag.shape == "text" and diag.complete is False
    write(state(dcgm_output={"status": "Banana"}))
    out = dcgmi_diag(runner, 2)
    assert '"status" : "Banana"' in out.stdout and out.returncode == 0


def test_dcgm_output_prints_a_recorded_file(tools, tmp_path, fixtures_dir):
    runner, write = tools
    recorded = fixtures_dir / "dcgm_diag" / "dcgm_3x_diag_json_4gpu_testfixture_warnings_fail.json"
    write(state(dcgm_output={"file": str(recorded), "exit": 226}))
    out = dcgmi_diag(runner, 2)
    assert (out.stdout, out.returncode) == (recorded.read_text(), 226)


@pytest.mark.parametrize("cut, rows, complete", [
    ("before-report", None, None), ("after-header", None, None), ("mid-row", 1, False),
    ("before-rule", 1, False), (None, 1, True),
])
def test_ib_bw_output_cuts_the_report_of_server_and_client(tools, cut, rows, complete):
    runner, write = tools
    data = state()
    data["ib_ports"][0]["output"] = {"cut": cut, "exit": 2} if cut else {}
    write(data)
    args = ["-d", "mlx5_0", "-p", str(free_port()), "-s", "8388608", "--report_gbits"]
    client, server_rc, server_out = loopback(runner, args)
    assert (client.returncode, server_rc) == ((2, 2) if cut else (0, 0))
    for text in (client.stdout, server_out):
        if rows is None:
            with pytest.raises(ValueError):
                parse_report(text)
        else:
            report = parse_report(text)
            assert (len(report.rows), report.complete) == (rows, complete)


def test_output_faults_reach_the_tools_through_the_simulated_node(tmp_path):
    sim = SimulatedNode(load_profile("h100-sxm-8"),
                        [parse("dcgm-output@node,drop=5,exit=7"),
                         parse("ib-bw-output@ib:mlx5_0:1,cut=before-rule"),
                         parse("ib-bw@ib:mlx5_0:1,gbit=1e30")])
    try:
        runner = sim.host().commands
        out = dcgmi_diag(runner, 2)
        assert out.returncode == 7 and 5 not in parse_diag(out.stdout).gpus
        client, _, _ = loopback(runner, ["-d", "mlx5_0", "-p", str(free_port()), "-s",
                                         "8388608", "--report_gbits"])
        assert "1000000000000000019884624838656.00" in client.stdout
    finally:
        sim.close()
