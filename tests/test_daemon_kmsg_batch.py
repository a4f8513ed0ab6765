"""The kernel-log follower's batch path (gpu_monitor/daemon_kmsg.py): no thread per record, a
crashing check isolated, only candidates dispatched, one transaction per batch (a process
killed inside a batch loses and doubles nothing), and a long replay beside the scheduler."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import subprocess
import sys
import textwrap
import threading

from checks._kmsg_events import UNKNOWN_BOOT
from checks.xid import Xid
from gpu_monitor.check import Check
from gpu_monitor.daemon import Daemon
from gpu_monitor.daemon_kmsg import BATCH_RECORDS
from gpu_monitor.model import Kind, Status
from tests.test_daemon import append_kmsg, sim_env  # noqa: F401 - the fixture's one home
from tests.waiting import eventually

XID = "NVRM: Xid (PCI:0000:53:00): 13, pid=42, name=python, Graphics Exception line {n}"


class Seen(Check):
    """Collects what it is handed; ``kmsg_literals`` as given."""

    name = "seen"
    kinds = frozenset({Kind.PASSIVE})

    def __init__(self, literals=()):
        self.kmsg_literals = tuple(literals)
        self.seen: list[str] = []

    def on_kmsg(self, record, ctx):
        self.seen.append(record.message)
        return ()


class Crashes(Check):
    name = "crashes"
    kinds = frozenset({Kind.PASSIVE})

    def on_kmsg(self, record, ctx):
        raise RuntimeError("parser bug")


def _text_log(ctx, tmp_path, lines):
    path = tmp_path / "kern.log"
    path.write_text("".join((line if line[:1].isspace() else f"[{1000 + i}.000000] {line}")
                            + "\n" for i, line in enumerate(lines)))
    ctx.host.paths = dataclasses.replace(ctx.host.paths, kmsg=str(path))
    return path


def _storm(n: int, every: int = 100) -> list[str]:
    return [XID.format(n=i) if i % every == 0 else f"mlx5_core 0000:3b:00.0: noise {i}"
            for i in range(n)]


def test_dispatch_starts_no_thread_per_record(sim_env, tmp_path, monkeypatch):  # noqa: F811
    _, ctx = sim_env()
    _text_log(ctx, tmp_path, [XID.format(n=i) for i in range(300)])
    check = Seen()
    d = Daemon([check], ctx)
    starts = []
    real_start = threading.Thread.start
    monkeypatch.setattr(threading.Thread, "start",
                        lambda self: (starts.append(self.name), real_start(self))[1])
    d.open_kmsg()
    d.shutdown()
    assert len(check.seen) == 300
    assert starts == []


def test_a_crashing_check_does_not_stop_the_other_or_the_follower(sim_env, tmp_path):  # noqa: F811
    _, ctx = sim_env()
    _text_log(ctx, tmp_path, [XID.format(n=i) for i in range(5)])
    good = Seen()
    d = Daemon([Crashes(), good], ctx)
    d.open_kmsg()
    d.shutdown()
    assert len(good.seen) == 5
    crashed = {r.check: r for r in ctx.store.latest_results()}["crashes"]
    assert crashed.status is Status.UNKNOWN and crashed.reason == "CheckCrashed"
    assert "parser bug" in crashed.message


def test_only_records_holding_a_checks_literal_reach_it(sim_env, tmp_path):  # noqa: F811
    _, ctx = sim_env()
    lines = _storm(1000, every=50) + ["  a continuation holding NVRM"]
    _text_log(ctx, tmp_path, lines)
    picky, everything = Seen(("NVRM",)), Seen()
    d = Daemon([picky, everything], ctx)
    d.open_kmsg()
    d.shutdown()
    assert len(everything.seen) == 1000  # the continuation joined the last record
    assert len(picky.seen) == 20 + 1  # the Xids, and the noise line with that continuation
    assert d.stats.kmsg_read >= 1000


def test_a_text_log_only_one_check_wants_is_not_parsed_line_by_line(sim_env, tmp_path):  # noqa: F811
    _, ctx = sim_env()
    _text_log(ctx, tmp_path, _storm(2000))
    d = Daemon([Xid()], ctx)
    d.open_kmsg()
    d.shutdown()
    assert d._kmsg_source is None or d.kmsg.source.lines_skipped == 2000 - 20
    assert sum(ctx.store.xid_counts(kind="xid").values()) == 20


_CHILD = textwrap.dedent("""
    import dataclasses, os, sys
    from checks.xid import Xid
    from gpu_monitor.check import Check, Context
    from gpu_monitor.clock import FakeClock
    from gpu_monitor.config import DEFAULT_CONFIG
    from gpu_monitor.daemon import Daemon
    from gpu_monitor.model import Kind
    from gpu_monitor.profiles import load_profile
    from gpu_monitor.sim.node import SimulatedNode
    from gpu_monitor.state import Store

    class DiesAt(Check):
        name = "dies_at"
        kinds = frozenset({Kind.PASSIVE})
        kmsg_literals = ("NVRM",)
        def __init__(self):
            self.n = 0
        def on_kmsg(self, record, ctx):
            self.n += 1
            if self.n == int(sys.argv[3]):
                os._exit(9)  # killed inside a batch, after some of its events were written
            return ()

    node = SimulatedNode(load_profile("h100-sxm-8"))
    clock = FakeClock()
    ctx = Context(host=node.host(), profile=load_profile("h100-sxm-8").for_simulation(),
                  config=DEFAULT_CONFIG, clock=clock, store=Store.open(sys.argv[1], clock=clock),
                  one_shot=False)
    ctx.host.paths = dataclasses.replace(ctx.host.paths, kmsg=sys.argv[2])
    Daemon([Xid(), DiesAt()], ctx).open_kmsg()
