"""rdma_loopback through the simulated node's fake ib_write_bw, and against misbehaving ones."""

from __future__ import annotations

import json
import shutil
import socket

import pytest

from checks.rdma_loopback import PORT_TRIES, RdmaLoopback
from gpu_monitor.config import Config
from gpu_monitor.model import Action, Status
from tests.checks.rig import (
    all_ok,
    fake_tool,
    judged_fixture,
    not_ok,
    run_once,
)

ONLY_MLX5_0 = tuple(f"port-down@ib:mlx5_{i}:1" for i in range(1, 8))


def run(ctx):
    return run_once(RdmaLoopback(), ctx)


judged = judged_fixture(RdmaLoopback)


def test_every_active_port_reaches_the_floor_with_gpudirect(judged):
    res = judged()
    all_ok(res, [f"ib:mlx5_{i}:1" for i in range(8)])
    d = res["ib:mlx5_0:1"].details
    assert d["bw_gbit_per_s"] == 392.0 and d["floor_gbit_per_s"] == 380
    assert d["message_bytes"] == 8388608 and d["unit_reported"] == "Gb/sec"
    assert d["gpudirect_gpu"] == 0
    assert "--use_cuda_bus_id=0000:53:00.0" in d["command"]
    assert " -s 8388608 " in d["command"] and "--report_gbits" in d["command"]
    # One port per device from the base (another process holding one moves it: see below).
    assert [res[f"ib:mlx5_{i}:1"].details["tcp_ports_tried"][0] for i in range(8)] == list(
        range(18510, 18518))
    assert res["ib:mlx5_7:1"].details["gpudirect_gpu"] == 7


def test_a_port_another_process_holds_moves_the_device_up_by_the_device_count(judged):
    """A stale perftest (or another suite on a shared test machine) listening on the device's
    port: the server cannot listen, and the check retries one device count higher."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        base = holder.getsockname()[1]
        if base + 8 * PORT_TRIES > 65535:
            pytest.skip("the kernel handed out a port at the top of the range")
        res = judged(*ONLY_MLX5_0, config=Config(checks={"rdma_loopback": {"tcp_port_base": base}}))
    r = res["ib:mlx5_0:1"]
    assert r.status is Status.OK, r.message
    tried = r.details["tcp_ports_tried"]
    assert tried[0] == base and r.details["tcp_port"] == tried[-1] == base + 8 * (len(tried) - 1)
    assert len(tried) >= 2


def test_low_bandwidth_fails_naming_the_port(judged):
    res = judged("ib-bw@ib:mlx5_1:1,gbit=100")
    assert not_ok(res) == {"ib:mlx5_1:1": (Status.FAILED, "RdmaBandwidthLow")}
    r = res["ib:mlx5_1:1"]
    assert r.details["bw_gbit_per_s"] == 100.0
    assert "below the floor 380" in r.message


def test_bandwidth_inside_the_warning_band_degrades(judged):
    res = judged("ib-bw@ib:mlx5_4:1,gbit=385")  # band 0.02: 380 .. 387.6
    assert not_ok(res) == {"ib:mlx5_4:1": (Status.DEGRADED, "RdmaBandwidthNearFloor")}
    assert res["ib:mlx5_4:1"].action is Action.WATCH
    assert res["ib:mlx5_4:1"].details["warning_band"] == 0.02


def test_port_that_is_not_active_is_skipped(judged):
    res = judged("port-down@ib:mlx5_2:1")
    assert not_ok(res) == {"ib:mlx5_2:1": (Status.SKIPPED, "PortNotActive")}


def test_gpu_nic_pairing_from_the_profile_picks_the_gpu(judged):
    pairing = [f"mlx5_{7 - i}" for i in range(8)]
    r = judged(*ONLY_MLX5_0, expect={"pcie": {"gpu_nic": pairing}})["ib:mlx5_0:1"]
    assert r.details["gpudirect_gpu"] == 7
    assert "--use_cuda_bus_id=0000:ca:00.0" in r.details["command"]


def test_use_cuda_off_uses_host_memory(judged):
    r = judged(*ONLY_MLX5_0, config=Config(checks={"rdma_loopback": {"use_cuda": False}}))["ib:mlx5_0:1"]
    assert r.status is Status.OK
    assert "use_cuda" not in r.details["command"] and r.details["gpudirect_gpu"] is None


@pytest.mark.skipif(shutil.which("ib_write_bw") is not None, reason="real perftest installed")
def test_without_perftest_the_check_is_skipped(without_tools):
    without_tools(run)


# --- misbehaving perftest ------------------------------------------------------------------------

FAKE = """\
import json, sys, time
cfg = json.load(open(os.path.join(here, "behaviour.json")))
args = sys.argv[1:]
if "--help" in args:
    print(cfg.get("help", "Usage: ib_write_bw"))
    sys.exit(0)
port = args[args.index("-p") + 1]
marker = os.path.join(here, "client-" + port)
if args[-1] == "127.0.0.1":
    c = cfg["client"]
    time.sleep(c.get("sleep", 0))
    open(marker, "w").close()
    sys.stdout.write(c.get("stdout", ""))
    sys.stderr.write(c.get("stderr", ""))
    sys.exit(c.get("code", 0))
s = cfg["server"]
if s.get("banner", True):
    print("* Waiting for client to connect... *", flush=True)
mode = s.get("mode", "wait")
if mode == "hang":
    time.sleep(120)
