"""RDMA port down-intervals: the sliding-window arithmetic and the monotonic total.

rdma_ports judges cumulative downtime in a window (default 10 min), so the clipping of
intervals to the window is where a wrong answer would cordon a healthy node or miss a bad one.
Times are offsets in seconds from the fake clock's start.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from gpu_monitor.clock import FakeClock
from gpu_monitor.state import Store
from gpu_monitor.state.ports import clip_downtime_s

T0 = FakeClock().now()


def at(seconds: float):
    return T0 + timedelta(seconds=seconds)


WINDOW = (100.0, 700.0)  # [window_start, now]: a 10-minute window

# (id, intervals as (start, end|None), expected seconds inside WINDOW)
CASES = [
    ("inside", [(200, 260)], 60.0),
    ("overlaps-window-start", [(50, 150)], 50.0),
    ("open-overlaps-now", [(650, None)], 50.0),
    ("closed-ends-after-now", [(650, 900)], 50.0),
    ("entirely-before-window", [(10, 90)], 0.0),
    ("ends-exactly-at-window-start", [(40, 100)], 0.0),
    ("zero-length", [(300, 300)], 0.0),
    ("zero-length-open-at-now", [(700, None)], 0.0),
    ("starts-after-now", [(750, None)], 0.0),
    ("spans-whole-window-open", [(0, None)], 600.0),
    ("spans-whole-window-closed", [(0, 800)], 600.0),
    ("many-flaps-add-up", [(110, 111.5), (200, 202), (300, 300), (690, None)], 13.5),
    ("before-and-inside", [(0, 50), (400, 430)], 30.0),
]


@pytest.mark.parametrize(("intervals", "expected"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_clip_downtime_to_window(intervals, expected):
    spans = [(at(s), None if e is None else at(e)) for s, e in intervals]
    assert clip_downtime_s(spans, at(WINDOW[0]), at(WINDOW[1])) == pytest.approx(expected)


@pytest.fixture
def store(tmp_path):
    clock = FakeClock(T0)
    with Store.open(str(tmp_path / "state.db"), clock) as s:
        yield s


@pytest.mark.parametrize(("intervals", "expected"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_store_downtime_in_window_matches_the_arithmetic(store, intervals, expected):
    for start, end in intervals:
        assert store.port_down_start("mlx5_0", 1, at(start))
        if end is not None:
            store.port_down_end("mlx5_0", 1, at(end))
    got = store.port_downtime_s("mlx5_0", 1, at(WINDOW[0]), at(WINDOW[1]))
    assert got == pytest.approx(expected)


def test_downtime_is_per_device_and_port(store):
    store.port_down_start("mlx5_0", 1, at(200))
    store.port_down_end("mlx5_0", 1, at(230))
    store.port_down_start("mlx5_1", 1, at(300))
    assert store.port_downtime_s("mlx5_0", 1, at(100), at(700)) == pytest.approx(30)
    assert store.port_downtime_s("mlx5_1", 1, at(100), at(700)) == pytest.approx(400)
    assert store.port_downtime_s("mlx5_0", 2, at(100), at(700)) == 0.0


def test_port_down_start_twice_keeps_the_first_start(store):
    assert store.port_down_start("mlx5_0", 1, at(10))
    assert not store.port_down_start("mlx5_0", 1, at(20))
    assert store.open_port_outage("mlx5_0", 1) == at(10)
    assert store.port_outages_total("mlx5_0", 1) == 1


def test_port_down_end_returns_the_outage_length(store):
    assert store.port_down_end("mlx5_0", 1, at(5)) is None  # nothing open
    store.port_down_start("mlx5_0", 1, at(10))
    assert store.port_down_end("mlx5_0", 1, at(17.5)) == pytest.approx(7.5)
    assert store.open_port_outage("mlx5_0", 1) is None
    assert store.port_down_end("mlx5_0", 1, at(20)) is None


def test_end_before_start_closes_with_zero_length(store):
    store.port_down_start("mlx5_0", 1, at(100))
    assert store.port_down_end("mlx5_0", 1, at(90)) == 0.0
    assert store.port_intervals("mlx5_0", 1) == [(at(100), at(100))]


def test_port_intervals_since_drops_those_that_ended_before(store):
    for s, e in [(10, 20), (50, 60), (90, None)]:
        store.port_down_start("mlx5_0", 1, at(s))
        if e is not None:
            store.port_down_end("mlx5_0", 1, at(e))
    assert store.port_intervals("mlx5_0", 1, since=at(55)) == [(at(50), at(60)), (at(90), None)]
    assert len(store.port_intervals("mlx5_0", 1)) == 3


def test_total_downtime_counts_the_open_outage_up_to_now(store):
    store.port_down_start("mlx5_0", 1, at(0))
    store.port_down_end("mlx5_0", 1, at(30))
    store.port_down_start("mlx5_0", 1, at(100))
    assert store.port_down_total_s("mlx5_0", 1, now=at(110)) == pytest.approx(40)
    assert store.port_down_total_s("mlx5_0", 1) == pytest.approx(30)  # clock still at T0+0
    assert store.port_down_total_s("mlx5_9", 1, now=at(110)) == 0.0


def test_total_downtime_never_goes_backwards_across_prune_and_restart(tmp_path):
    clock = FakeClock(T0)
    path = str(tmp_path / "state.db")
    with Store.open(path, clock) as s:
        for start in range(0, 100, 10):  # ten 2-second flaps
            s.port_down_start("mlx5_0", 1, at(start))
            s.port_down_end("mlx5_0", 1, at(start + 2))
        s.port_down_start("mlx5_0", 1, at(200))
        clock.advance(3600)
        before = s.port_down_total_s("mlx5_0", 1)
        assert s.prune(timedelta(minutes=10))["port_down"] == 10
        assert s.port_intervals("mlx5_0", 1) == [(at(200), None)]  # open outage kept
        assert s.port_down_total_s("mlx5_0", 1) == pytest.approx(before)
    clock.advance(1)
    with Store.open(path, clock) as s:
        assert s.port_down_total_s("mlx5_0", 1) == pytest.approx(before + 1)
        assert s.port_outages_total("mlx5_0", 1) == 11
        assert s.known_ports() == [("mlx5_0", 1)]
        assert s.port_down_end("mlx5_0", 1, clock.now()) == pytest.approx(3600 + 1 - 200)
        assert s.port_down_total_s("mlx5_0", 1) == pytest.approx(before + 1)
