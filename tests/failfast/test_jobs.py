"""gpu_monitor.jobs: the training-side helper, with real processes (a two-rank gloo loop on the
CPU) and in-process for the details."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from gpu_monitor.failfast.local import notice_path, write_notice
from gpu_monitor.jobs import FAILFAST_EXIT_CODE, notice_candidates, watch_notice
from tests.waiting import eventually

REPO = Path(__file__).resolve().parents[2]
RANK = Path(__file__).with_name("gloo_rank.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_ranks(tmp_path: Path, notice: str) -> list[subprocess.Popen]:
    """Two gloo ranks in one new process group (as a launcher starts its workers)."""
    port = str(free_port())
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs: list[subprocess.Popen] = []
    for rank in (0, 1):
        kw = {"process_group": 0 if rank == 0 else procs[0].pid}
        procs.append(subprocess.Popen(
            [sys.executable, str(RANK), str(rank), port, notice, str(tmp_path / f"step{rank}")],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw))
    return procs


def test_a_gloo_training_loop_aborts_with_the_distinct_code_when_its_notice_appears(tmp_path):
    notice = notice_path(str(tmp_path / "notices"), "ml", "trainer-0")
    procs = start_ranks(tmp_path, notice)
    try:
        eventually(lambda: all((tmp_path / f"step{r}").exists() for r in (0, 1))
                   or any(p.poll() is not None for p in procs), timeout=280,
                   what="both ranks training")
        assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
        write_notice(notice, {"reason": "PortDownExceededNcclTimeout", "target": "ib:mlx5_0:1"})
        eventually(lambda: all(p.poll() is not None for p in procs), timeout=120,
                   what="both ranks gone")
        codes = [p.returncode for p in procs]
        out = [p.communicate()[0] for p in procs]
        # The first to see the notice exits with the code; it aborts the rest of its group.
        assert FAILFAST_EXIT_CODE in codes, (codes, out)
        assert set(codes) <= {FAILFAST_EXIT_CODE, -signal.SIGKILL}, (codes, out)
        assert "notice PortDownExceededNcclTimeout" in "".join(out)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()


def test_an_old_notice_is_ignored_and_a_new_one_seen(tmp_path):
    path = str(tmp_path / "trainer-0.json")
    write_notice(path, {"reason": "old outage"})
    old = time.time() - 3600
    os.utime(path, (old, old))
    seen: list[dict] = []
    w = watch_notice(path, on_notice=seen.append, abort=False, interval_s=0.01)
    try:
        assert w.check() is None  # a restarted pod with its name kept: not re-aborted
        write_notice(path, {"reason": "PortDownExceededNcclTimeout"})
        eventually(lambda: seen, timeout=60)
        assert seen[0]["reason"] == "PortDownExceededNcclTimeout" and seen[0]["path"] == path
    finally:
        w.stop()


def test_a_directory_is_searched_for_this_pods_and_this_processs_notice(monkeypatch,
                                                                       tmp_path):
    monkeypatch.delenv("GPU_MONITOR_NOTICE", raising=False)
    monkeypatch.setenv("GPU_MONITOR_POD_NAME", "trainer-0")
    assert notice_candidates(str(tmp_path), pid=42) == [
        str(tmp_path / "trainer-0.json"), str(tmp_path / "pid-42.json")]
    monkeypatch.setenv("GPU_MONITOR_NOTICE", str(tmp_path / "x.json"))
    assert notice_candidates() == [str(tmp_path / "x.json")]
