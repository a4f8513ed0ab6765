"""One way to run external tools (``dcgmi``, ``ib_write_bw``, ``nvidia-smi``).

argv lists only (never a shell), a hard timeout that kills the whole process group, captured
output. Parsers of the output are pure functions elsewhere; this module only runs things.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class CommandResult:
    argv: tuple[str, ...]
    returncode: int | None  # None when it timed out or could not start
    stdout: str
    stderr: str
    duration_s: float
    timed_out: bool = False
    not_found: bool = False
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out


class CommandRunner:
    """Runs argv lists with a timeout. ``search_path`` lets the simulated node put its fake
    tools first on PATH without touching the process environment."""

    def __init__(self, search_path: Sequence[str] = (), env: Mapping[str, str] | None = None):
        self.search_path = tuple(search_path)
        self.env = dict(env) if env is not None else None

    def _environ(self) -> dict[str, str]:
        env = dict(os.environ)
        if self.env:
            env.update(self.env)
        if self.search_path:
            env["PATH"] = os.pathsep.join([*self.search_path, env.get("PATH", "")])
        return env

    def which(self, name: str) -> str | None:
        if os.sep in name:
            return name if os.access(name, os.X_OK) else None
        return shutil.which(name, path=self._environ().get("PATH"))

    def popen(self, argv: Sequence[str], **kwargs) -> subprocess.Popen:
        """Start a long-running process (e.g. an ib_write_bw server) in its own group."""
        exe = self.which(argv[0])
        if exe is None:
            raise FileNotFoundError(argv[0])
        return self._spawn(exe, argv, **kwargs)

    def _spawn(self, exe: str, argv: Sequence[str], **kwargs) -> subprocess.Popen:
        """The one way a tool is started: resolved ``exe``, this runner's environment, output
        captured as text, in a process group of its own (so a timeout kills all of it)."""
        return subprocess.Popen(
            [exe, *argv[1:]],
            env=self._environ(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
            start_new_session=True,
            **kwargs,
        )

    def run(self, argv: Sequence[str], timeout: float, stdin: str | None = None) -> CommandResult:
        argv = tuple(argv)
        start = time.monotonic()
        exe = self.which(argv[0])
        if exe is None:
            return CommandResult(argv, None, "", "", 0.0, not_found=True,
                                 error=f"{argv[0]}: not found")
        try:
            proc = self._spawn(
                exe, argv, stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL)
        except OSError as exc:
            return CommandResult(argv, None, "", "", time.monotonic() - start, error=str(exc))
        try:
            out, err = proc.communicate(stdin, timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_group(proc)
            out, err = proc.communicate()
            return CommandResult(argv, None, out or "", err or "", time.monotonic() - start,
                                 timed_out=True, error=f"timed out after {timeout:g} s")
        return CommandResult(argv, proc.returncode, out, err, time.monotonic() - start)


def kill_group(proc: subprocess.Popen, grace_s: float = 2.0) -> None:
    """SIGTERM the process group, then SIGKILL whatever is left after ``grace_s``."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        try:
            proc.wait(timeout=grace_s)
            return
        except subprocess.TimeoutExpired:
            continue
