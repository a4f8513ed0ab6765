"""The read-only door (state/readonly.py) and what ``status``/``history`` say about bad files.

Each bad file is one of tests/state/state_damage.py's real kinds; the commands must exit 1 with a
message naming the file (never a traceback) and leave the file byte for byte as it was.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from datetime import timedelta

import pytest

from gpu_monitor.cli import main
from gpu_monitor.clock import FakeClock
from gpu_monitor.model import Result, RunOutcome, Status
from gpu_monitor.state import Store
from gpu_monitor.state.errors import StoreCorruptError, StoreError, StoreVersionError
from gpu_monitor.state.readonly import StoreAbsentError, open_read_only
from gpu_monitor.state.schema import LATEST_VERSION
from tests.conftest import REPO
from tests.state.state_damage import (
    DAMAGED,
    assert_untouched,
    make_directory,
    make_newer_version,
    populated,
    snapshot,
)


def _store_with_results(path: str) -> None:
    clock = FakeClock()
    with Store.open(path, clock) as s:
        for status in (Status.OK, Status.FAILED):
            r = Result("nvlink_state", status, "nvlink:3:2",
                       reason="Ok" if status is Status.OK else "NvLinkDown",
                       observed_at=clock.now())
            s.record_run(RunOutcome("nvlink_state", (r,), clock.now(), 0.1, True))
            clock.advance(10)


def test_a_read_only_store_reads_what_the_daemon_wrote(tmp_path):
    path = str(tmp_path / "state.db")
    _store_with_results(path)
    with open_read_only(path) as store:
        assert [r.reason for r in store.latest_results()] == ["NvLinkDown"]
        assert len(store.results_for("nvlink_state")) == 2


def test_a_read_only_store_refuses_every_write(tmp_path):
    path = str(tmp_path / "state.db")
    _store_with_results(path)
    before = snapshot(path)
    with open_read_only(path) as store, pytest.raises(StoreError):
        store.set_kv("remediation", "policy", "{}")
    assert_untouched(path, before)


def test_an_older_schema_is_not_migrated_but_refused(tmp_path):
    from gpu_monitor.state.schema import MIGRATIONS

    path = str(tmp_path / "state.db")
    with Store.open(path, migrations=MIGRATIONS[:-1]):
        pass
    before = snapshot(path)
    with pytest.raises(StoreError, match=f"older than the {LATEST_VERSION}"):
        open_read_only(path)
    assert_untouched(path, before)


@pytest.mark.parametrize(("maker", "error"), [
    (None, StoreAbsentError),
    (make_directory, StoreCorruptError),
    (make_newer_version, StoreVersionError),
    *[(maker, StoreCorruptError) for _, maker, _ in DAMAGED],
], ids=["absent", "directory", "newer-version", *[kind for kind, _, _ in DAMAGED]])
def test_a_bad_file_is_a_store_error_naming_it(tmp_path, maker, error):
    path = str(tmp_path / "state.db")
    if maker is not None:
        maker(path)
    with pytest.raises(error) as exc:
        open_read_only(path)
    assert path in str(exc.value)


def test_an_empty_file_is_no_store_yet(tmp_path):
    path = tmp_path / "state.db"
    path.write_bytes(b"")
    with pytest.raises(StoreError, match="no gpu-monitor store yet"):
        open_read_only(str(path))
    assert path.read_bytes() == b""


@pytest.mark.parametrize("command", ["status", "history"])
@pytest.mark.parametrize(("kind", "maker"), [
    ("absent", None), ("newer-version", make_newer_version),
    *[(kind, maker) for kind, maker, _ in DAMAGED]])
def test_the_commands_exit_1_naming_a_bad_file_and_leave_it_alone(
        tmp_path, capsys, command, kind, maker):
    path = str(tmp_path / "state.db")
    if maker is not None:
        maker(path)
    before = snapshot(path)
    rc = main([command, "--state", path])
    out, err = capsys.readouterr()
    assert rc == 1
    assert err.startswith("gpu-monitor: ") and path in err
    assert "Traceback" not in err and out == ""
    assert_untouched(path, before)
    assert os.path.exists(path) == (maker is not None)


def test_the_json_form_of_a_bad_file_names_it_too(tmp_path, capsys):
    path = str(tmp_path / "state.db")
    rc = main(["status", "--state", path, "-o", "json"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 1 and doc["state_file"] == path and "does not exist" in doc["error"]


@pytest.mark.parametrize("argv", [
    ["history", "--since", "yesterday"],
    ["history", "--since", "1x"],
    ["history", "--limit", "0"],
    ["status", "--config", "/nonexistent/gpu-monitor.yaml"],
])
def test_bad_flags_exit_2_with_a_message(tmp_path, capsys, argv):
    path = str(tmp_path / "state.db")
    populated(path, n=3)
    rc = main([*argv, "--state", path])
    err = capsys.readouterr().err
    assert rc == 2 and "gpu-monitor: error:" in err and "Traceback" not in err


def _can_bind_mount_read_only(tmp_path) -> bool:
    src, dst = tmp_path / "probe-src", tmp_path / "probe-dst"
    src.mkdir()
    dst.mkdir()
    if not shutil.which("unshare"):
        return False
    got = subprocess.run(["unshare", "-m", "sh", "-c", f"mount --bind -o ro {src} {dst}"],
                         capture_output=True)
    return got.returncode == 0


def test_a_copy_without_its_wal_on_a_read_only_mount_is_read(tmp_path):
    """Guarantee 3: no -wal or -shm can be made there, so SQLite is told the file is fixed."""
    if not _can_bind_mount_read_only(tmp_path):
        pytest.skip("needs `unshare -m` and a bind mount (root in a mount namespace)")
    copy_dir, ro_dir = tmp_path / "copy", tmp_path / "ro"
    copy_dir.mkdir()
    ro_dir.mkdir()
    _store_with_results(str(copy_dir / "state.db"))
    assert sorted(os.listdir(copy_dir)) == ["state.db"]  # checkpointed, closed: no -wal
    script = (f"mount --bind -o ro {copy_dir} {ro_dir} && exec {sys.executable} -m "
              f"gpu_monitor status -o json --state {ro_dir / 'state.db'}")
    got = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=str(REPO)), timeout=120)
    assert got.returncode == 0, got.stderr
    doc = json.loads(got.stdout)
    assert doc["results"]["failed"] == 1
    assert sorted(os.listdir(copy_dir)) == ["state.db"]


def test_result_rows_are_every_result_oldest_first_filtered_as_asked(tmp_path):
    path = str(tmp_path / "state.db")
    clock = FakeClock()
    with Store.open(path, clock) as s:
        for _ in range(3):
            rs = tuple(Result(c, Status.OK, f"gpu:{g}", observed_at=clock.now())
                       for c in ("xid", "power") for g in (0, 1))
            s.record_run(RunOutcome("xid", rs, clock.now(), 0.1, True))
            clock.advance(60)
        mid = clock.now() - timedelta(seconds=90)
    with open_read_only(path, clock) as store:
        rows = store.result_rows()
        assert len(rows) == 12 and [r[7] for r in rows] == sorted(r[7] for r in rows)
        assert {(r[0], r[1]) for r in store.result_rows(check="power", target="gpu:1")} == {
            ("power", "gpu:1")}
        recent = store.result_rows(since=mid)
        assert len(recent) == 4 and all(r[7] >= mid for r in recent)
