"""``gpu-monitor slurm-hook``: as slurmd runs it (a separate process, $SLURMD_NODENAME set),
on the simulated node; the healthcheck drains through a real slurmctld."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import yaml

from gpu_monitor.remediate.slurm.reason import parse_reason
from gpu_monitor.remediate.slurm.tools import SlurmTools
from tests.slurm.cluster import EXTRA, PARTITION

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# the bootstrap suite cut to quick checks: the hooks' exit codes, not the active checks'
QUICK = ["inventory", "xid", "ecc_memory", "temperature"]


def hook(tmp_path, name: str, *args: str, node: str = "gm-hook", config: dict | None = None,
         env: dict | None = None) -> subprocess.CompletedProcess:
    cfg = tmp_path / "config.yaml"
    cfg.write_text(yaml.safe_dump({"enabled_checks": QUICK, **(config or {})}))
    return subprocess.run(
        [sys.executable, "-m", "gpu_monitor", "slurm-hook", name, "--simulate", "h100-sxm-8",
         "--config", str(cfg), "--state", str(tmp_path / "state.db"), *args],
        capture_output=True, text=True, timeout=300, cwd=REPO,
        env={**os.environ, "PYTHONPATH": REPO, "SLURMD_NODENAME": node, **(env or {})})


@pytest.mark.parametrize("name", ["prolog", "epilog"])
def test_prolog_and_epilog_exit_1_only_when_the_node_is_unhealthy(tmp_path, name):
    healthy = hook(tmp_path, name)
    assert healthy.returncode == 0, healthy.stderr
    assert "verdict healthy" in healthy.stderr
    sick = hook(tmp_path, name, "--inject", "row-remap-failure@gpu:2")
    assert sick.returncode == 1, sick.stderr  # slurmd drains the node (and requeues the job)
    assert "verdict unhealthy" in sick.stderr


def test_a_hook_over_its_budget_exits_0_and_says_so(tmp_path):
    out = hook(tmp_path, "prolog", "--budget", "0.01", "--inject", "row-remap-failure@gpu:2")
    assert out.returncode == 0, out.stderr
    assert "over its budget of 0.01 s" in out.stderr


def test_the_healthcheck_drains_the_node_through_the_same_delivery(tmp_path, slurm):
    node = EXTRA[8]
    config = {"daemon": {"backend": "slurm"},
              "checks": {"xid": {"remediation": {"Xid79": "drain"}}},
              "remediation": {"enabled": True, "dry_run": False, "hysteresis_polls": 1,
                              "drain": {"timeout_s": 30},
                              "slurm": {"partitions": [PARTITION], "gres": None}}}
    out = hook(tmp_path, "healthcheck", "--inject", "xid@gpu:3,code=79", node=node,
               config=config, env={"SLURM_CONF": str(slurm.conf)})
    assert out.returncode == 1, out.stderr
    assert "node state quarantined" in out.stderr, out.stderr
    rec = SlurmTools(20.0).show_node(node)
    ours = parse_reason(rec.reason)
    assert rec.drained and ours is not None and ours.token == "Xid79", rec
    assert ours.detail == ("xid", "gpu:3")
    # the next pass, clean: the same store's quarantine is released, the node resumed
    clean = hook(tmp_path, "healthcheck", node=node, config={
        **config, "remediation": {**config["remediation"], "hysteresis_s": 0}},
        env={"SLURM_CONF": str(slurm.conf)})
    assert clean.returncode == 0, clean.stderr
    assert not SlurmTools(20.0).show_node(node).drained, clean.stderr
