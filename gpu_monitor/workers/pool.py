"""Torch workers, the parent side: one subprocess per device, a hard timeout, results keyed by
device UUID.

Why subprocesses: a hung CUDA kernel or NCCL collective cannot be interrupted from Python, a
crashed driver call takes the process with it, and GPU memory is only certainly released when
the process that allocated it exits. So the daemon (and the CLI) never import torch: every
torch-using check hands a ``Task`` per device to ``WorkerPool.run``, which starts
``python -m gpu_monitor.workers`` for each (CPU devices: forks it from a fork server, see 6.),
sends the task as one JSON line on its input, and reads the result from a file the worker
writes when it is done.

The package's other rooms: procs.py (the processes, spawned or forked, and their cleanup),
board.py (the status board each worker writes and the parent reads), child.py (the worker
side: the task's ``WorkerContext``, the worker's main, the fork server), device.py (the torch
layer, imported only in workers), faults.py (test-only misbehaviour).

Guarantees, in order of importance:

1. The calling process never imports torch (tests/workers/test_pool.py holds us to it).
2. Each worker is its own session (process group). A worker that overruns its limit, or whose
   gang has failed, is killed with SIGKILL on the whole group; its GPU memory goes with it.
   Workers also exit by themselves when the parent goes away (stdin closes, or the parent pid
   changes) or after a hard limit, so nothing outlives a killed daemon for long.
3. Every outcome names the device and the cause in words a person can act on: "worker for
   gpu:3 timed out after 30 s (at all_reduce 8388608 B)", "worker for gpu:3 exited with signal
   11 (SIGSEGV)", "worker for gpu:3 failed: RuntimeError: CUDA error: ...". Checks turn a
   failed outcome into ``unknown`` (``WorkerTimeout`` / ``WorkerCrashed``), never ``ok``.
4. The worker reports the UUID of each device it opened (torch's, on CUDA); a UUID that is not
   the one NVML gave for that index is an outcome of its own (``WorkerDeviceMismatch``), so
   results are never filed under the wrong GPU.
5. Timing is fair. Workers start together (importing torch is slow and needs no fairness) and
   then wait for their *turn*. On real GPUs every worker gets its turn at once (GPUs are
   independent, and a burn-in is meant to load them together). With CPU devices
   (``WorkerSettings.device_type == "cpu"``, the simulated node) devices share a few cores, so
   turns are given one device at a time, in ``rounds`` rounds, so one device's measurement is
   not another's noise, and a burst of load from elsewhere hits one round, not one device.
6. CPU workers are forked from a per-run fork server that imported torch once (eight simulated
   devices on two cores would otherwise spend most of a short check importing torch eight
   times); CUDA workers are always fresh interpreters. Both kinds are killed, timed and
   reported the same way.
7. A gang (``gang=True``, torch.distributed) lives and dies together: the first failing rank
   stops the others. When a gang overruns its limit, the ranks that made the least progress
   (``WorkerContext.step``) are named as the ones that hung; the others were waiting for them.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpu_monitor.host import WorkerSettings
from gpu_monitor.model import gpu_target
from gpu_monitor.workers import board
from gpu_monitor.workers.procs import (
    WORKER_MODULE,
    ForkedProc,
    ForkServer,
    Proc,
    SpawnedProc,
    forget_dir,
    last_line,
    remember_dir,
)

log = logging.getLogger(__name__)

# Reasons checks use for failed outcomes (each check declares them).
REASON_TIMEOUT = "WorkerTimeout"
REASON_CRASHED = "WorkerCrashed"
REASON_MISMATCH = "WorkerDeviceMismatch"
WORKER_REASONS = (REASON_TIMEOUT, REASON_CRASHED, REASON_MISMATCH)


# --- values ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class DeviceRef:
    """A device as NVML names it: its index (PCI bus order) and UUID."""

    index: int
    uuid: str | None = None

    @property
    def target(self) -> str:
        return gpu_target(self.index)


@dataclass(frozen=True)
class Task:
    """One worker's job: call ``function`` with ``args`` on ``devices``."""

    function: str  # "checks.burn_in:burn_worker"
    devices: tuple[DeviceRef, ...]
    args: Mapping[str, Any] = field(default_factory=dict)
    label: str = ""  # how messages name the worker; defaults to the first device's target

    @property
    def name(self) -> str:
        if self.label:
            return self.label
        return self.devices[0].target if self.devices else "worker"


