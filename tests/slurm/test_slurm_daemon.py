"""``gpu-monitor daemon --backend slurm`` as a process: a fault on the (simulated) node ends in
a drain with our reason through the real slurmctld; `gpu-monitor status` says the same state."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys

import yaml

from gpu_monitor.remediate.slurm.reason import parse_reason
from gpu_monitor.remediate.slurm.tools import SlurmError, SlurmTools
from tests.slurm.cluster import EXTRA, PARTITION
from tests.waiting import eventually

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_daemon_backend_slurm_drains_its_node_and_status_shows_it(slurm, tmp_path):
    node = EXTRA[9]
    cfg = tmp_path / "config.yaml"
    cfg.write_text(yaml.safe_dump({
        "enabled_checks": ["inventory", "xid", "ecc_memory", "temperature"],
        "checks": {"xid": {"remediation": {"Xid79": "drain"}}},
        "daemon": {"bootstrap_on_start": False},
        "remediation": {"enabled": True, "dry_run": False, "hysteresis_polls": 1,
                        "drain": {"timeout_s": 30},
                        "slurm": {"partitions": [PARTITION], "gres": None}},
    }))
    state = tmp_path / "state.db"
    log = tmp_path / "daemon.log"
    env = {**os.environ, "PYTHONPATH": REPO, "SLURM_CONF": str(slurm.conf)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpu_monitor", "daemon", "--backend", "slurm",
         "--simulate", "h100-sxm-8", "--inject", "xid@gpu:3,code=79", "--node-name", node,
         "--config", str(cfg), "--state", str(state), "--listen", f"127.0.0.1:{free_port()}"],
        cwd=REPO, env=env, stderr=log.open("w"), text=True)
    tools = SlurmTools(20.0)

    def ours():
        try:
            rec = tools.show_node(node)
        except SlurmError:
            return None
        found = parse_reason(rec.reason) if rec.drained else None
        return found if found is not None and found.state != "claim" else None

    try:
        found = eventually(lambda: proc.poll() is None and ours(), timeout=180,
                           what=f"{node} drained by the daemon (past the breaker's claim)")
        assert found.token == "Xid79" and found.state == "quarantined"
        status = subprocess.run(
            [sys.executable, "-m", "gpu_monitor", "status", "--state", str(state), "-o", "json"],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
        body = json.loads(status.stdout)
        assert body["lifecycle"]["state"] == "quarantined", {k: body[k] for k in body
                                                             if k != "checks"}
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        assert proc.returncode == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
