"""The wire-level fake apiserver for the fail-fast API tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.kube.fake_apiserver import FakeApiServer


@pytest.fixture
def fake_api() -> Iterator[FakeApiServer]:
    server = FakeApiServer().start()
    try:
        yield server
    finally:
        server.stop()
