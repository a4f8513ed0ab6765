"""Fixtures for the cleaning tests: the fake apiserver (tests/kube's), a node with 8 GPUs, a
stand-in kube-scheduler, a real store."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gpu_monitor.state import Store
from tests.cleaning.kube_scheduler import Scheduler
from tests.fabric.conftest import kube  # noqa: F401 - the same fixtures, not copies
from tests.kube.conftest import fake_api  # noqa: F401
from tests.kube.fake_apiserver import FakeApiServer

NODE = "gpu-node-1"
#: The PriorityClasses of the test cluster: ours, a training default, and nothing (0).
CLASSES = {"gpu-monitor-cleaning": 1_000_000_000, "training": 1000}


@pytest.fixture
def node(fake_api: FakeApiServer) -> str:  # noqa: F811
    fake_api.add_namespace("gpu-monitor")
    fake_api.add_namespace("team")
    fake_api.add_node(NODE, gpus=8, labels={"kubernetes.io/hostname": NODE})
    return NODE


@pytest.fixture
def scheduler(fake_api: FakeApiServer) -> Iterator[Scheduler]:  # noqa: F811
    with Scheduler(fake_api, CLASSES) as s:
        yield s


@pytest.fixture
def store(tmp_path) -> Iterator[Store]:
    s = Store.open(str(tmp_path / "state.db"))
    try:
        yield s
    finally:
        s.close()