""")


def test_a_process_killed_inside_a_batch_counts_every_xid_once_after_restart(
        sim_env, tmp_path):  # noqa: F811
    _, ctx = sim_env()
    lines = _storm(30 * BATCH_RECORDS, every=10)  # a batch: BATCH_RECORDS candidates
    _text_log(ctx, tmp_path, lines)
    xids = sum(1 for line in lines if "Xid" in line)
    die_at = BATCH_RECORDS + 30  # in the second batch
    child = subprocess.run(
        [sys.executable, "-c", _CHILD, ctx.store.path, ctx.host.paths.kmsg_path, str(die_at)],
        env={**os.environ, "PYTHONPATH": os.getcwd()}, capture_output=True, text=True,
        timeout=120)
    assert child.returncode == 9, child.stderr
    committed = sum(ctx.store.xid_counts(kind="xid").values())
    assert committed == BATCH_RECORDS  # the first batch committed; the killed one did not
    d = Daemon([Xid()], ctx)
    d.open_kmsg()
    d.shutdown()
    assert sum(ctx.store.xid_counts(kind="xid").values()) == xids
    assert len(ctx.store.xid_events(kind="xid")) == xids


def test_a_long_replay_runs_beside_the_scheduler_and_reports_progress(sim_env, tmp_path):  # noqa: F811
    _, ctx = sim_env()
    _text_log(ctx, tmp_path, _storm(20 * BATCH_RECORDS))
    release, entered = threading.Event(), threading.Event()

    class Slowish(Seen):
        def on_kmsg(self, record, ctx):  # a replay that takes a while: held until released
            entered.set()
            release.wait(30)
            return ()

    d = Daemon([Xid(), Slowish(("NVRM",))], ctx)
    runner = threading.Thread(target=d.run, daemon=True)
    runner.start()
    try:
        # Asked while the replay is held in its first record (not at a time guessed from a
        # start: under load the follower may sit in the hold longer than the stall limits).
        eventually(lambda: d.stats.last_tick_monotonic and entered.is_set(),
                   what="the replay under way")
        healthy, message = d.health()
        assert healthy and "replaying" in message  # the scheduler ticks while replay runs
        assert not d.replayed.is_set()
        release.set()
        eventually(d.replayed.is_set, timeout=120, what="replay done")
        assert d.health() == (True, "ok")
        assert sum(ctx.store.xid_counts(kind="xid").values()) == len(range(0, 20 * BATCH_RECORDS, 100))
    finally:
        release.set()
        d.stop()
        runner.join(30)


def test_health_says_replaying_once_the_log_is_open_before_the_follower_starts(
        sim_env, tmp_path):  # noqa: F811
    """CI caught /healthz saying plain "ok" in the moment between the log's opening and the
    follower thread's start: an open log not yet caught up is "replaying" at any moment."""
    _, ctx = sim_env()
    _text_log(ctx, tmp_path, _storm(2 * BATCH_RECORDS))
    d = Daemon([Xid()], ctx)
    d.kmsg.open()  # what start() does first; the follower thread does not exist yet
    try:
        healthy, message = d.health()
        assert healthy and "replaying" in message
        d.kmsg.pump_all()
        d.kmsg.replay_done.set()
        assert d.health() == (True, "ok")
    finally:
        d.shutdown()


