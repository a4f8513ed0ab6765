"""Crash persistence: a process that dies without closing the store (SIGKILL, ``os._exit``)
loses nothing it committed, and a transaction it left open is rolled back, not half applied.

Each test runs the writer in a child process, because only a real process death shows what
SQLite recovers from the write-ahead log.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from gpu_monitor.state import Store
from tests.conftest import REPO

PRELUDE = """
import os, signal, sqlite3, sys
from gpu_monitor.clock import FakeClock
from gpu_monitor.model import Result, Status
from gpu_monitor.model import RunOutcome
from gpu_monitor.state import Store
from gpu_monitor.state.kernel_log import XidEvent

path = sys.argv[1]
clock = FakeClock()
s = Store.open(path, clock)


def run(message, status=Status.OK, reason="Ok", target="gpu:3"):
    r = Result("ecc_memory", status, target, reason, message, observed_at=clock.now())
    s.record_run(RunOutcome("ecc_memory", (r,), clock.now(), 0.2, True))
"""

COMMIT_THEN_DIE_MID_TRANSACTION = PRELUDE + """
run("remap pending", Status.FAILED, "RowRemapPending")
s.set_node_state("quarantined", "RowRemapPending", clock.now())
s.add_xid_event(XidEvent("boot-a", 42, clock.now(), 79, "0000:91:00.0", "GPU-x", 3))
s.mark_kmsg("boot-a", 42)
s.port_down_start("mlx5_0", 1, clock.now())
s.record_action("cordon", "ok", clock.now(), {"reason": "RowRemapPending"})
s.set_kv("rdma_ports", "baseline", {"link_downed": 7})

# A large write that never commits: with a tiny page cache SQLite spills its pages into the
# WAL before the commit that will never come.
other = sqlite3.connect(path, isolation_level=None)
other.execute("PRAGMA cache_size = 4")
other.execute("BEGIN IMMEDIATE")
for i in range(2000):
    other.execute("INSERT INTO kv (namespace, key, value, updated_us) VALUES (?, ?, ?, 0)",
                  ("uncommitted", str(i), '"' + "x" * 200 + '"'))
other.execute("UPDATE node_state SET state = 'healthy', reason = 'uncommitted'")
print("wal-bytes", os.path.getsize(path + "-wal"), flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""

WRITE_FOREVER = PRELUDE + """
i = 0
while True:
    s.set_kv("acked", str(i), i)
    run(str(i))
    print(i, flush=True)  # acknowledged only after both writes returned
    i += 1
"""

EXIT_WITHOUT_CLOSE = PRELUDE + """
run("before exit")
s.set_kv("exit", "k", [1, 2, 3])
s.add_health_report("uid-9", "node-a", "SdcSuspected", "cr", clock.now(), {"rank": 1})
os._exit(0)
"""


def _child(script: str, path: str, **kw) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.Popen([sys.executable, "-c", script, path], env=env, cwd=str(REPO),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def test_sigkill_keeps_committed_writes_and_drops_the_open_transaction(tmp_path):
    path = str(tmp_path / "state.db")
    proc = _child(COMMIT_THEN_DIE_MID_TRANSACTION, path)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGKILL, err
    wal_bytes = int(out.split()[1])
    assert wal_bytes > 100_000  # the uncommitted pages really reached the WAL
    assert os.path.exists(path + "-wal")  # nothing checkpointed it on the way down

    with Store.open(path) as s:
        assert s.check_integrity(full=True) == []
        (r,) = s.latest_results()
        assert (r.target, r.reason) == ("gpu:3", "RowRemapPending")
        state = s.node_state()
        assert (state.state, state.reason) == ("quarantined", "RowRemapPending")
        assert s.xid_counts() == {(3, "GPU-x", 79): 1}
        assert s.kmsg_high_water("boot-a") == 42
        assert s.open_port_outage("mlx5_0", 1) is not None
        assert s.action_counts() == {("cordon", "ok"): 1}
        assert s.get_kv("rdma_ports", "baseline") == {"link_downed": 7}
        assert s.kv_items("uncommitted") == {}


def test_sigkill_during_continuous_writes_loses_no_acknowledged_write(tmp_path):
    path = str(tmp_path / "state.db")
    proc = _child(WRITE_FOREVER, path)
    acked = -1
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            acked = int(line)
            if acked >= 150:
                proc.send_signal(signal.SIGKILL)
                break
        proc.wait(timeout=60)
        # Not communicate(): it reads the pipes' descriptors directly and would drop the lines
        # proc.stdout has already buffered, acknowledged writes the test would then miss.
        rest, err = proc.stdout.read(), proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGKILL, err
    for line in rest.split():
        acked = max(acked, int(line))
    assert acked >= 150

    with Store.open(path) as s:
        values = s.kv_items("acked")
        assert all(values.get(str(i)) == i for i in range(acked + 1))
        assert len(values) in (acked + 1, acked + 2)  # one more may have committed unacked
        assert s.reason_counts()[("ecc_memory", "Ok")] >= acked + 1
        assert int(s.latest_results()[0].message) >= acked


def test_exit_without_close_keeps_every_write(tmp_path):
    path = str(tmp_path / "state.db")
    proc = _child(EXIT_WITHOUT_CLOSE, path)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    with Store.open(path) as s:
        assert [r.message for r in s.latest_results()] == ["before exit"]
        assert s.get_kv("exit", "k") == [1, 2, 3]
        assert [h.payload for h in s.health_reports()] == [{"rank": 1}]


@pytest.mark.parametrize("kill_after", [1, 25])
def test_reopen_after_crash_accepts_new_writes(tmp_path, kill_after):
    path = str(tmp_path / "state.db")
    proc = _child(WRITE_FOREVER, path)
    assert proc.stdout is not None
    for line in proc.stdout:
        if int(line) >= kill_after:
            break
    proc.kill()
    proc.communicate(timeout=60)
    with Store.open(path) as s:
        before = s.reason_counts()[("ecc_memory", "Ok")]
        s.set_kv("after", "crash", True)
    with Store.open(path) as s:
        assert s.get_kv("after", "crash") is True
        assert s.reason_counts()[("ecc_memory", "Ok")] == before
