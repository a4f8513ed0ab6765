import threading
import time
import urllib.request

import pytest

from gpu_monitor.check import Check, Context
from gpu_monitor.clock import FakeClock
from gpu_monitor.config import DEFAULT_CONFIG
from gpu_monitor.daemon import Daemon, build_registry
from gpu_monitor.exporter import Exporter, parse_listen
from gpu_monitor.model import Kind, Status
from gpu_monitor.profiles import load_profile
from gpu_monitor.sim.node import SimulatedNode
from gpu_monitor.state import Store
from tests.waiting import eventually


class KmsgCounter(Check):
    """Counts NVRM lines; stands in for the kernel-log checks."""

    name = "kmsg_counter"
    kinds = frozenset({Kind.PASSIVE})
    reasons = ("Seen",)

    def __init__(self):
        self.seen = []

    def on_kmsg(self, record, ctx):
        if "NVRM" in record.message:
            self.seen.append(record.seq)
            return [self.result(ctx, Status.DEGRADED, "node", "Seen", record.message)]
        return []


def read_kmsg_once(ctx) -> tuple[KmsgCounter, Daemon]:
    """A new daemon with one KmsgCounter opens the kernel log (the counter sees what is there
    for it) and shuts down: (the counter, the daemon)."""
    check = KmsgCounter()
    d = Daemon([check], ctx)
    d.open_kmsg()
    d.shutdown()
    return check, d


class Slow(Check):
    name = "slow_check"
    kinds = frozenset({Kind.PASSIVE})
    interval = 1.0
    timeout = 10.0

    def __init__(self):
        self.release = threading.Event()
        self.runs = 0

    def poll(self, ctx):
        self.runs += 1
        self.release.wait(120)  # released by the test, however slow the machine
        return [self.ok(ctx)]


class Fast(Check):
    name = "fast_check"
    kinds = frozenset({Kind.PASSIVE})
    interval = 1.0

    def __init__(self):
        self.runs = 0

    def poll(self, ctx):
        self.runs += 1
        return [self.ok(ctx)]


@pytest.fixture
def sim_env(tmp_path):
    nodes = []

    def make(store_path=None, clock=None):
        node = SimulatedNode(load_profile("h100-sxm-8"))
        nodes.append(node)
        clock = clock or FakeClock()
        store = Store.open(str(store_path or tmp_path / "state.db"), clock=clock)
        ctx = Context(host=node.host(), profile=load_profile("h100-sxm-8").for_simulation(),
                      config=DEFAULT_CONFIG, clock=clock, store=store, one_shot=False)
        return node, ctx

    yield make
    for n in nodes:
        n.close()


def append_kmsg(path, seq, msg, pri=4):
    with open(path, "a") as fh:
        fh.write(f"{pri},{seq},{seq * 1000},-;{msg}\n")


def test_restart_neither_double_counts_nor_misses_kmsg_records(sim_env, tmp_path):
    node, ctx = sim_env()
    path = ctx.host.paths.kmsg_path
    for seq in (10, 11, 12):
        append_kmsg(path, seq, f"NVRM: Xid (PCI:0000:53:00): 79, pid=1, name=x, line {seq}")
    check, _ = read_kmsg_once(ctx)
    assert check.seen == [10, 11, 12]
    # A second daemon on the same store and boot replays the buffer: only new records count.
    append_kmsg(path, 13, "NVRM: Xid (PCI:0000:53:00): 79, pid=1, name=x, line 13")
    check2, _ = read_kmsg_once(ctx)
    assert check2.seen == [13]


def test_replayed_ring_buffer_is_deduplicated_by_boot_and_sequence(sim_env):
    # /dev/kmsg hands the whole ring buffer to a new reader: records at or below the stored
    # high-water mark of this boot are skipped. (Forget the file position to get that replay.)
    node, ctx = sim_env()
    path = ctx.host.paths.kmsg_path
    with open(path) as fh:
        boot_records = len(fh.readlines())  # the simulated node's own boot records
    for seq in (10, 11, 12):
        append_kmsg(path, seq, f"NVRM: line {seq}")
    read_kmsg_once(ctx)
    ctx.store.delete_kv(Daemon._KV_FILE_POS, path)
    append_kmsg(path, 13, "NVRM: line 13")
    check, d2 = read_kmsg_once(ctx)
    assert check.seen == [13]
    assert d2.stats.kmsg_skipped_replay == boot_records + 3


