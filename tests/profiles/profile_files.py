"""The shipped profile files, and a profile file written for a test."""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.conftest import REPO

SHIPPED = ("a100-sxm-8", "cpu-only", "h100-sxm-8", "h200-sxm-8")
GPU_PROFILES = ("a100-sxm-8", "h100-sxm-8", "h200-sxm-8")
PROFILE_DIR = REPO / "gpu_monitor" / "profiles"


def shipped_dict(name: str) -> dict:
    """A shipped profile as plain data, read as a user would read the file."""
    return yaml.safe_load((PROFILE_DIR / f"{name}.yaml").read_text())


def write_profile(tmp_path: Path, data, name: str = "custom.yaml") -> Path:
    """``data`` (text, or data dumped as YAML) written to ``tmp_path/name``."""
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data, sort_keys=False))
    return path
