"""The real daemon, in its own process, started on a damaged state file.

Configured to recover (the default), it moves the file aside, starts healthy, says so in its
log, on /metrics and in one Event on the fake apiserver (reached through a kubeconfig, as on a
workstation), and a restart neither repeats the Event nor moves anything. Configured not to, or
given a newer release's file, it exits 2 with the message and leaves the file as it was.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from gpu_monitor.state.errors import RECOVER_COMMAND
from gpu_monitor.state.recovery import corrupt_copies
from tests.conftest import REPO
from tests.kube.fake_apiserver import FakeApiServer
from tests.state.state_damage import (
    assert_untouched,
    make_malformed_page_with_live_wal,
    make_newer_version,
    snapshot,
)

NODE = "gpu-node-1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def fake():
    server = FakeApiServer().start()
    server.add_node(NODE, gpus=8)
    server.add_object({"apiVersion": "v1", "kind": "ConfigMap",
                       "metadata": {"name": "gpu-monitor-breaker", "namespace": "gpu-monitor"},
                       "data": {"state": "closed", "paused": "false", "slots": "{}"}})
    try:
        yield server
    finally:
        server.stop()


def write_config(tmp_path: Path, fake: FakeApiServer, recover: bool = True) -> tuple[str, str]:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: fake\n"
        f"clusters: [{{name: fake, cluster: {{server: '{fake.url}'}}}}]\n"
        "users: [{name: fake, user: {}}]\n"
        "contexts: [{name: fake, context: {cluster: fake, user: fake}}]\n")
    config = tmp_path / "config.yaml"
    config.write_text(
        "daemon:\n  bootstrap_on_start: false\n"
        f"  recover_corrupt_state: {'true' if recover else 'false'}\n"
        "remediation:\n  enabled: true\n  dry_run: true\n")
    return str(config), str(kubeconfig)


class DaemonProcess:
    def __init__(self, tmp_path: Path, state: str, config: str, kubeconfig: str,
                 extra: tuple[str, ...] = ()):
        self.port = free_port()
        tmpdir = tmp_path / "tmp"
        tmpdir.mkdir(exist_ok=True)
        env = dict(os.environ, KUBECONFIG=kubeconfig, NODE_NAME=NODE, TMPDIR=str(tmpdir),
                   PYTHONPATH=str(REPO))
        env.pop("KUBERNETES_SERVICE_HOST", None)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gpu_monitor", "daemon", "--simulate", "h100-sxm-8",
             "--state", state, "--config", config, "--listen", f"127.0.0.1:{self.port}",
             "--log-level", "info", *extra],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def get(self, path: str) -> tuple[int, str]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as r:
            return r.status, r.read().decode()

    def wait_for(self, condition, what: str, timeout: float = 90.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                _, err = self.proc.communicate()
                pytest.fail(f"the daemon exited {self.proc.returncode} waiting for {what}: "
                            f"{err[-3000:]}")
            try:
                value = condition()
            except OSError:
                value = None
            if value:
                return value
            time.sleep(0.2)
        pytest.fail(f"timed out waiting for {what}")

    def stop(self) -> str:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            _, err = self.proc.communicate(timeout=30)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
        assert self.proc.returncode == 0, err[-3000:]
        return err


def recovery_events(fake):
    return [e for e in fake.list("", "events") if e["reason"] == "StateRecovered"
            and (e.get("involvedObject") or {}).get("name") == NODE]


def metric(text: str, name: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


@pytest.mark.slow
def test_a_daemon_configured_to_recover_starts_healthy_on_a_damaged_file(fake, tmp_path):
    state = str(tmp_path / "state.db")
    make_malformed_page_with_live_wal(state)
    before = snapshot(state)
    config, kubeconfig = write_config(tmp_path, fake)

    daemon = DaemonProcess(tmp_path, state, config, kubeconfig)
    try:
        daemon.wait_for(lambda: daemon.get("/readyz")[0] == 200, "/readyz")
        assert daemon.get("/healthz")[0] == 200
        text = daemon.wait_for(
            lambda: (lambda t: t if metric(t, "gpu_monitor_state_recoveries_total") else None)(
                daemon.get("/metrics")[1]), "the recoveries counter")
        assert metric(text, "gpu_monitor_state_recoveries_total") == 1.0
        assert 'gpu_monitor_check_status{check="inventory",status="ok",target="gpu:0"} 1.0' \
            in daemon.wait_for(lambda: (lambda t: t if 'check="inventory"' in t else None)(
                daemon.get("/metrics")[1]), "the first poll results")
        events = daemon.wait_for(lambda: recovery_events(fake), "the StateRecovered Event")
    finally:
        err = daemon.stop()
    (moved,) = corrupt_copies(state)
    assert {k: snapshot(moved).get(k) for k in before} == before  # the file and its WAL, intact
    assert len(events) == 1 and moved in events[0]["message"]
    assert f"moved it aside to {moved}" in err and "Traceback" not in err

    # A restart opens the fresh store: no second move, no second Event, the counter kept.
    seen = len(fake.requests)
    daemon = DaemonProcess(tmp_path, state, config, kubeconfig)
    try:
        daemon.wait_for(lambda: daemon.get("/readyz")[0] == 200, "/readyz after the restart")
        assert metric(daemon.get("/metrics")[1], "gpu_monitor_state_recoveries_total") == 1.0
        # The breaker read ends the remediator's first tick; the Event would come before it.
        daemon.wait_for(lambda: any(q.path.endswith("/configmaps/gpu-monitor-breaker")
                                    for q in fake.requests[seen:]), "the first tick's end")
    finally:
        err = daemon.stop()
    assert corrupt_copies(state) == [moved]
    assert len(recovery_events(fake)) == 1
    assert "moved it aside" not in err


@pytest.mark.parametrize("case", ["recovery-off", "newer-release"])
def test_a_daemon_that_must_not_recover_exits_2_and_leaves_the_file(fake, tmp_path, case):
    state = str(tmp_path / "state.db")
    if case == "newer-release":
        make_newer_version(state)
    else:
        make_malformed_page_with_live_wal(state)
    before = snapshot(state)
    config, kubeconfig = write_config(tmp_path, fake, recover=case != "recovery-off")
    daemon = DaemonProcess(tmp_path, state, config, kubeconfig)
    _, err = daemon.proc.communicate(timeout=120)
    assert daemon.proc.returncode == 2, err[-3000:]
    assert "Traceback" not in err and state in err
    if case == "newer-release":
        assert "newer" in err and "downgrade" in err
    else:
        assert f"{RECOVER_COMMAND} --state {state}" in err
    assert_untouched(state, before)
    assert corrupt_copies(state) == []
    assert os.listdir(tmp_path / "tmp") == []  # the simulated node's tree went with it