if mode == "wait":
    deadline = time.time() + 30
    while not os.path.exists(marker) and time.time() < deadline:
        time.sleep(0.02)
sys.stdout.write(s.get("stdout", ""))
sys.stderr.write(s.get("stderr", ""))
sys.exit(s.get("code", 0))
"""

RULE = "-" * 87 + "\n"  # perftest's RESULT_LINE, printed after the report (write_bw.c)
GOOD = (" #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]\n"
        " 8388608    5000             393.10              392.55               0.005850\n"
        + RULE)
FAST = {"rdma_loopback": {"run_timeout_s": 1.0, "server_start_s": 0.3, "connect_retries": 2,
                          "server_exit_s": 0.5}}


def fake_perftest(tmp_path, server=None, client=None, help_text="Usage: ib_write_bw"):
    behaviour = {"server": server or {}, "client": client or {}, "help": help_text}
    return fake_tool(tmp_path, "ib_write_bw", FAKE,
                     files={"behaviour.json": json.dumps(behaviour)})


@pytest.fixture
def bad(node, tmp_path):
    def build(**behaviour):
        _, ctx = node(*ONLY_MLX5_0, config=Config(checks=FAST))
        ctx.host.commands = fake_perftest(tmp_path, **behaviour)
        res = run(ctx)
        assert not_ok(res).pop("ib:mlx5_1:1") == (Status.SKIPPED, "PortNotActive")
        return res["ib:mlx5_0:1"]
    return build


def test_fake_harness_reports_a_good_run(bad):
    r = bad(client={"stdout": GOOD})
    assert r.status is Status.OK and r.details["bw_gbit_per_s"] == 392.55
    assert r.details["gpudirect_gpu"] is None  # this perftest's --help lists no CUDA


def test_mb_per_sec_report_is_converted(bad):
    mb = GOOD.replace("Gb/sec", "MB/sec").replace("392.55", "46800.00")
    r = bad(client={"stdout": mb})
    assert r.details["bw_gbit_per_s"] == round(46800.0 * 1048576 * 8 / 1e9, 3)
    assert r.status is Status.OK


@pytest.mark.parametrize("client, reason, needle", [
    ({"stdout": "\x00garbage\x01 not a report\n"}, "PerftestBadOutput", "no perftest bandwidth"),
    ({"stdout": GOOD.splitlines()[0] + "\n"}, "PerftestBadOutput", "no result row"),
    ({"stdout": GOOD.replace("8388608", "65536")}, "PerftestBadOutput", "no 8388608-byte row"),
    ({"stderr": " Couldn't get context for the device\n", "code": 1}, "PerftestFailed",
     "exited 1: Couldn't get context for the device"),
    ({"sleep": 30, "stdout": GOOD}, "PerftestHang", "did not finish within 1 s"),
    ({"stdout": GOOD.replace("392.55", "nan")}, "PerftestBadOutput", "not a finite"),
    ({"stdout": GOOD.replace("392.55", "-392.55")}, "PerftestBadOutput", "not a finite"),
    ({"stdout": GOOD.replace("392.55", "1" + "0" * 30)}, "PerftestBadOutput",
     "faster than any RDMA link"),
    ({"stdout": GOOD.replace("392.55", "1000.00")}, "PerftestBadOutput",
     "above the port's rate of 400 Gb/s"),
    ({"stdout": GOOD.replace(RULE, "")}, "PerftestBadOutput", "cut short"),
    ({"stdout": GOOD.split("392.55")[0] + "39\n"}, "PerftestBadOutput", "cut short"),
])
def test_bad_client_runs_are_unknown_naming_the_device(bad, client, reason, needle):
    r = bad(client=client)
    assert (r.status, r.reason) == (Status.UNKNOWN, reason)
    assert needle in r.message
    assert "ib:mlx5_0:1" in r.message


def test_server_that_dies_before_the_client_is_unknown(bad):
    r = bad(server={"mode": "exit", "banner": False, "code": 1,
                    "stderr": " Unable to find the Infiniband/RoCE device\n"})
    assert (r.status, r.reason) == (Status.UNKNOWN, "PerftestFailed")
    assert "server for ib:mlx5_0:1 exited 1" in r.message
    assert "Unable to find the Infiniband/RoCE device" in r.message


def test_a_server_that_cannot_listen_on_any_port_tried_is_unknown(bad):
    busy = {"mode": "exit", "banner": False, "code": 1,
            "stderr": "Couldn't listen to port 18510\nUnable to open file descriptor for socket "
                      "connection"}
    r = bad(server=busy)
    assert (r.status, r.reason) == (Status.UNKNOWN, "PerftestFailed")
    assert "Couldn't listen" in r.message or "Unable to open file descriptor" in r.message
    assert list(r.details["tcp_ports_tried"]) == [18510 + 8 * k for k in range(PORT_TRIES)]


def test_server_that_never_listens_is_a_hang(bad):
    refused = {"code": 1, "stderr": "Couldn't connect to 127.0.0.1:18510\nUnable to open file "
                                    "descriptor for socket connection\n"}
    r = bad(server={"mode": "hang", "banner": False}, client=refused)
    assert (r.status, r.reason) == (Status.UNKNOWN, "PerftestHang")
    assert "never accepted a connection" in r.message


def test_server_hanging_after_a_good_client_report_still_judges_the_client(bad):
    r = bad(server={"mode": "hang"}, client={"stdout": GOOD})
    assert r.status is Status.OK
    assert r.details["server_finished"] is False
