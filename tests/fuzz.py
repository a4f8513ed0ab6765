"""Feeding arbitrary input to a loader: the property tests of every file format the daemon
reads (a config, a profile) hold it to raising only its own error type, whatever the bytes."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path


def load_any_bytes(load: Callable[[str], object], data: bytes, name: str,
                   allowed: type[Exception]) -> None:
    """``load`` the path of a file ``name`` holding ``data`` (in a fresh temporary folder);
    an ``allowed`` error is swallowed, any other escapes and fails the test."""
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / name
        path.write_bytes(data)
        try:
            load(str(path))
        except allowed:
            pass
