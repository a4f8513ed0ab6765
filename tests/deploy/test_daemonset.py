"""The DaemonSet runs the daemon the way the code expects to be run.

The flags it passes are parsed by the real command line; every ``--path.*`` flag points at a
read-only mount of the matching host path (the defaults ``gpu_monitor/hw/paths.py`` spells);
the state store, report drop directory and reboot sentinel of the shipped configuration are
on host paths; the configuration itself is valid and ships in dry-run.
"""

from __future__ import annotations

import os
import posixpath

import pytest

from gpu_monitor.hw import paths as hostpaths
from tests.deploy.deploy_helpers import (
    DEPLOY,
    base_objects,
    daemon_container,
    find,
    flag_values,
    overlay,
    render,
)

#: flag -> the host path its default spells (HostPaths' defaults).
PATH_FLAGS = {
    "--path.sysfs": hostpaths.DEFAULT_SYSFS,
    "--path.procfs": hostpaths.DEFAULT_PROCFS,
    "--path.dev": hostpaths.DEFAULT_DEV,
    "--path.rootfs": hostpaths.DEFAULT_ROOTFS,
}


def _daemonset(docs=None):
    return find(docs if docs is not None else base_objects(), "DaemonSet", "gpu-monitor")


def _mounts(ds) -> dict[str, tuple[dict, dict]]:
    """mountPath -> (volumeMount, volume)."""
    pod = ds["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    return {m["mountPath"]: (m, volumes[m["name"]]) for m in daemon_container(ds)["volumeMounts"]}


def _host_path_of(ds, container_path: str) -> tuple[str, dict] | None:
    """The host path a container path reaches through a hostPath mount (deepest mount wins)."""
    best = None
    for mount_path, (mount, volume) in _mounts(ds).items():
        if "hostPath" not in volume:
            continue
        below = container_path == mount_path or container_path.startswith(
            mount_path.rstrip("/") + "/")
        if below and (best is None or len(mount_path) > len(best[0])):
            best = (mount_path, mount, volume)
    if best is None:
        return None
    mount_path, mount, volume = best
    rest = posixpath.relpath(container_path, mount_path)
    host = volume["hostPath"]["path"]
    return (host if rest == "." else posixpath.join(host, rest)), mount


def _shipped_config():
    from gpu_monitor.config import load_config

    return load_config(DEPLOY / "config.yaml", env={"NODE_NAME": "gpu-node-1"})


def test_the_daemonset_args_parse_with_the_real_command_line():
    from gpu_monitor.cli import build_parser

    args = build_parser().parse_args(daemon_container(_daemonset())["args"])
    assert args.command == "daemon"
    assert args.log_format == "json"
    assert args.config == "/etc/gpu-monitor/config.yaml"


@pytest.mark.parametrize("flag", sorted(PATH_FLAGS))
def test_each_path_flag_points_at_a_mount_of_the_same_host_path(flag):
    ds = _daemonset()
    flags = flag_values(daemon_container(ds)["args"])
    assert flag in flags, f"the DaemonSet does not pass {flag}"
    root = flags[flag]
    assert root.startswith("/host/"), f"{flag}={root}: host paths are mounted under /host"
    mounted = [(p, m, v) for p, (m, v) in _mounts(ds).items()
               if p == root or p.startswith(root.rstrip("/") + "/")]
    assert mounted, f"{flag}={root}, but nothing is mounted at or below it"
    for mount_path, _mount, volume in mounted:
        assert "hostPath" in volume, f"{mount_path} is not a hostPath"
        expected = posixpath.normpath(posixpath.join(PATH_FLAGS[flag],
                                                     posixpath.relpath(mount_path, root)))
        assert volume["hostPath"]["path"] == expected, (
            f"{mount_path} (below {flag}={root}) mounts host {volume['hostPath']['path']}, "
            f"expected {expected}")


@pytest.mark.parametrize("flag", ["--path.sysfs", "--path.procfs", "--path.dev"])
def test_host_pseudo_filesystems_are_mounted_read_only(flag):
    ds = _daemonset()
    root = flag_values(daemon_container(ds)["args"])[flag]
    for mount_path, (mount, _volume) in _mounts(ds).items():
        if mount_path == root or mount_path.startswith(root + "/"):
            assert mount.get("readOnly") is True, f"{mount_path} must be read-only"


def test_the_kernel_log_is_the_host_kmsg_device_below_path_dev():
    ds = _daemonset()
    flags = flag_values(daemon_container(ds)["args"])
    assert "--kmsg" not in flags, "--kmsg reads a text file; the DaemonSet reads the device"
    kmsg = hostpaths.HostPaths(dev=flags["--path.dev"]).kmsg_path
    host, mount = _host_path_of(ds, kmsg)
    assert host == posixpath.join(hostpaths.DEFAULT_DEV, "kmsg")
    assert _mounts(ds)[kmsg][1]["hostPath"]["type"] == "CharDevice"
    assert mount["readOnly"] is True


def test_the_journal_component_follows_a_host_log_file_without_privileged(tmp_path):
    ds = _daemonset(render(overlay(tmp_path, ["journal-kmsg"])))
    c = daemon_container(ds)
    flags = flag_values(c["args"])
    assert "--path.dev" not in flags, "no /dev/kmsg is mounted in the journal variant"
    kmsg = flags["--kmsg"]
    found = _host_path_of(ds, kmsg)
    assert found is not None, f"--kmsg={kmsg} is not on a hostPath mount"
    host, mount = found
    assert mount["readOnly"] is True
    # the directory is mounted, not the file: rotation creates a new inode
    assert _mounts(ds)[posixpath.dirname(kmsg)][1]["hostPath"]["type"] == "Directory"
    assert not any(v.get("hostPath", {}).get("path") == "/dev/kmsg"
                   for _m, v in _mounts(ds).values())
    sc = c["securityContext"]
    assert sc["privileged"] is False and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]
    for flag in ("--path.sysfs", "--path.procfs", "--path.rootfs"):
        assert flags[flag] == flag_values(daemon_container(_daemonset())["args"])[flag]


