"""Fixtures for tests that talk Kubernetes: the fake apiserver and a real client pointed at it."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

# The fake's modules live beside this file, with no package (tests/ has no __init__.py).
_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from fake_apiserver import FakeApiServer  # noqa: E402


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