@dataclass(frozen=True)
class Outcome:
    """What became of one task. ``cause`` is empty when the worker returned a value."""

    task: Task
    value: Mapping[str, Any] | None
    cause: str = ""  # timeout | signal | exit | error | bad-result | aborted | spawn | mismatch
    message: str = ""
    returncode: int | None = None
    duration_s: float = 0.0
    steps: int = 0
    phase: str = ""
    uuids: tuple[str | None, ...] = ()
    log_tail: str = ""
    failed_at: float | None = None  # the worker's clock when it raised (gang blame)

    @property
    def ok(self) -> bool:
        return not self.cause

    @property
    def reason(self) -> str:
        if self.cause == "timeout":
            return REASON_TIMEOUT
        if self.cause == "mismatch":
            return REASON_MISMATCH
        return REASON_CRASHED

    @property
    def details(self) -> dict[str, Any]:
        out: dict[str, Any] = {"worker": self.task.name, "cause": self.cause,
                               "returncode": self.returncode,
                               "duration_s": round(self.duration_s, 3)}
        if self.phase:
            out["phase"] = self.phase
        if self.steps:
            out["steps"] = self.steps
        if self.log_tail:
            out["log_tail"] = self.log_tail[-1000:]
        return out


# --- the parent side ------------------------------------------------------------------------


def _with_last_output(message: str, tail: str) -> str:
    """What a worker that ended without a result is reported with, by signal or by status:
    ``message`` and the last line it printed, if any."""
    last = last_line(tail)
    return message + (f"; last output: {last}" if last else "")