def test_new_boot_id_replays_everything(sim_env):
    node, ctx = sim_env()
    path = ctx.host.paths.kmsg_path
    append_kmsg(path, 5, "NVRM: something")
    read_kmsg_once(ctx)
    node.spec.boot_id = "00000000-0000-4000-8000-000000000001"
    node.advance(0.1)
    ctx.store.delete_kv(Daemon._KV_FILE_POS, path)  # a new boot: a new ring buffer
    check, _ = read_kmsg_once(ctx)
    assert check.seen == [5]


def test_follower_dispatches_appended_record_quickly(sim_env):
    node, ctx = sim_env()
    check = KmsgCounter()
    d = Daemon([check], ctx, kmsg_poll_s=0.005)
    d.start()
    try:
        append_kmsg(ctx.host.paths.kmsg_path, 99, "NVRM: Xid (PCI:0000:53:00): 48, pid=1")
        deadline = time.monotonic() + 5
        latest = {}
        while "kmsg_counter" not in latest and time.monotonic() < deadline:
            time.sleep(0.005)
            latest = {r.check: r for r in ctx.store.latest_results()}
        assert check.seen == [99]
        assert latest["kmsg_counter"].reason == "Seen"
    finally:
        d.shutdown()


def test_malformed_lines_are_counted_not_fatal(sim_env):
    node, ctx = sim_env()
    with open(ctx.host.paths.kmsg_path, "ab") as fh:
        fh.write(b"\x00\x01garbage\xff\n" + b"x" * 70000 + b"\n")
    append_kmsg(ctx.host.paths.kmsg_path, 7, "NVRM: after the garbage")
    check, d = read_kmsg_once(ctx)
    assert d.stats.kmsg_parse_errors >= 2
    assert check.seen == [7]


def test_missing_kernel_log_reports_unknown_and_keeps_running(sim_env, tmp_path):
    import dataclasses

    node, ctx = sim_env()
    ctx.host.paths = dataclasses.replace(ctx.host.paths, kmsg=str(tmp_path / "absent" / "kmsg"))
    d = Daemon([KmsgCounter(), Fast()], ctx)
    d.open_kmsg()
    latest = {r.check: r for r in ctx.store.latest_results()}
    assert latest["kmsg_counter"].status is Status.UNKNOWN
    assert latest["kmsg_counter"].reason == "KmsgUnavailable"
    assert d.replayed.is_set()
    assert d.tick(wait=True)[0].check == "fast_check"
    d.shutdown()


def test_while_the_kernel_log_cannot_be_read_no_gpu_or_switch_is_ok_about_it(sim_env, tmp_path):
    import dataclasses

    from checks.nvswitch import NvSwitch
    from checks.xid import Xid

    _, ctx = sim_env()
    missing = str(tmp_path / "absent" / "kmsg")
    ctx.host.paths = dataclasses.replace(ctx.host.paths, kmsg=missing)
    d = Daemon([Xid(), NvSwitch()], ctx)
    try:
        d.open_kmsg()
        d.tick(wait=True)
        latest = [r for r in ctx.store.latest_results() if r.check in ("xid", "nvswitch")]
        # What the log would have told: XIDs per GPU, SXids per switch (the switches' fabric
        # registration, read from NVML, is not the log's to tell).
        per_target = [r for r in latest if (r.check, r.target.split(":")[0]) in
                      {("xid", "gpu"), ("nvswitch", "nvswitch")}]
        assert {r.target for r in per_target if r.check == "xid"} == {f"gpu:{i}" for i in range(8)}
        assert any(r.check == "nvswitch" for r in per_target)
        for r in per_target:
            assert r.status is Status.UNKNOWN and r.reason == "KmsgReadError", r
            assert missing in r.message
    finally:
        d.shutdown()


