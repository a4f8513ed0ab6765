"""Torch workers: one subprocess per device, a hard timeout, results keyed by device UUID.

Why subprocesses: a hung CUDA kernel or NCCL collective cannot be interrupted from Python, a
crashed driver call takes the process with it, and GPU memory is only certainly released when
the process that allocated it exits. So the daemon (and the CLI) never import torch: every
torch-using check hands a ``Task`` per device to ``WorkerPool.run``, which starts
``python -m gpu_monitor.workers.pool`` for each (CPU devices: forks it from a fork server, see
6.), sends the task as one JSON line on its input, and reads the result from a file the worker
writes when it is done.

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

Worker side (``_worker_main``): the task function ``"package.module:function"`` is called with a
``WorkerContext`` (devices, args, rank, ``turns()``, ``step()``) and returns a JSON-able dict.

Test-only fault hook: ``GPU_MONITOR_WORKER_TEST_FAULT`` makes a worker misbehave on purpose so
the tests can prove that hangs and crashes become ``unknown``. Format: ``KIND@LABEL[,at=WHEN]``
entries joined by ``;``, KIND one of ``hang``, ``crash`` (SIGSEGV), ``exit`` (status 3, no
result), ``error`` (an exception), ``garbage`` (an unreadable result); WHEN is ``setup``,
``turn`` (default: when its first turn starts) or a step number N (just before announcing step
N, like a rank stuck before joining a collective). Never set it in production.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import importlib
import importlib.util
import json
import logging
import os
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpu_monitor.host import WorkerSettings
from gpu_monitor.model import gpu_target

log = logging.getLogger(__name__)

TEST_FAULT_ENV = "GPU_MONITOR_WORKER_TEST_FAULT"
WORKER_MODULE = "gpu_monitor.workers.pool"

# Reasons checks use for failed outcomes (each check declares them).
REASON_TIMEOUT = "WorkerTimeout"
REASON_CRASHED = "WorkerCrashed"
REASON_MISMATCH = "WorkerDeviceMismatch"
WORKER_REASONS = (REASON_TIMEOUT, REASON_CRASHED, REASON_MISMATCH)

# The status board: a small file each worker updates in place and the parent reads.
_STATE_STARTING, _STATE_READY, _STATE_IN_TURN, _STATE_FINISHING = 0, 1, 2, 3
_BOARD = struct.Struct("<QIII256s")  # steps, state, turns_done, phase length, phase text
_EXIT_PARENT_GONE = 75
_EXIT_OVERRAN = 76


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


# --- test-only faults -------------------------------------------------------------------------


@dataclass(frozen=True)
class TestFault:
    """One ``GPU_MONITOR_WORKER_TEST_FAULT`` entry for this worker (test-only)."""

    __test__ = False  # not a pytest class
    kind: str
    at: str = "turn"  # setup | turn | <step number>


TEST_FAULT_KINDS = ("hang", "crash", "exit", "error", "garbage")


def parse_test_faults(text: str, label: str) -> list[TestFault]:
    """The entries of ``text`` aimed at ``label``; malformed entries raise ValueError."""
    out: list[TestFault] = []
    for entry in filter(None, (e.strip() for e in (text or "").split(";"))):
        head, _, rest = entry.partition(",")
        kind, sep, who = head.partition("@")
        if not sep or kind not in TEST_FAULT_KINDS:
            raise ValueError(f"{TEST_FAULT_ENV}: bad entry {entry!r} (KIND@LABEL[,at=WHEN], KIND "
                             f"one of {', '.join(TEST_FAULT_KINDS)})")
        at = "turn"
        if rest:
            key, _, value = rest.partition("=")
            if key.strip() != "at" or not value.strip():
                raise ValueError(f"{TEST_FAULT_ENV}: bad option {rest!r} in {entry!r}")
            at = value.strip()
        if who.strip() == label:
            out.append(TestFault(kind, at))
    return out


# --- the parent side ------------------------------------------------------------------------


_LIVE_GROUPS: set[int] = set()
# The temporary directories of runs still in progress. A run abandoned in its check's thread
# (Ctrl-C or SIGTERM in the main thread, which then exits) never reaches its ``finally``.
_LIVE_DIRS: set[str] = set()
_LIVE_LOCK = threading.Lock()


def _kill_group(pid: int) -> None:
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
        _kill_group(pid)
    for path in dirs:
        _rmtree(path)


def _signal_name(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


def _last_line(text: str) -> str:
    for line in reversed(text.splitlines()):
        if line.strip():
            return line.strip()[:300]
    return ""


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


# --- worker processes: spawned (a fresh interpreter) or forked (from a fork server) -----------


class _Proc:
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


class _SpawnedProc(_Proc):
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
        _kill_group(self.popen.pid)

    def send(self, line: str) -> None:
        try:
            assert self.popen.stdin is not None
            self.popen.stdin.write(line.encode())
            self.popen.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            pass  # it died; the poll notices

    def close_input(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            if self.popen.stdin is not None:
                self.popen.stdin.close()


class _ForkServer:
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
                        _kill_group(int(msg["pid"]))
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
        try:
            assert self.popen.stdin is not None
            self.popen.stdin.write(line.encode())
            self.popen.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            with self._cond:
                self.errors[req_id] = self.gone_reason()

    def close(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            if self.popen.stdin is not None:
                self.popen.stdin.close()
        try:
            self.popen.wait(timeout=5)
        except subprocess.TimeoutExpired:
            _kill_group(self.popen.pid)
            self.popen.wait()
        with _LIVE_LOCK:
            _LIVE_GROUPS.discard(self.popen.pid)

    def gone_reason(self) -> str:
        try:
            with open(self.log_path, "rb") as fh:
                last = _last_line(fh.read()[-4000:].decode("utf-8", "replace"))
        except OSError:
            last = ""
        rc = self.popen.poll()
        status = f" with status {rc}" if rc is not None else ""
        return f"the fork server exited{status}" + (f" ({last})" if last else "")


class _ForkedProc(_Proc):
    _UNWATCHED = 255  # the fork server died: this worker's own status is lost

    def __init__(self, server: _ForkServer, req_id: str, fifo: str):
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
                    _kill_group(pid)
                self._rc, self.lost = self._UNWATCHED, self.server.gone_reason()
        return self._rc

    def kill(self) -> None:
        with self.server._cond:
            pid = self.server.pids.get(self.req_id)
            if pid is None:
                self.server.cancelled.add(self.req_id)
        if pid is not None:
            _kill_group(pid)

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


@dataclass
class _Worker:
    task: Task
    proc: _Proc | None
    board_path: str
    result_path: str
    log_path: str
    started: float
    rank: int = 0
    outcome: Outcome | None = None
    turn_deadline: float | None = None
    board: tuple[int, int, int, str] = (0, _STATE_STARTING, 0, "")

    def alive(self) -> bool:
        return self.outcome is None and self.proc is not None and self.proc.poll() is None

    def read_board(self) -> tuple[int, int, int, str]:
        try:
            with open(self.board_path, "rb") as fh:
                raw = fh.read(_BOARD.size)
            steps, state, turns, n, text = _BOARD.unpack(raw)
            self.board = (steps, state, turns, text[:n].decode("utf-8", "replace"))
        except (OSError, struct.error):
            pass
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
        with _LIVE_LOCK:
            _LIVE_DIRS.add(tmp)
        rendezvous = os.path.join(tmp, "rendezvous")
        rounds = 1 if gang else (self.rounds if rounds is None else max(1, int(rounds)))
        env = self.environment(*sorted({t.function for t in tasks}))
        server = None
        if self.fork_server:
            try:
                server = _ForkServer(self.python, env, tmp)
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
            _rmtree(tmp)
            with _LIVE_LOCK:
                _LIVE_DIRS.discard(tmp)

    def _spawn(self, task: Task, payload: dict[str, Any], tmp: str, rank: int,
               env: Mapping[str, str], server: _ForkServer | None) -> _Worker:
        base = os.path.join(tmp, f"w{rank}")
        board_path, result_path, log_path = base + ".board", base + ".json", base + ".log"
        with open(board_path, "wb") as fh:
            fh.write(b"\0" * 4096)
        payload = {**payload, "board_path": board_path, "result_path": result_path}
        w = _Worker(task, None, board_path, result_path, log_path, time.monotonic(), rank)
        try:
            if server is not None:
                fifo = base + ".in"
                os.mkfifo(fifo, 0o600)
                w.proc = _ForkedProc(server, f"w{rank}", fifo)
                server.fork(f"w{rank}", fifo, log_path, env)
            else:
                with open(log_path, "wb") as log:
                    w.proc = _SpawnedProc(subprocess.Popen(
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
        self._wait(workers, lambda w: w.read_board()[1] >= _STATE_READY,
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
            last = _last_line(tail)
            w.outcome = Outcome(
                w.task, None, "signal",
                f"worker for {name} exited with signal {sig} ({_signal_name(sig)})"
                + (f"; last output: {last}" if last else ""), **common)
        else:
            last = _last_line(tail)
            w.outcome = Outcome(
                w.task, None, "exit",
                f"worker for {name} exited with status {rc} without a result"
                + (f"; last output: {last}" if last else ""), **common)
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


def _rmtree(path: str) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)


# --- the worker side --------------------------------------------------------------------------


class WorkerContext:
    """What a task function gets: its devices, args, rank, and the turn/progress protocol."""

    def __init__(self, payload: Mapping[str, Any], devices: list[Any], board: _Board,
                 faults: list[TestFault]):
        self.payload = payload
        self.devices = devices
        self.args: Mapping[str, Any] = payload.get("args") or {}
        self.rank: int = int(payload.get("rank", 0))
        self.world_size: int = int(payload.get("world_size", 1))
        self.rendezvous: str | None = payload.get("rendezvous")
        self.rounds: int = int(payload.get("rounds", 1))
        self.timeout_s: float = float(payload.get("timeout_s", 60.0))
        self.label: str = payload.get("label", "")
        self._board = board
        self._faults = faults
        self._steps = 0

    @property
    def device(self) -> Any:
        return self.devices[0]

    def turns(self) -> Iterator[int]:
        """Yields once per turn the parent grants; measure only inside the loop body."""
        for turn in range(self.rounds):
            self._board.update(state=_STATE_READY)
            line = sys.stdin.readline()
            if not line:  # the parent is gone or has given up on us
                os._exit(_EXIT_PARENT_GONE)
            self._board.update(state=_STATE_IN_TURN)
            self._fire("turn")
            yield turn
            self._board.update(state=_STATE_FINISHING, turns_done=turn + 1)

    def step(self, phase: str | None = None) -> None:
        """Count progress (cheap: one in-place write) before each unit of work, e.g. each
        collective; when a gang hangs, the ranks that did not get as far are named."""
        self._fire(str(self._steps + 1))  # a test hang here never announces this step
        self._steps += 1
        self._board.update(steps=self._steps, phase=phase)

    def _fire(self, when: str) -> None:
        for fault in self._faults:
            if fault.at == when:
                _trigger(fault)


def _trigger(fault: TestFault) -> None:
    """Test-only misbehaviour (GPU_MONITOR_WORKER_TEST_FAULT)."""
    if fault.kind == "hang":
        while True:
            time.sleep(3600)
    if fault.kind == "crash":
        signal.signal(signal.SIGSEGV, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGSEGV)
    if fault.kind == "exit":
        os._exit(3)
    if fault.kind == "error":
        raise RuntimeError("injected test fault (GPU_MONITOR_WORKER_TEST_FAULT)")
    if fault.kind == "garbage":
        raise _Garbage()


class _Garbage(Exception):
    pass


class _Board:
    """The worker's end of the status board: an mmap of the file the parent reads."""

    def __init__(self, path: str):
        import mmap

        self._fh = open(path, "r+b")  # noqa: SIM115 - lives as long as the worker
        self._map = mmap.mmap(self._fh.fileno(), 4096)
        self.steps, self.state, self.turns_done, self.phase = 0, _STATE_STARTING, 0, ""

    def update(self, steps: int | None = None, state: int | None = None,
               turns_done: int | None = None, phase: str | None = None) -> None:
        if steps is not None:
            self.steps = steps
        if state is not None:
            self.state = state
        if turns_done is not None:
            self.turns_done = turns_done
        if phase is not None:
            self.phase = phase
            raw = phase.encode("utf-8", "replace")[:256]
            self._map[16:20 + 256] = struct.pack("<I256s", len(raw), raw)
        self._map[0:16] = struct.pack("<QII", self.steps, self.state, self.turns_done)


