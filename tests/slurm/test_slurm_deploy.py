"""deploy/slurm: the systemd unit passes systemd-analyze verify; the config example loads and
is what the unit runs."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from gpu_monitor.config import load_config

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "slurm"
UNIT = DEPLOY / "gpu-monitor.service"
INSTALLED = "/usr/local/bin/gpu-monitor"


def problems(unit: Path) -> list[str]:
    """What ``systemd-analyze verify`` says about ``unit`` (a warning is a problem too: an
    unparsable directive is "ignored" with exit 0)."""
    out = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True,
                         text=True, timeout=120)
    said = [line for line in (out.stdout + out.stderr).splitlines() if unit.name in line]
    return said + ([f"exit {out.returncode}"] if out.returncode else [])


def test_the_unit_passes_systemd_analyze_verify(tmp_path):
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze not installed (apt-get install systemd)")
    text = UNIT.read_text()
    assert f"ExecStart={INSTALLED} daemon --backend slurm " in text
    # verify checks that ExecStart's program exists: the installed path (INSTALL.md) is
    # pointed at a stand-in here; every other line is the shipped unit's
    stand_in = tmp_path / "gpu-monitor"
    stand_in.write_text("#!/bin/sh\nexit 0\n")
    stand_in.chmod(0o755)
    unit = tmp_path / "gpu-monitor.service"
    unit.write_text(text.replace(INSTALLED, str(stand_in)))
    assert problems(unit) == []


def test_a_broken_unit_fails_the_same_verification(tmp_path):
    """The check above can fail: an unknown directive in [Service] is reported."""
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze not installed")
    unit = tmp_path / "gpu-monitor.service"
    unit.write_text(UNIT.read_text().replace(INSTALLED, "/bin/true")
                    .replace("Restart=always", "Restart=sometimes"))
    assert any("restart specifier" in line for line in problems(unit))


def test_the_config_example_loads_with_the_slurm_backend():
    cfg = load_config(DEPLOY / "config.yaml", env={})
    assert cfg.daemon.backend == "slurm"
    assert cfg.remediation.enabled and cfg.remediation.dry_run  # a first install drains nothing
    assert cfg.remediation.slurm.partitions == ("gpu",)
    unit_config = re.search(r"--config (\S+)", UNIT.read_text()).group(1)
    assert unit_config == "/etc/gpu-monitor/config.yaml"
    assert yaml.safe_load((DEPLOY / "config.yaml").read_text())["daemon"]["backend"] == "slurm"
