"""The fabric scheduler's per-node record, kept in a ConfigMap so a new leader carries on.

Why apart: the record is the scheduler's memory across leaders (when each node was last probed
or checked, with what outcome, in which group, and when it was last reported), and its
persistence has rules of its own that the scheduling loop should not have to read:

1. A new leader reads the record before it plans anything, so it does not re-probe every node
   (what it already holds in memory wins over what it reads).
2. A write is a compare-and-swap on the ConfigMap's resourceVersion. When someone else wrote
   it first (409) or it vanished (404), the record is read again and ours is merged over
   theirs, up to three times; any other API error leaves the record dirty for the next round.
3. Only the leader writes, and only when something changed (``dirty``).
"""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from gpu_monitor.fabric.api import FabricApi
from gpu_monitor.fabric.bisect import PASS
from gpu_monitor.fabric.pods import LABEL_MANAGED_BY, LABEL_NAME, MANAGER
from gpu_monitor.kube.errors import KubeError
from gpu_monitor.model import iso, parse_iso

log = logging.getLogger(__name__)

STATE_KEY = "nodes.json"


class NodeRecords:
    """Node name -> its record (``last_<what>``, ``<what>_outcome``, ``<what>_group``,
    ``<what>_partial``, ``reported_at``), for ``what`` in probe, check, abandoned,
    check-abandoned; loaded from and saved to the ConfigMap ``namespace/name``."""

    def __init__(self, api: FabricApi, namespace: str, name: str):
        self.api = api
        self.namespace = namespace
        self.name = name
        self.nodes: dict[str, dict[str, Any]] = {}
        self.dirty = False
        self._rv: str | None = None

    def __getitem__(self, node: str) -> dict[str, Any]:
        return self.nodes[node]

    def snapshot(self) -> dict[str, dict[str, Any]]:
        return copy.deepcopy(self.nodes)

    # --- reading and writing one node's record --------------------------------------------------

    def last(self, node: str, what: str) -> datetime | None:
        raw = self.nodes.get(node, {}).get(f"last_{what}")
        return parse_iso(raw) if raw else None

    def mark(self, nodes: Iterable[str], what: str, outcome: str, now: datetime, group: str,
             partial: Sequence[Mapping[str, Any]] = ()) -> None:
        for n in nodes:
            rec = self.nodes.setdefault(n, {})
            rec[f"last_{what}"] = iso(now)
            rec[f"{what}_outcome"] = outcome
            rec[f"{what}_group"] = group
            if partial:
                rec[f"{what}_partial"] = [dict(x) for x in partial][:4]
        self.dirty = True

    def reported_at(self, node: str) -> str | None:
        return self.nodes.get(node, {}).get("reported_at")

    def mark_reported(self, node: str, now: datetime) -> None:
        self.nodes.setdefault(node, {})["reported_at"] = iso(now)
        self.dirty = True

    def known_good(self, exclude: Iterable[str], now: datetime, max_age_s: float) -> list[str]:
        """Nodes whose last probe passed within ``max_age_s``, most recent first."""
        skip = set(exclude)
        good = []
        for n, rec in self.nodes.items():
            if n in skip or rec.get("probe_outcome") != PASS or not rec.get("last_probe"):
                continue
            age = (now - parse_iso(rec["last_probe"])).total_seconds()
            if age <= max_age_s:
                good.append((age, n))
        return [n for _, n in sorted(good)]

    # --- the ConfigMap ---------------------------------------------------------------------------

    def load(self) -> None:
        cm = self.api.get_configmap(self.namespace, self.name)
        if cm is None:
            self._rv = None
            return
        self._rv = (cm.get("metadata") or {}).get("resourceVersion")
        try:
            data = json.loads((cm.get("data") or {}).get(STATE_KEY) or "{}")
        except ValueError:
            log.warning("the fabric record %s is not JSON; starting afresh", self.name)
            data = {}
        if isinstance(data, dict):
            for node, rec in data.items():
                if isinstance(rec, dict):
                    self.nodes[node] = {**rec, **self.nodes.get(node, {})}

    def save(self) -> None:
        body = {"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": self.name, "namespace": self.namespace,
                             "labels": {LABEL_NAME: "gpu-monitor", LABEL_MANAGED_BY: MANAGER}},
                "data": {STATE_KEY: json.dumps(self.nodes, sort_keys=True)}}
        for _ in range(3):
            try:
                if self._rv is None:
                    made = self.api.create_configmap(self.namespace, body)
                else:
                    body["metadata"]["resourceVersion"] = self._rv
                    made = self.api.replace_configmap(self.namespace, self.name, body)
                self._rv = (made or {}).get("metadata", {}).get("resourceVersion")
                self.dirty = False
                return
            except KubeError as err:
                if err.status not in (404, 409):
                    log.warning("cannot save the fabric record: %s", err)
                    return
                mine = copy.deepcopy(self.nodes)
                self.load()  # someone else wrote it: merge ours over theirs
                for node, rec in mine.items():
                    self.nodes[node] = {**self.nodes.get(node, {}), **rec}
                body["data"][STATE_KEY] = json.dumps(self.nodes, sort_keys=True)
                body["metadata"].pop("resourceVersion", None)
