"""A real Slurm cluster on this machine for the tests: munged, slurmctld and one slurmd.

Everything lives in one fresh temporary directory (its own munge key and socket, slurm.conf,
state and spool directories, logs) and listens on ports chosen free at start, so two test runs
on one machine do not meet. The daemons run in the foreground (``-D``/``-F``) as children of
the test process and ``stop()`` ends them (and only them) by their process ids.

The cluster: one node with a real slurmd (``REAL``) that runs jobs, plus ``EXTRA`` nodes
defined in slurm.conf that never register (``SlurmdTimeout=0`` keeps them from being set
DOWN; DRAIN with a reason works on them) for the fleet-breaker tests, all in one partition.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

BINARIES = ("munged", "slurmctld", "slurmd", "scontrol", "sinfo", "squeue", "sbatch")
REAL = "gmreal"
EXTRA = tuple(f"gm{i:02d}" for i in range(1, 21))
PARTITION = "gpu"  # the 20 fleet nodes
JOBS = "jobs"  # the node with a slurmd


def missing_binaries() -> list[str]:
    return [b for b in BINARIES if shutil.which(b) is None]


def _free_ports(n: int) -> list[int]:
    socks, ports = [], []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    return ports


class SlurmCluster:
    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="gm-slurm-"))
        self.procs: dict[str, subprocess.Popen] = {}
        self.ctld_port, self.slurmd_port, self.extra_port = _free_ports(3)
        self.conf = self.dir / "slurm.conf"
        self.munge_socket = self.dir / "munge" / "munge.socket"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}

    # --- files ------------------------------------------------------------------------------

    def _write(self) -> None:
        d = self.dir
        for sub in ("munge", "state", "spool", "log"):
            (d / sub).mkdir(mode=0o700)
        key = d / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        user = pwd.getpwuid(os.getuid()).pw_name
        auth = f"AuthInfo=socket={self.munge_socket}"
        extra = ",".join(EXTRA)
        self.conf.write_text(f"""\
