"""rdma_ports over the simulated node and the real sysfs/ibstat fixtures, on a fake clock.

Each test drives the real check through the real SysfsReader: faults change the simulated
hardware, ``CheckRig.run_to`` steps a FakeClock one poll period at a time (a ten-minute window
takes a few hundred polls and well under a second).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from checks._downtime import nccl_tolerance_s, window_stats
from checks.rdma_ports import RdmaPorts
from gpu_monitor.check import Context
from gpu_monitor.clock import FakeClock
from gpu_monitor.config import DEFAULT_CONFIG, parse_config
from gpu_monitor.host import Host
from gpu_monitor.hw.command import CommandRunner
from gpu_monitor.hw.paths import HostPaths
from gpu_monitor.hw.procfs import ProcfsReader
from gpu_monitor.hw.sysfs import SysfsReader
from gpu_monitor.model import Action, Status
from gpu_monitor.profiles import load_profile
from gpu_monitor.state import Store
from tests.checks.rig import CheckRig, NodeClock, rig_fixture

PORT = "ib:mlx5_0:1"


# A one-shot watches a down port for a while: the node moves on while it sleeps.
rig = rig_fixture(RdmaPorts, clock=NodeClock, watch=PORT)


def port_spec(rig: CheckRig, device: str = "mlx5_0"):
    return next(p for p in rig.node.spec.ib_ports if p.device == device)


# --- the NCCL arithmetic and the window, as pure functions -------------------------------------


@pytest.mark.parametrize("timeout, retries, expected_s", [
    (18, 7, 7.516),   # NCCL's historical defaults: the "about 7 seconds" operators quote
    (20, 7, 30.065),  # newer NCCL default timeout
    (14, 7, 0.470),
    (18, 0, 1.074),   # no retry still waits one timeout
])
def test_nccl_tolerance_is_4096ns_times_2_pow_timeout_times_retries(timeout, retries, expected_s):
    assert nccl_tolerance_s(timeout, retries) == pytest.approx(expected_s, abs=1e-3)


@pytest.mark.parametrize("intervals, expected", [
    ([], (0.0, 0.0, 0)),
    ([(100, 130)], (30.0, 30.0, 1)),
    ([(50, 110)], (10.0, 60.0, 1)),          # clipped at the window start, longest kept whole
    ([(10, 40)], (0.0, 0.0, 0)),             # drained
    ([(100, None)], (100.0, 100.0, 1)),      # open: runs to now
    ([(120, 121), (150, 151), (190, None)], (12.0, 10.0, 3)),
])
def test_window_stats_clips_to_window_and_measures_whole_outages(intervals, expected):
    downtime, longest, count = window_stats(intervals, window_start=100.0, now=200.0)
    assert (round(downtime, 6), round(longest, 6), count) == expected


# --- outages over time -------------------------------------------------------------------------


def test_single_30s_outage_fails_past_nccl_tolerance_and_clears_when_window_drains(rig):
    r = rig("port-down@ib:mlx5_0:1,after=10,for=30")
    r.run_to(45)
    assert r.history() == [
        (0, Status.OK, "Ok"),
        (10, Status.DEGRADED, "PortDown"),
        (18, Status.FAILED, "PortDownExceededNcclTimeout"),  # 8 s > 7.5 s
    ]
    down_at_18 = r.log[18][1][PORT]
    assert "would have killed an NCCL job" in down_at_18.message
    assert down_at_18.details["current_outage_s"] == 8.0
    back = r.log[-1][1][PORT]
    assert back.status is Status.FAILED and back.details["state"] == "ACTIVE"
    assert back.details["downtime_s"] == 30.0
    assert back.details["longest_outage_s"] == 30.0
    assert back.details["nccl_tolerance_s"] == pytest.approx(7.516, abs=1e-3)
    assert back.details["window_s"] == 600 and back.details["budget_s"] == 30
    assert back.details["link_downed"] == 1 and back.details["flaps_between_polls"] == 0
    # The other seven ports never noticed.
    assert all(res.status is Status.OK for res in r.log[-1][1].values() if res.target != PORT)
    # The window slides past the outage (it ended at t=40): cleared at t=640, not before.
    r.run_to(700, every=5)
    assert r.history()[-3:] == [(18, Status.FAILED, "PortDownExceededNcclTimeout"),
                                (640, Status.OK, "Cleared"),  # reported once ...
                                (645, Status.OK, "Ok")]       # ... then plain ok
    assert r.store.port_down_total_s("mlx5_0", 1) == 30.0
    (start, end), = r.store.port_intervals("mlx5_0", 1)
    assert (end - start).total_seconds() == 30.0


@pytest.mark.parametrize("seconds, worst", [
    (7, (Status.DEGRADED, "PortDown")),                         # NCCL would have survived it
    (9, (Status.FAILED, "PortDownExceededNcclTimeout")),
])
def test_outage_shorter_vs_longer_than_nccl_tolerance(rig, seconds, worst):
    r = rig(f"port-down@ib:mlx5_0:1,after=10,for={seconds}")
    r.run_to(30)
    states = [(s, reason) for _, s, reason in r.history()]
    assert worst in states
    if worst[0] is Status.DEGRADED:
        assert (Status.FAILED, "PortDownExceededNcclTimeout") not in states
        # Back up with 7 s in the window: under the warning (15 s), so it clears at once.
        assert states[-2:] == [(Status.OK, "Cleared"), (Status.OK, "Ok")]


def test_nccl_settings_from_config_move_the_tolerance(rig):
    config = parse_config({"nccl": {"ib_timeout": 20, "ib_retry_cnt": 7}})  # ~30 s
    r = rig("port-down@ib:mlx5_0:1,after=10,for=20", config=config)
    r.run_to(35)
    reasons = [reason for _, _, reason in r.history()]
    assert "PortDownExceededNcclTimeout" not in reasons
    assert r.log[-1][1][PORT].details["nccl_tolerance_s"] == pytest.approx(30.065, abs=1e-3)
    assert r.log[-1][1][PORT].details["nccl_ib_timeout"] == 20


def test_many_short_outages_and_one_long_outage_with_the_same_total_downtime(rig):
    flappy = rig(*[f"port-down@ib:mlx5_0:1,after={10 + 20 * i},for=1" for i in range(20)])
    flappy.run_to(400)
    single = rig("port-down@ib:mlx5_0:1,after=10,for=20")
    single.run_to(400)
    a, b = flappy.log[-1][1][PORT], single.log[-1][1][PORT]
    assert a.details["downtime_s"] == b.details["downtime_s"] == 20.0
    # The same downtime is what is judged: above half the 30 s budget -> degraded ...
    assert (a.status, a.reason) == (Status.DEGRADED, "PortDowntimeHigh")
    assert a.details["outages_in_window"] == 20 and a.details["longest_outage_s"] == 1.0
    # ... while one outage past NCCL's tolerance is a failure on its own.
    assert (b.status, b.reason) == (Status.FAILED, "PortDownExceededNcclTimeout")
    assert b.details["outages_in_window"] == 1


def test_short_outages_adding_up_past_the_budget_fail(rig):
    r = rig(*[f"port-down@ib:mlx5_0:1,after={10 + 10 * i},for=2" for i in range(16)])
    r.run_to(200)
    last = r.log[-1][1][PORT]
    assert (last.status, last.reason) == (Status.FAILED, "PortDowntimeExceeded")
    assert last.details["downtime_s"] == 32.0 and last.details["longest_outage_s"] == 2.0
    assert last.action is Action.WATCH
    # Budget first exceeded by the 16th outage; then the window drains and it clears.
    r.run_to(900, every=10)
    assert [h[1:] for h in r.history()][-2:] == [(Status.OK, "Cleared"), (Status.OK, "Ok")]


# --- link_downed: flaps shorter than the poll period --------------------------------------------


def flap(r: CheckRig, count: int = 1, device: str = "mlx5_0") -> None:
    port_spec(r, device).link_downed += count
    r.sync()


def test_link_downed_increment_between_polls_counts_as_a_short_outage(rig):
    r = rig()
    r.run_to(5)
    r.advance()
    flap(r)
    res = r.run_to(6)[PORT]
    assert res.details["state"] == "ACTIVE"
    assert res.details["outages_in_window"] == 1
    assert res.details["flaps_between_polls"] == 1
    assert res.details["downtime_s"] == 1.0  # credited one poll period: the most it can be
    (start, end), = r.store.port_intervals("mlx5_0", 1)
    assert (end - start).total_seconds() == 1.0
    # Three flaps inside one poll period: three events, still at most one period of downtime.
    r.advance()
    flap(r, 3)
    res = r.run_to(7)[PORT]
    assert res.details["flaps_between_polls"] == 4
    assert res.details["downtime_s"] == 2.0


def test_twenty_unseen_flaps_add_up_like_outages(rig):
    r = rig()
    r.run_to(1)
    for _ in range(20):
        r.advance(10)
        flap(r)
        r.poll()
    res = r.log[-1][1][PORT]
    assert res.details["downtime_s"] == 20.0
    assert (res.status, res.reason) == (Status.DEGRADED, "PortDowntimeHigh")


def test_observed_outage_is_not_counted_again_through_link_downed(rig):
    r = rig("port-down@ib:mlx5_0:1,after=3,for=2")
    res = r.run_to(10)[PORT]
    assert res.details["link_downed"] == 1
    assert res.details["outages_in_window"] == 1 and res.details["flaps_between_polls"] == 0
    assert res.details["downtime_s"] == 2.0


def test_link_downed_going_backwards_rebases_without_alarm(rig):
    r = rig()
    port_spec(r).link_downed = 40
    r.sync()
    r.run_to(3)
    r.advance()
    port_spec(r).link_downed = 0  # driver reload / perfquery -R
    r.sync()
    res = r.run_to(4)[PORT]
    assert res.status is Status.OK and res.details["outages_in_window"] == 0
    r.advance()
    flap(r)
    res = r.run_to(5)[PORT]
    assert res.details["flaps_between_polls"] == 1  # counting resumes from the new base


def test_counter_present_at_start_is_a_baseline_not_an_outage(rig):
    r = rig()
    port_spec(r).link_downed = 255
    r.sync()
    res = r.run_to(2)[PORT]
    assert res.status is Status.OK and res.details["outages_in_window"] == 0
    assert res.details["link_downed_saturated"] is True  # 8-bit counter: flaps now invisible


# --- persistence --------------------------------------------------------------------------------


def test_restart_mid_outage_continues_the_same_interval(rig):
    r = rig("port-down@ib:mlx5_0:1,after=10,for=30")
    r.run_to(14)
    assert r.log[-1][1][PORT].reason == "PortDown"
    r.check = RdmaPorts()  # the daemon restarts: new instance, same store
    r.advance()
    r.run_to(18)
    res = r.log[-1][1][PORT]
    assert (res.status, res.reason) == (Status.FAILED, "PortDownExceededNcclTimeout")
    assert res.details["current_outage_s"] == 8.0  # measured from t=10, before the restart
    r.run_to(45)
    (start, end), = r.store.port_intervals("mlx5_0", 1)
    assert (end - start).total_seconds() == 30.0


def test_restart_after_a_long_gap_credits_only_what_was_seen(rig):
    r = rig("port-down@ib:mlx5_0:1,after=10,for=3")
    r.run_to(11)  # seen down at 10 and 11
    r.check = RdmaPorts()
    r.advance(300)  # the daemon was away for five minutes; the port came back meanwhile
    r.sync()
    res = r.poll()[PORT]
    assert res.status is Status.OK
    (start, end), = r.store.port_intervals("mlx5_0", 1)
    assert (end - start).total_seconds() == 2.0  # last seen down at 11, plus one poll period


def test_restart_after_reboot_closes_the_old_outage(rig):
    r = rig("port-down@ib:mlx5_0:1,after=10,for=1000")
    r.run_to(12)
    r.check = RdmaPorts()
    r.node.spec.boot_id = "0c5b1d7e-2222-4c1f-9e7a-000000000001"
    r.advance(60)
    r.sync()
    r.poll()
    intervals = r.store.port_intervals("mlx5_0", 1)
    assert len(intervals) == 2
    assert (intervals[0][1] - intervals[0][0]).total_seconds() == 3.0
    assert intervals[1][1] is None


def test_works_without_a_store(rig):
    r = rig("port-down@ib:mlx5_0:1,after=2,for=10", store=False)
    r.run_to(15)
    assert (Status.FAILED, "PortDownExceededNcclTimeout") in [h[1:] for h in r.history()]


# --- expectations from the profile ---------------------------------------------------------------


def test_missing_expected_port_fails(rig):
    ports = [f"mlx5_{i}:1" for i in range(8)] + ["mlx5_9:1"]
    r = rig(expect={"rdma": {"ports": ports}})
    res = r.run_to(0)
    assert (res["ib:mlx5_9:1"].status, res["ib:mlx5_9:1"].reason) == (Status.FAILED,
                                                                      "PortMissing")
    assert res["ib:mlx5_9:1"].action is Action.REBOOT
    assert sum(x.status is Status.OK for x in res.values()) == 8


def test_port_not_in_the_profile_is_reported_not_judged(rig):
    r = rig("port-down@ib:mlx5_7:1,after=0,for=100",
            expect={"rdma": {"ports": [f"mlx5_{i}:1" for i in range(7)]}})
    res = r.run_to(20)
    assert (res["ib:mlx5_7:1"].status, res["ib:mlx5_7:1"].reason) == (Status.SKIPPED,
                                                                      "PortNotExpected")
    assert r.store.port_intervals("mlx5_7", 1) == []


def test_rate_below_the_profile_is_degraded(rig):
    r = rig()
    p = port_spec(r, "mlx5_3")
    p.rate_gbit, p.rate_text = 200, "200 Gb/sec (4X HDR)"
    r.sync()
    res = r.run_to(0)["ib:mlx5_3:1"]
    assert (res.status, res.reason) == (Status.DEGRADED, "PortRateDegraded")
    assert res.details["rate_gbit_per_s"] == 200 and res.details["expected_rate_gbit_per_s"] == 400


# --- one-shot (bootstrap, gpu-monitor check rdma_ports) ------------------------------------------


def test_one_shot_without_history_judges_now_and_says_so(rig):
    r = rig()
    results = RdmaPorts().run(r.ctx(one_shot=True))
    assert len(results) == 8 and all(x.status is Status.OK for x in results)
    assert all(x.details["window"] == "instantaneous" for x in results)


def test_one_shot_watches_a_down_port_until_it_exceeds_nccl_tolerance(rig):
    r = rig("port-down@ib:mlx5_0:1,after=0,for=1000")
    res = {x.target: x for x in RdmaPorts().run(r.ctx(one_shot=True))}[PORT]
    assert (res.status, res.reason) == (Status.FAILED, "PortDownExceededNcclTimeout")
    assert res.details["window"] == "instantaneous"
    assert res.details["observed_s"] > res.details["nccl_tolerance_s"]
    assert r.store.port_intervals("mlx5_0", 1) == []  # a one-shot writes nothing


def test_one_shot_blip_that_comes_back_is_judged_like_the_daemon_would(rig):
    r = rig("port-down@ib:mlx5_0:1,after=0,for=3")
    res = {x.target: x for x in RdmaPorts().run(r.ctx(one_shot=True))}[PORT]
    assert res.status is Status.OK
    assert res.details["downtime_s"] == 3.0 and res.details["outages_in_window"] == 1


def test_one_shot_uses_the_daemons_history(rig):
    r = rig("port-down@ib:mlx5_0:1,after=10,for=30")
    r.run_to(100, every=1)
    res = {x.target: x for x in RdmaPorts().run(r.ctx(one_shot=True))}[PORT]
    assert (res.status, res.reason) == (Status.FAILED, "PortDownExceededNcclTimeout")
    assert res.details["window"] == "history" and res.details["downtime_s"] == 30.0


# --- boot grace and bad input --------------------------------------------------------------------


def test_port_down_during_boot_grace_is_unknown_and_not_recorded(rig):
    r = rig("port-down@ib:mlx5_0:1,after=0,for=30")
    r.node.spec.uptime_s = 60.0
    r.sync()
    res = r.run_to(20)[PORT]
    assert (res.status, res.reason) == (Status.UNKNOWN, "BootGrace")
    assert r.store.port_intervals("mlx5_0", 1) == []


def test_junk_in_the_state_file_is_unknown(rig):
    r = rig()
    r.run_to(0)
    path = os.path.join(r.node.paths.sys("class", "infiniband", "mlx5_2", "ports", "1"), "state")
    with open(path, "w") as f:
        f.write("\x00garbage\n")
    r.advance()
    res = r.poll_says("ib:mlx5_2:1", Status.UNKNOWN, "SysfsReadError")
    assert any("state" in e for e in res.details["read_errors"])
    assert r.log[-1][1][PORT].status is Status.OK  # the other ports are still judged


@pytest.mark.parametrize("rel,content", [
    ("rate", "banana\n"), ("rate", ""), ("rate", "-400 Gb/sec (4X NDR)\n"), ("rate", None),
    ("phys_state", "5: ACTIVE\n"), ("counters/link_downed", "-1\n"),
    ("counters/link_downed", None),
], ids=["rate-garbage", "rate-empty", "rate-negative", "rate-directory", "phys-mismatch",
        "link-downed-negative", "link-downed-directory"])
def test_a_judged_file_that_does_not_parse_makes_the_polled_port_unknown(rig, rel, content):
    r = rig()
    assert r.run_to(0)["ib:mlx5_2:1"].status is Status.OK
    path = os.path.join(r.node.paths.sys("class", "infiniband", "mlx5_2", "ports", "1"), rel)
    os.unlink(path)
    if content is None:
        os.mkdir(path)
    else:
        with open(path, "w") as f:
            f.write(content)
    r.advance()
    res = r.poll_says("ib:mlx5_2:1", Status.UNKNOWN, "SysfsReadError")
    assert os.path.basename(rel) in res.message
    assert any(path in e for e in res.details["read_errors"])
    assert r.log[-1][1][PORT].status is Status.OK  # the other ports are still judged


# --- real sysfs and ibstat samples ---------------------------------------------------------------


def tree_host(root: Path) -> Host:
    paths = HostPaths().under(str(root))
    return Host(paths=paths, nvml=None, sysfs=SysfsReader(paths), procfs=ProcfsReader(paths),
                commands=CommandRunner())


def test_gpud_h100_sysfs_tree_every_400g_port_ok(fixtures_dir, tmp_path):
    src = fixtures_dir / "sysfs" / "gpud_h100" / "sys-class-infiniband-h100.0"
    shutil.copytree(src, tmp_path / "sys" / "class" / "infiniband")
    ports = ["mlx5_0:1", "mlx5_1:1"] + [f"mlx5_{i}:1" for i in range(4, 10)]
    prof = load_profile("h100-sxm-8").with_overrides({"rdma": {"ports": ports}})
    ctx = Context(host=tree_host(tmp_path), profile=prof, config=DEFAULT_CONFIG,
                  clock=FakeClock(), one_shot=True)
    res = {x.target: x for x in RdmaPorts().run(ctx)}
    assert {t for t, x in res.items() if x.status is Status.OK} == {f"ib:{p}" for p in ports}
    assert res["ib:mlx5_bond_0:1"].reason == "PortNotExpected"
    assert res["ib:mlx5_1:1"].details["link_downed"] == 255
    assert res["ib:mlx5_1:1"].details["link_downed_saturated"] is True


_IB_STATE = {"Active": "4: ACTIVE", "Down": "1: DOWN", "Init": "2: INIT", "Armed": "3: ARMED"}
_IB_PHYS = {"LinkUp": "5: LinkUp", "Polling": "2: Polling", "Disabled": "3: Disabled"}


def ibstat_tree(text: str, root: Path) -> list[tuple[str, str, str, str, int, str]]:
    """Render real ``ibstat`` output as the sysfs files the kernel shows for the same ports."""
    ports, ca = [], None
    block: dict[str, str] = {}

    def flush() -> None:
        if ca and block:
            ports.append((ca, block["CA type"], block["State"], block["Physical state"],
                          int(block["Rate"]), block["Link layer"]))

    for line in text.splitlines():
        if line.startswith("CA '"):
            flush()
            ca, block = line.split("'")[1], {}
        elif ":" in line and ca:
            k, v = (s.strip() for s in line.split(":", 1))
            if k in ("CA type", "State", "Physical state", "Rate", "Link layer"):
                block[k] = v
    flush()
    for name, _, state, phys, rate, layer in ports:
        d = root / "sys" / "class" / "infiniband" / name / "ports" / "1"
        (d / "counters").mkdir(parents=True)
        (d / "state").write_text(_IB_STATE[state] + "\n")
        (d / "phys_state").write_text(_IB_PHYS[phys] + "\n")
        (d / "rate").write_text(f"{rate} Gb/sec (4X)\n")
        (d / "link_layer").write_text(layer + "\n")
        (d / "counters" / "link_downed").write_text("0\n")
    return ports


@pytest.mark.parametrize("fixture, down", [
    # Only the unused 100G MT4125 ports are down here: not rails, so nothing is PortDown
    # (GPUd PR #295: counting every port flagged healthy hosts).
    ("gpud_ibstat_47.0_H100_some_down_0.txt", set()),
    ("gpud_ibstat_47.0_H100_some_down_1.txt", {"mlx5_5", "mlx5_11"}),
    ("gpud_ibstat_47.0_H100_some_down_polling.txt", {"mlx5_5", "mlx5_11"}),
])
def test_ibstat_down_and_polling_ports_are_down_and_not_rate_degraded(fixtures_dir, tmp_path,
                                                                      fixture, down):
    ports = ibstat_tree((fixtures_dir / "ib_perftest" / fixture).read_text(), tmp_path)
    # The profile lists the host's 400G ConnectX-7 rails (MT4129), as an operator would.
    rails = [n for n, ca_type, *_ in ports if ca_type == "MT4129"]
    prof = load_profile("h100-sxm-8").with_overrides(
        {"rdma": {"ports": [f"{n}:1" for n in rails]}})
    clock = FakeClock()
    ctx = Context(host=tree_host(tmp_path), profile=prof, config=DEFAULT_CONFIG, clock=clock,
                  store=Store.open(":memory:", clock), one_shot=False)
    res = {x.target: x for x in RdmaPorts().poll(ctx)}
    got_down = {t.split(":")[1] for t, x in res.items() if x.reason == "PortDown"}
    assert got_down == down
    # A down port reports a meaningless 40 Gb/s: never a rate complaint.
    assert not any(x.reason == "PortRateDegraded" for x in res.values())
    # The 100G management NICs (MT4125) are not in rdma.ports: reported, not judged.
    assert all(res[f"ib:{n}:1"].reason == "PortNotExpected" for n, t, *_ in ports
               if t == "MT4125")


# --- the crossing instant: asked for, not waited for ------------------------------------------


def test_a_down_port_asks_for_a_poll_at_the_instant_it_crosses_nccl_tolerance(rig):
    r = rig("port-down@ib:mlx5_0:1,after=10,for=20")
    r.run_to(10)
    start = r.clock.now().timestamp()
    res = r.poll_says(PORT, Status.DEGRADED, "PortDown")
    tolerance = nccl_tolerance_s(18, 7)
    assert res.details["longest_outage_start"] == pytest.approx(start, abs=1e-4)
    assert res.details["longest_outage_end"] is None
    wake = r.check.wake_at()
    assert wake == pytest.approx(start + tolerance + RdmaPorts.CROSSING_MARGIN_S, abs=1e-4)
    r.run_to(17)  # one-second polls up to just before the crossing
    assert r.check.wake_at() == pytest.approx(wake, abs=1e-4)  # still ahead: still asked for
    r.advance(wake - r.clock.now().timestamp())  # the daemon polls at the instant asked for
    r.sync()
    crossed = r.poll_says(PORT, Status.FAILED, "PortDownExceededNcclTimeout")
    assert crossed.details["longest_outage_start"] == pytest.approx(start, abs=1e-4)
    assert r.check.wake_at() is None  # crossed: nothing more to ask for


def test_an_up_port_asks_for_no_early_poll(rig):
    r = rig()
    r.run_to(3)
    assert r.check.wake_at() is None