def test_state_store_and_report_directory_of_the_shipped_config_are_host_paths():
    config = _shipped_config()
    ds = _daemonset()
    state_dir = posixpath.dirname(config.state_path)
    assert config.state_path == hostpaths.DEFAULT_STATE_DB
    assert _host_path_of(ds, config.state_path)[0] == config.state_path
    assert _mounts(ds)[state_dir][1]["hostPath"]["type"] == "DirectoryOrCreate"
    report_dir = config.daemon.report_dir
    assert report_dir == hostpaths.DEFAULT_REPORT_DIR, "jobs default to this drop directory"
    assert _mounts(ds)[report_dir][1]["hostPath"]["path"] == report_dir, (
        "the report directory needs its own hostPath so jobs can mount just that")


def test_the_reboot_sentinel_lands_on_the_host_below_path_rootfs():
    config = _shipped_config()
    ds = _daemonset()
    rootfs = flag_values(daemon_container(ds)["args"])["--path.rootfs"]
    sentinel = hostpaths.HostPaths(rootfs=rootfs).root(config.remediation.reboot_sentinel)
    host, mount = _host_path_of(ds, sentinel)
    assert host == config.remediation.reboot_sentinel
    assert not mount.get("readOnly")


def test_the_shipped_config_is_valid_and_in_dry_run():
    config = _shipped_config()
    assert config.remediation.dry_run is True
    assert config.remediation.enabled is True, "dry-run Events need the remediator running"
    assert config.remediation.drain.force_delete is False
    assert config.log_format == "json"
    assert config.node_name == "gpu-node-1", "the node name must come from $NODE_NAME"


