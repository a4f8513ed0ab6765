"""A followed text log keeps exact XID counts across daemon restarts, in every text format.

Why: text lines carry no kernel sequence number, so the de-duplication key of an event found
in one must survive a resume; the line counter restarted at the saved position did not, and
new XIDs collided with stored ones (issue 18: Xid 79 counted 5, restart, 5 more gave 5, not
10). Each case runs the real xid check in the daemon over a store: five lines, a restart, five
appended while it was down, then five appended while it follows.
"""

from __future__ import annotations

import dataclasses

import pytest

from checks.xid import Xid
from gpu_monitor.daemon import Daemon
from tests.hw.kmsg_shapes import HOST
from tests.test_daemon import sim_env  # noqa: F401, F811 - the fixture's one home
from tests.waiting import eventually

MSG = "NVRM: Xid (PCI:0000:53:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."

# One line per text format the reader knows (gpu_monitor/hw/kmsg/text.py); ``n`` makes each
# line's stamp differ, as a real log's do.
TEXT_FORMATS = {
    "dmesg": lambda n: f"[{1000 + n:5d}.{n:06d}] {MSG}",
    "dmesg-ctime": lambda n: f"[Thu Jan  2 15:{n // 60:02d}:{n % 60:02d} 2025] {MSG}",
    "dmesg-iso": lambda n: f"2025-01-02T15:{n // 60:02d}:{n % 60:02d},470068+00:00 {MSG}",
    "dmesg-decode-iso":
        lambda n: f"kern  :err   : 2025-01-02T15:{n // 60:02d}:{n % 60:02d},470068+00:00 {MSG}",
    "journal-short-iso":
        lambda n: f"2025-01-02T15:{n // 60:02d}:{n % 60:02d}+0000 {HOST} kernel: {MSG}",
    "journal-short-iso-precise":
        lambda n: f"2025-01-02T15:{n // 60:02d}:{n % 60:02d}.123456+0000 {HOST} kernel: {MSG}",
    "syslog": lambda n: f"Jan  2 15:{n // 60:02d}:{n % 60:02d} {HOST} kernel: {MSG}",
    "pstore": lambda n: f"<3>[{1000 + n:5d}.{n:06d}] {MSG}",
    "plain": lambda n: MSG,
}


def _xid79_on_gpu0(ctx) -> int:
    return sum(n for (idx, _uuid, code), n in ctx.store.xid_counts(kind="xid").items()
               if idx == 0 and code == 79)


def _append(path, fmt: str, first: int, count: int = 5) -> None:
    with open(path, "a", encoding="utf-8") as fh:
        for n in range(first, first + count):
            fh.write(TEXT_FORMATS[fmt](n) + "\n")
            fh.write("mlx5_core 0000:3b:00.0: an ordinary line between the events\n")


@pytest.mark.parametrize("fmt", sorted(TEXT_FORMATS))
def test_xids_in_a_text_log_count_exactly_once_across_restarts(sim_env, tmp_path, fmt):  # noqa: F811
    _, ctx = sim_env()
    log_path = tmp_path / "kern.log"
    log_path.write_text("")
    ctx.host.paths = dataclasses.replace(ctx.host.paths, kmsg=str(log_path))
    _append(log_path, fmt, 0)
    first = Daemon([Xid()], ctx)
    first.open_kmsg()
    first.shutdown()
    assert _xid79_on_gpu0(ctx) == 5
    _append(log_path, fmt, 5)  # written while no daemon ran
    second = Daemon([Xid()], ctx)
    second.start()
    try:
        eventually(lambda: _xid79_on_gpu0(ctx) >= 10, what="10 counted")
        assert _xid79_on_gpu0(ctx) == 10
        _append(log_path, fmt, 10)  # written while it follows
        eventually(lambda: _xid79_on_gpu0(ctx) >= 15, what="15 counted")
    finally:
        second.shutdown()
    assert _xid79_on_gpu0(ctx) == 15
    third = Daemon([Xid()], ctx)  # a restart with nothing new counts nothing again
    third.open_kmsg()
    third.shutdown()
    assert _xid79_on_gpu0(ctx) == 15