def test_slow_check_does_not_starve_fast_one_and_never_runs_twice(sim_env):
    _, ctx = sim_env()
    clock = ctx.clock
    slow, fast = Slow(), Fast()
    d = Daemon([slow, fast], ctx)
    try:
        d.tick()
        for _ in range(5):
            # Each tick starts the fast check only once its last run is done: wait for that,
            # never for a guessed time (under load a run can outlast any sleep).
            eventually(lambda: d.in_flight["fast_check"].done(), what="the fast check's run")
            clock.advance(1.0)
            d.tick()
        eventually(lambda: fast.runs == 6, what="six runs of the fast check")
        assert slow.runs == 1  # still in flight all along: never started again
        assert not d.in_flight["slow_check"].done()
    finally:
        slow.release.set()
        d.shutdown()


def polled_once(sim_env) -> tuple[Context, Fast, Daemon]:
    """A daemon with one Fast check on a simulated node, after its first poll: (the Context,
    the check, the daemon; the caller shuts it down)."""
    _, ctx = sim_env()
    fast = Fast()
    d = Daemon([fast], ctx)
    d.tick(wait=True)
    return ctx, fast, d


def test_intervals_follow_the_injected_clock(sim_env):
    ctx, fast, d = polled_once(sim_env)
    d.tick(wait=True)  # not due yet: the fake clock has not moved
    assert fast.runs == 1
    ctx.clock.advance(600)  # ten minutes, instantly
    d.tick(wait=True)
    assert fast.runs == 2
    d.shutdown()


def test_exporter_serves_metrics_health_and_404(sim_env):
    ctx, fast, d = polled_once(sim_env)
    exp = Exporter(build_registry(d, ctx.store, [Fast], ctx.clock), d.health,
                   ready=lambda: True)
    host, port = exp.start("127.0.0.1:0")
    try:
        body = urllib.request.urlopen(f"http://{host}:{port}/metrics").read().decode()
        assert 'gpu_monitor_check_success{check="fast_check"} 1.0' in body
        assert urllib.request.urlopen(f"http://{host}:{port}/healthz").status == 200
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(f"http://{host}:{port}/nope")
        assert err.value.code == 404
    finally:
        exp.stop()
        d.shutdown()


@pytest.mark.parametrize("text, want", [("0.0.0.0:9425", ("0.0.0.0", 9425)),
                                        (":9425", ("0.0.0.0", 9425)),
                                        ("[::1]:80", ("::1", 80))])
def test_parse_listen(text, want):
    assert parse_listen(text) == want


def test_parse_listen_rejects_garbage():
    with pytest.raises(ValueError):
        parse_listen("localhost")


class _GapSource:
    """A kernel-log source whose reads hit a ring-buffer overrun (EPIPE -> KmsgGap)."""

    path = "/dev/kmsg"

    def __init__(self, batches):
        self.batches = list(batches)

    def read_available(self, max_records=None):
        return self.batches.pop(0) if self.batches else []

    def fileno(self):
        raise OSError("no fd")

    def close(self):
        pass


def test_ring_buffer_overrun_reports_unknown_and_keeps_following(sim_env):
    from gpu_monitor.hw.kmsg.record import KmsgGap, parse_kmsg_record

    _, ctx = sim_env()
    check = KmsgCounter()
    d = Daemon([check], ctx)
    rec = parse_kmsg_record("4,500,1000,-;NVRM: Xid (PCI:0000:53:00): 79, pid=1, name=x")
    d._kmsg_source = _GapSource([[KmsgGap(missed=12, reason="EPIPE")], [rec]])
    d.kmsg.pump()  # one batch: one read
    latest = {r.check: r for r in ctx.store.latest_results()}
    assert latest["kmsg_counter"].status is Status.UNKNOWN
    assert latest["kmsg_counter"].reason == "KmsgOverrun" and "12" in latest["kmsg_counter"].message
    assert d.stats_snapshot()["kmsg_gaps"] == 1
    d.kmsg.pump()  # one batch: one read
    assert check.seen == [500]
    d.shutdown()