def test_a_batch_and_a_poll_of_the_same_check_do_not_deadlock(sim_env, tmp_path):  # noqa: F811
    """poll takes the check's lock, then the store's; a batch must take them in that order
    too (it once held the store's transaction and waited for the check's lock: a storm
    beside the xid check's poll froze the daemon)."""
    _, ctx = sim_env()
    _text_log(ctx, tmp_path, [XID.format(n=i) for i in range(3)])
    class Locking(Seen):  # like Xid: on_kmsg and poll share state under one lock
        def __init__(self):
            super().__init__()
            self._lock = threading.RLock()

        def on_kmsg(self, record, ctx):
            with self._lock:
                return super().on_kmsg(record, ctx)

    check = Locking()
    d = Daemon([check], ctx)
    d.kmsg.open()
    held, in_tx = threading.Event(), threading.Event()
    real_batch = ctx.store.batch

    def batch():
        in_tx.set()
        return real_batch()

    ctx.store.batch = batch

    def poll():  # what Xid.poll does: its lock, then the store
        with check._lock:
            held.set()
            in_tx.wait(2)  # a batch that got the transaction first would now be waiting
            ctx.store.get_kv("seen", "open")

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    held.wait(10)
    pumper = threading.Thread(target=d.kmsg.pump_all, daemon=True)
    pumper.start()
    pumper.join(30)
    poller.join(30)
    assert not pumper.is_alive() and not poller.is_alive(), "deadlocked"
    assert len(check.seen) == 3
    d.shutdown()


def test_the_follower_reads_the_boot_id_once_and_keys_every_event_by_it(
        sim_env, tmp_path, monkeypatch):  # noqa: F811
    _, ctx = sim_env()
    _text_log(ctx, tmp_path, _storm(1000))  # 10 XIDs
    real = ctx.host.procfs.boot_id()
    calls = []
    monkeypatch.setattr(ctx.host.procfs, "boot_id", lambda: calls.append(1) or real)
    d = Daemon([Xid()], ctx)
    d.open_kmsg()
    d.shutdown()
    assert len(calls) == 1  # once per follower, not per record
    events = ctx.store.xid_events(kind="xid")
    assert len(events) == 10
    assert {e.boot_id for e in events} == {real} == {d.kmsg.boot_id}


def test_an_unread_boot_id_is_one_value_and_marks_no_high_water(sim_env, monkeypatch):  # noqa: F811
    _, ctx = sim_env()
    monkeypatch.setattr(ctx.host.procfs, "boot_id", lambda: None)
    for seq in (1, 2, 3):
        append_kmsg(ctx.host.paths.kmsg_path, seq,
                    f"NVRM: Xid (PCI:0000:53:00): 13, pid=42, name=python, line {seq}")
    d = Daemon([Xid()], ctx)
    d.open_kmsg()
    d.shutdown()
    assert d.kmsg.boot_id == UNKNOWN_BOOT
    assert {e.boot_id for e in ctx.store.xid_events(kind="xid")} == {UNKNOWN_BOOT}
    # Sequence numbers of different boots would be confused under one unread id.
    assert ctx.store.kmsg_high_water(UNKNOWN_BOOT) is None


