"""Reading Slurm's output strictly, and our reason format (no cluster needed)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

import pytest

from gpu_monitor.remediate.slurm.breaker import SlurmBreaker, SlurmBreakerSettings, our_drains
from gpu_monitor.remediate.slurm.delivery import SlurmDelivery, SlurmSettings
from gpu_monitor.remediate.slurm.reason import MAX_LEN, format_reason, parse_reason
from gpu_monitor.remediate.slurm.tools import (
    SlurmError,
    SlurmTools,
    parse_show_nodes,
)
from tests.conftest import FIXTURES

SHOW = (FIXTURES / "slurm" / "scontrol_show_node_o_22.05.8.txt").read_text()


def test_a_recorded_scontrol_show_node_reads_as_slurm_printed_it():
    nodes = parse_show_nodes(SHOW)
    assert len(nodes) == 21
    ours, down, busy = nodes["gm01"], nodes["gm02"], nodes["gmreal"]
    assert ours.state == "UNKNOWN+DRAIN" and ours.drained and not ours.down
    assert ours.reason_user == "root" and ours.reason_time.startswith("2026-12-02T")
    assert parse_reason(ours.reason).token == "Xid79"
    assert down.down and down.out_of_service and down.reason == "admin: PSU swap"
    assert parse_reason(down.reason) is None
    assert busy.state == "ALLOCATED+DRAIN" and busy.reason == "admin work"
    assert busy.partitions == ("jobs",)
    assert nodes["gm03"].reason == "" and not nodes["gm03"].out_of_service
    assert [n for _t, n, _tok in our_drains(nodes, ("gpu",))] == ["gm01"]


@pytest.mark.parametrize("line", [
    "",
    "slurm_load_node error: Unable to contact slurm controller (connect failure)",
    "Node gm01 not found",
    "NodeName=gm01 CPUTot=1 Partitions=gpu",  # no State
    "NodeName=gm01 State=idle Partitions=gpu",  # not Slurm's state form
    "NodeName=gm01 State=IDLE+DRAIN Partitions=gpu Reason=no stamp here",
    "NodeName=gm01 State=IDLE+DRAIN Reason=x [root@2026-12-02T15:00:39]",  # no Partitions
])
def test_output_it_cannot_read_is_an_error_never_a_guess(line):
    with pytest.raises(SlurmError):
        parse_show_nodes(line)


def test_the_reason_stays_within_its_length_and_reads_back():
    r = format_reason("Xid79", "quarantined", ("xid", "gpu:3"), "2026-12-02T15:00:39")
    assert r == "gpu-monitor: Xid79 xid gpu:3 state:quarantined since:2026-12-02T15:00:39"
    back = parse_reason(r)
    assert (back.token, back.detail, back.state, back.since) == (
        "Xid79", ("xid", "gpu:3"), "quarantined", "2026-12-02T15:00:39")
    long = format_reason("Xid79", "replace", tuple(f"ib:mlx5_{i}:1" for i in range(100)))
    assert len(long) <= MAX_LEN and long.endswith(" state:replace")
    assert parse_reason(long).state == "replace"
    # a name with spaces or '=' never breaks the form
    assert parse_reason(format_reason("Bad Token=1", "claim", ("a b=c",))) is not None
    for theirs in ("admin work", "gpu-monitor: by hand", "gpu-monitor: Xid79 state:bogus",
                   "NHC: check_hw_gpu: 7 GPUs", ""):
        assert parse_reason(theirs) is None


@pytest.fixture
def fake_slurm(tmp_path, monkeypatch):
    """A fake ``scontrol``/``squeue`` on PATH printing what a test sets."""
    bindir = tmp_path / "bin"
    bindir.mkdir()

    def make(name: str, output: str, rc: int = 0) -> None:
        script = bindir / name
        (tmp_path / f"{name}.out").write_text(output)
        script.write_text(f"#!/bin/sh\ncat {tmp_path / (name + '.out')}\nexit {rc}\n")
        script.chmod(0o755)

    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    return make


def test_a_fake_scontrol_with_unreadable_output_makes_the_step_fail_not_guess(fake_slurm):
    fake_slurm("scontrol", "NodeName=gm01 Stat=IDLE Partitions=gpu\n")
    fake_slurm("squeue", "1234\nnot-a-job\n")
    d = SlurmDelivery("gm01", SlurmSettings(command_timeout_s=5.0))
    with pytest.raises(d.errors):
        d.read()
    assert d.facts() is None  # nothing was taken for a fact
    claim = d.breaker.claim("gm01", "Xid79")
    assert not claim.granted and claim.why == "error"
    with pytest.raises(SlurmError, match="not job ids"):
        d.tools.jobs_on("gm01")


def test_a_slurmctld_that_does_not_answer_is_an_error_within_the_timeout(fake_slurm, tmp_path):
    (tmp_path / "bin" / "scontrol").write_text("#!/bin/sh\nexec sleep 60\n")
    (tmp_path / "bin" / "scontrol").chmod(0o755)
    with pytest.raises(SlurmError, match="did not answer"):
        SlurmTools(0.5).show_node("gm01")


def test_a_refused_command_is_an_error_naming_slurms_message(fake_slurm):
    fake_slurm("scontrol", "slurm_load_node error: Unable to contact slurm controller "
                           "(connect failure)\n", rc=1)
    with pytest.raises(SlurmError, match="Unable to contact slurm controller"):
        SlurmTools(5.0).show_nodes()


def test_breaker_budget_counts_the_configured_gres():
    nodes = parse_show_nodes(SHOW)
    st = SlurmBreaker(SlurmTools(), SlurmBreakerSettings(partitions=("gpu",), gres=None)
                      )._status(nodes)
    assert (st.gpu_nodes, st.budget, sorted(st.slots)) == (20, 2, ["gm01"])
    gres = SlurmBreaker(SlurmTools(), SlurmBreakerSettings(gres="gpu"))._status(nodes)
    assert gres.gpu_nodes == 0 and gres.budget == 1  # none names gpu: the node itself counts


def test_the_slurm_path_imports_no_kubernetes():
    code = textwrap.dedent("""
        import sys
        import gpu_monitor.daemon, gpu_monitor.remediate.slurm.delivery
        from gpu_monitor.remediate.slurm.delivery import SlurmDelivery
        SlurmDelivery("n1")
        bad = sorted(m for m in sys.modules if m == "kubernetes" or m.startswith(
            ("kubernetes.", "gpu_monitor.remediate.k8s", "gpu_monitor.kube.client")))
        print(bad)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_the_slurm_node_name_of_a_host(fake_slurm):
    fake_slurm("scontrol", SHOW)  # every node's NodeHostName is localhost there
    tools = SlurmTools(5.0)
    assert tools.node_name_of_host("gm05") == "gm05"
    assert tools.node_name_of_host("gm05.cluster.example") == "gm05"
    with pytest.raises(SlurmError, match="set node_name in the config"):
        tools.node_name_of_host("localhost")  # 21 nodes: never a guess
    with pytest.raises(SlurmError, match="no node"):
        tools.node_name_of_host("elsewhere")


