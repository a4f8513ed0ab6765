"""The Dockerfiles build what they claim, as far as can be told without a Docker engine.

Every file they COPY from the build context exists and is not excluded by .dockerignore; the
base images are pinned; the entry point is the ``gpu-monitor`` console script and the default
command parses with the real command line; the health check hits ``/healthz`` on the daemon's
port; the image runs as a non-root user; the full image installs the ``active`` extra and the
passive one does not.
"""

from __future__ import annotations

import fnmatch
import json
import re
import shlex
from dataclasses import dataclass, field

import pytest

from tests.deploy.deploy_helpers import REPO

IMAGES = {"Dockerfile": "active", "Dockerfile.passive": "passive"}


@dataclass
class Dockerfile:
    args: dict[str, str] = field(default_factory=dict)
    stages: list[str] = field(default_factory=list)  # FROM references, resolved
    instructions: list[tuple[str, str]] = field(default_factory=list)  # (INSTRUCTION, rest)

    def all(self, name: str) -> list[str]:
        return [rest for ins, rest in self.instructions if ins == name]

    def last(self, name: str) -> str:
        found = self.all(name)
        assert found, f"no {name} instruction"
        return found[-1]


def parse(name: str) -> Dockerfile:
    """Instructions with line continuations joined and comments dropped."""
    lines, buf = [], ""
    for raw in (REPO / name).read_text(encoding="utf-8").splitlines():
        stripped = raw.strip()
        if not buf and (not stripped or stripped.startswith("#")):
            continue
        if stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            buf += stripped[:-1] + " "
            continue
        lines.append(buf + stripped)
        buf = ""
    df = Dockerfile()
    for line in lines:
        ins, _, rest = line.partition(" ")
        ins, rest = ins.upper(), rest.strip()
        if ins == "ARG" and not df.stages:
            k, _, v = rest.partition("=")
            df.args[k] = v
        if ins == "FROM":
            ref = rest.split()[0]
            df.stages.append(re.sub(r"\$\{(\w+)\}", lambda m: df.args.get(m.group(1), ""), ref))
        df.instructions.append((ins, rest))
    return df


def _dockerignore() -> list[str]:
    path = REPO / ".dockerignore"
    return [line.strip() for line in path.read_text().splitlines()
            if line.strip() and not line.startswith("#")]


def _ignored(rel: str, patterns: list[str]) -> bool:
    ignored = False
    for pat in patterns:
        negate = pat.startswith("!")
        pat = pat.lstrip("!").rstrip("/")
        hit = fnmatch.fnmatch(rel, pat) or fnmatch.fnmatch(rel.split("/")[0], pat) or (
            pat.startswith("**/") and fnmatch.fnmatch(rel.rsplit("/", 1)[-1], pat[3:]))
        if hit:
            ignored = not negate
    return ignored


def _exec_form(rest: str) -> list[str]:
    assert rest.startswith("["), f"use the exec form (JSON array), not {rest!r}"
    return json.loads(rest)


@pytest.mark.parametrize("name", sorted(IMAGES))
def test_copied_files_exist_in_the_build_context_and_are_not_ignored(name):
    df = parse(name)
    patterns = _dockerignore()
    copies = [c for c in df.all("COPY") if not c.startswith("--from")]
    assert copies, f"{name} copies nothing"
    for copy in copies:
        *sources, _dest = shlex.split(copy)
        for src in sources:
            rel = src.rstrip("/")
            assert (REPO / rel).exists(), f"{name}: COPY {src}: no such file in the repository"
            assert not _ignored(rel, patterns), f"{name}: COPY {src} is excluded by .dockerignore"


@pytest.mark.parametrize("name", sorted(IMAGES))
def test_base_images_are_pinned(name):
    df = parse(name)
    for ref in df.stages:
        if ref in {"build"}:
            continue
        repo, _, tag = ref.rpartition(":")
        assert "@sha256:" in ref or (repo and tag and tag != "latest"), f"{name}: {ref} unpinned"


def test_the_full_image_is_pytorch_with_cuda_and_installs_the_active_extra():
    df = parse("Dockerfile")
    base = df.stages[-1]
    assert base.startswith(("pytorch/pytorch:", "nvcr.io/nvidia/pytorch:")), base
    assert "cuda12" in base or "nvcr.io" in base
    assert any("[active]" in run for run in df.all("RUN")), "the active extra is not installed"


def test_the_passive_image_is_slim_python_without_torch():
    df = parse("Dockerfile.passive")
    assert df.stages[-1].startswith("python:3.11") and "slim" in df.stages[-1]
    runs = " ".join(df.all("RUN"))
    assert "[active]" not in runs and "torch" not in runs.replace('import torch"', "")


@pytest.mark.parametrize("name", sorted(IMAGES))
def test_the_entrypoint_is_the_console_script_and_the_command_runs_the_daemon(name):
    from gpu_monitor.cli import build_parser

    pyproject = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    scripts = pyproject.split("[project.scripts]", 1)[1].split("\n[", 1)[0]
    assert re.search(r'^gpu-monitor\s*=\s*"gpu_monitor\.cli:main"', scripts, re.M), (
        "pyproject.toml no longer declares the gpu-monitor console script")
    df = parse(name)
    entrypoint = _exec_form(df.last("ENTRYPOINT"))
    assert entrypoint == ["gpu-monitor"]
    cmd = _exec_form(df.last("CMD"))
    args = build_parser().parse_args(cmd)
    assert args.command == "daemon" and args.log_format == "json"


@pytest.mark.parametrize("name", sorted(IMAGES))
def test_the_health_check_hits_healthz_on_the_daemon_port(name):
    from gpu_monitor.config import DEFAULT_LISTEN

    port = DEFAULT_LISTEN.rsplit(":", 1)[1]
    check = parse(name).last("HEALTHCHECK")
    assert f"127.0.0.1:{port}/healthz" in check
    assert f"EXPOSE {port}" in [f"EXPOSE {e}" for e in parse(name).all("EXPOSE")]


@pytest.mark.parametrize("name", sorted(IMAGES))
def test_the_image_runs_as_a_non_root_user(name):
    user = parse(name).last("USER")
    uid = user.split(":")[0]
    assert uid not in {"0", "root"}, f"{name}: USER {user}"
