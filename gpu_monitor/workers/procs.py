"""Worker processes as the pool drives them: spawned (a fresh interpreter) or forked (from a
fork server), both killed, timed and reported the same way.

A worker is its own session (process group), so a kill takes everything it started. Every group
and every run directory still in use is remembered here: when the calling process exits with
runs still going (a check abandoned in its thread at Ctrl-C), the groups are killed and the
directories removed at exit (pool.py, guarantee 2).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Mapping

# What ``python -m`` runs in a worker process (gpu_monitor/workers/__main__.py).
WORKER_MODULE = "gpu_monitor.workers"


_LIVE_GROUPS: set[int] = set()
# The temporary directories of runs still in progress. A run abandoned in its check's thread
# (Ctrl-C or SIGTERM in the main thread, which then exits) never reaches its ``finally``.
_LIVE_DIRS: set[str] = set()
_LIVE_LOCK = threading.Lock()


def remember_dir(path: str) -> None:
    """A run's temporary directory, removed at exit if the run never gets to remove it."""
    with _LIVE_LOCK:
        _LIVE_DIRS.add(path)


def forget_dir(path: str) -> None:
    """Remove a run's temporary directory (the run is over)."""
    rmtree(path)
    with _LIVE_LOCK:
        _LIVE_DIRS.discard(path)


def kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    with _LIVE_LOCK:
        _LIVE_GROUPS.discard(pid)


@atexit.register
def _kill_leftovers() -> None:  # pragma: no cover - exercised only when a caller is killed
    with _LIVE_LOCK:
        pids = list(_LIVE_GROUPS)
        dirs = list(_LIVE_DIRS)
    for pid in pids:
        kill_group(pid)
    for path in dirs:
        rmtree(path)


def write_line(popen: subprocess.Popen, line: str) -> bool:
    """Write ``line`` to a child's stdin and flush it; False when the child is gone (a broken
    or closed pipe), which its caller learns more about from the child's exit."""
    try:
        assert popen.stdin is not None
        popen.stdin.write(line.encode())
        popen.stdin.flush()
    except (BrokenPipeError, OSError, ValueError):
        return False
    return True


def last_line(text: str) -> str:
    for line in reversed(text.splitlines()):
        if line.strip():
            return line.strip()[:300]
    return ""




class Proc:
    """One worker process as the pool drives it; both kinds look the same to the pool."""

    pid: int | None = None

    def poll(self) -> int | None:  # exit status, Popen's convention (-N: killed by signal N)
        raise NotImplementedError

    def kill(self) -> None:
        raise NotImplementedError

    def wait(self, timeout: float | None = None) -> int | None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (rc := self.poll()) is None:
            if deadline is not None and time.monotonic() >= deadline:
                return None
            time.sleep(0.005)
        return rc

    def send(self, line: str) -> None:
        raise NotImplementedError

    def close_input(self) -> None:
        raise NotImplementedError


