"""An SDC alarm from a Slurm job names nodes as Slurm knows them ($SLURMD_NODENAME, what
slurmd sets in every task) and reaches the named node's daemon through a report directory
shared by the nodes; every other node's daemon ignores it."""

from __future__ import annotations

from gpu_monitor.clock import Clock
from gpu_monitor.remediate.slurm.delivery import SlurmDelivery
from gpu_monitor.sdc.report import write_report
from gpu_monitor.sdc.topology import node_identity
from gpu_monitor.state import Store


def test_the_named_slurm_node_and_only_it_takes_the_alarm(tmp_path):
    shared = tmp_path / "reports"  # e.g. a directory on the cluster's shared filesystem
    shared.mkdir()
    task_env = [{"SLURMD_NODENAME": "gpu-a017", "SLURM_PROCID": "0"},
                {"SLURMD_NODENAME": "gpu-b042", "SLURM_PROCID": "1"}]
    identities = [node_identity(e) for e in task_env]
    assert identities == [("gpu-a017", "$SLURMD_NODENAME"), ("gpu-b042", "$SLURMD_NODENAME")]
    ranks = [{"rank": i, "node": name, "gpu_uuid": f"GPU-{i:08d}"}
             for i, (name, _src) in enumerate(identities)]
    alarm = {"step": 1200, "check": "audit", "culprits": [1], "nonfinite": [],
             "mismatched_pairs": [[0, 1]]}
    written = write_report(alarm, ranks, str(shared))
    assert written

    def taken_by(node: str) -> list:
        store = Store.open(":memory:", Clock())
        source = SlurmDelivery(node).incoming_reports(store, str(shared))
        return source.poll()

    blamed = taken_by("gpu-b042")
    assert len(blamed) == 1 and blamed[0].status.value == "failed", blamed
    assert blamed[0].reason == "SdcAlarm", blamed[0]
    assert taken_by("gpu-a017") == []  # in the job, not blamed
    assert taken_by("gpu-c001") == []  # not in the job
