"""The Dockerfiles build what they claim, and reproducibly, as far as a parse can tell.

The real build runs in .ci/run (``images/build.sh passive --debootstrap --smoke``); these are the
rules it relies on, cheap enough for the suite: everything a Dockerfile takes from its context is
what images/build.sh puts there; the bases are pinned by version tag with the digest
pin documented; every apt package is pinned ``name=version``; pip installs only ``--no-index``
from the host-built wheels, the lock with ``--require-hashes``; the lock pins every dependency
of pyproject.toml with hashes, and no torch. The entry point is the ``gpu-monitor`` console
script of the venv and the default command parses with the real command line; the health check
asks ``/healthz`` on the port PID 1 serves, for the daemon and the fabric scheduler alike; the
image runs as a non-root user; the full image has torch (its base's) and the passive one not.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shlex
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from packaging.requirements import Requirement

from tests.deploy.deploy_helpers import DEPLOY, DOCS, REPO, load_yaml_documents

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
        if ins == "ARG":
            k, _, v = rest.partition("=")
            df.args[k] = v
        if ins == "FROM":
            ref = rest.split()[0]
            df.stages.append(re.sub(r"\$\{(\w+)\}", lambda m: df.args.get(m.group(1), ""), ref))
        df.instructions.append((ins, rest))
    return df


def _exec_form(rest: str) -> list[str]:
    assert rest.startswith("["), f"use the exec form (JSON array), not {rest!r}"
    return json.loads(rest)


BUILD_SH = REPO / "images" / "build.sh"
LOCK = REPO / "images" / "requirements.txt"
# What images/build.sh puts in the build context, by name there: the repository file, or None
# for the wheels folder it fills (pip wheel + pip download).
CONTEXT = {"requirements.txt": "images/requirements.txt", "healthcheck.py": "images/healthcheck.py",
           "wheels/": None, "wheels": None}
VENV_BIN = "/opt/gpu-monitor/bin"


def _expand(text: str, args: dict[str, str]) -> str:
    return re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), m.group(0)), text)


def _commands(df: Dockerfile) -> list[list[str]]:
    """Every simple command of every RUN, split on ``&&``, ``;`` and ``|``, ARGs expanded."""
    out = []
    for run in df.all("RUN"):
        for part in re.split(r"&&|;|\|\|?", _expand(run, df.args)):
            try:
                words = shlex.split(part)
            except ValueError:  # a quote spanning a split point: not a command we look at
                continue
            if words:
                out.append(words)
    return out


def _invocations(df: Dockerfile, *prefix: str) -> list[list[str]]:
    """The commands whose words contain ``prefix`` in a row (``apt-get install``, ``pip install``);
    the words after it."""
    found = []
    for words in _commands(df):
        for i in range(len(words) - len(prefix) + 1):
            if tuple(w.rsplit("/", 1)[-1] for w in words[i:i + len(prefix)]) == prefix:
                found.append(words[i + len(prefix):])
                break
    return found


def _lock() -> dict[str, tuple[str, list[str]]]:
    """images/requirements.txt: name -> (version, hashes)."""
    text = LOCK.read_text(encoding="utf-8")
    out = {}
    for entry in re.split(r"\n(?=\S)", re.sub(r"(?m)^\s*#.*\n?", "", text)):
        entry = entry.replace("\\\n", " ").strip()
        if not entry:
            continue
        req, *opts = shlex.split(entry)
        name, sep, version = req.partition("==")
        assert sep and version, f"images/requirements.txt: {req!r} is not pinned name==version"
        hashes = [o.split("=", 1)[1] for o in opts if o.startswith("--hash=")]
        assert len(hashes) == len(opts), f"{req}: options other than --hash: {opts}"
        out[re.sub(r"[-_.]+", "-", name).lower()] = (version, hashes)
    return out


CONTEXT_MOUNT = "/tmp/image"


def _context_uses(df: Dockerfile) -> set[str]:
    """What the image takes from its build context, by name there: COPY sources, and the
    paths RUN steps read below the context's bind mount."""
    used = set()
    for copy in df.all("COPY"):
        if not copy.startswith("--from"):
            used.update(shlex.split(copy)[:-1])
    for run in df.all("RUN"):
        mount = re.match(r"--mount=(\S+)", run)
        if mount:
            opts = dict(o.partition("=")[::2] for o in mount.group(1).split(","))
            assert opts.get("type") == "bind" and opts.get("target") == CONTEXT_MOUNT, opts
            assert opts.get("source") == ".", opts
        for path in re.findall(rf"{CONTEXT_MOUNT}/([\w.-]+/?)", run):
            assert mount, f"RUN reads {CONTEXT_MOUNT}/{path} without the context mounted there"
            used.add(path)
    return used


