"""Slurm's own tools, as an administrator would run them: ``scontrol`` and ``squeue``.

Why strict: the remediator decides whether a node is ours to resume from what these print. A
line it cannot read is a ``SlurmError`` (the remediation step does not complete and is retried;
``gpu-monitor status`` shows the error), never a guess at what the node's state might be.

What is read:

- ``scontrol show node -o [NODE]``: one line per node of ``Key=Value`` fields separated by
  spaces; a value may itself hold spaces (``OS=Linux 6.1 #1 SMP ...``, ``Reason=...``), so a
  field runs until the next `` Key=``. A line must start with ``NodeName=`` and carry
  ``State=`` and ``Partitions=``; a ``Reason`` is always followed by Slurm's stamp
  `` [user@YYYY-MM-DDTHH:MM:SS]`` (the time has one-second resolution).
- ``squeue -h -w NODE -o %i``: one job id per line (``123``, an array task ``123_4``, a het
  job ``123+0``).

Every command runs with ``timeout_s`` (config ``remediation.slurm.command_timeout_s``): a
slurmctld that does not answer is an error within that time, not a hung daemon.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

__all__ = ["NodeRecord", "SlurmError", "SlurmTools", "parse_node_line", "parse_show_nodes"]


class SlurmError(Exception):
    """A Slurm command failed, timed out, or printed what we cannot parse."""


_FIELD = re.compile(r"(?:^|(?<= ))([A-Za-z][A-Za-z0-9_]*)=")
_STATE = re.compile(r"[A-Z_]+(\+[A-Z_]+)*[*~#!%$@^-]?")
_STAMP = re.compile(r"^(?P<text>.*) \[(?P<user>[^@\[\]]+)@(?P<time>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)\]$",
                    re.S)
_JOB_ID = re.compile(r"\d+([_+]\d+)?")


@dataclass(frozen=True)
class NodeRecord:
    """One node as ``scontrol show node -o`` prints it, the fields the delivery uses."""

    name: str
    state: str  # the whole State value, e.g. "IDLE+DRAIN"
    partitions: tuple[str, ...]
    gres: str  # "" when (null)
    reason: str  # without Slurm's stamp; "" when none
    reason_user: str = ""
    reason_time: str = ""  # YYYY-MM-DDTHH:MM:SS (slurmctld's clock, 1 s resolution)
    hostname: str = ""  # NodeHostName: the host slurmd runs on

    @property
    def base(self) -> str:
        return self.state.split("+", 1)[0].rstrip("*~#!%$@^-")

    @property
    def flags(self) -> frozenset[str]:
        return frozenset(self.state.rstrip("*~#!%$@^-").split("+")[1:])

    @property
    def drained(self) -> bool:
        """DRAIN set (draining or drained): no new jobs start."""
        return "DRAIN" in self.flags or self.base in ("DRAIN", "DRAINED", "DRAINING")

    @property
    def down(self) -> bool:
        return self.base == "DOWN"

    @property
    def out_of_service(self) -> bool:
        return self.drained or self.down or "FAIL" in self.flags or self.base == "FAIL"


def _fields(line: str) -> dict[str, str]:
    keys = list(_FIELD.finditer(line))
    out: dict[str, str] = {}
    for i, m in enumerate(keys):
        end = keys[i + 1].start() if i + 1 < len(keys) else len(line)
        out.setdefault(m.group(1), line[m.end():end].strip(" "))
    return out


def parse_node_line(line: str) -> NodeRecord:
    """One ``scontrol show node -o`` line; ``SlurmError`` when it is not one."""
    line = line.rstrip("\n")
    if not line.startswith("NodeName="):
        raise SlurmError(f"scontrol: not a node line: {line[:120]!r}")
    f = _fields(line)
    name, state = f.get("NodeName", ""), f.get("State", "")
    if not name or " " in name or not _STATE.fullmatch(state) or "Partitions" not in f:
        raise SlurmError(f"scontrol: node line without a readable NodeName/State/Partitions: "
                         f"{line[:200]!r}")
    reason = f.get("Reason", "")
    user = when = ""
    if reason:
        m = _STAMP.match(reason)
        if m is None:
            raise SlurmError(f"scontrol: node {name}: Reason without Slurm's [user@time] "
                             f"stamp: {reason[:200]!r}")
        reason, user, when = m.group("text"), m.group("user"), m.group("time")
    parts = f["Partitions"]
    gres = f.get("Gres", "")
    return NodeRecord(name=name, state=state,
                      partitions=tuple(p for p in parts.split(",") if p and p != "(null)"),
                      gres="" if gres in ("", "(null)") else gres,
                      reason=reason, reason_user=user, reason_time=when,
                      hostname=f.get("NodeHostName", ""))


def parse_show_nodes(text: str) -> dict[str, NodeRecord]:
    """Every node of a ``scontrol show node -o`` output (blank lines aside)."""
    out: dict[str, NodeRecord] = {}
    for line in text.splitlines():
        if line.strip():
            rec = parse_node_line(line)
            out[rec.name] = rec
    if not out:
        raise SlurmError("scontrol show node printed no node")
    return out


Runner = Callable[..., subprocess.CompletedProcess]


class SlurmTools:
    """``scontrol`` and ``squeue`` with a timeout; ``env`` adds to the environment (e.g.
    ``SLURM_CONF``)."""

    def __init__(self, timeout_s: float = 10.0, env: Mapping[str, str] | None = None,
                 runner: Runner = subprocess.run):
        self.timeout_s = timeout_s
        self.env = dict(env) if env else None
        self.runner = runner

    def _run(self, argv: Sequence[str], *, ok_rc: tuple[int, ...] = (0,)
             ) -> subprocess.CompletedProcess:
        env = {**os.environ, **self.env} if self.env else None
        try:
            out = self.runner(list(argv), capture_output=True, text=True,
                              timeout=self.timeout_s, env=env, check=False)
        except subprocess.TimeoutExpired as exc:
            raise SlurmError(f"{argv[0]} did not answer within {self.timeout_s:g} s") from exc
        except OSError as exc:
            raise SlurmError(f"cannot run {argv[0]}: {exc}") from exc
        if out.returncode not in ok_rc:
            msg = (out.stderr or out.stdout or "").strip().splitlines()
            raise SlurmError(f"{' '.join(argv[:3])}: exit {out.returncode}: "
                             f"{msg[-1] if msg else 'no output'}")
        return out

    def show_node(self, node: str) -> NodeRecord:
        recs = parse_show_nodes(self._run(["scontrol", "show", "node", "-o", node]).stdout)
        if node not in recs:
            raise SlurmError(f"scontrol show node {node} printed another node: {sorted(recs)}")
        return recs[node]

    def show_nodes(self) -> dict[str, NodeRecord]:
        return parse_show_nodes(self._run(["scontrol", "show", "node", "-o"]).stdout)

    def node_name_of_host(self, host: str) -> str:
        """The NodeName slurmctld knows this host by (what ``$SLURMD_NODENAME`` says in a job,
        and so what an SDC report names): the node of that name, else the one node whose
        ``NodeHostName`` is ``host`` or its short form; ``SlurmError`` when none or several."""
        nodes = self.show_nodes()
        short = host.split(".", 1)[0]
        for name in (host, short):
            if name in nodes:
                return name
        found = sorted(n for n, r in nodes.items() if r.hostname in (host, short))
        if len(found) != 1:
            raise SlurmError(f"cannot tell this host's Slurm node name: NodeHostName {host!r} "
                             f"matches {found or 'no node'}; set node_name in the config")
        return found[0]

    def drain(self, node: str, reason: str) -> None:
        self._run(["scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}"])

    def resume(self, node: str) -> NodeRecord:
        """``State=RESUME``; the node read back. A node whose slurmd never registered answers
        exit 1 ("Invalid node state specified") yet its drain is cleared: what counts is the
        state read back, which must show no DRAIN."""
        out = self._run(["scontrol", "update", f"NodeName={node}", "State=RESUME"], ok_rc=(0, 1))
        rec = self.show_node(node)
        if rec.drained:
            raise SlurmError(f"scontrol update NodeName={node} State=RESUME: still "
                             f"{rec.state} (exit {out.returncode}: {out.stderr.strip()})")
        return rec

    def jobs_on(self, node: str) -> list[str]:
        text = self._run(["squeue", "-h", "-w", node, "-o", "%i"]).stdout
        jobs = [x.strip() for x in text.splitlines() if x.strip()]
        bad = [j for j in jobs if not _JOB_ID.fullmatch(j)]
        if bad:
            raise SlurmError(f"squeue -w {node}: not job ids: {bad[:5]}")
        return jobs

    def requeue(self, jobs: Sequence[str]) -> None:
        if jobs:
            self._run(["scontrol", "requeue", ",".join(jobs)])
