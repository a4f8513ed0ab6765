"""``gpu-monitor state check`` and ``gpu-monitor state recover`` on real damaged files, in-process
through ``cli.main``; and where each command keeps its state without ``--state``."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from gpu_monitor.cli import build_env, build_parser, main
from gpu_monitor.state import Store
from gpu_monitor.state.errors import RECOVER_COMMAND
from gpu_monitor.state.recovery import corrupt_copies, recoveries
from gpu_monitor.state.schema import LATEST_VERSION
from tests.state.state_damage import (
    DAMAGED,
    assert_untouched,
    make_directory,
    make_newer_version,
    populated,
    snapshot,
    unreadable_file,
)


@pytest.fixture
def unreadable(tmp_path):
    yield from unreadable_file(tmp_path)


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out, err


@pytest.mark.parametrize(("make", "detail"), [v[1:] for v in DAMAGED], ids=[v[0] for v in DAMAGED])
def test_check_finds_the_damage_and_recover_moves_it_aside(capsys, tmp_path, make, detail):
    path = str(tmp_path / "state.db")
    make(path)
    before = snapshot(path)

    code, _, err = run(capsys, "state", "check", "--state", path)
    assert code == 1 and detail in err and f"{RECOVER_COMMAND} --state {path}" in err
    assert_untouched(path, before)  # check changes nothing

    code, out, _ = run(capsys, "state", "recover", "--state", path, "-o", "json")
    report = json.loads(out)
    assert code == 0 and report["status"] == "recovered" and detail in report["detail"]
    assert report["moved_to"] == corrupt_copies(path)[0]
    moved = snapshot(report["moved_to"])
    assert {k: moved.get(k) for k in before} == before  # every byte kept, companions too
    assert report["moved"][0] == report["moved_to"]
    assert all(os.path.lexists(m) for m in report["moved"])

    code, out, _ = run(capsys, "state", "check", "--state", path, "-o", "json")
    assert code == 0 and json.loads(out)["status"] == "sound"
    with Store.open(path) as s:
        assert s.schema_version == LATEST_VERSION and s.latest_results() == []
        assert [r.by for r in recoveries(s)] == ["cli"]


def test_recover_prints_every_moved_path(capsys, tmp_path):
    path = str(tmp_path / "state.db")
    DAMAGED[[v[0] for v in DAMAGED].index("malformed-page-live-wal")][1](path)
    code, out, _ = run(capsys, "state", "recover", "--state", path)
    (moved,) = corrupt_copies(path)
    assert code == 0
    assert f"{moved}, {moved}-wal" in out and "nothing deleted" in out


def test_a_newer_release_file_is_refused_by_check_and_recover(capsys, tmp_path):
    path = str(tmp_path / "state.db")
    make_newer_version(path)
    before = snapshot(path)
    for action in ("check", "recover"):
        code, _, err = run(capsys, "state", action, "--state", path)
        assert code == 2, action
        assert f"schema version {LATEST_VERSION + 1}" in err and "downgrade" in err
    assert_untouched(path, before)
    assert corrupt_copies(path) == []


def test_a_sound_file_is_left_as_it_is(capsys, tmp_path):
    path = str(tmp_path / "state.db")
    populated(path, 5)
    before = Path(path).read_bytes()
    code, out, _ = run(capsys, "state", "recover", "--state", path)
    assert code == 0 and "nothing to recover" in out and "sound" in out
    assert Path(path).read_bytes() == before and corrupt_copies(path) == []


def test_an_empty_file_is_sound_and_an_absent_one_is_not_created(capsys, tmp_path):
    empty = tmp_path / "empty.db"
    empty.write_bytes(b"")
    assert run(capsys, "state", "check", "--state", str(empty))[0] == 0
    assert run(capsys, "state", "recover", "--state", str(empty))[0] == 0
    assert empty.read_bytes() == b"" and corrupt_copies(str(empty)) == []
    absent = tmp_path / "absent.db"
    for action in ("check", "recover"):
        code, out, _ = run(capsys, "state", action, "--state", str(absent), "-o", "json")
        assert code == 0 and json.loads(out)["status"] == "absent"
    assert not absent.exists()


def test_a_directory_is_moved_aside(capsys, tmp_path):
    path = str(tmp_path / "state.db")
    make_directory(path)
    assert run(capsys, "state", "check", "--state", path)[0] == 1
    assert run(capsys, "state", "recover", "--state", path)[0] == 0
    assert os.path.isfile(path) and os.path.isdir(corrupt_copies(path)[0])


def test_a_file_it_may_not_read_is_refused_not_moved(capsys, unreadable):
    for action in ("check", "recover"):
        with unreadable:
            code = main(["state", action, "--state", unreadable.path])
        _, err = capsys.readouterr()
        assert code == 2 and "may be intact" in err, action
    assert os.path.isfile(unreadable.path) and corrupt_copies(unreadable.path) == []


def test_the_path_comes_from_the_config_when_not_given(capsys, tmp_path):
    path = tmp_path / "from-config.db"
    path.write_bytes(b"garbage" * 100)
    cfg = tmp_path / "config.yaml"
    cfg.write_text(f"state_path: {path}\n")
    code, out, _ = run(capsys, "state", "recover", "--config", str(cfg), "-o", "json")
    assert code == 0 and json.loads(out)["path"] == str(path)
    assert len(corrupt_copies(str(path))) == 1


def test_a_bad_config_is_a_usage_error_naming_the_field(capsys, tmp_path):
    cfg = tmp_path / "config.yaml"
    cfg.write_text("daemon:\n  recover_corrupt_state: perhaps\n")
    code, _, err = run(capsys, "state", "check", "--config", str(cfg))
    assert code == 2 and "daemon.recover_corrupt_state" in err


def test_a_one_shot_check_on_a_damaged_file_names_the_command_and_moves_nothing(capsys,
                                                                                  tmp_path):
    path = str(tmp_path / "state.db")
    DAMAGED[0][1](path)
    before = snapshot(path)
    code, _, err = run(capsys, "check", "inventory", "--simulate", "h100-sxm-8", "--state", path)
    assert code == 2 and f"`{RECOVER_COMMAND} --state {path}`" in err
    assert_untouched(path, before)


# --- where each command keeps its state without --state -----------------------------------------


def _store_path(*argv: str) -> str:
    env = build_env(build_parser().parse_args(list(argv)))
    try:
        return env.store.path
    finally:
        env.close()


def test_one_shot_commands_keep_their_state_in_memory_unless_asked(tmp_path):
    daemon_db = tmp_path / "daemon.db"
    cfg = tmp_path / "config.yaml"
    cfg.write_text(f"state_path: {daemon_db}\nlog_level: error\n")
    sysfs, procfs = tmp_path / "sys", tmp_path / "proc"
    sysfs.mkdir()
    procfs.mkdir()
    host = ["--path.sysfs", str(sysfs), "--path.procfs", str(procfs)]
    assert _store_path("check", "inventory", *host) == ":memory:"
    assert _store_path("bootstrap", *host, "--config", str(cfg)) == ":memory:"
    assert _store_path("check", "inventory", "--simulate", "h100-sxm-8") == ":memory:"
    assert not daemon_db.exists()
    asked = str(tmp_path / "mine.db")
    assert _store_path("check", "inventory", *host, "--state", asked) == asked
    # The daemon keeps its history where the config (the DaemonSet's) says.
    assert _store_path("daemon", *host, "--config", str(cfg)) == str(daemon_db)


def test_help_says_where_each_command_keeps_its_state(capsys):
    for command, words in (("check", "in memory"), ("bootstrap", "in memory"),
                           ("daemon", "/var/lib/gpu-monitor/state.db")):
        with pytest.raises(SystemExit):
            build_parser().parse_args([command, "--help"])
        out = " ".join(capsys.readouterr().out.split())
        assert words in out, command
