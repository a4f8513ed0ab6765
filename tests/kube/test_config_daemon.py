"""A daemon outside a cluster reaches its API server through ``--kubeconfig`` (docs/cli.md).

The real ``gpu-monitor daemon`` runs in its own process on a simulated node with an injected Xid
79, with no in-cluster configuration, no ``$KUBECONFIG`` and no ``~/.kube/config``: the only way
to the (fake) API server is the file named by the flag. It must publish the node's condition
and quarantine it there.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest
import yaml

from tests.remediate.remediate_helpers import (
    NODE,
    FakeApiServer,
    our_conditions,
    our_taints,
    seed_breaker,
)


def kubeconfig(server: FakeApiServer) -> dict:
    return {"apiVersion": "v1", "kind": "Config", "current-context": "lab",
            "clusters": [{"name": "lab", "cluster": {"server": server.url}}],
            "contexts": [{"name": "lab", "context": {"cluster": "lab", "user": "me"}}],
            "users": [{"name": "me", "user": {"token": "t"}}]}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_a_daemon_outside_a_cluster_reaches_the_api_server_through_kubeconfig(tmp_path):
    with FakeApiServer() as server:
        server.add_node(NODE, gpus=8)
        seed_breaker(server)
        (tmp_path / "kubeconfig").write_text(yaml.safe_dump(kubeconfig(server)))
        (tmp_path / "config.yaml").write_text(yaml.safe_dump({
            "daemon": {"bootstrap_on_start": False},
            "remediation": {"enabled": True, "dry_run": False},
            "checks": {"xid": {"remediation": {"Xid79": "cordon"}}}}))
        env = {k: v for k, v in os.environ.items()
               if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT")}
        env.update(HOME=str(tmp_path), POD_NAMESPACE="gpu-monitor")
        argv = ["daemon", "--simulate", "h100-sxm-8", "--inject", "xid@gpu:3,code=79",
                "--node-name", NODE, "--config", str(tmp_path / "config.yaml"),
                "--kubeconfig", str(tmp_path / "kubeconfig"),
                "--listen", f"127.0.0.1:{free_port()}"]
        code = f"import sys\nfrom gpu_monitor.cli import main\nsys.exit(main({argv!r}))\n"
        proc = subprocess.Popen([sys.executable, "-c", code], env=env, cwd=tmp_path,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 120
            node = server.node(NODE)
            while time.monotonic() < deadline and proc.poll() is None:
                node = server.node(NODE)
                cond = our_conditions(node).get("GPUXidError") if node.get("status") else None
                if cond and cond["status"] == "True" and node["spec"].get("unschedulable"):
                    break
                time.sleep(0.2)
        finally:
            proc.terminate()
            _, err = proc.communicate(timeout=30)
        assert our_conditions(node)["GPUXidError"]["reason"] == "Xid79", err[-3000:]
        assert node["spec"]["unschedulable"] is True
        assert [t["value"] for t in our_taints(node)] == ["Xid79"]
        assert any(q.path == f"/api/v1/nodes/{NODE}" and q.method == "PATCH"
                   for q in server.requests)


def test_the_bootstrap_gates_node_client_is_made_once_through_the_kubeconfig(tmp_path):
    """Without remediation the bootstrap gate still publishes its verdict: through the same
    ``--kubeconfig``, and through one NodeClient whose Event queue outlives a failed send."""
    from types import SimpleNamespace

    from gpu_monitor.clock import Clock
    from gpu_monitor.config import DEFAULT_CONFIG
    from gpu_monitor.daemon import _node_delivery
    from gpu_monitor.kube.config import kubeconfig_factory

    with FakeApiServer() as server:
        server.add_node(NODE, gpus=8)
        path = tmp_path / "kubeconfig"
        path.write_text(yaml.safe_dump(kubeconfig(server)))
        make = _node_delivery(SimpleNamespace(clock=Clock(), node=NODE, config=DEFAULT_CONFIG), None,
                              kubeconfig_factory(str(path)))
        node = make()
        assert make() is node and node.node is node.node
        assert node.node.read().name == NODE and node.kube.api_client.configuration.host == server.url
