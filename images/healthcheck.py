"""The images' HEALTHCHECK: asks the running gpu-monitor process for ``/healthz`` on its port.

One image runs two servers: ``gpu-monitor daemon`` (``/healthz`` on the daemon's listen
address, 9425 by default and in daemonset/daemonset.yaml) and ``gpu-monitor fabric-scheduler``
(its own ``--listen``, 9426 by default and in daemonset/fabric/deployment.yaml). A fixed port in
the Dockerfile is wrong for one of them, so this reads the container's main process's command
line (PID 1, the ENTRYPOINT plus its arguments) and takes the port from ``--listen`` there, or
for the daemon from ``daemon.listen`` in its ``--config`` file, or the command's default. Docker and Podman run it; Kubernetes ignores an
image's HEALTHCHECK and uses the manifests' probes instead (the same ports and path).

It imports nothing from gpu_monitor (it runs every 30 s; importing the CLI costs more than the
request). tests/deploy/test_images.py holds DEFAULT_PORTS equal to the CLI's defaults and the
port this picks for each manifest's arguments equal to the container port the probes use.

Exit status: 0 healthy, 1 not (what Docker's HEALTHCHECK expects).
"""

from __future__ import annotations

import sys
import urllib.request

# The listen port of each long-running command when its command line names none.
DEFAULT_PORTS = {"daemon": 9425, "fabric-scheduler": 9426}
TIMEOUT_S = 4.0


def _flag(argv: list[str], name: str) -> str | None:
    """The value of ``--name VALUE`` / ``--name=VALUE``; the last one wins, as in argparse."""
    value = None
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith(name + "="):
            value = arg.partition("=")[2]
    return value


def _config_listen(path: str) -> str | None:
    """``daemon.listen`` of the daemon's configuration file, or None where it names none or
    cannot be read (the daemon itself would not have started then)."""
    try:
        import yaml  # the image's PyYAML, a dependency of gpu-monitor
    except ImportError:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            listen = (yaml.safe_load(f) or {}).get("daemon", {}).get("listen")
    except (OSError, ValueError, AttributeError, yaml.YAMLError):
        return None
    return listen if isinstance(listen, str) else None


def listen_port(argv: list[str]) -> int:
    """The port the process started with ``argv`` serves on: ``--listen``, else (the daemon)
    its config file's ``daemon.listen``, else the command's default; a command other than the
    two servers gets the daemon's."""
    command = next((a for a in argv if a in DEFAULT_PORTS), "daemon")
    listen = _flag(argv, "--listen")
    if not listen and command == "daemon" and (config := _flag(argv, "--config")):
        listen = _config_listen(config)
    port = (listen or "").rpartition(":")[2]
    return int(port) if port.isdigit() else DEFAULT_PORTS[command]


def main_process_argv(cmdline_path: str = "/proc/1/cmdline") -> list[str]:
    """PID 1's arguments (NUL-separated in /proc), or [] where they cannot be read."""
    try:
        with open(cmdline_path, "rb") as f:
            raw = f.read()
    except OSError:
        return []
    return [a.decode("utf-8", "replace") for a in raw.split(b"\0") if a]


def main() -> int:
    port = listen_port(main_process_argv())
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=TIMEOUT_S) as r:
            return 0 if r.status == 200 else 1
    except OSError as e:  # refused, timed out, or an HTTP error status (503: a stalled loop)
        print(f"healthcheck: 127.0.0.1:{port}/healthz: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
