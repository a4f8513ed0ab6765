"""The processes of a Kubernetes pod, from its cgroup under ``/sys/fs/cgroup``.

The kubelet puts every pod in a cgroup named after its UID: ``pod<uid>`` with the cgroupfs
driver (``kubepods/burstable/pod1234-...``), ``kubepods-<qos>-pod<uid with _ for ->.slice``
with the systemd driver; the containers' cgroups (and their ``cgroup.procs``) are below it.
The root is a ``HostPaths`` path, so tests hand in a tree on disk.
"""

from __future__ import annotations

import os


def _pod_dir_names(uid: str) -> tuple[str, ...]:
    return (f"pod{uid}", f"pod{uid.replace('-', '_')}")


def find_pod_cgroup(root: str, uid: str, max_depth: int = 4) -> str | None:
    """The pod's cgroup directory under the kubelet's ``kubepods`` hierarchy, or None."""
    wanted = _pod_dir_names(uid)
    stack = [(os.path.join(root, name), 1) for name in _listdir(root)
             if name.startswith("kubepods")]
    while stack:
        path, depth = stack.pop()
        base = os.path.basename(path)
        if base.removesuffix(".slice").endswith(wanted):
            return path
        if depth < max_depth:
            stack.extend((os.path.join(path, n), depth + 1) for n in _listdir(path)
                         if n.startswith("kubepods"))
    return None


def _listdir(path: str) -> list[str]:
    try:
        return [e.name for e in os.scandir(path) if e.is_dir(follow_symlinks=False)]
    except OSError:
        return []


def cgroup_pids(path: str) -> list[int]:
    """Every pid in ``cgroup.procs`` of the cgroup ``path`` and of all cgroups below it."""
    pids: dict[int, None] = {}
    for dirpath, _dirs, files in os.walk(path):
        if "cgroup.procs" not in files:
            continue
        try:
            with open(os.path.join(dirpath, "cgroup.procs")) as fh:
                for line in fh:
                    if line.strip().isdigit():
                        pids[int(line)] = None
        except OSError:
            continue  # the container exited while we walked
    return list(pids)


def pod_pids(root: str, uid: str) -> list[int]:
    """The pids of the pod with ``uid`` (empty when its cgroup is not found)."""
    path = find_pod_cgroup(root, uid)
    return cgroup_pids(path) if path else []