def _watchdog(parent_pid: int, hard_limit_s: float) -> None:
    """Exit when the parent (the pool, or the fork server) is gone, i.e. the worker has been
    reparented, or when the worker has run far too long."""
    start = time.monotonic()
    while True:
        time.sleep(0.5)
        if os.getppid() != parent_pid:
            os._exit(_EXIT_PARENT_GONE)
        if time.monotonic() - start > hard_limit_s:
            sys.stderr.write(f"worker overran its hard limit of {hard_limit_s:g} s\n")
            os._exit(_EXIT_OVERRAN)


def _resolve(function: str) -> Callable[[WorkerContext], Mapping[str, Any]]:
    module_name, _, attr = function.partition(":")
    module = importlib.import_module(module_name)
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise RuntimeError(f"{function}: no such function")
    return fn


def _write_result(path: str, data: Mapping[str, Any] | str) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        if isinstance(data, str):
            fh.write(data)
        else:
            json.dump(data, fh)
    os.replace(tmp, path)


def _worker_main() -> int:
    line = sys.stdin.readline()
    if not line:
        return _EXIT_PARENT_GONE
    payload = json.loads(line)
    result_path = payload["result_path"]
    label = payload.get("label", "")
    threading.Thread(target=_watchdog, args=(os.getppid(), float(payload["hard_limit_s"])),
                     name="watchdog", daemon=True).start()
    try:
        faults = parse_test_faults(os.environ.get(TEST_FAULT_ENV, ""), label)
        board = _Board(payload["board_path"])
        for fault in faults:
            if fault.at == "setup":
                _trigger(fault)
        from gpu_monitor.workers.device import open_devices

        devices = open_devices(payload["device_type"], payload["devices"])
        ctx = WorkerContext(payload, devices, board, faults)
        fn = _resolve(payload["function"])
        value = fn(ctx)
        _write_result(result_path, {"ok": True, "value": value,
                                    "uuids": [d.uuid for d in devices]})
        return 0
    except _Garbage:
        _write_result(result_path, "{not json")
        return 0
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which decides
        tb = traceback.format_exc()
        sys.stderr.write(tb)
        _write_result(result_path, {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:1000],
                                    "traceback": tb[-4000:], "failed_at": time.time()})
        return 1


