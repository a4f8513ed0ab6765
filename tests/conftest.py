"""Shared test fixtures: where the real sample data lives, clocks, temp host trees."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


# The recorded real outputs the tests read: copied into the repository (with their provenance,
# tests/fixtures/PROVENANCE.md) so that the test command passes in a fresh clone with nothing
# beside it.
FIXTURES = REPO / "tests" / "fixtures"


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    return FIXTURES


@pytest.fixture
def fake_clock():
    from gpu_monitor.clock import FakeClock

    return FakeClock()


@pytest.fixture
def check_rig():
    """Build ``CheckRig``s (tests/checks/rig.py) with the rig's arguments; each is closed after
    the test."""
    from tests.checks.rig import CheckRig

    made: list[CheckRig] = []

    def make(*args, **kw) -> CheckRig:
        made.append(CheckRig(*args, **kw))
        return made[-1]

    yield make
    for rig in made:
        rig.close()


def pytest_addoption(parser):
    parser.addoption("--update-golden", action="store_true", default=False,
                     help="rewrite tests/golden/*.prom from the current exposition")


@pytest.fixture
def update_golden(request) -> bool:
    return bool(request.config.getoption("--update-golden")
                or os.environ.get("GPU_MONITOR_UPDATE_GOLDEN"))


@pytest.fixture(autouse=True)
def _restore_root_logging():
    """CLI tests configure the root logger; give every test the logging it started with."""
    import logging

    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


_GUARDED_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP")


@pytest.fixture(autouse=True)
def _signal_handlers_are_left_as_found():
    """A test that runs a command in-process must leave the process's signal handlers as it
    found them: a handler left behind (a daemon's ``stop``) would swallow a later test's
    Ctrl-C. The handler is put back, and the test that left it fails."""
    import signal

    before = {name: signal.getsignal(getattr(signal, name)) for name in _GUARDED_SIGNALS}
    yield
    changed = []
    for name, handler in before.items():
        signum = getattr(signal, name)
        now = signal.getsignal(signum)
        if now is not handler:
            changed.append(f"{name}: {handler!r} -> {now!r}")
            signal.signal(signum, handler)
    assert not changed, "the test left signal handlers changed: " + "; ".join(changed)
