"""Test-only worker faults: make a worker misbehave on purpose, so tests can prove that hangs
and crashes become ``unknown``, never ``ok``.

``GPU_MONITOR_WORKER_TEST_FAULT`` in a worker's environment holds ``KIND@LABEL[,at=WHEN]``
entries joined by ``;``: KIND one of ``hang``, ``crash`` (SIGSEGV), ``exit`` (status 3, no
result), ``error`` (an exception), ``garbage`` (an unreadable result); LABEL the worker's label
(``gpu:3``); WHEN ``setup``, ``turn`` (default: when its first turn starts) or a step number N
(just before announcing step N, like a rank stuck before joining a collective). The worker side
(child.py) parses the entries aimed at it and fires them. Never set it in production.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass

TEST_FAULT_ENV = "GPU_MONITOR_WORKER_TEST_FAULT"


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


def trigger(fault: TestFault) -> None:
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
        raise Garbage()


class Garbage(Exception):
    """Raised by a ``garbage`` fault: the worker then writes an unreadable result."""