def _forkserver_main() -> int:
    """Import torch once, then fork a worker per request line (see ``_ForkServer``)."""
    import select

    import torch  # noqa: F401 - the point of the server: imported once, shared by every fork
    import torch.distributed  # noqa: F401

    import gpu_monitor.workers.device  # noqa: F401

    def report(msg: Mapping[str, Any]) -> None:
        os.write(1, (json.dumps(msg) + "\n").encode())

    pending = b""
    while True:
        ready, _, _ = select.select([0], [], [], 0.05)
        if ready:
            chunk = os.read(0, 65536)
            if not chunk:
                return 0  # end of the run, or the pool is gone: the workers watch for that
            pending += chunk
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                req = json.loads(line)
                try:
                    report({"id": req["id"], "pid": _fork_worker(req)})
                except OSError as exc:
                    report({"id": req["id"], "error": f"fork failed: {exc}"})
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            report({"exit": pid, "code": os.waitstatus_to_exitcode(status)})


def _fork_worker(req: Mapping[str, Any]) -> int:
    pid = os.fork()
    if pid:
        return pid
    code = 70
    try:
        os.setsid()
        log = os.open(req["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        fifo = os.open(req["fifo"], os.O_RDONLY)
        os.dup2(fifo, 0)
        os.close(fifo)
        os.environ.clear()
        os.environ.update(req["env"])
        sys.stdin = open(0, encoding="utf-8", closefd=False)  # noqa: SIM115
        sys.stdout = open(1, "w", encoding="utf-8", buffering=1, closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", encoding="utf-8", buffering=1, closefd=False)  # noqa: SIM115
        code = _worker_main()
    except BaseException:  # noqa: BLE001 - a forked worker must never return into the server
        with contextlib.suppress(BaseException):
            traceback.print_exc()
    finally:
        with contextlib.suppress(BaseException):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


if __name__ == "__main__":
    # Run from the imported module (not this __main__ copy), so task functions that import
    # gpu_monitor.workers.pool see the same classes.
    from gpu_monitor.workers import pool as _pool

    if sys.argv[1:] == ["--forkserver"]:
        os._exit(_pool._forkserver_main())
    code = _pool._worker_main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # skip interpreter teardown: CUDA/NCCL destructors can hang there
