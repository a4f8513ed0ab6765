"""ProcfsReader on fake proc trees (fd symlinks to /dev/nvidia*) and on the real /proc."""

from __future__ import annotations

import errno
import os
import sys
from pathlib import Path

import pytest

from gpu_monitor.hw import procfs as procfs_mod
from gpu_monitor.hw.paths import HostPaths
from gpu_monitor.hw.procfs import DeviceHolder, ProcfsReader


def _proc(root: Path, pid: int, comm: str | None, fds: dict[int, str] | None,
          cmdline: bytes | None = None) -> Path:
    d = root / "proc" / str(pid)
    d.mkdir(parents=True)
    if comm is not None:
        (d / "comm").write_text(comm + "\n")
    if cmdline is not None:
        (d / "cmdline").write_bytes(cmdline)
    if fds is not None:
        (d / "fd").mkdir()
        for fd, target in fds.items():
            os.symlink(target, d / "fd" / str(fd))
    return d


@pytest.fixture
def fake_proc(tmp_path: Path) -> ProcfsReader:
    """A training job on GPU 0, nvidia-smi on the control node, sshd, a kernel thread."""
    proc = tmp_path / "proc"
    _proc(tmp_path, 4242, "python", {0: "/dev/null", 1: "pipe:[73211]", 3: "/dev/nvidiactl",
                                     4: "/dev/nvidia0", 5: "/dev/nvidia-uvm"},
          cmdline=b"python\0train.py\0--epochs\x003\0")
    _proc(tmp_path, 977, "sshd", {0: "/dev/null", 3: "socket:[29876]"})
    _proc(tmp_path, 5150, "nvidia-smi", {3: "/dev/nvidiactl"})
    _proc(tmp_path, 2, "kthreadd", {}, cmdline=b"")
    _proc(tmp_path, 31337, None, None)  # exited: its directory is an empty husk
    os.symlink("4242", proc / "self")
    (proc / "sys" / "kernel" / "random").mkdir(parents=True)
    (proc / "sys" / "kernel" / "random" / "boot_id").write_text(
        "6f0c2b1e-8a5d-4c1f-9e7a-2d3b4c5d6e7f\n")
    (proc / "sys" / "kernel" / "hostname").write_text("gpu-node-17\n")
    (proc / "uptime").write_text("350735.47 234388.90\n")
    return ProcfsReader(HostPaths(procfs=str(proc), dev=str(tmp_path / "dev")))


def test_boot_id_uptime_hostname(fake_proc):
    assert fake_proc.boot_id() == "6f0c2b1e-8a5d-4c1f-9e7a-2d3b4c5d6e7f"
    assert fake_proc.uptime_s() == 350735.47
    assert fake_proc.hostname() == "gpu-node-17"


def test_missing_files_are_none(tmp_path):
    reader = ProcfsReader(HostPaths(procfs=str(tmp_path / "nowhere")))
    assert reader.boot_id() is None
    assert reader.uptime_s() is None
    assert reader.hostname() is None
    assert reader.comm(1) is None
    assert reader.cmdline(1) is None
    assert reader.pids() == []


@pytest.mark.parametrize("content", ["", "\n", "soon\n", "nan 1.0\n", "-5.00 1.0\n", "inf 0\n",
                                     "1e400 0\n"])
def test_junk_uptime_is_none(tmp_path, content):
    (tmp_path / "uptime").write_text(content)
    assert ProcfsReader(HostPaths(procfs=str(tmp_path))).uptime_s() is None


def test_comm_and_cmdline(fake_proc):
    assert fake_proc.comm(4242) == "python"
    assert fake_proc.cmdline(4242) == ["python", "train.py", "--epochs", "3"]
    assert fake_proc.cmdline(2) == []  # kernel thread
    assert fake_proc.comm(31337) is None
    assert fake_proc.cmdline(31337) is None


def test_pids_are_the_numeric_entries(fake_proc):
    assert fake_proc.pids() == [2, 977, 4242, 5150, 31337]


def test_processes_holding_nvidia_devices(fake_proc):
    assert fake_proc.processes_with_open("nvidia") == [
        DeviceHolder(4242, "python"), DeviceHolder(5150, "nvidia-smi")]


def test_holders_unpack_as_pid_comm_pairs(fake_proc):
    assert [(pid, comm) for pid, comm in fake_proc.processes_with_open()] == [
        (4242, "python"), (5150, "nvidia-smi")]


def test_absolute_prefix_matches_only_that_device(fake_proc):
    assert fake_proc.processes_with_open("/dev/nvidia0") == [DeviceHolder(4242, "python")]
    assert fake_proc.processes_with_open("/dev/nvidia-uvm") == [DeviceHolder(4242, "python")]
    assert fake_proc.processes_with_open("/dev/infiniband") == []


def test_exclude_pids_leaves_our_own_process_out(fake_proc):
    assert fake_proc.processes_with_open("nvidia", exclude_pids=[4242]) == [
        DeviceHolder(5150, "nvidia-smi")]


def test_fd_links_into_the_configured_dev_dir_match(tmp_path):
    """The simulated node points fd links at its own dev/ tree."""
    _proc(tmp_path, 10, "worker", {3: str(tmp_path / "dev" / "nvidia3")})
    reader = ProcfsReader(HostPaths(procfs=str(tmp_path / "proc"), dev=str(tmp_path / "dev")))
    assert reader.processes_with_open("nvidia") == [DeviceHolder(10, "worker")]


def test_holder_without_comm_is_kept_while_it_lives(tmp_path):
    _proc(tmp_path, 11, None, {3: "/dev/nvidia1"})
    reader = ProcfsReader(HostPaths(procfs=str(tmp_path / "proc")))
    assert reader.processes_with_open() == [DeviceHolder(11, None)]


def test_denied_fd_table_is_reported_not_hidden(fake_proc, monkeypatch):
    real_listdir = os.listdir

    def listdir(path):
        if str(path).endswith(os.path.join("5150", "fd")):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_listdir(path)

    monkeypatch.setattr(procfs_mod.os, "listdir", listdir)
    scan = fake_proc.scan_open("nvidia")
    assert scan.holders == (DeviceHolder(4242, "python"),)
    assert scan.denied_pids == (5150,)
    assert scan.complete is False


def test_fd_vanishing_mid_scan_is_skipped(fake_proc, monkeypatch):
    real_readlink = os.readlink

    def readlink(path, *args, **kwargs):
        if os.path.join("4242", "fd") in str(path):
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", str(path))
        return real_readlink(path, *args, **kwargs)

    monkeypatch.setattr(procfs_mod.os, "readlink", readlink)
    scan = fake_proc.scan_open("nvidia")
    assert scan.holders == (DeviceHolder(5150, "nvidia-smi"),)
    assert scan.complete is True


def test_missing_proc_root_scan_is_unavailable(tmp_path):
    scan = ProcfsReader(HostPaths(procfs=str(tmp_path / "none"))).scan_open()
    assert scan.available is False
    assert scan.complete is False
    assert scan.holders == ()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs Linux procfs")
def test_real_proc_sees_our_own_open_file(tmp_path):
    target = tmp_path / "fake-nvidia0"
    target.write_text("")
    reader = ProcfsReader(HostPaths())
    with open(target):
        holders = reader.processes_with_open(str(target))
    assert (os.getpid(), reader.comm(os.getpid())) in holders
    assert reader.boot_id() and len(reader.boot_id()) == 36
    assert reader.uptime_s() > 0
