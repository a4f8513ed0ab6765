"""One notice per outage, in the state store: a trigger's record is committed before any action
it starts (a daemon restarted mid-notice never notifies the same outage twice), and every
action's outcome is counted there (the counts survive restarts, as counters must)."""

from __future__ import annotations

from typing import Any

NOTICES = "failfast"  # kv namespace: trigger key -> the notice's record
COUNTS = "failfast_counts"  # kv namespace: "action/result" -> count


class NoticeBook:
    """The notices over a ``Store``'s key/value tables (one writer: the notifier's thread)."""

    def __init__(self, store: Any):
        self.store = store

    def seen(self, key: str) -> dict | None:
        return self.store.get_kv(NOTICES, key)

    def write(self, key: str, record: dict) -> None:
        self.store.set_kv(NOTICES, key, record)

    def count(self, action: str, result: str, n: int = 1) -> None:
        name = f"{action}/{result}"
        self.store.set_kv(COUNTS, name, int(self.store.get_kv(COUNTS, name, 0) or 0) + n)

    def counts(self) -> dict[tuple[str, str], int]:
        out: dict[tuple[str, str], int] = {}
        for name, value in self.store.kv_items(COUNTS).items():
            action, _, result = name.partition("/")
            out[(action, result)] = int(value or 0)
        return out

    def notices(self) -> dict[str, dict]:
        return dict(self.store.kv_items(NOTICES))