@pytest.mark.parametrize("name", sorted(IMAGES))
def test_everything_taken_from_the_context_is_what_build_sh_puts_there(name):
    df = parse(name)
    build_sh = BUILD_SH.read_text(encoding="utf-8")
    used = _context_uses(df)
    assert used, f"{name} takes nothing from its context"
    for src in used:
        assert src in CONTEXT, f"{name}: {src}: images/build.sh puts no such thing in the context"
        if CONTEXT[src]:
            assert (REPO / CONTEXT[src]).is_file()
            assert f'"$repo/{CONTEXT[src]}"' in build_sh, f"build.sh does not copy {CONTEXT[src]}"
    assert {"wheels", "wheels/"} & used and ("dockerfile=" + name) in build_sh, f"build.sh never builds {name}"
    assert 'mkdir -p "$ctx/wheels"' in build_sh and '--wheel-dir "$ctx/wheels"' in build_sh


@pytest.mark.parametrize("name", sorted(IMAGES))
def test_the_base_is_a_version_tag_and_the_digest_pin_is_documented(name):
    df = parse(name)
    assert len(df.stages) == 1, f"{name}: one stage (the wheels are built on the host)"
    ref = df.stages[0]
    repo, _, tag = ref.partition("@")[0].rpartition(":")
    assert repo and re.match(r"\d+(\.\d+)+", tag), f"{name}: {ref} is not pinned to a version tag"
    assert "@sha256:" in ref or re.search(r"(?m)^#.*@sha256:<digest>", (REPO / name).read_text()), (
        f"{name}: neither a digest nor how to pin one")
    assert f"{repo}:{tag}" in (DOCS / "deploy-images.md").read_text(encoding="utf-8")


@pytest.mark.parametrize("name", sorted(IMAGES))
def test_every_apt_package_is_pinned_to_a_version(name):
    df = parse(name)
    for words in _invocations(df, "apt-get", "install"):
        packages = [w for w in words if not w.startswith("-")]
        assert packages, words
        for pkg in packages:
            pkg_name, sep, version = pkg.partition("=")
            assert sep and version and "$" not in version, (
                f"{name}: apt package {pkg!r} is not pinned name=version (an ARG needs a default)")


@pytest.mark.parametrize("name", sorted(IMAGES))
def test_pip_installs_only_from_the_wheels_and_the_lock_with_hashes(name):
    df = parse(name)
    installs = _invocations(df, "pip", "install")
    assert len(installs) == 2, installs
    for words in installs:
        assert "--no-index" in words, f"{name}: pip install without --no-index: {words}"
        if "-r" in words:
            assert "--require-hashes" in words and words[words.index("-r") + 1].endswith(
                "/requirements.txt"), words
            # A venv that sees the base's packages would keep a base package of the lock's
            # version without checking its hash.
            sees_base = any("--system-site-packages" in v for v in _invocations(df, "-m", "venv"))
            assert not sees_base or "--ignore-installed" in words, words
        else:  # the project's own wheel, built from this tree: nothing else comes with it
            assert "--no-deps" in words and any("gpu_monitor-" in w for w in words), words
    assert not _invocations(df, "pip", "download") and not _invocations(df, "pip", "wheel")
    assert any(w == "--without-pip" for c in _invocations(df, "-m", "venv") for w in c)


def test_the_lock_pins_every_dependency_of_pyproject_with_hashes_and_no_torch():
    import tomllib

    lock = _lock()
    for name, (_version, hashes) in lock.items():
        assert hashes and all(re.fullmatch(r"sha256:[0-9a-f]{64}", h) for h in hashes), name
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    for dep in map(Requirement, deps):
        key = re.sub(r"[-_.]+", "-", dep.name).lower()
        assert key in lock, f"images/requirements.txt lacks {dep.name} (run images/lock.sh)"
        assert dep.specifier.contains(lock[key][0]), f"{dep}: the lock has {lock[key][0]}"
    assert "torch" not in lock and "pip" in lock
    wanted = [Requirement(line.split("#")[0]) for line in
              (REPO / "images" / "requirements.in").read_text().splitlines()
              if line.split("#")[0].strip()]
    assert sorted(str(r) for r in wanted if r.name != "pip") == sorted(deps), (
        "images/requirements.in no longer lists pyproject.toml's dependencies")
    assert not re.search(r"(?m)^--(find-links|index-url|extra-index-url)", LOCK.read_text())