ClusterName=gmtest
SlurmctldHost=localhost
SlurmctldPort={self.ctld_port}
SlurmdPort={self.slurmd_port}
SlurmUser={user}
SlurmdUser={user}
AuthType=auth/munge
CredType=cred/munge
{auth}
StateSaveLocation={d / 'state'}
SlurmdSpoolDir={d / 'spool'}/%n
SlurmctldPidFile={d / 'slurmctld.pid'}
SlurmdPidFile={d / 'slurmd.pid'}
SlurmctldLogFile={d / 'log' / 'slurmctld.log'}
SlurmdLogFile={d / 'log' / 'slurmd.log'}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SchedulerType=sched/builtin
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
ReturnToService=2
SlurmdTimeout=0
SlurmctldTimeout=30
MessageTimeout=10
RebootProgram=/bin/true
NodeName={REAL} NodeHostname=localhost NodeAddr=127.0.0.1 CPUs=1 State=UNKNOWN
NodeName={extra} NodeHostname=localhost NodeAddr=127.0.0.1 Port={self.extra_port} CPUs=1 State=UNKNOWN
PartitionName={PARTITION} Nodes={extra} MaxTime=INFINITE State=UP
PartitionName={JOBS} Nodes={REAL} Default=YES MaxTime=INFINITE State=UP
""")

    # --- processes --------------------------------------------------------------------------

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = open(self.dir / "log" / f"{name}.out", "wb")  # noqa: SIM115 - closed in stop()
        self.procs[name] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                            env=self.env, start_new_session=True)
        log.close()

    def start(self, timeout: float = 60.0) -> SlurmCluster:
        self._write()
        d = self.dir
        self._spawn("munged", ["munged", "-F", f"--socket={self.munge_socket}",
                               f"--key-file={d / 'munge' / 'munge.key'}",
                               f"--pid-file={d / 'munge' / 'munged.pid'}",
                               f"--seed-file={d / 'munge' / 'munge.seed'}",
                               f"--log-file={d / 'log' / 'munged.log'}", "--force"])
        self._wait(lambda: self.munge_socket.exists(), timeout, "munged socket")
        self.start_ctld(timeout)
        self._spawn("slurmd", ["slurmd", "-D", "-N", REAL, "-f", str(self.conf)])
        self._wait(lambda: self.node_state(REAL) in ("IDLE", "MIXED", "ALLOCATED"), timeout,
                   f"slurmd {REAL} registered")
        return self

    def start_ctld(self, timeout: float = 60.0) -> None:
        self._spawn("slurmctld", ["slurmctld", "-D", "-i", "-f", str(self.conf)])
        self._wait(lambda: self.run("scontrol", "ping").returncode == 0
                   and "UP" in self.run("scontrol", "ping").stdout, timeout, "slurmctld up")

    def stop_ctld(self) -> None:
        self._end("slurmctld")

    def _end(self, name: str) -> None:
        p = self.procs.pop(name, None)
        if p is None or p.poll() is not None:
            return
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(10)

    def _cancel_jobs(self, timeout: float = 60.0) -> None:
        """Every job cancelled and gone before slurmd stops: no slurmstepd outlives the
        cluster."""
        if "slurmctld" not in self.procs or "slurmd" not in self.procs:
            return
        self.run("scancel", "--full", "--quiet", "-u", pwd.getpwuid(os.getuid()).pw_name)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            out = self.run("squeue", "-h", "-o", "%i")
            if out.returncode != 0 or not out.stdout.strip():
                return
            time.sleep(0.3)

    def stop(self) -> None:
        try:
            self._cancel_jobs()
        except (OSError, subprocess.SubprocessError):
            pass
        for name in ("slurmd", "slurmctld", "munged"):
            self._end(name)
        shutil.rmtree(self.dir, ignore_errors=True)

    # --- helpers ----------------------------------------------------------------------------

    def run(self, *argv: str, check: bool = False, timeout: float = 30.0
            ) -> subprocess.CompletedProcess:
        out = subprocess.run(list(argv), capture_output=True, text=True, env=self.env,
                             timeout=timeout)
        if check and out.returncode != 0:
            raise AssertionError(f"{argv}: rc {out.returncode}: {out.stderr or out.stdout}")
        return out

    def node_state(self, node: str) -> str:
        out = self.run("sinfo", "-h", "-N", "-n", node, "-o", "%T")
        return out.stdout.strip().upper() if out.returncode == 0 else ""

    def node_line(self, node: str) -> str:
        return self.run("scontrol", "show", "node", "-o", node, check=True).stdout

    def reset_node(self, node: str) -> None:
        """Back to service with no reason, whatever a test left (an unregistered node's RESUME
        exits 1 yet clears the drain)."""
        self.run("scontrol", "update", f"NodeName={node}", "State=RESUME")

    def reset_all(self) -> None:
        """Every node that has a drain or a reason resumed (one read, then only those)."""
        out = self.run("scontrol", "show", "node", "-o", check=True).stdout
        for line in out.splitlines():
            if "+DRAIN" in line or " Reason=" in line:
                self.reset_node(line.split(" ", 1)[0].removeprefix("NodeName="))

    def log_tail(self, name: str = "slurmctld") -> str:
        p = self.dir / "log" / f"{name}.log"
        return p.read_text(errors="replace")[-4000:] if p.exists() else ""

    def _wait(self, pred, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, p in self.procs.items():
                if p.poll() is not None:
                    raise RuntimeError(f"{name} exited rc {p.returncode} while waiting for "
                                       f"{what}: {self.log_tail(name)}"
                                       f"{(self.dir / 'log' / (name + '.out')).read_text()}")
            if pred():
                return
            time.sleep(0.2)
        raise RuntimeError(f"{what} not reached in {timeout} s: {self.log_tail()}")
