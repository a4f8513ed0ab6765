"""``status`` and ``history`` read the store of a daemon that is writing it, and a copy of it.

A real ``gpu-monitor daemon --simulate h100-sxm-8`` (NVLink 2 of GPU 3 down, remediation on
in dry-run against the fake API server) writes its store while the commands run as separate
processes, the way ``kubectl exec`` runs them in the pod. The daemon must keep writing while
a reader holds a snapshot open, and a copied file must be read without being changed.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys

import pytest

from gpu_monitor.state.readonly import open_read_only
from tests.conftest import REPO
from tests.state.state_damage import assert_untouched, snapshot
from tests.test_daemon_state_recovery import DaemonProcess, fake, write_config  # noqa: F401

INJECT = ("--inject", "nvlink-down@gpu:3,link=2")


def gm(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "gpu_monitor", *args], env=env,
                          capture_output=True, text=True, timeout=120)


def status_json(state: str, config: str) -> dict | None:
    got = gm("status", "--state", state, "--config", config, "-o", "json")
    return json.loads(got.stdout) if got.returncode == 0 else None


def _nvlink_down_decided(doc: dict | None) -> dict | None:
    """The status once the daemon judged the link and its remediator remembered it."""
    if not doc or doc["next"]["from"] != "the remediator's memory":
        return None
    results = {(r["check"], r["target"]): r for c in doc["checks"] for r in c["results"]}
    r = results.get(("nvlink_state", "nvlink:3:2"))
    return doc if r and r["status"] == "failed" and doc["breaker"] else None


@pytest.fixture
def daemon(fake, tmp_path):  # noqa: F811 - the fake API server fixture, imported above
    state = str(tmp_path / "state.db")
    config, kubeconfig = write_config(tmp_path, fake)
    d = DaemonProcess(tmp_path, state, config, kubeconfig, extra=INJECT)
    try:
        yield d, state, config
    finally:
        d.stop()


@pytest.mark.slow
def test_status_and_history_read_the_store_a_running_daemon_writes(daemon):
    d, state, config = daemon
    doc = d.wait_for(lambda: _nvlink_down_decided(status_json(state, config)),
                     "status to show NVLink 3:2 failed and the remediator's decision")
    assert doc["lifecycle"]["state"] in ("healthy", "suspect")
    assert doc["next"]["op"] == "reset_gpu" and doc["next"]["reason"] == "NvLinkDown"
    assert doc["next"]["dry_run"] is True and "dry-run" in doc["next"]["step"]
    assert doc["breaker"]["state"] == "closed"
    assert {c["check"] for c in doc["checks"]} >= {"nvlink_state", "xid", "inventory"}

    table = gm("status", "--state", state, "--config", config)
    assert table.returncode == 0, table.stderr
    assert "FAILED    nvlink_state" in table.stdout
    assert "nvlink:3:2" in table.stdout and "next remediation step: quarantine (reset_gpu)" \
        in table.stdout

    hist = gm("history", "--state", state, "--config", config, "--target", "nvlink:3:2",
              "--since", "1h", "-o", "json")
    assert hist.returncode == 0, hist.stderr
    rows = json.loads(hist.stdout)["results"]
    assert rows and all(r["target"] == "nvlink:3:2" for r in rows)
    assert rows[0]["reason"] == "NvLinkDown"

    # A reader holding a snapshot open does not stop the daemon's commits (WAL, no lock).
    with open_read_only(state) as store, store._read():
        before = len(store.results_for("rdma_ports"))
        d.wait_for(lambda: _rows_now(state, "rdma_ports") > before,
                   "the daemon to commit new rdma_ports results while a reader is open")
    d.stop()


def _rows_now(state: str, check: str) -> int:
    with open_read_only(state) as store:
        return len(store.results_for(check))


@pytest.mark.slow
def test_a_copied_state_file_is_read_and_left_as_it_was(daemon, tmp_path):
    d, state, config = daemon
    d.wait_for(lambda: _nvlink_down_decided(status_json(state, config)), "a decided status")
    copy = str(tmp_path / "copy" / "state.db")
    os.makedirs(os.path.dirname(copy))
    # The way docs/cli.md says to take a copy: SQLite's online backup of the live file.
    with sqlite3.connect(f"file:{state}?mode=ro", uri=True) as src, \
            sqlite3.connect(copy) as dst:
        src.backup(dst)
    d.stop()
    before = snapshot(copy)
    got = gm("status", "--state", copy, "--config", config, "-o", "json")
    assert got.returncode == 0, got.stderr
    assert json.loads(got.stdout)["state_file"] == copy
    got = gm("history", "--state", copy, "--config", config, "--check", "nvlink_state",
             "--since", "2d")
    assert got.returncode == 0, got.stderr
    assert "NvLinkDown" in got.stdout
    assert_untouched(copy, before)
