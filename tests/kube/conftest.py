"""Fixtures for tests that talk Kubernetes: the fake apiserver and a real client pointed at it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.kube.fake_apiserver import FakeApiServer


@pytest.fixture
def fake_api() -> Iterator[FakeApiServer]:
    """A started fake apiserver on 127.0.0.1 and a free port; stopped after the test."""
    server = FakeApiServer().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def kube_client(fake_api: FakeApiServer):
    """A real `kubernetes.client.ApiClient` configured for `fake_api` (plain HTTP, no auth)."""
    from kubernetes import client

    cfg = client.Configuration(host=fake_api.url)
    api = client.ApiClient(cfg)
    try:
        yield api
    finally:
        api.close()
