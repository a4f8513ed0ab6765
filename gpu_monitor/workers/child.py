"""The worker side: what runs inside a worker process, and the fork server that forks them.

``python -m gpu_monitor.workers`` (``__main__.py``) reads one task as a JSON line on stdin --
the task function ``"package.module:function"``, its devices and args, where its status board
and result file are -- opens the devices (device.py), calls the function with a
``WorkerContext`` (devices, args, rank, ``turns()``, ``step()``) and writes its JSON-able
return value, or the error, to the result file. ``--forkserver`` imports torch once and forks a
worker per request instead (pool.py, guarantee 6).

A worker exits by itself when its parent is gone (stdin closes, or the parent pid changes) and
after a hard limit; test-only faults (faults.py) fire at the points they name.

Simulated devices: the parent may name a device seam (``WorkerSettings.device_seam``,
``"package.module:function"``); the worker resolves it like the task function and hands it to
``open_devices``, so the simulator reaches the devices without this code importing it.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import select
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from gpu_monitor.workers import board
from gpu_monitor.workers.device import open_devices
from gpu_monitor.workers.faults import (
    TEST_FAULT_ENV,
    Garbage,
    TestFault,
    parse_test_faults,
    trigger,
)

_EXIT_PARENT_GONE = 75
_EXIT_OVERRAN = 76


class WorkerContext:
    """What a task function gets: its devices, args, rank, and the turn/progress protocol."""

    def __init__(self, payload: Mapping[str, Any], devices: list[Any], status: board.Board,
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
        self._board = status
        self._faults = faults
        self._steps = 0

    @property
    def device(self) -> Any:
        return self.devices[0]

    def turns(self) -> Iterator[int]:
        """Yields once per turn the parent grants; measure only inside the loop body."""
        for turn in range(self.rounds):
            self._board.update(state=board.READY)
            line = sys.stdin.readline()
            if not line:  # the parent is gone or has given up on us
                os._exit(_EXIT_PARENT_GONE)
            self._board.update(state=board.IN_TURN)
            self._fire("turn")
            yield turn
            self._board.update(state=board.FINISHING, turns_done=turn + 1)

    def step(self, phase: str | None = None) -> None:
        """Count progress (cheap: one in-place write) before each unit of work, e.g. each
        collective; when a gang hangs, the ranks that did not get as far are named."""
        self._fire(str(self._steps + 1))  # a test hang here never announces this step
        self._steps += 1
        self._board.update(steps=self._steps, phase=phase)

    def _fire(self, when: str) -> None:
        for fault in self._faults:
            if fault.at == when:
                trigger(fault)


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


def _resolve(function: str) -> Callable[..., Any]:
    """The function ``"package.module:function"`` names (a task, or a device seam)."""
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


def worker_main() -> int:
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
        status = board.Board(payload["board_path"])
        for fault in faults:
            if fault.at == "setup":
                trigger(fault)
        seam = payload.get("device_seam")
        devices = open_devices(payload["device_type"], payload["devices"],
                               seam_for=_resolve(seam) if seam else None)
        ctx = WorkerContext(payload, devices, status, faults)
        fn = _resolve(payload["function"])
        value = fn(ctx)
        _write_result(result_path, {"ok": True, "value": value,
                                    "uuids": [d.uuid for d in devices]})
        return 0
    except Garbage:
        _write_result(result_path, "{not json")
        return 0
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which decides
        tb = traceback.format_exc()
        sys.stderr.write(tb)
        _write_result(result_path, {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:1000],
                                    "traceback": tb[-4000:], "failed_at": time.time()})
        return 1


def forkserver_main() -> int:
    """Import torch once, then fork a worker per request line (procs.py, ``ForkServer``)."""
    import torch  # noqa: F401 - the point of the server: imported once, shared by every fork
    import torch.distributed  # noqa: F401

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
        code = worker_main()
    except BaseException:  # noqa: BLE001 - a forked worker must never return into the server
        with contextlib.suppress(BaseException):
            traceback.print_exc()
    finally:
        with contextlib.suppress(BaseException):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)