def test_daemon_backend_slurm_that_cannot_name_its_node_exits_2_naming_the_fix(fake_slurm,
                                                                                tmp_path):
    import socket

    fake_slurm("scontrol", SHOW)
    env = {k: v for k, v in os.environ.items() if k != "NODE_NAME"}
    out = subprocess.run([sys.executable, "-m", "gpu_monitor", "daemon", "--backend", "slurm",
                          "--state", str(tmp_path / "s.db"), "--once"],
                         capture_output=True, text=True, timeout=120, env=env)
    if socket.gethostname() in parse_show_nodes(SHOW):
        pytest.skip("this host's name is a node of the recorded cluster")
    assert out.returncode == 2, out.stderr
    assert "set node_name in the config" in out.stderr


def test_config_backend_and_slurm_block_are_validated_naming_the_field():
    from gpu_monitor.config import ConfigError, parse_config

    for data, field in [({"daemon": {"backend": "pbs"}}, "daemon.backend"),
                        ({"remediation": {"slurm": {"partitions": ["a,b"]}}},
                         "remediation.slurm.partitions[0]"),
                        ({"remediation": {"slurm": {"requeue_on": ["xid 79"]}}},
                         "remediation.slurm.requeue_on[0]"),
                        ({"remediation": {"slurm": {"command_timeout_s": -1}}},
                         "remediation.slurm.command_timeout_s"),
                        ({"remediation": {"slurm": {"partition": ["gpu"]}}},
                         "remediation.slurm.partition")]:
        with pytest.raises(ConfigError, match=re.escape(field)):
            parse_config(data, env={})
    cfg = parse_config({"daemon": {"backend": "SLURM"},
                        "remediation": {"slurm": {"partitions": ["gpu"], "gres": None,
                                                  "requeue_on": ["Xid79", "*"]}}}, env={})
    assert cfg.daemon.backend == "slurm"
    assert cfg.remediation.slurm.partitions == ("gpu",) and cfg.remediation.slurm.gres is None
    assert cfg.remediation.slurm.requeue_on == ("Xid79", "*")
