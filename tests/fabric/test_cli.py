"""The register functions: the three commands parse, and ``fabric-scheduler --once`` runs one
round against the fake apiserver through the real argument handling."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from gpu_monitor.fabric import cli

TEMPLATE = Path(__file__).resolve().parents[2] / "daemonset" / "fabric" / "job-template.yaml"


def parser(api_factory=None):
    p = argparse.ArgumentParser(prog="gpu-monitor")
    sub = p.add_subparsers(dest="command")
    cli.register(sub, api_factory)
    return p


def test_the_three_commands_are_registered():
    p = parser()
    a = p.parse_args(["fabric-probe", "--max-bytes", "1024", "--zero-exit"])
    assert a.max_bytes == 1024 and a.zero_exit and callable(a.func)
    a = p.parse_args(["fabric-scheduler", "--topology-label", "a", "--topology-label", "b"])
    assert a.topology_label == ["a", "b"] and callable(a.func)
    a = p.parse_args(["idle-check", "--checks", "burn_in", "--deliver", "crd"])
    assert a.checks == "burn_in" and a.deliver == "crd"


def test_fabric_scheduler_once_launches_a_probe(fake_api, kube, capsys):
    for n in ("c0", "c1"):
        fake_api.add_node(n, gpus=8, labels={"nvidia.com/rail": "3"})
    p = parser(lambda args: kube)
    args = p.parse_args(["fabric-scheduler", "--once", "--job-template", str(TEMPLATE),
                         "--idle-for-s", "0", "--rdma-resource", "rdma/ib=8",
                         "--image", "registry.example/gpu-monitor:9"])
    assert args.func(args) == 0
    (job,) = fake_api.list("batch", "jobs", "gpu-monitor-jobs")
    c = job["spec"]["template"]["spec"]["containers"][0]
    assert c["image"] == "registry.example/gpu-monitor:9"
    assert c["resources"]["limits"]["rdma/ib"] == "8"
    assert job["metadata"]["annotations"]["gpu-monitor.io/probe-group"] == "rail=3.0"
    out = json.loads(capsys.readouterr().out)
    assert out["idle_nodes"] == 2


def test_fabric_scheduler_refuses_unknown_settings(tmp_path, capsys):
    bad = tmp_path / "s.yaml"
    bad.write_text("group_sise: 4\n")
    args = parser().parse_args(["fabric-scheduler", "--settings", str(bad), "--once"])
    assert args.func(args) == 2
    assert "group_sise" in capsys.readouterr().err


def test_fabric_scheduler_reads_a_settings_file(tmp_path):
    from gpu_monitor.fabric.scheduler_command import settings_from_args

    f = tmp_path / "s.yaml"
    f.write_text("group_size: 4\ntopology_labels: [x/rack]\nrdma_resources: {rdma/ib: 1}\n"
                 "active_checks: true\n")
    args = parser().parse_args(["fabric-scheduler", "--settings", str(f), "--group-size", "6"])
    s = settings_from_args(args)
    assert s.group_size == 6 and s.topology_labels == ("x/rack",)  # flags win
    assert s.rdma_resources == {"rdma/ib": "1"} and s.active_checks


def test_probe_pods_run_the_schedulers_own_image(fake_api, kube, monkeypatch):
    """kustomize rewrites the Deployment's image, not the template inside a ConfigMap."""
    for n in ("d0", "d1"):
        fake_api.add_node(n, gpus=8)
    fake_api.add_object({"apiVersion": "v1", "kind": "Pod",
                         "metadata": {"name": "sched-0", "namespace": "gpu-monitor"},
                         "spec": {"containers": [{"name": "scheduler",
                                                  "image": "registry.example.com/gpu-monitor:0.1.0"}]},
                         "status": {"phase": "Running"}})
    monkeypatch.setenv("POD_NAME", "sched-0")
    monkeypatch.setenv("POD_NAMESPACE", "gpu-monitor")
    args = parser(lambda a: kube).parse_args(["fabric-scheduler", "--once", "--job-template",
                                              str(TEMPLATE), "--idle-for-s", "0"])
    assert args.func(args) == 0
    (job,) = fake_api.list("batch", "jobs", "gpu-monitor-jobs")
    assert job["spec"]["template"]["spec"]["containers"][0]["image"] == \
        "registry.example.com/gpu-monitor:0.1.0"


def test_fabric_scheduler_logs_json_lines_as_the_daemon_does(fake_api, kube, capsys):
    """One logging set-up for daemon and scheduler (gpu_monitor/logs.py): --log-format json
    makes every record one JSON object on stderr."""
    import logging

    args = parser(lambda a: kube).parse_args(
        ["fabric-scheduler", "--once", "--job-template", str(TEMPLATE), "--log-format", "json"])
    try:
        assert args.func(args) == 0
        capsys.readouterr()
        logging.getLogger("gpu_monitor.fabric.test").warning("probe %s", "x", extra={"node": "n1"})
        line = capsys.readouterr().err.strip().splitlines()[-1]
        record = json.loads(line)
        assert record["level"] == "warning" and record["msg"] == "probe x"
        assert record["logger"] == "gpu_monitor.fabric.test" and record["node"] == "n1"
    finally:
        from gpu_monitor import logs

        logs.setup("text", "warning")


@pytest.mark.parametrize("argv,why", [
    (["--namespace", "gm", "--job-namespace", "gm"], "job_namespace must differ"),
    (["--settings", "STALL"], "stall_after_s must be longer"),
])
def test_fabric_scheduler_refuses_settings_it_could_not_honour(argv, why, capsys, tmp_path):
    stall = tmp_path / "stall.yaml"
    stall.write_text("stall_after_s: 10\n")  # shorter than the 15 s lease
    argv = [str(stall) if a == "STALL" else a for a in argv]
    args = parser().parse_args(["fabric-scheduler", "--once", *argv])
    assert args.func(args) == 2
    assert why in capsys.readouterr().err


def test_the_resource_settings_take_only_requests_and_limits(tmp_path):
    from gpu_monitor.fabric.scheduler_command import settings_from_args

    f = tmp_path / "s.yaml"
    f.write_text("probe_resources: {request: {cpu: 1}}\n")
    with pytest.raises(ValueError, match="only requests and limits"):
        settings_from_args(parser().parse_args(["fabric-scheduler", "--settings", str(f)]))
    f.write_text("probe_resources: {requests: {cpu: 2, memory: 4Gi}}\njob_namespace: probes\n")
    s = settings_from_args(parser().parse_args(["fabric-scheduler", "--settings", str(f)]))
    assert s.probe_resources == {"requests": {"cpu": "2", "memory": "4Gi"}}
    assert s.job_namespace == "probes" and s.namespace == "gpu-monitor"