def test_sigterm_stops_the_daemon_cleanly(tmp_path):
    import signal
    import subprocess
    import sys

    port_file = tmp_path / "port"
    code = (
        "import socket,sys\n"
        "s=socket.socket(); s.bind(('127.0.0.1',0)); p=s.getsockname()[1]; s.close()\n"
        f"open({str(port_file)!r},'w').write(str(p))\n"
        "from gpu_monitor.cli import main\n"
        "sys.exit(main(['daemon','--simulate','a100-sxm-8','--listen',f'127.0.0.1:{p}',"
        "'--log-level','info']))\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                port = int(port_file.read_text())
                if urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1).status == 200:
                    break
            except (OSError, ValueError):
                time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert "daemon stopped" in err


def test_followed_text_log_resumes_after_restart_without_recounting(sim_env, tmp_path):
    import dataclasses

    _, ctx = sim_env()
    log_path = tmp_path / "kern.log"
    log_path.write_text(
        "2025-01-02T15:20:12+0800 host kernel: NVRM: Xid (PCI:0000:53:00): 79, pid=1, a\n")
    ctx.host.paths = dataclasses.replace(ctx.host.paths, kmsg=str(log_path))
    first, _ = read_kmsg_once(ctx)
    assert len(first.seen) == 1
    with open(log_path, "a") as fh:
        fh.write("2025-01-02T15:21:12+0800 host kernel: NVRM: Xid (PCI:0000:53:00): 48, b\n")
    second, _ = read_kmsg_once(ctx)
    assert len(second.seen) == 1  # only the new line; the old one is not counted again


def test_rotated_text_log_is_read_from_its_start(sim_env, tmp_path):
    import dataclasses
    import os

    _, ctx = sim_env()
    log_path = tmp_path / "kern.log"
    log_path.write_text("Jan  2 15:20:12 host kernel: NVRM: old line\n")
    ctx.host.paths = dataclasses.replace(ctx.host.paths, kmsg=str(log_path))
    read_kmsg_once(ctx)
    os.rename(log_path, tmp_path / "kern.log.1")
    log_path.write_text("Jan  2 15:30:12 host kernel: NVRM: new file line\n")
    check, _ = read_kmsg_once(ctx)
    assert len(check.seen) == 1


class AsksEarly(Check):
    """Asks for its next poll ``ahead`` seconds after each poll (an outage about to cross)."""

    name = "asks_early"
    kinds = frozenset({Kind.PASSIVE})
    interval = 1.0

    def __init__(self, clock, ahead):
        self.clock, self.ahead, self.runs = clock, ahead, 0

    def poll(self, ctx):
        self.runs += 1
        return [self.ok(ctx)]

    def wake_at(self):
        return None if self.ahead is None else self.clock.now().timestamp() + self.ahead


def test_a_check_asking_for_an_earlier_poll_is_polled_then_not_a_tick_later(sim_env):
    _node, ctx = sim_env()
    check = AsksEarly(ctx.clock, 0.3)
    d = Daemon([check], ctx)
    d.tick(wait=True)
    assert check.runs == 1
    assert d.seconds_to_next_due() == pytest.approx(0.3)  # not the 1 s interval
    assert d._wake.is_set()  # a sleeping scheduler is woken to recompute its sleep
    ctx.clock.advance(0.3)
    d.tick(wait=True)
    assert check.runs == 2
    check.ahead = 5.0  # later than the interval: the interval wins
    ctx.clock.advance(0.3)
    d.tick(wait=True)
    assert check.runs == 3
    assert d.seconds_to_next_due() == pytest.approx(1.0)
    d.shutdown()


def test_a_running_daemon_wakes_for_the_instant_asked_for(sim_env):
    """The real loop on the real clock: a check with a ten-minute interval that asks for a poll
    0.05 s after each poll is polled again and again (only its requests can do that)."""
    from gpu_monitor.clock import Clock

    class Slowly(AsksEarly):
        interval = 600.0

    _node, ctx = sim_env(clock=Clock())
    check = Slowly(ctx.clock, 0.05)
    d = Daemon([check], ctx)
    t = threading.Thread(target=d.run, daemon=True)
    t.start()
    try:
        eventually(lambda: check.runs >= 5, timeout=60)
    finally:
        d.stop()
        t.join(timeout=30)
