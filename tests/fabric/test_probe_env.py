"""fabric/probe_env.py: the launcher's environment and the test-only fault seam."""

from __future__ import annotations

import re

import pytest

from gpu_monitor.fabric.probe_env import (
    LaunchEnv,
    ProbeError,
    TestFault,
    launch_env,
    parse_test_faults,
)

# --- launcher -------------------------------------------------------------------------------------


def test_torchrun_environment():
    env = launch_env({"RANK": "9", "WORLD_SIZE": "16", "LOCAL_RANK": "1",
                      "LOCAL_WORLD_SIZE": "8", "MASTER_ADDR": "job-0.svc", "MASTER_PORT": "29500",
                      "NODE_NAME": "gpu-node-7", "POD_NAME": "job-1-abc"})
    assert env == LaunchEnv(9, 16, 1, 8, "job-0.svc", 29500, "gpu-node-7", "job-1-abc")


def test_indexed_job_index_stands_in_for_a_missing_rank():
    env = launch_env({"JOB_COMPLETION_INDEX": "3", "WORLD_SIZE": "4", "MASTER_ADDR": "m",
                      "MASTER_PORT": "1"})
    assert env.rank == 3 and env.local_rank == 0


@pytest.mark.parametrize("environ, words", [
    ({}, "RANK (or JOB_COMPLETION_INDEX), WORLD_SIZE, MASTER_ADDR, MASTER_PORT"),
    ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "m"}, "MASTER_PORT"),
    ({"RANK": "2", "WORLD_SIZE": "2", "MASTER_ADDR": "m", "MASTER_PORT": "1"}, "outside"),
    ({"RANK": "x", "WORLD_SIZE": "2", "MASTER_ADDR": "m", "MASTER_PORT": "1"}, "integer"),
])
def test_a_missing_or_bad_launcher_environment_is_a_usage_error(environ, words):
    with pytest.raises(ProbeError, match=re.escape(words)):
        launch_env(environ)


@pytest.mark.parametrize("text, want", [
    ("", []),
    ("slow:2", [TestFault("slow", 2, 0.05)]),
    ("slow:1:0.2, corrupt:3", [TestFault("slow", 1, 0.2), TestFault("corrupt", 3)]),
])
def test_fault_seam_entries(text, want):
    assert parse_test_faults(text) == want


@pytest.mark.parametrize("text", ["hang:1", "slow", "corrupt:x", "slow:1:fast"])
def test_fault_seam_rejects_garbage(text):
    with pytest.raises(ProbeError):
        parse_test_faults(text)