def test_a_batch_is_stored_with_one_record_run_per_check(sim_env, tmp_path, monkeypatch):  # noqa: F811
    _, ctx = sim_env()
    _text_log(ctx, tmp_path, [XID.format(n=i) for i in range(3 * BATCH_RECORDS)])
    calls = []
    real = ctx.store.record_run
    monkeypatch.setattr(ctx.store, "record_run",
                        lambda outcome: (calls.append(len(outcome.results)), real(outcome))[1])
    d = Daemon([Xid(), Crashes()], ctx)
    d.open_kmsg()
    d.shutdown()
    # 3 batches x 2 checks, each of them one run of like outcomes, all 96 results stored
    assert calls == [BATCH_RECORDS] * 6
    assert ctx.store.reason_counts()[("xid", "Xid13")] == 3 * BATCH_RECORDS
    assert ctx.store.reason_counts()[("crashes", "CheckCrashed")] == 3 * BATCH_RECORDS


def test_merged_outcomes_store_what_the_parts_store_one_by_one(fake_clock):
    from datetime import timedelta

    from gpu_monitor.daemon_kmsg import merge_outcomes
    from gpu_monitor.model import Result, RunOutcome
    from gpu_monitor.state import Store

    def outcome(check, n, success=True, error=""):
        at = fake_clock.now() + timedelta(seconds=n)
        status = Status.OK if success else Status.UNKNOWN
        res = Result(check=check, status=status, target=f"gpu:{n % 3}",
                     reason="Xid13" if success else "CheckCrashed", message=f"#{n}",
                     details={"n": n}, observed_at=at)
        return RunOutcome(check, (res,), at, 0.01 * n, success, error)

    parts = [outcome("xid", 1), outcome("sxid", 2), outcome("xid", 3),
             outcome("xid", 4, False, "RuntimeError"), outcome("xid", 5), outcome("xid", 6)]
    merged = merge_outcomes(parts)
    assert [(m.check, len(p)) for m, p in merged] == [("xid", 2), ("xid", 1), ("xid", 2),
                                                       ("sxid", 1)]
    one_by_one, at_once = Store.open(":memory:", fake_clock), Store.open(":memory:", fake_clock)
    for p in parts:
        one_by_one.record_run(p)
    for m, _ in merged:
        at_once.record_run(m)
    for read in (lambda s: s.latest_results(), lambda s: s.reason_counts(),
                 lambda s: s.runs(), lambda s: s.results_for("xid")):
        assert read(at_once) == read(one_by_one)


def test_a_backlog_pauses_between_batches_only_when_someone_waits(sim_env, tmp_path,  # noqa: F811
                                                                  monkeypatch):
    import gpu_monitor.daemon_kmsg as follower

    _, ctx = sim_env()
    _text_log(ctx, tmp_path, [XID.format(n=i) for i in range(4 * BATCH_RECORDS)])
    pauses = []
    monkeypatch.setattr(follower.time, "sleep", pauses.append)
    check = Seen()
    d = Daemon([check], ctx)
    d.open_kmsg()
    d.shutdown()
    assert len(check.seen) == 4 * BATCH_RECORDS and pauses == []

    class Waited:  # a lock some other thread is waiting for
        waited = True

    _, ctx = sim_env()
    (tmp_path / "again").mkdir()
    _text_log(ctx, tmp_path / "again", [XID.format(n=i) for i in range(4 * BATCH_RECORDS)])
    check = Seen()
    check._lock = Waited()
    d = Daemon([check], ctx)
    monkeypatch.setattr(d.kmsg, "_checks_locked", lambda: contextlib.ExitStack())
    d.open_kmsg()
    d.shutdown()
    assert len(check.seen) == 4 * BATCH_RECORDS and pauses == [follower.YIELD_S] * 4


def test_a_waited_lock_says_so_while_a_thread_waits():
    from gpu_monitor.locks import WaitedLock

    lock = WaitedLock()
    with lock, lock:  # re-entrant
        assert not lock.waited
        t = threading.Thread(target=lambda: lock.acquire() and lock.release())
        t.start()
        eventually(lambda: lock.waited, what="the other thread waiting")
    t.join(timeout=30)
    assert not t.is_alive() and not lock.waited
