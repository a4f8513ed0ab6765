"""The notice's actions on this host: a notice file per workload, a signal to its processes."""

from __future__ import annotations

import json
import os
import re
import signal as signals
import tempfile
from collections.abc import Callable, Iterable
from typing import Any

_SAFE = re.compile(r"[^A-Za-z0-9._-]")


def notice_path(notice_dir: str, namespace: str = "", pod: str = "",
                pid: int | None = None) -> str:
    """``<dir>/<namespace>/<pod>.json`` for a pod, ``<dir>/pid-<pid>.json`` for a process.
    Names are Kubernetes names; anything else is replaced so a name never leaves the dir."""
    if pod:
        return os.path.join(notice_dir, _SAFE.sub("_", namespace) or "_",
                            _SAFE.sub("_", pod) + ".json")
    return os.path.join(notice_dir, f"pid-{int(pid or 0)}.json")


def write_notice(path: str, payload: dict[str, Any]) -> None:
    """Write ``payload`` as JSON atomically: a temporary file in the same directory, flushed
    and renamed over ``path``, so a reader sees the whole notice or none."""
    folder = os.path.dirname(path)
    os.makedirs(folder, mode=0o755, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".notice-", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(payload, fh, sort_keys=True)
            fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def signal_number(name: str) -> int:
    return int(getattr(signals, name))


def send_signal(pids: Iterable[int], signum: int,
                kill: Callable[[int, int], None] = os.kill) -> tuple[list[int], dict[int, str]]:
    """Signal each pid (never 0, 1 or ourselves): (signalled, {pid: why not})."""
    done: list[int] = []
    failed: dict[int, str] = {}
    me = os.getpid()
    for pid in dict.fromkeys(pids):
        if pid <= 1 or pid == me:
            failed[pid] = "refused: init or the daemon itself"
            continue
        try:
            kill(pid, signum)
            done.append(pid)
        except ProcessLookupError:
            failed[pid] = "exited"
        except OSError as exc:
            failed[pid] = f"{type(exc).__name__}: {exc}"
    return done, failed
