"""``gpu-monitor state check`` and ``gpu-monitor state recover``: the state file, by hand.

Why: a damaged state file stops the daemon (unless ``daemon.recover_corrupt_state`` lets it
recover at start), and the error message tells the operator to run ``state recover``. ``check``
judges the file without changing it; ``recover`` moves a damaged file aside and creates an
empty store (recovery.py). Both take the path from ``--state``, else the config's
``state_path``, else the daemon's default, so that on a node they find the daemon's file.

Exit codes: 0 sound, absent or recovered; 1 damaged (``check`` only: ``recover`` fixes it);
2 refused or failed: a newer release's file (a downgrade), a file gpu-monitor may not read,
bad flags or config, a move that failed.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from gpu_monitor import logs
from gpu_monitor.config import ConfigError, load_config
from gpu_monitor.hw.paths import DEFAULT_STATE_DB
from gpu_monitor.model import EXIT_USAGE, UsageError
from gpu_monitor.state.errors import StoreCorruptError, StoreError
from gpu_monitor.state.files import check_file
from gpu_monitor.state.recovery import corrupt_copies, recover

EXIT_DAMAGED = 1

DESCRIPTION = """\
The state database (default /var/lib/gpu-monitor/state.db, the daemon's; --state or the
config's state_path choose another):

  gpu-monitor state check     judge it without changing it
  gpu-monitor state recover   move a damaged file (with its -wal/-shm) aside to
                              <file>.corrupt-<UTC timestamp> and create an empty store

Nothing is ever deleted. A file written by a newer gpu-monitor is refused (starting empty
would be a downgrade); so is one gpu-monitor may not read (fix its permissions instead).
Stop the daemon before `recover` (or set daemon.recover_corrupt_state: true and let the
daemon do it at start).

exit codes: 0 sound, absent or recovered; 1 damaged (check); 2 refused or failed"""


def register(sub: Any) -> None:
    st = sub.add_parser("state", help="check the state database, or recover a damaged one",
                        description=DESCRIPTION,
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    ssub = st.add_subparsers(dest="state_command", metavar="ACTION")
    ssub.required = True
    for name, text, fn in (
        ("check", "judge the state file without changing it (exit 0 sound, 1 damaged, "
                  "2 unusable by this release)", cmd_check),
        ("recover", "move a damaged state file (with its -wal/-shm) aside to "
                    "<file>.corrupt-<timestamp> and create an empty store; deletes nothing; "
                    "refuses a newer release's file. Stop the daemon first.", cmd_recover),
    ):
        p = ssub.add_parser(name, help=text, description=text)
        p.add_argument("--state", metavar="PATH",
                       help="state database (default: state_path from --config, else "
                            "/var/lib/gpu-monitor/state.db, the daemon's)")
        p.add_argument("--config", metavar="FILE", help="YAML configuration file")
        p.add_argument("--output", "-o", choices=("table", "json"), default="table")
        p.set_defaults(func=fn)


def _path(args: argparse.Namespace) -> str:
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    logs.setup(config.log_format, config.log_level)
    path = args.state or config.state_path or DEFAULT_STATE_DB
    if path == ":memory:":
        raise UsageError("--state :memory: has no file to check or recover")
    return path


def _emit(args: argparse.Namespace, report: dict[str, Any], text: str, code: int) -> int:
    if args.output == "json":
        print(json.dumps(report, indent=2))
    else:
        print(text, file=sys.stdout if code == 0 else sys.stderr)
    return code


def _copies_note(path: str) -> str:
    copies = corrupt_copies(path)
    if not copies:
        return ""
    return f"; damaged copies kept beside it: {len(copies)} (newest {copies[-1]})"


def _emit_intact(args: argparse.Namespace, report: dict[str, Any], version: int | None, *,
                 absent: str, sound: str) -> int:
    """A file that needs nothing, for both commands: absent (``version`` None: the daemon
    creates it at start) or sound at schema ``version``; exit 0 either way."""
    if version is None:
        report.update(status="absent")
        return _emit(args, report, absent, 0)
    report.update(status="sound", schema_version=version)
    return _emit(args, report, sound, 0)


def cmd_check(args: argparse.Namespace) -> int:
    path = _path(args)
    report: dict[str, Any] = {"path": path, "copies": corrupt_copies(path)}
    try:
        version = check_file(path, integrity="full")
    except StoreCorruptError as exc:
        report.update(status="damaged" if exc.cause != "access" else "unreadable",
                      cause=exc.cause, detail=exc.detail, message=str(exc))
        return _emit(args, report, f"gpu-monitor: {exc}",
                     EXIT_USAGE if exc.cause == "access" else EXIT_DAMAGED)
    except StoreError as exc:
        report.update(status="refused", message=str(exc))
        return _emit(args, report, f"gpu-monitor: {exc}", EXIT_USAGE)
    note = _copies_note(path)
    return _emit_intact(args, report, version,
                        absent=f"state file {path} does not exist: the daemon creates an "
                               f"empty store there at start{note}",
                        sound=f"state file {path}: sound (schema version {version}, "
                              f"integrity_check ok){note}")


def cmd_recover(args: argparse.Namespace) -> int:
    path = _path(args)
    report: dict[str, Any] = {"path": path}
    try:
        version = check_file(path, integrity="full")
    except StoreCorruptError as exc:
        if exc.cause == "access":
            report.update(status="refused", cause=exc.cause, message=str(exc))
            return _emit(args, report, f"gpu-monitor: {exc}", EXIT_USAGE)
    except StoreError as exc:
        if type(exc) is not StoreError:  # a newer release's file: never moved aside
            report.update(status="refused", message=str(exc))
            return _emit(args, report, f"gpu-monitor: {exc}", EXIT_USAGE)
        # Only a writer can judge it (an interrupted transaction): recover() opens it so.
    else:
        return _emit_intact(args, report, version,
                            absent=f"nothing to recover: state file {path} does not exist "
                                   f"(the daemon creates it at start)",
                            sound=f"nothing to recover: state file {path} is sound (schema "
                                  f"version {version}); it was left as it is")
    try:
        store, rec = recover(path, by="cli", integrity="full")
    except StoreError as exc:
        report.update(status="refused", message=str(exc))
        return _emit(args, report, f"gpu-monitor: {exc}", EXIT_USAGE)
    with store:
        version = store.schema_version
    if rec is None:
        report.update(status="sound", schema_version=version)
        return _emit(args, report, f"nothing to recover: state file {path} is sound", 0)
    report.update(status="recovered", moved_to=rec.moved_to, moved=list(rec.moved),
                  detail=rec.detail, copies=rec.copies, schema_version=version)
    moved = ", ".join(rec.moved)
    return _emit(args, report,
                 f"state file {path} was damaged ({rec.detail}).\n"
                 f"moved aside (nothing deleted): {moved}\n"
                 f"created an empty store at {path} (schema version {version}); start the "
                 f"daemon: it begins with an empty history, re-reads quarantine state from the "
                 f"node's labels and raises a StateRecovered Event", 0)
