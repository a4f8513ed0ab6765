"""The policy's memory between observations, persisted in the state store.

Why apart: results arrive from the daemon's threads (``Remediator.on_results``) while the
lifecycle forgets what a GPU reset, a reboot or a release made stale; both go through this one
lock, and every change is committed to the store before the step that depends on it (a daemon
restarted mid-quarantine decides on the same standing results).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from gpu_monitor.model import Result
from gpu_monitor.remediate.policy import Decision, PolicySettings, PolicyState, decide, observe
from gpu_monitor.remediate.record import KV_NAMESPACE, KV_POLICY

__all__ = ["PolicyMemory"]


class PolicyMemory:
    """``PolicyState`` behind a lock, saved on every change."""

    def __init__(self, store: Any):
        self.store = store
        self._lock = threading.RLock()
        self._state = PolicyState.from_json(store.get_kv(KV_NAMESPACE, KV_POLICY))
        self._saved = self._state.to_json()

    def observe(self, results: Iterable[Result]) -> None:
        """Fold one batch of results into the memory."""
        with self._lock:
            self._state = observe(self._state, results)
            self._save()

    def observe_afresh(self, results: Iterable[Result]) -> None:
        """Forget every standing result, then fold ``results`` in (a retest's suite)."""
        with self._lock:
            self._state = observe(self._state.without(), results)
            self._save()

    def forget(self, checks: Iterable[str] | None = None) -> None:
        """Forget the standing results of ``checks`` (None: all of them)."""
        with self._lock:
            self._state = self._state.without(checks)
            self._save()

    def decide(self, settings: PolicySettings, now: datetime,
               node_labels: Mapping[str, str] | None) -> Decision:
        with self._lock:
            return decide(self._state, settings, now, node_labels=node_labels)

    def _save(self) -> None:
        text = self._state.to_json()
        if text != self._saved:
            self.store.set_kv(KV_NAMESPACE, KV_POLICY, text)
            self._saved = text