class SpawnedProc(Proc):
    def __init__(self, popen: subprocess.Popen):
        self.popen = popen
        self.pid = popen.pid
        with _LIVE_LOCK:
            _LIVE_GROUPS.add(popen.pid)

    def poll(self) -> int | None:
        rc = self.popen.poll()
        if rc is not None:
            with _LIVE_LOCK:
                _LIVE_GROUPS.discard(self.popen.pid)
        return rc

    def kill(self) -> None:
        kill_group(self.popen.pid)

    def send(self, line: str) -> None:
        write_line(self.popen, line)  # False: it died; the poll notices

    def close_input(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            if self.popen.stdin is not None:
                self.popen.stdin.close()


class ForkServer:
    """A per-run process that imports torch once and forks the workers (CPU devices).

    Importing torch costs about a CPU-second; eight simulated devices on two cores would spend
    most of a short check importing it eight times. The server is started with the workers'
    environment, imports torch (no thread starts: the CPU environment pins every thread pool
    to one thread, which keeps fork safe), then forks one worker per request. Each worker
    calls ``setsid`` (its own process group, killed like a spawned one), takes its task and
    turns from a FIFO, and writes its log where a spawned one would. The server reaps them and
    reports exit statuses; it exits when its stdin closes (end of run, or the parent is gone).
    """

    def __init__(self, python: str, env: Mapping[str, str], tmp: str):
        self._cond = threading.Condition()
        self.pids: dict[str, int] = {}
        self.exits: dict[int, int] = {}
        self.errors: dict[str, str] = {}
        self.cancelled: set[str] = set()
        self.dead = False
        self.log_path = os.path.join(tmp, "forkserver.log")
        with open(self.log_path, "wb") as log:
            self.popen = subprocess.Popen(
                [python, "-m", WORKER_MODULE, "--forkserver"], stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=log, env=dict(env), start_new_session=True,
                close_fds=True)
        with _LIVE_LOCK:
            _LIVE_GROUPS.add(self.popen.pid)
        threading.Thread(target=self._read, name="forkserver-reader", daemon=True).start()

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for raw in self.popen.stdout:
            try:
                msg = json.loads(raw)
            except ValueError:
                continue
            with self._cond:
                if "pid" in msg:
                    self.pids[msg["id"]] = int(msg["pid"])
                    if msg["id"] in self.cancelled:
                        kill_group(int(msg["pid"]))
                elif "exit" in msg:
                    self.exits[int(msg["exit"])] = int(msg["code"])
                elif "error" in msg:
                    self.errors[msg["id"]] = str(msg["error"])
                self._cond.notify_all()
        with self._cond:
            self.dead = True
            self._cond.notify_all()

    def fork(self, req_id: str, fifo: str, log: str, env: Mapping[str, str]) -> None:
        line = json.dumps({"id": req_id, "fifo": fifo, "log": log, "env": dict(env)}) + "\n"
        if not write_line(self.popen, line):
            with self._cond:
                self.errors[req_id] = self.gone_reason()

    def close(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            if self.popen.stdin is not None:
                self.popen.stdin.close()
        try:
            self.popen.wait(timeout=5)
        except subprocess.TimeoutExpired:
            kill_group(self.popen.pid)
            self.popen.wait()
        with _LIVE_LOCK:
            _LIVE_GROUPS.discard(self.popen.pid)

    def gone_reason(self) -> str:
        try:
            with open(self.log_path, "rb") as fh:
                last = last_line(fh.read()[-4000:].decode("utf-8", "replace"))
        except OSError:
            last = ""
        rc = self.popen.poll()
        status = f" with status {rc}" if rc is not None else ""
        return f"the fork server exited{status}" + (f" ({last})" if last else "")


class ForkedProc(Proc):
    _UNWATCHED = 255  # the fork server died: this worker's own status is lost

    def __init__(self, server: ForkServer, req_id: str, fifo: str):
        self.server, self.req_id = server, req_id
        # O_RDWR: opening a FIFO for writing alone would block until the worker opens it.
        self._fd: int | None = os.open(fifo, os.O_RDWR)
        self._rc: int | None = None
        self.lost = ""  # why the worker's own exit status is unknown

    @property  # type: ignore[override]
    def pid(self) -> int | None:
        return self.server.pids.get(self.req_id)

    def poll(self) -> int | None:
        if self._rc is not None:
            return self._rc
        with self.server._cond:
            pid = self.server.pids.get(self.req_id)
            if self.req_id in self.server.errors:
                self._rc, self.lost = self._UNWATCHED, self.server.errors[self.req_id]
            elif pid is not None and pid in self.server.exits:
                self._rc = self.server.exits[pid]
            elif self.server.dead:
                if pid is not None:
                    kill_group(pid)
                self._rc, self.lost = self._UNWATCHED, self.server.gone_reason()
        return self._rc

    def kill(self) -> None:
        with self.server._cond:
            pid = self.server.pids.get(self.req_id)
            if pid is None:
                self.server.cancelled.add(self.req_id)
        if pid is not None:
            kill_group(pid)

    def send(self, line: str) -> None:
        if self._fd is None:
            return
        with contextlib.suppress(OSError):
            os.write(self._fd, line.encode())

    def close_input(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None


def rmtree(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)