def _signal_name(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


def _import_roots(function: str) -> list[str]:
    """Directories that make ``function``'s top-level package (and gpu_monitor) importable."""
    roots: list[str] = []
    for top in (function.split(":", 1)[0].split(".", 1)[0], "gpu_monitor"):
        try:
            spec = importlib.util.find_spec(top)
        except (ImportError, ValueError):
            spec = None
        if spec is None:
            continue
        locations = list(spec.submodule_search_locations or [])
        if locations:
            roots += [os.path.dirname(os.path.abspath(p)) for p in locations]
        elif spec.origin:
            roots.append(os.path.dirname(os.path.abspath(spec.origin)))
    seen: dict[str, None] = {}
    for r in roots:
        seen.setdefault(r, None)
    return list(seen)


@dataclass
class _Worker:
    task: Task
    proc: Proc | None
    board_path: str
    result_path: str
    log_path: str
    started: float
    rank: int = 0
    outcome: Outcome | None = None
    turn_deadline: float | None = None
    board: tuple[int, int, int, str] = (0, board.STARTING, 0, "")

    def alive(self) -> bool:
        return self.outcome is None and self.proc is not None and self.proc.poll() is None

    def read_board(self) -> tuple[int, int, int, str]:
        """The board as the worker last wrote it (the last good read, if it cannot be read)."""
        now = board.read(self.board_path)
        if now is not None:
            self.board = now
        return self.board

    def log_tail(self) -> str:
        try:
            with open(self.log_path, "rb") as fh:
                fh.seek(0, os.SEEK_END)
                size = fh.tell()
                fh.seek(max(0, size - 4000))
                return fh.read().decode("utf-8", "replace")
        except OSError:
            return ""


class WorkerPool:
    """Runs tasks in worker subprocesses as ``settings`` says (device type, extra env)."""

    def __init__(self, settings: WorkerSettings | None = None, *, python: str | None = None,
                 poll_s: float = 0.01, sequential: bool | None = None,
                 sequential_rounds: int = 3, fork_server: bool | None = None):
        self.settings = settings or WorkerSettings()
        self.python = python or self.settings.python or sys.executable
        self.poll_s = poll_s
        # CPU workers fork from a per-run server that imported torch once; CUDA workers are
        # fresh interpreters (no CUDA state can leak through a fork).
        self.fork_server = (self.settings.device_type == "cpu") if fork_server is None \
            else bool(fork_server)
        # CPU devices share cores: measure them one after another. (Benchmarks that put two
        # tasks on one GPU ask for sequential turns too.)
        self.sequential = (self.settings.device_type == "cpu") if sequential is None \
            else bool(sequential)
        self.sequential_rounds = max(1, int(sequential_rounds))

    @property
    def rounds(self) -> int:
        """How many turns each device gets (the checks divide their measuring time by it)."""
        return self.sequential_rounds if self.sequential else 1

    def environment(self, *functions: str) -> dict[str, str]:
        env = dict(os.environ)
        env.update(self.settings.env)
        # CUDA's default order is "fastest first"; NVML's is PCI bus order. Make them agree.
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        # cuBLAS is bit-for-bit reproducible run to run only with a fixed workspace config.
        env.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        env["PYTHONFAULTHANDLER"] = "1"
        env["PYTHONUNBUFFERED"] = "1"
        if self.settings.device_type == "cpu":
            for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
                env[var] = "1"
        roots: list[str] = []
        for function in functions:
            roots += [r for r in _import_roots(function) if r not in roots]
        if env.get("PYTHONPATH"):
            roots.append(env["PYTHONPATH"])
        env["PYTHONPATH"] = os.pathsep.join(roots)
        return env

    # -- the run -------------------------------------------------------------------------------

    def run(self, tasks: Sequence[Task], *, timeout_s: float, setup_timeout_s: float = 120.0,
            budget_s: float | None = None, gang: bool = False, rounds: int | None = None,
            on_tick: Callable[[], None] | None = None, tick_s: float = 0.5) -> list[Outcome]:
        """Run every task; one ``Outcome`` per task, in order. Never raises for a worker's
        failure.

        ``timeout_s`` limits each turn of each worker (and the wrap-up after its last turn);
        ``setup_timeout_s`` limits the start-up before its first turn (importing torch,
        opening the device, building inputs). ``budget_s`` is the whole run's limit (the
        check's time budget): start-up then gets at most a third of it and each turn at most
        a fair share, so one hung worker cannot use up the others' time, and nothing outlives
        it. ``rounds`` overrides ``self.rounds`` (a single worker has nobody to take turns
        with). ``on_tick`` is called about every ``tick_s`` while workers run (telemetry).
        """
        if not tasks:
            return []
        end = float("inf")
        if budget_s is not None and budget_s > 0:
            end = time.monotonic() + budget_s
            gang_or_together = gang or not self.sequential
            n_rounds = 1 if gang else (self.rounds if rounds is None else max(1, int(rounds)))
            turns = n_rounds * (1 if gang_or_together else len(tasks))
            setup_timeout_s = min(setup_timeout_s, budget_s / 3)
            timeout_s = min(timeout_s, (budget_s - setup_timeout_s) / (turns + 1))
        tmp = tempfile.mkdtemp(prefix="gpu-monitor-workers-")
        remember_dir(tmp)
        rendezvous = os.path.join(tmp, "rendezvous")
        rounds = 1 if gang else (self.rounds if rounds is None else max(1, int(rounds)))
        env = self.environment(*sorted({t.function for t in tasks}))
        server = None
        if self.fork_server:
            try:
                server = ForkServer(self.python, env, tmp)
            except OSError as exc:  # spawn each worker instead; slower, same results
                log.warning("cannot start the worker fork server (%s); spawning workers", exc)
        workers: list[_Worker] = []
        ticker = _Ticker(on_tick, tick_s)
        try:
            for rank, task in enumerate(tasks):
                payload = {
                    "function": task.function,
                    "args": dict(task.args),
                    "label": task.name,
                    "device_type": self.settings.device_type,
                    "device_seam": self.settings.device_seam,
                    "devices": [{"index": d.index, "uuid": d.uuid} for d in task.devices],
                    "rounds": rounds,
                    "rank": rank,
                    "world_size": len(tasks),
                    "rendezvous": rendezvous if gang else None,
                    # Waiting for the other devices' turns counts too.
                    "hard_limit_s": setup_timeout_s + (rounds * len(tasks) + 1) * timeout_s + 60,
                    "timeout_s": timeout_s,
                }
                workers.append(self._spawn(task, payload, tmp, rank, env, server))
            self._run_phases(workers, rounds, timeout_s, setup_timeout_s, gang, ticker, end)
            ticker.tick(force=True)
            outcomes = [self._finish(w) for w in workers]
            return _blame(outcomes) if gang else outcomes
        finally:
            for w in workers:
                if w.proc is not None:
                    if w.proc.poll() is None:
                        w.proc.kill()
                        w.proc.wait(timeout=5)
                    w.proc.close_input()
            if server is not None:
                server.close()
            forget_dir(tmp)

    def _spawn(self, task: Task, payload: dict[str, Any], tmp: str, rank: int,
               env: Mapping[str, str], server: ForkServer | None) -> _Worker:
        base = os.path.join(tmp, f"w{rank}")
        board_path, result_path, log_path = base + ".board", base + ".json", base + ".log"
        board.create(board_path)
        payload = {**payload, "board_path": board_path, "result_path": result_path}
        w = _Worker(task, None, board_path, result_path, log_path, time.monotonic(), rank)
        try:
            if server is not None:
                fifo = base + ".in"
                os.mkfifo(fifo, 0o600)
                w.proc = ForkedProc(server, f"w{rank}", fifo)
                server.fork(f"w{rank}", fifo, log_path, env)
            else:
                with open(log_path, "wb") as log:
                    w.proc = SpawnedProc(subprocess.Popen(
                        [self.python, "-m", WORKER_MODULE], stdin=subprocess.PIPE, stdout=log,
                        stderr=subprocess.STDOUT, env=dict(env), start_new_session=True,
                        close_fds=True))
        except OSError as exc:
            w.outcome = Outcome(task, None, "spawn",
                                f"worker for {task.name} could not start: {exc}")
            return w
        w.proc.send(json.dumps(payload) + "\n")
        return w

    def _run_phases(self, workers: list[_Worker], rounds: int, timeout_s: float,
                    setup_timeout_s: float, gang: bool, ticker: _Ticker, end: float) -> None:
        def limit(seconds: float, what: str = "") -> tuple[float, str]:
            deadline = time.monotonic() + seconds
            if deadline > end:
                return end, "its share of the check's time budget" + what
            return deadline, f"{seconds:.3g} s{what}"

        # 1. Start-up: every worker imports torch and prepares, all at once.
        self._wait(workers, lambda w: w.read_board()[1] >= board.READY,
                   *limit(setup_timeout_s, " while starting up"), ticker, gang)
        # 2. Turns.
        for turn in range(rounds):
            if gang or not self.sequential:
                group = [w for w in workers if w.alive()]
                for w in group:
                    w.proc.send("go\n")
                self._wait(group, _turn_done(turn), *limit(timeout_s), ticker, gang)
            else:
                for w in workers:
                    if not w.alive():
                        continue
                    w.proc.send("go\n")
                    self._wait([w], _turn_done(turn), *limit(timeout_s), ticker, gang)
        # 3. Wrap-up: no more turns; results are written and the workers exit.
        for w in workers:
            if w.proc is not None:
                w.proc.close_input()
        self._wait(workers, lambda w: False, *limit(timeout_s, " while finishing"), ticker, gang)

    def _wait(self, group: Sequence[_Worker], done: Callable[[_Worker], bool], deadline: float,
              limit_text: str, ticker: _Ticker, gang: bool) -> None:
        """Until each worker of ``group`` is ``done`` or has exited; kill those at the
        deadline. In a gang, the first failure stops everyone."""
        while True:
            ticker.tick()
            pending = []
            for w in group:
                if w.outcome is not None:
                    continue
                if w.proc is None or w.proc.poll() is not None:
                    if gang and not self._exited_well(w):
                        self._abort_gang(group, w)
                        return
                    continue
                if not done(w):
                    pending.append(w)
            if not pending:
                return
            if time.monotonic() >= deadline:
                self._time_out(pending, limit_text, gang, group)
                return
            time.sleep(self.poll_s)

    def _exited_well(self, w: _Worker) -> bool:
        return self._finish(w).ok

    def _abort_gang(self, group: Sequence[_Worker], first: _Worker) -> None:
        assert first.outcome is not None
        for w in group:
            if w is first or w.outcome is not None or w.proc is None:
                continue
            if w.proc.poll() is None:
                w.proc.kill()
                w.proc.wait(timeout=10)
                w.outcome = Outcome(
                    w.task, None, "aborted",
                    f"worker for {w.task.name} stopped because the worker for "
                    f"{first.task.name} failed ({first.outcome.cause})",
                    w.proc.poll(), time.monotonic() - w.started, *self._progress(w),
                    log_tail=w.log_tail())

    def _progress(self, w: _Worker) -> tuple[int, str]:
        steps, _state, _turns, phase = w.read_board()
        return steps, phase

    def _time_out(self, pending: Sequence[_Worker], limit_text: str, gang: bool,
                  group: Sequence[_Worker]) -> None:
        progress = {id(w): self._progress(w) for w in pending}
        least = min(s for s, _ in progress.values())
        most = max(s for s, _ in progress.values())
        culprits = [w for w in pending if not gang or most == least
                    or progress[id(w)][0] == least]
        names = ", ".join(w.task.name for w in culprits)
        for w in pending:
            assert w.proc is not None
            w.proc.kill()
            w.proc.wait(timeout=10)
            steps, phase = progress[id(w)]
            where = f" (at {phase})" if phase else ""
            if w in culprits:
                extra = (f"; the other ranks had reached step {most}"
                         if gang and most != least else "")
                w.outcome = Outcome(
                    w.task, None, "timeout",
                    f"worker for {w.task.name} timed out after {limit_text}{where}{extra}",
                    w.proc.poll(), time.monotonic() - w.started, steps, phase,
                    log_tail=w.log_tail())
            else:
                w.outcome = Outcome(
                    w.task, None, "aborted",
                    f"worker for {w.task.name} stopped: it was waiting for {names}, which "
                    f"timed out after {limit_text}", w.proc.poll(),
                    time.monotonic() - w.started, steps, phase, log_tail=w.log_tail())
        if gang:
            for w in group:
                if w.outcome is None and w.proc is not None and w.proc.poll() is None:
                    w.proc.kill()
                    w.proc.wait(timeout=10)
                    w.outcome = Outcome(w.task, None, "aborted",
                                        f"worker for {w.task.name} stopped: {names} timed out",
                                        w.proc.poll(), time.monotonic() - w.started,
                                        *self._progress(w), log_tail=w.log_tail())

    def _finish(self, w: _Worker) -> Outcome:
        """The outcome of a worker that has exited (or was given one already)."""
        if w.outcome is not None:
            return w.outcome
        assert w.proc is not None
        rc = w.proc.wait(timeout=30)
        duration = time.monotonic() - w.started
        steps, phase = self._progress(w)
        tail = w.log_tail()
        name = w.task.name
        result: Any = None
        unreadable = ""
        if os.path.exists(w.result_path):
            try:
                with open(w.result_path, encoding="utf-8") as fh:
                    result = json.load(fh)
                if not isinstance(result, dict):
                    raise ValueError(f"expected an object, got {type(result).__name__}")
            except (OSError, ValueError) as exc:
                result, unreadable = None, str(exc)
        common = dict(returncode=rc, duration_s=duration, steps=steps, phase=phase,
                      log_tail=tail)
        lost = getattr(w.proc, "lost", "")
        if lost and result is None:
            w.outcome = Outcome(w.task, None, "exit", f"worker for {name} was lost: {lost}",
                                **common)
        elif unreadable:
            w.outcome = Outcome(w.task, None, "bad-result",
                                f"worker for {name} wrote an unreadable result: {unreadable}",
                                **common)
        elif result is not None and result.get("ok"):
            uuids = tuple(result.get("uuids") or ())
            w.outcome = _check_uuids(w.task, result.get("value") or {}, uuids, common)
        elif result is not None:
            w.outcome = Outcome(w.task, None, "error",
                                f"worker for {name} failed: {result.get('error', '?')}",
                                failed_at=result.get("failed_at"), **common)
        elif rc is not None and rc < 0:
            sig = -rc
            w.outcome = Outcome(
                w.task, None, "signal",
                _with_last_output(f"worker for {name} exited with signal {sig} "
                                  f"({_signal_name(sig)})", tail), **common)
        else:
            w.outcome = Outcome(
                w.task, None, "exit",
                _with_last_output(f"worker for {name} exited with status {rc} without a "
                                  "result", tail), **common)
        return w.outcome


_HARD_CAUSES = ("signal", "exit", "bad-result", "mismatch", "timeout", "spawn")


def _blame(outcomes: list[Outcome]) -> list[Outcome]:
    """In a failed gang, name the rank(s) that failed first; the others' failures (a peer's
    connection closed, a collective aborted) are consequences, reported as ``aborted``.

    A rank that died (signal, exit without a result) or hung is a cause. Failing that, of the
    ranks that raised, the one that raised first.
    """
    failed = [o for o in outcomes if not o.ok and o.cause != "aborted"]
    if len(failed) <= 1:
        return outcomes
    culprits = [o for o in failed if o.cause in _HARD_CAUSES]
    if not culprits:
        culprits = [min(failed, key=lambda o: o.failed_at if o.failed_at is not None
                        else float("inf"))]
    names = ", ".join(o.task.name for o in culprits)
    out = []
    for o in outcomes:
        if any(o is f for f in failed) and not any(o is c for c in culprits):
            o = dataclasses.replace(
                o, cause="aborted",
                message=f"worker for {o.task.name} stopped because the worker for {names} "
                        f"failed ({culprits[0].cause}); its own error: {o.message}")
        out.append(o)
    return out


def _check_uuids(task: Task, value: Mapping[str, Any], uuids: tuple, common: dict) -> Outcome:
    if len(uuids) != len(task.devices):
        return Outcome(task, None, "mismatch",
                       f"worker for {task.name} opened {len(uuids)} devices, expected "
                       f"{len(task.devices)}", uuids=uuids, **common)
    for ref, got in zip(task.devices, uuids, strict=True):
        if ref.uuid and got and ref.uuid != got:
            return Outcome(
                task, None, "mismatch",
                f"worker for {task.name} opened {got}, but NVML says {ref.target} is "
                f"{ref.uuid} (is CUDA_VISIBLE_DEVICES set?)", uuids=uuids, **common)
    return Outcome(task, value, uuids=uuids, **common)


def _turn_done(turn: int) -> Callable[[_Worker], bool]:
    return lambda w: w.read_board()[2] > turn


class _Ticker:
    def __init__(self, fn: Callable[[], None] | None, every_s: float):
        self.fn = fn
        self.every_s = every_s
        self.last = float("-inf")

    def tick(self, force: bool = False) -> None:
        now = time.monotonic()
        if self.fn is not None and (force or now - self.last >= self.every_s):
            self.last = now
            try:
                self.fn()
            except Exception:  # noqa: BLE001 - telemetry must not abandon running workers
                log.exception("worker pool tick failed")


