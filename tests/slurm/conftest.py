"""The real Slurm cluster (cluster.py), one per test session, stopped at its end."""

from __future__ import annotations

import pytest

from tests.slurm.cluster import JOBS, SlurmCluster, missing_binaries


@pytest.fixture(scope="session")
def slurm_cluster():
    missing = missing_binaries()
    if missing:
        pytest.skip(f"Slurm/munge not installed (missing {', '.join(missing)}): "
                    "apt-get install slurmctld slurmd slurm-client munge")
    cluster = SlurmCluster()
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def slurm(slurm_cluster, monkeypatch):
    """The cluster, every node back in service without a reason before and after the test;
    SLURM_CONF points the tools at it."""
    monkeypatch.setenv("SLURM_CONF", str(slurm_cluster.conf))
    slurm_cluster.reset_all()
    yield slurm_cluster
    slurm_cluster.run("scancel", "--full", "-p", JOBS)
    slurm_cluster.reset_all()
