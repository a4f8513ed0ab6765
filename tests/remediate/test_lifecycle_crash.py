"""kill -9 of the daemon at random points of a quarantine and its drain: the restarted daemon
resumes from its store and the node ends exactly as an uninterrupted run leaves it."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpu_monitor.remediate.k8s.node import ANNOTATIONS, LABEL_STATE
from gpu_monitor.state import Store
from tests.conftest import REPO
from tests.remediate.remediate_helpers import (
    NODE,
    TAINT_KEY,
    FakeApiServer,
    breaker_data,
    our_conditions,
    our_taints,
    seed_breaker,
)
from tests.waiting import eventually

PROC = "tests.remediate.remediate_proc"  # run with -m from the repository root
TRIALS = 12


def seed(fake: FakeApiServer) -> None:
    fake.add_node(NODE, gpus=8)
    fake.add_node("gpu-node-2", gpus=8)
    seed_breaker(fake)
    for i, stop in enumerate((0.2, 0.5, 0.9)):
        fake.add_pod(f"team-{i}", f"train-{i}", node=NODE, owner=("ReplicaSet", f"t{i}"),
                     gpus=2, grace_period=2, stop_after=stop)
    fake.add_pod("web", "web-0", node=NODE, owner=("ReplicaSet", "web"))
    fake.add_pod("kube-system", "dcgm-exporter", node=NODE, daemonset="dcgm-exporter", gpus=1)


def start(fake: FakeApiServer, tmp: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, "-m", PROC, "--url", fake.url, "--node", NODE,
                             "--state", str(tmp / "state.db"), "--root", str(tmp)],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, text=True)


def finish(fake: FakeApiServer, tmp: Path) -> None:
    proc = start(fake, tmp)
    out, _ = proc.communicate(timeout=90)
    assert proc.returncode == 0 and "done" in out, out


def check_end_state(fake: FakeApiServer, tmp: Path) -> None:
    node = fake.node(NODE)
    assert node["spec"]["unschedulable"] is True
    assert our_taints(node) == [{"key": TAINT_KEY, "value": "Xid79", "effect": "NoSchedule"}]
    ann = node["metadata"]["annotations"]
    assert ann[ANNOTATIONS.PRE_EXISTING] == "false"  # our own cordon, recorded before it
    assert ann[ANNOTATIONS.DRAIN] == "succeeded" and ann[ANNOTATIONS.REASON] == "Xid79"
    assert ANNOTATIONS.CORDONED in ann and ANNOTATIONS.UNCORDONED_MANUALLY not in ann
    assert node["metadata"]["labels"][LABEL_STATE] == "reboot-required"
    assert our_conditions(node)["GPUXidError"]["status"] == "True"
    for i in range(3):
        assert fake.pod(f"team-{i}", f"train-{i}") is None
    assert fake.pod("web", "web-0") and fake.pod("kube-system", "dcgm-exporter")
    data = breaker_data(fake)
    assert list(json.loads(data["slots"])) == [NODE] and data["state"] == "closed"
    assert (tmp / "root" / "var" / "run" / "reboot-required").exists()
    with Store.open(tmp / "state.db") as store:
        assert store.node_state().state == "reboot-required"
        assert store.action_counts().get(("cordon", "ok"), 0) <= 1


def kill(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    proc.stdout.close()


@pytest.mark.slow
@pytest.mark.timeout(1200)  # ~40 daemon starts; on a loaded 2-core machine each takes seconds
def test_kill_9_at_random_points_of_quarantine_and_drain_then_restart(tmp_path):
    """Each kill waits until the quarantine has reached a phase drawn at random (the order of
    PHASES), then a random moment more: the kill points spread over the phases however slow
    the machine is (a kill timed from a calibration run landed all twelve kills before the
    quarantine on a loaded machine)."""
    rng = random.Random(int(os.environ.get("GPU_MONITOR_CRASH_SEED", "20260101")))
    kills = []
    for trial in range(TRIALS):
        tmp = tmp_path / f"trial-{trial}"
        with FakeApiServer() as fake:
            seed(fake)
            for _ in range(rng.choice((1, 1, 2))):  # sometimes killed twice in a row
                proc = start(fake, tmp)
                proc.stdout.readline()  # "started": imports done, the store is open
                reached = PHASES.index(rng.choice(PHASES))
                eventually(lambda p=proc, at=reached: PHASES.index(phase(fake)) >= at
                           or p.poll() is not None,
                           timeout=90, what=f"the quarantine at {PHASES[reached]}")
                time.sleep(rng.uniform(0.0, 0.3))
                kills.append(phase(fake))
                kill(proc)
            finish(fake, tmp)
            check_end_state(fake, tmp)
    assert len(kills) >= TRIALS
    print("kill points:", kills)
    assert len(set(kills)) >= 3, kills  # the kills land in several phases


@pytest.mark.slow
def test_kill_9_inside_the_drain_then_restart(tmp_path):
    """The point a random kill may miss on a loaded machine, hit on purpose: the kill comes as
    soon as the drain is seen under way (pods evicted, not all gone)."""
    target = "draining"
    with FakeApiServer() as fake:
        seed(fake)
        proc = start(fake, tmp_path)
        proc.stdout.readline()
        seen = eventually(lambda: phase(fake) in (target, "drained") and phase(fake),
                          timeout=60, what=f"the node {target}")
        kill(proc)
        assert seen == target, f"the drain ran past {target} before it was seen"
        finish(fake, tmp_path)
        check_end_state(fake, tmp_path)


PHASES = ("before-quarantine", "recorded-not-cordoned", "cordoned", "draining", "drained")


def phase(fake: FakeApiServer) -> str:
    """Where the quarantine stood when the daemon was killed."""
    node = fake.node(NODE)
    ann = node["metadata"].get("annotations") or {}
    left = sum(fake.pod(f"team-{i}", f"train-{i}") is not None for i in range(3))
    if not ann.get(ANNOTATIONS.SINCE):
        return "before-quarantine"
    if not node["spec"].get("unschedulable"):
        return "recorded-not-cordoned"
    if ann.get(ANNOTATIONS.DRAIN) == "pending":
        return "draining" if left < 3 or any(
            (fake.pod(f"team-{i}", f"train-{i}") or {}).get("metadata", {}).get(
                "deletionTimestamp") for i in range(3)) else "cordoned"
    return "drained"

