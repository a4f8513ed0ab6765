"""``--simulate`` runs leave nothing in the temporary directory: after success, after a usage
error at any point, after Ctrl-C (SIGINT) and SIGTERM in the middle of a check running workers.
Each test lists a private temporary directory before and after, in-process and in a subprocess.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest

from gpu_monitor.cli import main
from tests.conftest import REPO
from tests.waiting import eventually

SIM = ("--simulate", "h100-sxm-8")
QUIET = ("--log-level", "error")


@pytest.fixture
def tmpdir_listing(tmp_path, monkeypatch):
    """A private temporary directory for this process (``tempfile`` reads ``tempfile.tempdir``
    first), empty before the test."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    assert os.listdir(tmp) == []
    return tmp


@pytest.fixture
def sigint_as_at_a_terminal():
    """Ctrl-C reaches a command started at a terminal as KeyboardInterrupt. A shell script that
    starts the suite in the background (``pytest &``, ``nohup``) hands it SIGINT *ignored*, and
    Python then keeps it ignored, as every Unix program does: a Ctrl-C test must set the
    terminal's disposition itself, in-process and for its children, or it tests the harness."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


def _terminal_sigint() -> None:
    """preexec_fn of a child started as at a terminal: SIGINT at its default (see above)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def wait_until(condition, what: str, timeout: float = 120.0):
    return eventually(condition, timeout, interval=0.05, what=what)


def workers_running(tmp: Path) -> bool:
    return any(n.startswith("gpu-monitor-workers-") for n in os.listdir(tmp))


# Every way a run ends before or after its checks, from the success to each usage error that
# can happen once the simulated node exists.
ENDINGS = [
    ("success", ("check", "inventory", *SIM), 0),
    ("unhealthy", ("check", "inventory", *SIM, "--inject", "gpu-missing@gpu:7"), 1),
    ("daemon-once", ("daemon", "--once", *SIM), 0),
    ("kmsg-with-simulate", ("check", "xid", *SIM, "--kmsg", "/dev/null"), 3),  # log gave nothing
    ("fault-target-not-on-node", ("check", "inventory", *SIM, "--inject", "hot@gpu:99"), 2),
    ("fault-value-bad", ("check", "inventory", *SIM, "--inject", "hot@gpu:1,core=abc"), 2),
    ("unknown-check", ("check", "no_such_check", *SIM), 2),
    ("unknown-profile", ("check", "inventory", *SIM, "--profile", "no-such-profile"), 2),
    ("damaged-state-file", ("check", "inventory", *SIM, "--state", "{tmp}/garbage.db"), 2),
    ("bad-listen-address", ("daemon", *SIM, "--listen", "999.1.1.1:99999"), 2),
]


@pytest.mark.parametrize(("argv", "code"), [e[1:] for e in ENDINGS], ids=[e[0] for e in ENDINGS])
def test_an_in_process_run_leaves_no_temporary_directory(argv, code, tmpdir_listing, tmp_path,
                                                         capsys):
    (tmp_path / "garbage.db").write_bytes(b"not a database" * 100)
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    assert main([*argv, *QUIET]) == code, capsys.readouterr().err[-2000:]
    assert os.listdir(tmpdir_listing) == []


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)],
                         ids=["ctrl-c", "sigterm"])
def test_an_in_process_run_interrupted_mid_check_removes_its_tree(signum, code, tmpdir_listing,
                                                                   capsys,
                                                                   sigint_as_at_a_terminal):
    main_thread = threading.main_thread().ident
    interrupter: dict[str, object] = {}

    def interrupt():
        try:
            wait_until(lambda: workers_running(tmpdir_listing), "the burn-in's workers")
            interrupter["handler"] = signal.getsignal(signum)
            signal.pthread_kill(main_thread, signum)
            interrupter["sent"] = True
        except BaseException as exc:  # noqa: BLE001 - said by the assertion below
            interrupter["error"] = exc

    threading.Thread(target=interrupt, daemon=True).start()
    # What the interrupter did goes into the message: a signal never sent (the workers were
    # not seen) reads differently from one a stale handler swallowed.
    assert main(["check", "burn_in", *SIM, *QUIET]) == code, interrupter
    capsys.readouterr()
    assert not [n for n in os.listdir(tmpdir_listing) if n.startswith("gpu-monitor-sim-")]
    # The check's thread is abandoned, not killed: its workers' directory goes when it ends.
    wait_until(lambda: os.listdir(tmpdir_listing) == [], "the abandoned run's clean-up")
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # restored after the run


def _subprocess(tmp: Path, *argv: str) -> subprocess.Popen:
    env = dict(os.environ, TMPDIR=str(tmp), PYTHONPATH=str(REPO))
    return subprocess.Popen([sys.executable, "-m", "gpu_monitor", *argv, *QUIET], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_terminal_sigint)


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)],
                         ids=["ctrl-c", "sigterm"])
def test_a_subprocess_interrupted_mid_check_leaves_nothing(signum, code, tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    proc = _subprocess(tmp, "check", "burn_in", *SIM)
    try:
        wait_until(lambda: workers_running(tmp) or proc.poll() is not None,
                   "the burn-in's workers")
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == code, err[-2000:]
    assert "Traceback" not in err
    assert os.listdir(tmp) == []


@pytest.mark.parametrize(("argv", "code"), [
    (("check", "inventory", *SIM), 0),
    (("check", "inventory", *SIM, "--inject", "hot@gpu:99"), 2),
], ids=["success", "usage-error"])
def test_a_subprocess_run_leaves_nothing(argv, code, tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    proc = _subprocess(tmp, *argv)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == code, err[-2000:]
    assert os.listdir(tmp) == []