def test_node_identity_and_nvidia_runtime_come_from_the_pod_spec():
    ds = _daemonset()
    pod = ds["spec"]["template"]["spec"]
    c = daemon_container(ds)
    env = {e["name"]: e for e in c["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == "all"
    assert set(env["NVIDIA_DRIVER_CAPABILITIES"]["value"].split(",")) == {"utility", "compute"}
    assert pod["runtimeClassName"] == "nvidia"
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert pod["hostPID"] is True
    assert "nvidia.com/gpu" not in c["resources"].get("limits", {}), "never take a GPU"


def test_the_container_is_privileged_only_with_a_read_only_root_and_bounded_resources():
    c = daemon_container(_daemonset())
    sc = c["securityContext"]
    assert sc["privileged"] is True
    assert sc["readOnlyRootFilesystem"] is True
    res = c["resources"]
    for key in ("cpu", "memory"):
        assert key in res["requests"] and key in res["limits"]
    assert res["requests"]["memory"] == "128Mi" and res["requests"]["cpu"] == "50m"
    writable = {p for p, (m, _v) in _mounts(_daemonset()).items() if not m.get("readOnly")}
    assert "/tmp" in writable, "torch and the workers need a writable /tmp"


def test_probes_and_the_metrics_port_match_the_listen_address():
    from gpu_monitor.config import DEFAULT_LISTEN
    from gpu_monitor.exporter import parse_listen

    ds = _daemonset()
    c = daemon_container(ds)
    listen = flag_values(c["args"]).get("--listen", DEFAULT_LISTEN)
    _host, port = parse_listen(listen)
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports["metrics"] == port
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    service = find(base_objects(), "Service", "gpu-monitor")
    svc_port = next(p for p in service["spec"]["ports"] if p["name"] == "metrics")
    assert svc_port["port"] == port and svc_port["targetPort"] == "metrics"
    selector = service["spec"]["selector"]
    labels = ds["spec"]["template"]["metadata"]["labels"]
    assert selector.items() <= labels.items(), "the Service does not select the daemon pods"


def test_tolerations_cover_our_taints_and_every_noschedule_noexecute_taint():
    config = _shipped_config()
    tolerations = _daemonset()["spec"]["template"]["spec"]["tolerations"]

    def tolerated(key: str, effect: str) -> bool:
        for t in tolerations:
            if t.get("effect") not in (None, "", effect):
                continue
            if t.get("operator") == "Exists" and t.get("key") in (None, "", key):
                return True
        return False

    for key in (config.remediation.taint_key, "gpu-monitor.io/bootstrap"):
        assert any(t.get("key") == key for t in tolerations), f"no explicit toleration of {key}"
        assert tolerated(key, "NoSchedule")
    assert tolerated("node.kubernetes.io/unreachable", "NoExecute")
    assert tolerated("nvidia.com/gpu", "NoSchedule")


def test_priority_class_service_account_and_config_map_exist():
    docs = base_objects()
    pod = _daemonset(docs)["spec"]["template"]["spec"]
    find(docs, "PriorityClass", pod["priorityClassName"])
    find(docs, "ServiceAccount", pod["serviceAccountName"])
    config_volume = next(v for v in pod["volumes"] if v["name"] == "config")
    assert config_volume["configMap"]["name"] == "gpu-monitor-config"
    c = daemon_container(_daemonset(docs))
    config_flag = flag_values(c["args"])["--config"]
    mount, _v = _mounts(_daemonset(docs))[os.path.dirname(config_flag)]
    assert mount["name"] == "config" and mount["readOnly"] is True


def test_the_passive_image_component_keeps_the_daemon_but_drops_cuda_compute(tmp_path):
    ds = _daemonset(render(overlay(tmp_path, ["passive-image"])))
    c = daemon_container(ds)
    assert c["image"].endswith("-passive")
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["NVIDIA_DRIVER_CAPABILITIES"] == "utility"
    assert c["args"] == daemon_container(_daemonset())["args"]


def test_kustomize_gives_the_image_a_registry_and_a_pinned_tag():
    from gpu_monitor import __version__

    image = daemon_container(_daemonset(render(DEPLOY)))["image"]
    name, _, tag = image.rpartition(":")
    assert "/" in name, f"{image}: no registry"
    assert tag == __version__, f"{image}: the tag should be the package version"


def test_the_kubelet_pod_resources_socket_is_mounted_read_only_where_the_config_looks():
    """workloads.socket (its default) must be reachable in the container: the kubelet's
    pod-resources directory, read-only, at the same path."""
    from gpu_monitor.workloads.kubelet import DEFAULT_SOCKET

    reached = _host_path_of(_daemonset(), DEFAULT_SOCKET)
    assert reached is not None, f"nothing mounts {DEFAULT_SOCKET}"
    host, mount = reached
    assert host == DEFAULT_SOCKET and mount.get("readOnly") is True


def test_the_failfast_notice_dir_is_mounted_writable_at_the_same_host_path():
    """failfast.notice_dir (the shipped config's value) must reach the host, writable, at the
    same path: a job mounts that host directory to read its notice (docs/workloads.md)."""
    notice_dir = _shipped_config().failfast.notice_dir
    reached = _host_path_of(_daemonset(), notice_dir)
    assert reached is not None, f"nothing mounts {notice_dir}"
    host, mount = reached
    assert host == notice_dir and not mount.get("readOnly")
