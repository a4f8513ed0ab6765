"""The images' HEALTHCHECK: asks the running gpu-monitor process for ``/healthz`` on its port.

One image runs two servers: ``gpu-monitor daemon`` (``/healthz`` on the daemon's listen
address, 9425 by default and in daemonset/daemonset.yaml) and ``gpu-monitor fabric-scheduler``
(its own ``--listen``, 9426 by default and in daemonset/fabric/deployment.yaml). A fixed port in
the Dockerfile is wrong for one of them, so this reads the container's main process's command
line (PID 1, the ENTRYPOINT plus its arguments) and takes the port from ``--listen`` there, or
the command's default when none is given. Docker and Podman run it; Kubernetes ignores an
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


def listen_port(argv: list[str]) -> int:
    """The port the process started with ``argv`` serves on (the last ``--listen`` wins, as
    argparse does); a command other than the two servers gets the daemon's default."""
    port: str | None = None
    for i, arg in enumerate(argv):
        if arg == "--listen" and i + 1 < len(argv):
            port = argv[i + 1].rpartition(":")[2]
        elif arg.startswith("--listen="):
            port = arg.partition("=")[2].rpartition(":")[2]
    if port:
        return int(port)
    command = next((a for a in argv if a in DEFAULT_PORTS), "daemon")
    return DEFAULT_PORTS[command]


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
