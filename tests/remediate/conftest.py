"""The fake cluster the remediation tests run against (the helpers: remediate_helpers.py)."""

from __future__ import annotations

import pytest

from tests.remediate.remediate_helpers import NODE, FakeApiServer, seed_breaker


@pytest.fixture
def cluster():
    """``cluster(*nodes, breaker=True)`` -> a started fake apiserver holding ``nodes`` (8 GPUs
    each, added in order) and, with ``breaker``, the breaker ConfigMap in its closed state.
    Every one made is stopped after the test."""
    made: list[FakeApiServer] = []

    def make(*nodes: str, breaker: bool = True) -> FakeApiServer:
        server = FakeApiServer().start()
        made.append(server)
        for node in nodes:
            server.add_node(node, gpus=8)
        if breaker:
            seed_breaker(server)
        return server

    yield make
    for server in made:
        server.stop()


@pytest.fixture
def fake(cluster) -> FakeApiServer:
    """The cluster most remediation tests need: this node (``NODE``) and the breaker."""
    return cluster(NODE)
