"""Small JSON values checks keep between polls: baselines, last counter readings, records.

Why it exists: a check that compares with what it saw before (a counter's last value, a
recorded baseline) needs somewhere that survives a restart, without a table of its own.
Values are stored by (namespace, key); a check uses its own name as the namespace.
"""

from __future__ import annotations

import json
from typing import Any

from gpu_monitor.state.connection import Database
from gpu_monitor.state.encoding import dumps, to_us

__all__ = ["KvTables"]


class KvTables(Database):
    """``kv``: JSON text by (namespace, key)."""

    def get_kv(self, namespace: str, key: str, default: Any = None) -> Any:
        """A JSON value stored by ``set_kv`` (datetimes come back as ISO strings)."""
        with self._read() as c:
            row = c.execute("SELECT value FROM kv WHERE namespace = ? AND key = ?",
                            (namespace, key)).fetchone()
        return default if row is None else json.loads(row[0])

    def set_kv(self, namespace: str, key: str, value: Any) -> None:
        text = dumps(value)
        with self._write() as c:
            c.execute("INSERT INTO kv (namespace, key, value, updated_us) VALUES (?, ?, ?, ?)"
                      " ON CONFLICT (namespace, key) DO UPDATE SET value = excluded.value,"
                      " updated_us = excluded.updated_us",
                      (namespace, key, text, to_us(self._clock.now())))

    def delete_kv(self, namespace: str, key: str) -> bool:
        with self._write() as c:
            return c.execute("DELETE FROM kv WHERE namespace = ? AND key = ?",
                             (namespace, key)).rowcount > 0

    def kv_items(self, namespace: str) -> dict[str, Any]:
        with self._read() as c:
            rows = c.execute("SELECT key, value FROM kv WHERE namespace = ? ORDER BY key",
                             (namespace,)).fetchall()
        return {k: json.loads(v) for k, v in rows}

