"""The xid check's repeat-rule history in memory (checks/_xid_history.py) against the recount
it replaces: ``Xid()`` and ``Xid(recount=True)`` (every event's history read back from the
store) fed the same kernel-log lines, each with its own store, must give the same results.

The sequences mix what breaks an incremental count: events out of time order, a record read
again (a replay), reboots and recorded GPU resets (the hardware ladder), a restart mid-window
(a fresh check on the same store), a prune, a changed window, unmapped addresses, sympathetic
Xid 45s, and a rolled-back batch.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path
from tempfile import TemporaryDirectory

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from checks._xid_history import XidRecall
from checks.xid import Xid
from gpu_monitor.clock import FakeClock
from gpu_monitor.hw.kmsg.text import parse_text_line
from gpu_monitor.model import Status
from tests.checks.test_xid import Node

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
BUSES = ("0000:86:00", "0000:53:00", "0000:3b:00")  # gpu:3, gpu:0, an address NVML lacks
NONFATAL_149 = ("NETIR_BER_EVENT Nonfatal XC0 i0 Link 01 (0x00082226 0x00000001 0x00000000 "
                "0x00000000 0x00000000 0x00000000)")
FATAL_149 = ("NETIR_LINK_EVT  Fatal   XC0 i0 Link 01 (0x021425c6 0x00000000 0x00000000 "
             "0x00000000 0x00000000 0x00000000)")
TEXTS = {13: "Graphics Exception: ESR 0x1", 31: "MMU Fault", 43: "Ch 00000010 reset",
         45: "Ch 00000002 caused by previous Xid 13", 48: "DBE", 95: "Uncontained",
         119: "Timeout after 6s", 149: FATAL_149}


def xid_text(at: datetime, code: int, bus: str, variant: int) -> str:
    """A ``dmesg --time-format=iso`` line: the event's time comes from the line itself."""
    text = TEXTS[code]
    if code == 45 and variant:
        text = "Ch 00000002 preemptive channel removal"  # an Xid 45 that counts
    if code == 149 and variant:
        text = NONFATAL_149
    pid = "" if code == 149 else "pid=7, name=python, "
    stamp = at.strftime("%Y-%m-%dT%H:%M:%S,%f+00:00")
    return f"{stamp} NVRM: Xid (PCI:{bus}): {code}, {pid}{text}"


class Side:
    """One check, its store and its node: the incremental one or the recount."""

    def __init__(self, tmp: Path, clock: FakeClock, recount: bool):
        self.node = Node(tmp, clock)
        self.recount = recount
        self.check = Xid(recount=recount)
        self.overrides: dict = {"app_xid_window_s": 1000, "app_xid_dedup_s": 60,
                                "app_xid_repeat_count": 3}

    def feed(self, line: str, line_no: int) -> list[tuple]:
        ctx = self.node.ctx(**self.overrides)
        results = self.check.on_kmsg(parse_text_line(line, line_no=line_no), ctx)
        return [(r.target, r.status, r.reason, r.action, r.details) for r in results]


EVENT = st.tuples(st.just("xid"),
                  st.sampled_from([13, 13, 45, 31, 48, 48, 119, 149]),
                  st.sampled_from([BUSES[0], BUSES[0], BUSES[1], BUSES[2]]),
                  st.integers(0, 1),
                  # mostly forward in time (in steps that land on the dedup interval and the
                  # window's edge), sometimes the same second, sometimes back
                  st.one_of(*[st.integers(0, 9).map(lambda n: 10 * n)] * 3,
                            st.integers(-70, 40).map(lambda n: 10 * n)))
OTHER = st.one_of(
    st.tuples(st.just("replay"), st.integers(0, 10_000)),
    st.tuples(st.sampled_from(["reboot", "reset", "restart", "prune", "rollback"])),
    st.tuples(st.just("window"), st.sampled_from([(1000, 60), (1000, 0), (300, 60),
                                                  (5000, 180)])),
)
STEPS = st.lists(st.one_of(EVENT, EVENT, EVENT, EVENT, OTHER), min_size=20, max_size=80)


