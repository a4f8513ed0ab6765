"""Leader election over a coordination.k8s.io/v1 Lease, with client-go's rules.

Why: two scheduler replicas must never both launch probes; the holder renews every retry
period, a candidate takes over only when the record has not changed for the lease duration *as
it observed it* (clock skew does not matter), and a leader that could not renew within the
renew deadline stops acting before anyone can take over.
"""

from __future__ import annotations

import copy
import logging
import math
from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

from gpu_monitor.clock import Clock
from gpu_monitor.kube.errors import KubeError

if TYPE_CHECKING:
    from gpu_monitor.fabric.api import FabricApi

log = logging.getLogger(__name__)


def micro_time(ts: datetime) -> str:
    """A Lease MicroTime: RFC 3339 with exactly six fractional digits."""
    return ts.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    """One candidate for the Lease (client-go's leaderelection rules).

    - Expiry is judged on *this* process's clock: a holder is considered gone when its record
      (holder, renewTime, transitions) has not changed for ``lease_duration_s`` since we first
      saw it, so clock skew between candidates does not matter.
    - Every write carries the resourceVersion read just before (a conflict means someone
      else wrote: we are not the leader this round).
    - The leader considers itself leader only until ``renew_deadline_s`` after its last
      successful renewal, which is shorter than the lease duration another candidate waits.
    """

    def __init__(self, api: FabricApi, namespace: str, name: str, identity: str, *,
                 lease_duration_s: float = 15.0, renew_deadline_s: float = 10.0,
                 clock: Clock | None = None):
        self.api = api
        self.namespace, self.name, self.identity = namespace, name, identity
        self.lease_duration_s = lease_duration_s
        self.renew_deadline_s = renew_deadline_s
        self.clock = clock or Clock()
        self._leader = False
        self._last_renew = -math.inf
        self._observed: tuple[Any, ...] | None = None
        self._observed_at = -math.inf
        self.transitions_seen = 0

    @property
    def is_leader(self) -> bool:
        return self._leader and self.clock.monotonic() - self._last_renew < self.renew_deadline_s

    def _spec(self, now: datetime, acquire: str, transitions: int) -> dict[str, Any]:
        return {"holderIdentity": self.identity,
                "leaseDurationSeconds": max(1, int(math.ceil(self.lease_duration_s))),
                "acquireTime": acquire, "renewTime": micro_time(now),
                "leaseTransitions": transitions}

    def try_acquire_or_renew(self) -> bool:
        now, mono = self.clock.now(), self.clock.monotonic()
        try:
            lease = self.api.get_lease(self.namespace, self.name)
            if lease is None:
                body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                        "metadata": {"name": self.name, "namespace": self.namespace},
                        "spec": self._spec(now, micro_time(now), 0)}
                self.api.create_lease(self.namespace, body)
                return self._won(mono, body["spec"])
            spec = lease.get("spec") or {}
            holder = spec.get("holderIdentity") or ""
            record = (holder, spec.get("renewTime"), spec.get("leaseTransitions"),
                      spec.get("acquireTime"))
            if record != self._observed:
                self._observed, self._observed_at = record, mono
            duration = float(spec.get("leaseDurationSeconds") or self.lease_duration_s)
            if holder and holder != self.identity and mono - self._observed_at < duration:
                self._leader = False
                return False
            ours = holder == self.identity
            transitions = int(spec.get("leaseTransitions") or 0) + (0 if ours else 1)
            acquire = spec.get("acquireTime") if ours and spec.get("acquireTime") \
                else micro_time(now)
            new = copy.deepcopy(lease)
            new["spec"] = {**spec, **self._spec(now, acquire, transitions)}
            self.api.replace_lease(self.namespace, self.name, new)
            if not ours:
                log.info("%s took the lease %s/%s from %r", self.identity, self.namespace,
                         self.name, holder or None)
            return self._won(mono, new["spec"])
        except KubeError as err:
            if err.status == 409:
                log.debug("lease %s: lost a race (%s)", self.name, err)
            else:
                log.warning("lease %s: %s", self.name, err)
            return self.is_leader

    def _won(self, mono: float, spec: Mapping[str, Any]) -> bool:
        if not self._leader:
            self.transitions_seen += 1
        self._leader = True
        self._last_renew = mono
        self._observed = (spec.get("holderIdentity"), spec.get("renewTime"),
                          spec.get("leaseTransitions"), spec.get("acquireTime"))
        self._observed_at = mono
        return True

    def release(self) -> None:
        """Step down now, so another candidate need not wait a lease duration."""
        if not self._leader:
            return
        self._leader = False
        try:
            lease = self.api.get_lease(self.namespace, self.name)
            if lease and (lease.get("spec") or {}).get("holderIdentity") == self.identity:
                new = copy.deepcopy(lease)
                new["spec"] = {**(lease.get("spec") or {}), "holderIdentity": "",
                               "leaseDurationSeconds": 1,
                               "renewTime": micro_time(self.clock.now())}
                self.api.replace_lease(self.namespace, self.name, new)
        except KubeError as err:
            log.warning("releasing the lease %s: %s", self.name, err)