def test_ci_builds_and_smoke_runs_the_passive_image():
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    assert re.search(r"(?m)^images/build\.sh passive --debootstrap --smoke$", ci)
    build_sh = BUILD_SH.read_text(encoding="utf-8")
    assert 'apt-get install -y -qq --no-install-recommends "${need[@]}"' in build_sh
    assert "need+=(buildah)" in build_sh and "need+=(debootstrap)" in build_sh


def _build_sh_python(flavor: str) -> str:
    m = re.search(rf"^\s*{flavor}\) dockerfile=\S+; python_version=([\d.]+)", BUILD_SH.read_text(), re.M)
    assert m, f"images/build.sh has no default Python for {flavor}"
    return m.group(1)


def test_the_full_image_is_pytorch_with_cuda_and_sees_its_torch():
    df = parse("Dockerfile")
    base = df.stages[-1]
    assert base.startswith(("pytorch/pytorch:", "nvcr.io/nvidia/pytorch:")), base
    assert "cuda12" in base or "nvcr.io" in base
    venvs = _invocations(df, "-m", "venv")
    assert venvs and "--system-site-packages" in venvs[0], "the venv cannot see the base's torch"
    assert any("import" in run and "torch" in run for run in df.all("RUN"))
    assert f"Its Python ({_build_sh_python('full')})" in (REPO / "Dockerfile").read_text()


def test_the_passive_image_is_a_current_slim_python_without_torch():
    df = parse("Dockerfile.passive")
    python = _build_sh_python("passive")
    base = df.stages[-1]
    assert base.startswith(f"python:{python}.") and base.endswith("-slim-trixie"), base
    assert tuple(map(int, python.split("."))) >= (3, 13), "Debian stable's Python or newer"
    runs = " ".join(df.all("RUN"))
    assert "--system-site-packages" not in runs and "[active]" not in runs
    assert "torch" not in runs.replace('import torch"', "")


@pytest.mark.parametrize("name", sorted(IMAGES))
def test_the_venv_comes_first_on_path(name):
    env = parse(name).last("ENV")
    path = re.search(r"\bPATH=(\S+)", env)
    assert path and path.group(1).split(":")[0] == VENV_BIN, env


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


def _healthcheck():
    spec = importlib.util.spec_from_file_location("image_healthcheck", REPO / "images" / "healthcheck.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name", sorted(IMAGES))
def test_the_health_check_runs_the_images_healthcheck_script(name):
    df = parse(name)
    check = df.last("HEALTHCHECK")
    assert _exec_form(check.split("CMD", 1)[1].strip()) == [
        f"{VENV_BIN}/python", "/opt/gpu-monitor/healthcheck.py"]
    assert any("/opt/gpu-monitor/healthcheck.py" in run for run in df.all("RUN"))
    assert df.all("EXPOSE") == [_healthcheck().DEFAULT_PORTS["daemon"].__str__()]


def test_the_health_checks_defaults_are_the_commands_defaults():
    from gpu_monitor.cli import build_parser
    from gpu_monitor.config import DEFAULT_LISTEN

    hc = _healthcheck()
    assert hc.DEFAULT_PORTS["daemon"] == int(DEFAULT_LISTEN.rsplit(":", 1)[1])
    scheduler = build_parser().parse_args(["fabric-scheduler"])
    assert hc.DEFAULT_PORTS["fabric-scheduler"] == int(scheduler.listen.rsplit(":", 1)[1])


@pytest.mark.parametrize("manifest, container", [
    ("daemonset.yaml", "gpu-monitor"), ("fabric/deployment.yaml", "scheduler")])
def test_the_health_check_asks_the_port_the_manifests_probe_and_serve(manifest, container):
    """The image's PID 1 is its ENTRYPOINT plus the manifest's args; the port the health check
    picks from them is the container's metrics port."""
    docs = load_yaml_documents(DEPLOY / manifest)
    workload = next(d for d in docs if d.get("kind") in {"DaemonSet", "Deployment"})
    c = next(c for c in workload["spec"]["template"]["spec"]["containers"] if c["name"] == container)
    argv = _exec_form(parse("Dockerfile").last("ENTRYPOINT")) + c.get("command", []) + c["args"]
    port = {p["name"]: p["containerPort"] for p in c["ports"]}["metrics"]
    assert _healthcheck().listen_port(argv) == port


