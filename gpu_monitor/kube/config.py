"""Where the API server is and who we are to it: in-cluster config, else a kubeconfig.

Why apart: the daemon, the CLIs, the fabric scheduler and the SDC library in a training job
all start from an ``ApiClient`` and must fail the same way on a bad kubeconfig
(``KubeConfigError`` naming the file and what is wrong), before the first request.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import yaml

from gpu_monitor.kube.errors import KubeConfigError

__all__ = ["in_cluster_api_client", "kubeconfig_factory", "load_api_client"]


def load_api_client(kubeconfig: str | None = None, context: str | None = None):
    """A ``kubernetes.client.ApiClient``: in-cluster config first (the DaemonSet), else the
    kubeconfig (an operator's workstation)."""
    from kubernetes import client, config

    if kubeconfig is None:
        try:
            config.load_incluster_config()
            return client.ApiClient()
        except config.ConfigException:
            pass
    cfg = client.Configuration()
    config.load_kube_config(config_file=kubeconfig, context=context,
                            client_configuration=cfg)
    return client.ApiClient(cfg)


def kubeconfig_factory(kubeconfig: str | None, context: str | None = None
                       ) -> Callable[[], Any]:
    """A factory of ``ApiClient``s for the daemon's ``--kubeconfig``/``--context`` (a daemon
    outside a cluster), checked now so a bad file fails the start instead of the first
    remediation tick. ``kubeconfig`` None: ``$KUBECONFIG``, else ``~/.kube/config`` (the
    client's own default). Raises KubeConfigError saying what is wrong; never anything else."""
    from kubernetes import client, config

    if kubeconfig is not None and not os.path.isfile(kubeconfig):
        why = "is a directory" if os.path.isdir(kubeconfig) else "no such file"
        raise KubeConfigError(f"{kubeconfig}: {why}")
    cfg = client.Configuration()
    try:
        config.load_kube_config(config_file=kubeconfig, context=context,
                                client_configuration=cfg, persist_config=False)
        if kubeconfig is not None:
            _check_user(kubeconfig, context)
    except KubeConfigError:
        raise
    except Exception as exc:  # noqa: BLE001 - the client raises many kinds on a bad file
        text = " ".join(str(exc).split())[:300] or type(exc).__name__
        if isinstance(exc, (TypeError, AttributeError, KeyError, ValueError)):
            text = f"not a kubeconfig (a YAML map of clusters, contexts, users): {text}"
        raise KubeConfigError(f"{kubeconfig or 'the default kubeconfig'}: {text}") from None
    url = urlsplit(cfg.host or "")
    if url.scheme not in ("http", "https") or not url.netloc:
        raise KubeConfigError(f"{kubeconfig or 'the default kubeconfig'}: the server of "
                              f"context {context or '(current)'} is "
                              f"{repr(cfg.host) if cfg.host else 'missing'}, not an http(s) URL")
    return lambda: client.ApiClient(cfg)


def _check_user(path: str, context: str | None) -> None:
    """The user the context names must exist (the Python client would go on anonymously;
    kubectl's config validation refuses it: 'user "x" was not found for context "y"')."""
    with open(path, encoding="utf-8", errors="replace") as fh:
        doc = yaml.safe_load(fh)
    name = context or doc.get("current-context")
    ctx = next((c.get("context") or {} for c in doc.get("contexts") or []
                if isinstance(c, dict) and c.get("name") == name), {})
    user = ctx.get("user") if isinstance(ctx, dict) else None
    users = {u.get("name") for u in doc.get("users") or [] if isinstance(u, dict)}
    if user and user not in users:
        raise KubeConfigError(f'{path}: user "{user}" was not found for context "{name}"')



def in_cluster_api_client() -> Any | None:
    """An ``ApiClient`` from the pod's service account, or None outside a pod (or without the
    ``kubernetes`` package): for code that may also run off a cluster (the SDC library)."""
    try:
        from kubernetes import client, config
    except ImportError:
        return None
    try:
        config.load_incluster_config()
    except Exception:  # noqa: BLE001 - not in a pod, or its service account is unreadable
        return None
    return client.ApiClient()
