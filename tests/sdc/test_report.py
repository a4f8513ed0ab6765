"""write_report: the schema-1 JSON, the file drop, and GPUHealthReport objects via a fake API."""

from __future__ import annotations

import json
import os

import pytest

from gpu_monitor.sdc import report as R
from gpu_monitor.sdc import write_report

RANK_MAP = [
    {"rank": r, "node": f"node{r // 2}", "gpu_uuid": f"GPU-0000000{r}-aaaa-bbbb-cccc-dddddddddddd"}
    for r in range(6)
]

COMPUTE_ALARM = {
    "step": 13,
    "check": "compute",
    "nonfinite": [3],
    "mismatched_pairs": [(3, 1), (4, 2), (2, 0)],
    "culprits": [2],
    "verdicts": [{"pair": (3, 1), "third": 5, "suspect": 3, "kind": "transient"}],
    "suspects": None,
    "suspect_window": [13, 13],
    "last_audit_pass": 9,
    "last_weight_check_pass": 9,
    "named": [2, 3],
    "note": None,
    "applied": False,
    "audit": "loss",
}

WEIGHTS_NO_MAJORITY = dict(
    COMPUTE_ALARM, check="weights", nonfinite=[], mismatched_pairs=[], culprits=[], verdicts=[],
    suspects=None, named=[], note="replicas diverged with no strict majority: no suspect",
)


class FakeCustomObjects:
    """Records create calls like kubernetes.client.CustomObjectsApi; can fail on demand."""

    def __init__(self, fail: Exception | None = None) -> None:
        self.calls: list[dict] = []
        self.fail = fail

    def create_namespaced_custom_object(self, group, version, namespace, plural, body):
        if self.fail:
            raise self.fail
        self.calls.append(dict(group=group, version=version, namespace=namespace,
                               plural=plural, body=body))
        return dict(body, metadata=dict(body["metadata"], name="sdc-x-abcde"))


def test_report_joins_named_ranks_to_nodes_and_gpus():
    rep = R.build_report(COMPUTE_ALARM, RANK_MAP, job="llm-pretrain", now="2026-11-30T13:00:00Z")
    assert rep["schema"] == 1 and rep["job"] == "llm-pretrain"
    assert rep["step"] == 13 and rep["check"] == "compute"
    assert rep["ranks"] == [
        {"rank": 2, "node": "node1", "gpu_uuid": RANK_MAP[2]["gpu_uuid"], "roles": ["culprit"]},
        {"rank": 3, "node": "node1", "gpu_uuid": RANK_MAP[3]["gpu_uuid"],
         "roles": ["nonfinite", "suspect:transient"]},
    ]
    assert rep["nodes"] == ["node1"]
    assert rep["mismatched_pairs"] == [[3, 1], [4, 2], [2, 0]]
    assert rep["verdicts"] == [{"pair": [3, 1], "third": 5, "suspect": 3, "kind": "transient"}]
    assert rep["suspect_window"] == [13, 13] and rep["time"] == "2026-11-30T13:00:00Z"
    json.dumps(rep)  # JSON-serialisable as is


@pytest.mark.parametrize(
    "env, job",
    [({"JOB_NAME": "a", "TORCHELASTIC_RUN_ID": "b"}, "a"), ({"TORCHELASTIC_RUN_ID": "b"}, "b"),
     ({"SLURM_JOB_ID": "42"}, "42"), ({}, None)],
)
def test_job_name_comes_from_the_launcher_environment(env, job):
    assert R.job_name(env) == job


def test_write_report_to_a_directory_writes_one_complete_json_file(tmp_path, monkeypatch):
    monkeypatch.setenv("JOB_NAME", "job/with spaces")
    path = write_report(COMPUTE_ALARM, RANK_MAP, path=str(tmp_path))
    assert os.path.dirname(path) == str(tmp_path)
    assert os.path.basename(path).startswith("sdc-job-with-spaces-step13-")
    assert os.listdir(tmp_path) == [os.path.basename(path)]  # no temp file left behind
    with open(path) as f:
        data = json.load(f)
    assert data["schema"] == 1 and data["nodes"] == ["node1"] and data["job"] == "job/with spaces"


def test_write_report_to_a_file_path(tmp_path):
    target = tmp_path / "alarm.json"
    assert write_report(COMPUTE_ALARM, RANK_MAP, path=str(target)) == str(target)
    assert json.loads(target.read_text())["step"] == 13


def test_health_reports_one_object_per_named_node_with_the_node_label():
    api = FakeCustomObjects()
    rep = R.build_report(COMPUTE_ALARM, RANK_MAP, job="j", now="2026-11-30T13:00:00Z")
    created = R.create_health_reports(api, rep, "ml-jobs")
    assert len(created) == 1 and len(api.calls) == 1
    call = api.calls[0]
    assert (call["group"], call["version"], call["plural"], call["namespace"]) == (
        "gpu-monitor.io", "v1alpha1", "gpuhealthreports", "ml-jobs")
    body = call["body"]
    assert body["apiVersion"] == "gpu-monitor.io/v1alpha1" and body["kind"] == "GPUHealthReport"
    assert body["metadata"]["labels"] == {"gpu-monitor.io/node": "node1"}
    assert body["metadata"]["namespace"] == "ml-jobs"
    assert body["spec"] == {"node": "node1", "reason": "SdcAlarm", "source": "sdc-library",
                            "evidence": rep, "observedTime": "2026-11-30T13:00:00Z"}


def test_an_alarm_naming_no_rank_creates_no_object():
    api = FakeCustomObjects()
    rep = R.build_report(WEIGHTS_NO_MAJORITY, RANK_MAP)
    assert rep["ranks"] == [] and rep["nodes"] == []
    assert R.create_health_reports(api, rep, "ns") == [] and api.calls == []


def test_api_errors_reach_the_caller():
    api = FakeCustomObjects(fail=RuntimeError("403 forbidden"))
    rep = R.build_report(COMPUTE_ALARM, RANK_MAP)
    with pytest.raises(RuntimeError, match="403"):
        R.create_health_reports(api, rep, "ns")


def test_without_path_and_cluster_the_report_directory_is_used(tmp_path, monkeypatch):
    monkeypatch.setattr(R, "_in_cluster_api", lambda: None)
    monkeypatch.setenv("GPU_MONITOR_REPORT_DIR", str(tmp_path))
    path = write_report(COMPUTE_ALARM, RANK_MAP)
    assert os.path.dirname(path) == str(tmp_path)


def test_without_path_in_cluster_the_objects_are_created(monkeypatch):
    api = FakeCustomObjects()
    monkeypatch.setattr(R, "_in_cluster_api", lambda: (api, "train-ns"))
    created = write_report(COMPUTE_ALARM, RANK_MAP)
    assert len(created) == 1 and api.calls[0]["namespace"] == "train-ns"


def test_without_any_destination_write_report_says_what_to_do(tmp_path, monkeypatch):
    monkeypatch.setattr(R, "_in_cluster_api", lambda: None)
    monkeypatch.setenv("GPU_MONITOR_REPORT_DIR", str(tmp_path / "missing"))
    with pytest.raises(RuntimeError, match="GPU_MONITOR_REPORT_DIR"):
        write_report(COMPUTE_ALARM, RANK_MAP)


def test_outside_a_cluster_no_in_cluster_api_is_found(monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert R._in_cluster_api() is None
