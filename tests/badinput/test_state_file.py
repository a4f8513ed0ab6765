"""Bad input class: the state file. Every kind of damaged or refused state file, under every
command that opens the store without recovering it, is a usage error (exit 2) naming the file
and what to do, with no traceback, and leaves the file exactly as it was.

The table is generated: each kind of file in tests/state/state_damage.py (the damaged ones, a
directory, a newer release's file) crossed with each one-shot command. The long-running
daemon recovers instead (tests/test_daemon_state_recovery.py).
"""

from __future__ import annotations

import dataclasses

import pytest

from gpu_monitor.state.errors import RECOVER_COMMAND
from gpu_monitor.state.recovery import corrupt_copies
from tests.badinput.harness import config_case, ids, run_case
from tests.state.state_damage import (
    DAMAGED,
    assert_untouched,
    make_directory,
    make_newer_version,
    snapshot,
)

STATE = "{tmp}/state.db"
RECOVERY_WORDS = ("state.db", f"{RECOVER_COMMAND} --state", ".corrupt-<timestamp>")

# (id, maker, words the error must hold)
FILES = [(name, make, RECOVERY_WORDS + (detail,)) for name, make, detail in DAMAGED] + [
    ("a-directory", make_directory, RECOVERY_WORDS + ("directory",)),
    ("newer-release", make_newer_version, ("state.db", "newer", "downgrade", RECOVER_COMMAND)),
]

COMMANDS = {
    "check": ("check", "inventory", "--simulate", "h100-sxm-8"),
    "bootstrap": ("bootstrap", "--checks", "inventory", "--simulate", "h100-sxm-8"),
    "daemon-once": ("daemon", "--once", "--simulate", "h100-sxm-8"),
    "check-real-host": ("check", "inventory", "--path.sysfs", "{tmp}/sys",
                        "--path.procfs", "{tmp}/proc"),
}


def _setup(make):
    def setup(tmp):
        (tmp / "sys").mkdir(exist_ok=True)
        (tmp / "proc").mkdir(exist_ok=True)
        make(str(tmp / "state.db"))
    return setup


CASES = [
    config_case(f"{command}-{name}", (*argv, "--state", STATE, "--log-level", "error"), words,
                setup=_setup(make))
    for name, make, words in FILES
    for command, argv in COMMANDS.items()
]


def test_the_table_covers_every_kind_under_every_command():
    assert len(CASES) == len(FILES) * len(COMMANDS) >= 40


@pytest.mark.parametrize("case", CASES, ids=ids(CASES))
def test_a_bad_state_file_is_a_clear_usage_error_and_left_alone(case, tmp_path, capsys, caplog):
    snapshots = {}
    original = case.setup

    def setup(tmp):
        original(tmp)
        snapshots["before"] = snapshot(str(tmp / "state.db"))

    run_case(dataclasses.replace(case, setup=setup), tmp_path, capsys, caplog)
    path = str(tmp_path / "state.db")
    assert_untouched(path, snapshots["before"])
    assert corrupt_copies(path) == []  # one-shot commands never move a file aside
