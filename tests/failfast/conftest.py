"""Fixtures of the fail-fast tests: the wire-level fake apiserver (the one tests/kube uses)
and a rig whose RDMA port has just crossed NCCL's tolerance."""

from __future__ import annotations

import pytest

from tests.failfast.failfast_helpers import crossing_result, new_rig
from tests.kube.conftest import fake_api  # noqa: F401 - the same fixture, not a copy


@pytest.fixture
def crossing():
    """A rig and the rdma_ports result of its port's outage crossing the tolerance."""
    rig = new_rig()
    try:
        yield rig, crossing_result(rig)
    finally:
        rig.close()
