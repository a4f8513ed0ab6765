"""Watch for this workload's fail-fast notice and abort on it.

Guarantees:
1. **Cheap.** One ``stat`` per candidate file every ``interval_s`` (0.1 s) on a daemon thread:
   no inotify, no reads until a file appears.
2. **Only this workload's, only new ones.** A directory is searched for ``<pod>.json`` (the pod
   name from ``$GPU_MONITOR_POD_NAME``, ``$POD_NAME`` or ``$HOSTNAME``) and
   ``pid-<pid>.json``; a notice written before the watch began (``since``: a restarted pod
   that kept its name, a notice left by the previous outage) is ignored.
3. **Immediate.** On a notice: ``on_notice(notice)`` (if given; its exceptions are printed,
   never raised), then every other process of our process group gets ``group_signal``
   (SIGKILL: a rank stuck in a collective ignores anything milder; found in /proc, as
   ``os.killpg`` would, minus this process), then this process exits
   with ``exit_code`` (``FAILFAST_EXIT_CODE``, 86) without unwinding (``os._exit``: a thread
   blocked in a collective would never let an orderly exit finish).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

#: The exit status of a process the helper aborted: distinct from Python's 1 and from the
#: 128+N of a signal, so a Job's podFailurePolicy or a launcher can tell "the fabric failed,
#: restart me" from a bug (docs/workloads.md).
FAILFAST_EXIT_CODE = 86
NOTICE_ENV = "GPU_MONITOR_NOTICE"
DEFAULT_NOTICE_DIR = "/run/gpu-monitor/notices"
POD_NAME_ENVS = ("GPU_MONITOR_POD_NAME", "POD_NAME", "HOSTNAME")
# File times come from the kernel's coarse clock (up to a tick behind time.time()): a notice
# written just after the watch began may carry an mtime a few ms before it.
MTIME_SLACK_S = 1.0


def notice_candidates(path: str | None = None, pid: int | None = None) -> list[str]:
    """The files that would be this workload's notice: ``path`` itself when it is a file (or
    does not exist yet and ends in ``.json``), else ``<path>/<pod>.json`` and
    ``<path>/pid-<pid>.json``."""
    path = path or os.environ.get(NOTICE_ENV) or DEFAULT_NOTICE_DIR
    if path.endswith(".json") and not os.path.isdir(path):
        return [path]
    names = [os.environ[e] for e in POD_NAME_ENVS if os.environ.get(e)]
    out = [os.path.join(path, f"{names[0]}.json")] if names else []
    out.append(os.path.join(path, f"pid-{os.getpid() if pid is None else pid}.json"))
    return out


def read_notice(path: str) -> dict[str, Any] | None:
    """The notice in ``path`` (None when absent or not a notice). The writer renames a whole
    file into place, so a partial read only happens to a file that is not a notice."""
    try:
        with open(path) as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


class NoticeWatcher:
    def __init__(self, candidates: list[str], since: float, interval_s: float,
                 on_notice: Callable[[dict], Any] | None, exit_code: int, abort: bool,
                 group_signal: int):
        self.candidates = candidates
        self.since = since
        self.interval_s = interval_s
        self.on_notice = on_notice
        self.exit_code = exit_code
        self.abort = abort
        self.group_signal = group_signal
        self.notice: dict[str, Any] | None = None
        self.seen = threading.Event()
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="gpu-monitor-notice",
                                       daemon=True)

    def stop(self) -> None:
        self._stop.set()

    def check(self) -> dict[str, Any] | None:
        """One look: the new notice among the candidates, if any."""
        for path in self.candidates:
            try:
                st = os.stat(path)
            except OSError:
                continue
            if st.st_mtime < self.since - MTIME_SLACK_S:
                continue  # from before this watch: an old outage's notice
            notice = read_notice(path)
            if notice is not None:
                return {**notice, "path": path}
        return None

    def _run(self) -> None:
        while not self._stop.is_set():
            notice = self.check()
            if notice is not None:
                self._fire(notice)
                return
            self._stop.wait(self.interval_s)

    def _fire(self, notice: dict[str, Any]) -> None:
        self.notice = notice
        self.seen.set()
        if self.on_notice is not None:
            try:
                self.on_notice(notice)
            except Exception:  # noqa: BLE001 - the abort must happen whatever the hook does
                traceback.print_exc()
        if not self.abort:
            return
        print(f"gpu-monitor: fail-fast notice {notice.get('path')}: {notice.get('reason')} on "
              f"{notice.get('target')}; aborting the process group (exit {self.exit_code})",
              file=sys.stderr, flush=True)
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001
                pass
        _signal_group_but_me(os.getpgrp(), self.group_signal)
        os._exit(self.exit_code)


def _signal_group_but_me(pgid: int, signum: int) -> None:
    """``os.killpg`` minus this process (it leaves by its own exit code, and a signal handler
    cannot be changed from the watcher's thread): the group's members are found in /proc and
    signalled one by one. Without /proc, ``os.killpg`` itself (we then die by the signal)."""
    me = os.getpid()
    try:
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        try:
            os.killpg(pgid, signum)
        except OSError:
            pass
        return
    for pid in pids:
        if pid == me:
            continue
        try:
            if os.getpgid(pid) == pgid:
                os.kill(pid, signum)
        except OSError:
            continue


def watch_notice(path: str | None = None, on_notice: Callable[[dict], Any] | None = None,
                 exit_code: int = FAILFAST_EXIT_CODE, *, interval_s: float = 0.1,
                 since: float | None = None, abort: bool = True,
                 group_signal: int = signal.SIGKILL) -> NoticeWatcher:
    """Start watching for this workload's notice (see the module's guarantees); the watcher,
    already running. ``path``: a notice file or the notice directory (default
    ``$GPU_MONITOR_NOTICE``, else ``/run/gpu-monitor/notices``). ``abort=False`` only
    calls ``on_notice`` (a script that checkpoints and exits by itself)."""
    watcher = NoticeWatcher(notice_candidates(path), time.time() if since is None else since,
                            interval_s, on_notice, exit_code, abort, group_signal)
    watcher.thread.start()
    return watcher