@pytest.mark.parametrize("argv, port", [
    (["gpu-monitor", "daemon", "--log-format", "json"], 9425),
    (["gpu-monitor", "daemon", "--listen", "127.0.0.1:9500"], 9500),
    (["gpu-monitor", "daemon", "--listen=[::1]:9501", "--listen=:9502"], 9502),
    (["gpu-monitor", "fabric-scheduler", "--namespace=x"], 9426),
    (["/opt/gpu-monitor/bin/python", "/opt/gpu-monitor/bin/gpu-monitor", "fabric-scheduler"], 9426),
    (["gpu-monitor", "breaker", "status"], 9425),
])
def test_the_health_check_port_comes_from_the_command_line(argv, port):
    assert _healthcheck().listen_port(argv) == port


@pytest.mark.parametrize("config, port", [
    ("daemon:\n  listen: 0.0.0.0:9600\n", 9600),
    ("daemon:\n  interval_s: 30\n", 9425),  # no listen: the default
    ("daemon: [\n", 9425),                     # not YAML the daemon would start with
])
def test_the_daemons_port_may_come_from_its_config_file(tmp_path, config, port):
    path = tmp_path / "config.yaml"
    path.write_text(config, encoding="utf-8")
    hc = _healthcheck()
    assert hc.listen_port(["gpu-monitor", "daemon", f"--config={path}"]) == port
    assert hc.listen_port(["gpu-monitor", "daemon", "--config", str(path), "--listen=:9700"]) == 9700
    assert hc.listen_port(["gpu-monitor", "daemon", f"--config={tmp_path / 'absent'}"]) == 9425


def test_the_health_check_reads_pid_1s_nul_separated_command_line(tmp_path):
    hc = _healthcheck()
    cmdline = tmp_path / "cmdline"
    cmdline.write_bytes(b"/opt/gpu-monitor/bin/python\0/opt/gpu-monitor/bin/gpu-monitor\0daemon\0")
    assert hc.main_process_argv(str(cmdline)) == [
        "/opt/gpu-monitor/bin/python", "/opt/gpu-monitor/bin/gpu-monitor", "daemon"]
    assert hc.main_process_argv(str(tmp_path / "absent")) == []


@pytest.mark.parametrize("status, exit_code", [(200, 0), (503, 1)])
def test_the_health_check_exits_by_the_healthz_answer(monkeypatch, status, exit_code):
    seen = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            seen.append(self.path)
            self.send_response(status)
            self.end_headers()

        def log_message(self, *a):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        hc = _healthcheck()
        argv = ["gpu-monitor", "daemon", f"--listen=0.0.0.0:{server.server_port}"]
        monkeypatch.setattr(hc, "main_process_argv", lambda: argv)
        assert hc.main() == exit_code
        assert seen == ["/healthz"]
    finally:
        server.shutdown()
        server.server_close()


def test_the_health_check_fails_where_nothing_listens(monkeypatch):
    import socket

    with socket.socket() as s:  # a port that was free a moment ago and is closed now
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    hc = _healthcheck()
    monkeypatch.setattr(hc, "main_process_argv", lambda: ["gpu-monitor", "daemon", f"--listen=:{port}"])
    assert hc.main() == 1


@pytest.mark.parametrize("name", sorted(IMAGES))
def test_the_image_runs_as_a_non_root_user(name):
    user = parse(name).last("USER")
    uid = user.split(":")[0]
    assert uid not in {"0", "root"}, f"{name}: USER {user}"


@pytest.mark.parametrize("script", ["build.sh", "lock.sh"])
def test_the_image_scripts_are_valid_bash(script):
    import subprocess

    done = subprocess.run(["bash", "-n", str(REPO / "images" / script)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("args, says", [
    ([], "usage"), (["everything"], "no image 'everything'"),
    (["passive", "--engine", "docker", "--smoke"], "need --engine buildah"),
    (["passive", "--frobnicate"], "unknown option --frobnicate"),
])
def test_build_sh_refuses_what_it_cannot_build_before_building_anything(args, says):
    import subprocess

    done = subprocess.run(["bash", str(BUILD_SH), *args], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and says in done.stderr, (done.returncode, done.stderr)
