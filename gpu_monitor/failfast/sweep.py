"""Notice files whose workload is gone: removed, so the notice directory holds only notices a
running workload may still read.

A notice file is the daemon's own writing (its ``key`` is a notice in the store's book); the
directory is the host's and a job mounts its part of it. A file is removed only when all of
these hold:

1. this daemon wrote it (its ``key`` is in the book; anything else there is left alone);
2. for a pod's file, the attribution snapshot is fresh (``ok``) and no longer shows the pod
   holding a device of this node: a stale or unknown snapshot removes nothing;
3. for a process's file (off Kubernetes), the process is gone.

A pod restarted under the same name (a StatefulSet's or JobSet's) holds its devices again and
its old notice stays; ``gpu_monitor.jobs.watch_notice`` ignores a notice older than the watch.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Container, Iterator

from gpu_monitor.workloads.attribution import Snapshot

log = logging.getLogger(__name__)


def _files(notice_dir: str) -> Iterator[str]:
    """``<dir>/pid-<pid>.json`` and ``<dir>/<namespace>/<pod>.json``, nothing else."""
    try:
        entries = list(os.scandir(notice_dir))
    except OSError:
        return
    for entry in entries:
        if entry.is_file(follow_symlinks=False):
            if entry.name.startswith("pid-") and entry.name.endswith(".json"):
                yield entry.path
        elif entry.is_dir(follow_symlinks=False):
            try:
                inner = list(os.scandir(entry.path))
            except OSError:
                continue
            yield from (e.path for e in inner
                        if e.name.endswith(".json") and not e.name.startswith(".")
                        and e.is_file(follow_symlinks=False))


def _pods_holding(snapshot: Snapshot) -> set[tuple[str, str]]:
    return {(h.namespace, h.pod) for holders in (*snapshot.gpus.values(),
                                                 *snapshot.rdma.values())
            for h in holders if h.pod}


def gone_notices(notice_dir: str, ours: Container[str], snapshot: Snapshot,
                 pid_alive: Callable[[int], bool]) -> list[str]:
    """The notice files to remove (module docstring)."""
    pods = _pods_holding(snapshot) if snapshot.state == "ok" else None
    out = []
    for path in _files(notice_dir):
        try:
            with open(path, encoding="utf-8") as fh:
                notice = json.load(fh)
        except (OSError, ValueError):
            continue
        if not isinstance(notice, dict) or notice.get("key") not in ours:
            continue
        pid = notice.get("pid")
        if notice.get("pod"):
            if pods is not None and (notice.get("namespace"), notice["pod"]) not in pods:
                out.append(path)
        elif isinstance(pid, int) and not pid_alive(pid):
            out.append(path)
    return out


def remove_gone(notice_dir: str, ours: Container[str], snapshot: Snapshot,
                pid_alive: Callable[[int], bool]) -> int:
    """Remove the notice files of workloads that are gone; how many were removed."""
    removed = 0
    for path in gone_notices(notice_dir, ours, snapshot, pid_alive):
        try:
            os.unlink(path)
            removed += 1
            log.info("fail-fast: removed %s (its workload is gone)", path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.warning("fail-fast: cannot remove %s: %s", path, exc)
    return removed


def process_alive(pid: int, proc: str = "/proc") -> bool:
    """Whether ``pid`` exists (the daemon runs with the host's PID namespace)."""
    return os.path.exists(os.path.join(proc, str(pid)))