def run_both(steps) -> None:
    with TemporaryDirectory() as a, TemporaryDirectory() as b:
        clock = FakeClock(T0)
        sides = [Side(Path(a), clock, recount=False), Side(Path(b), clock, recount=True)]
        at = T0
        lines: list[tuple[str, int]] = []
        boots = 0
        for step in steps:
            kind = step[0]
            if kind == "xid":
                _, code, bus, variant, dt = step
                at += timedelta(seconds=dt)
                lines.append((xid_text(at, code, bus, variant), len(lines) + 1))
                clock.advance(1)
                fed = [lines[-1]]
            elif kind == "replay" and lines:
                fed = [lines[step[1] % len(lines)]]
            else:
                fed = []
                for side in sides:
                    if kind == "reboot":
                        side.node.set_boot(f"boot-{boots + 1}")
                    elif kind == "reset":
                        # just after the newest event: between two occurrences of a code
                        side.node.store.record_action("reset_gpu", "ok",
                                                      at + timedelta(seconds=5),
                                                      {"gpu_index": 3})
                    elif kind == "restart":
                        side.check = Xid(recount=side.recount)
                    elif kind == "prune":
                        side.node.store.prune(at - timedelta(seconds=1500))
                    elif kind == "rollback":
                        # The follower's batch fails after the check stored an event: the
                        # store holds none of it, and the state in memory must not either.
                        line = xid_text(at, 13, BUSES[0], 0)
                        with pytest.raises(RuntimeError), side.node.store.batch():
                            side.feed(line, 90_000 + len(lines))
                            raise RuntimeError("the batch fails after the check's add")
                    elif kind == "window":
                        window, dedup = step[1]
                        side.overrides.update(app_xid_window_s=window, app_xid_dedup_s=dedup)
                boots += kind == "reboot"
            for line, line_no in fed:
                quick, recount = (side.feed(line, line_no) for side in sides)
                assert quick == recount, (line, line_no)
        assert sides[0].node.store.xid_events() == sides[1].node.store.xid_events()


@settings(deadline=None, max_examples=60, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(STEPS)
def test_the_state_in_memory_judges_every_event_as_the_recount_does(steps):
    run_both(steps)


# --- the cases the property covers, one at a time ------------------------------------------


@pytest.fixture
def sides(tmp_path):
    clock = FakeClock(T0)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    return [Side(tmp_path / "a", clock, recount=False), Side(tmp_path / "b", clock, recount=True)]


def feed_both(sides, line: str, line_no: int) -> list[tuple]:
    quick, recount = (side.feed(line, line_no) for side in sides)
    assert quick == recount
    return quick


def test_a_check_seeded_from_a_store_with_earlier_events_judges_as_a_fresh_recount(sides):
    for n in range(3):  # three bursts of Xid 13 on gpu:3, 100 s apart (dedup 60 s)
        feed_both(sides, xid_text(T0 + timedelta(seconds=100 * n), 13, BUSES[0], 0), n + 1)
    for side in sides:
        side.check = Xid(recount=side.recount)  # a restart mid-window
        side.overrides["app_xid_repeat_count"] = 4
    [(_, status, _, _, details)] = feed_both(
        sides, xid_text(T0 + timedelta(seconds=300), 13, BUSES[0], 0), 4)
    assert (status, details["occurrences_in_window"]) == (Status.FAILED, 4)


def test_an_event_older_than_the_newest_is_recounted(sides):
    at = [T0 + timedelta(seconds=s) for s in (500, 900, 890, 1895)]
    feed_both(sides, xid_text(at[0], 13, BUSES[0], 0), 1)
    feed_both(sides, xid_text(at[1], 13, BUSES[0], 0), 2)
    # Out of order: +890 s, with +900 s stored already, is judged by a recount...
    [(_, _, _, _, details)] = feed_both(sides, xid_text(at[2], 13, BUSES[0], 0), 3)
    assert details["occurrences_in_window"] == 2  # +500, +890
    # ...and the key is seeded again: at +1895 s (window 1000 s) +900 s is still in it.
    [(_, _, _, _, details)] = feed_both(sides, xid_text(at[3], 13, BUSES[0], 0), 4)
    assert details["occurrences_in_window"] == 2  # +900, +1895


def test_a_replayed_record_does_not_count_itself(sides):
    line = xid_text(T0, 13, BUSES[0], 0)
    first = feed_both(sides, line, 1)
    assert feed_both(sides, line, 1) == first


def test_events_another_writer_adds_are_seen(sides):
    quick = sides[0]
    feed_both(sides, xid_text(T0, 13, BUSES[0], 0), 1)
    # A second check on the same store (another instance, or a one-shot scan) adds events.
    other = Xid()
    ctx = quick.node.ctx(**quick.overrides)
    for n in (2, 3):
        other.on_kmsg(parse_text_line(xid_text(T0 + timedelta(seconds=100 * n), 13, BUSES[0],
                                               0), line_no=n), ctx)
    [(_, status, _, _, details)] = quick.feed(
        xid_text(T0 + timedelta(seconds=400), 13, BUSES[0], 0), 4)
    assert (status, details["occurrences_in_window"]) == (Status.FAILED, 4)


def test_a_long_storm_is_judged_as_the_recount_does_and_stays_bounded(sides):
    for n in range(100):  # every 73 s (dedup 60 s: each a burst), windows of 1000 s slide
        [(_, _, _, _, details)] = feed_both(
            sides, xid_text(T0 + timedelta(seconds=73 * n), 13, BUSES[0], 0), n + 1)
    assert details["occurrences_in_window"] == 1000 // 73 + 1
    for n in range(100, 600):  # then once a second: one burst
        sides[0].feed(xid_text(T0 + timedelta(seconds=7300 + n), 13, BUSES[0], 0), n + 1)
    recall = sides[0].check._recall
    assert isinstance(recall, XidRecall)
    [bursts] = recall._bursts.values()
    assert len(bursts.runs) <= 1000 // 60 + 1
