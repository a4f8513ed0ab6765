"""The cleaner as the daemon runs it: built from ``cleaning.*`` and run on its own thread.

``build`` puts the pieces together (the loop, the held suite, the hold's spec from the config);
``Service.start`` runs a pass every ``cleaning.interval_s`` until the daemon stops. A pass never
raises (``Cleaner.tick``), and a suite in progress stops between checks once the daemon is
stopping, so a SIGTERM never waits a whole suite out; what it had not finished is run again
after the restart (the memory says the node is still dirty).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from gpu_monitor.check import Check, Context
from gpu_monitor.cleaning.hold import HoldSpec
from gpu_monitor.cleaning.loop import Cleaner
from gpu_monitor.cleaning.suite import HeldSuite
from gpu_monitor.clock import Clock
from gpu_monitor.config import CleaningConfig
from gpu_monitor.model import RunOutcome, UsageError, parse_iso
from gpu_monitor.remediate.bootstrap_gate import KV_NAMESPACE as GATE_NAMESPACE
from gpu_monitor.remediate.bootstrap_gate import KV_PASSED as GATE_PASSED
from gpu_monitor.remediate.record import load_record

log = logging.getLogger(__name__)

DEFAULT_NAMESPACE = "gpu-monitor"


def hold_namespace(cfg: CleaningConfig, env: Mapping[str, str] | None = None) -> str:
    """``cleaning.namespace``, else the daemon's own ($POD_NAMESPACE from the downward API),
    else gpu-monitor: the RBAC grants pod create/delete in the daemon's namespace only."""
    env = os.environ if env is None else env
    return cfg.namespace or env.get("POD_NAMESPACE") or DEFAULT_NAMESPACE


def refuse_without_runtime(cfg: CleaningConfig, runtime_missing: Callable[[], str]) -> None:
    """``cleaning.enabled`` on an image that cannot run the active suite (the passive image) is
    refused at the daemon's start, naming the field: it could hold a node but never release
    it. ``runtime_missing``: what the image lacks ("" when nothing)."""
    missing = runtime_missing() if cfg.enabled else ""
    if missing:
        raise UsageError(f"cleaning.enabled: true, but this image cannot run the active suite "
                         f"({missing}), so it could never release a node: run the full image, "
                         f"or set cleaning.enabled: false")


@dataclass
class Service:
    cleaner: Cleaner
    suite: HeldSuite
    interval_s: float
    stop: threading.Event
    thread: threading.Thread | None = None

    def start(self) -> threading.Thread:
        def loop() -> None:
            log.info("cleaning: on for %s (a pass every %g s, budget %g s)",
                     self.cleaner.node, self.interval_s, self.cleaner.budget_s)
            while not self.stop.is_set():
                self.cleaner.tick()
                self.stop.wait(self.interval_s)

        self.thread = threading.Thread(target=loop, name="cleaning", daemon=True)
        self.thread.start()
        return self.thread


def build(cfg: CleaningConfig, node: str, store: Any, *, kube: Callable[[], Any],
          checks: Sequence[Check], disabled: Mapping[str, str] | None,
          context: Callable[[], Context], record: Callable[[RunOutcome], None],
          runtime_missing: Callable[[], str], quarantined: Callable[[], bool],
          stop: threading.Event, clock: Clock | None = None,
          provisioning: Callable[[], tuple[bool, datetime | None]] = lambda: (False, None),
          env: Mapping[str, str] | None = None) -> Service:
    """The cleaner of ``cfg`` (enabled or not: the caller decides whether to start it)."""
    clock = clock or Clock()
    suite = HeldSuite(checks, context, record=record, disabled=disabled,
                      runtime_missing=runtime_missing, stopping=stop.is_set, clock=clock)

    spec = HoldSpec(namespace=hold_namespace(cfg, env), image=cfg.hold_image,
                    priority_class=cfg.priority_class)
    cleaner = Cleaner(kube, node, store, run_suite=suite, quarantined=quarantined,
                      provisioning=provisioning, spec=spec, budget_s=cfg.budget_s,
                      retry_after_s=cfg.retry_after_s, max_attempts=cfg.max_attempts,
                      clock=clock)
    return Service(cleaner, suite, cfg.interval_s, stop)


def from_env(env: Any, suite: tuple[Sequence[Check], Mapping[str, str]], *,
             record: Callable[[RunOutcome], None], stop: threading.Event,
             kube: Callable[[], Any], runtime_missing: Callable[[], str]) -> Service | None:
    """The daemon's cleaner (None when nothing is stored: there is no memory to keep),
    skipped while remediation holds a quarantine record. ``env``: the CLI's environment
    (config, node, store, clock, context); ``suite``: the bootstrap suite's checks and the
    config's disabled ones."""
    if env.store is None:
        return None
    checks, disabled = suite
    return build(env.config.cleaning, env.node, env.store, kube=kube, checks=checks,
                 disabled=disabled, context=lambda: env.context(force=False), record=record,
                 runtime_missing=runtime_missing,
                 quarantined=lambda: load_record(env.store, env.clock.now()) is not None,
                 provisioning=lambda: bootstrap_gate_state(env.store,
                                                           env.config.daemon.bootstrap_on_start),
                 stop=stop, clock=env.clock)


def bootstrap_gate_state(store: Any, gate_on: bool) -> tuple[bool, datetime | None]:
    """(the bootstrap gate is still closed, when its suite passed): while it is closed its
    taint holds the node and its suite runs, so the cleaner waits; its pass is a clean."""
    raw = store.get_kv(GATE_NAMESPACE, GATE_PASSED)
    try:
        passed = parse_iso(raw) if isinstance(raw, str) else None
    except ValueError:
        passed = None
    return gate_on and passed is None, passed
