"""Shared helpers of the remediation tests: the fake apiserver, a configured Remediator, results.

The fake apiserver (tests/kube/fake_apiserver.py) is driven by the real `kubernetes` client over
HTTP on 127.0.0.1; these helpers only seed it and build the pieces under test around it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from gpu_monitor.clock import Clock
from gpu_monitor.config import parse_config
from gpu_monitor.host_actuator import HostActuator
from gpu_monitor.hw.paths import HostPaths
from gpu_monitor.model import Action, Result, Status
from gpu_monitor.remediate.actuator import ResetOutcome
from gpu_monitor.remediate.k8s.delivery import KubeDelivery
from gpu_monitor.remediate.k8s.drain import DrainPolicy
from gpu_monitor.remediate.remediator import Remediator
from gpu_monitor.remediate.settings import Timing
from gpu_monitor.state import Store
from tests.kube.client_helpers import kube_for
from tests.kube.fake_apiserver import FakeApiServer

NODE = "gpu-node-1"  # the node the daemon under test runs on
NAMESPACE = "gpu-monitor"
BREAKER = "gpu-monitor-breaker"
TAINT_KEY = "gpu-monitor.io/unhealthy"
FAST_DRAIN = DrainPolicy(timeout_s=15.0, poll_s=0.05, retry_base_s=0.2, retry_max_s=1.0,
                         parallelism=4)


def seed_breaker(fake: FakeApiServer, **data: str) -> dict:
    body = {"state": "closed", "paused": "false", "slots": "{}", **data}
    return fake.add_object({"apiVersion": "v1", "kind": "ConfigMap",
                            "metadata": {"name": BREAKER, "namespace": NAMESPACE}, "data": body})


@contextmanager
def fake_cluster(*nodes: str, breaker: bool = True) -> Iterator[FakeApiServer]:
    """The fake apiserver, running, with ``nodes`` (8 GPUs each) and, unless told otherwise,
    the pre-created breaker ConfigMap."""
    server = FakeApiServer().start()
    for name in nodes:
        server.add_node(name, gpus=8)
    if breaker:
        seed_breaker(server)
    try:
        yield server
    finally:
        server.stop()


def breaker_data(fake: FakeApiServer) -> dict:
    return (fake.get("", "configmaps", BREAKER, NAMESPACE) or {}).get("data") or {}


def config(**remediation: Any):
    rem = {"enabled": True, "dry_run": False, "hysteresis_polls": 2, "hysteresis_s": 60.0}
    breaker = remediation.pop("breaker", {})
    rem.update(remediation)
    rem["breaker"] = {"budget_fraction": 0.1, "max_nodes": 20, "cooldown_s": 600.0,
                      "ttl_s": 3600.0, **breaker}
    return parse_config({"remediation": rem}, env={"NODE_NAME": "test"})


def xid(code: int = 79, gpu: int = 3, action: Action | None = None,
        status: Status = Status.FAILED, at: datetime | None = None) -> Result:
    default = {79: Action.REBOOT, 48: Action.RESET_GPU, 64: Action.REPLACE, 94: Action.WATCH}
    kw = {"observed_at": at} if at is not None else {}
    return Result(check="xid", status=status, target=f"gpu:{gpu}", reason=f"Xid{code}",
                  message=f"Xid {code} on GPU {gpu}", action=action or default.get(code, Action.RESET_GPU),
                  **kw)


def ok(check: str = "xid", target: str = "gpu:3", at: datetime | None = None) -> Result:
    kw = {"observed_at": at} if at is not None else {}
    return Result(check=check, status=Status.OK, target=target, **kw)


def host_paths(root: Path, boot_id: str = "boot-1") -> HostPaths:
    paths = HostPaths(sysfs=str(root / "sys"), procfs=str(root / "proc"), dev=str(root / "dev"),
                      rootfs=str(root / "root"))
    set_boot_id(paths, boot_id)
    return paths


def set_boot_id(paths: HostPaths, boot_id: str) -> None:
    p = Path(paths.proc("sys", "kernel", "random"))
    p.mkdir(parents=True, exist_ok=True)
    (p / "boot_id").write_text(boot_id + "\n")


@dataclass
class Resets:
    """An injectable GPU reset that records its calls and answers as told."""

    ok: bool = True
    calls: list = field(default_factory=list)

    def __call__(self, gpus):
        self.calls.append(None if gpus is None else list(gpus))
        if not self.ok:
            return ResetOutcome(False, "nvidia-smi: GPU reset failed")
        done = tuple(range(8)) if gpus is None else tuple(gpus)
        return ResetOutcome(True, "reset", done)


TIMING_FIELDS = frozenset(Timing.__dataclass_fields__)


def remediator(fake: FakeApiServer, root: Path, node: str = NODE, *, store=None,
               cfg=None, clock: Clock | None = None, drain: DrainPolicy = FAST_DRAIN,
               holders=None, resets: Resets | None = None, retest=None, **kw: Any) -> Remediator:
    """A Remediator on the fake apiserver (its Kubernetes delivery) and a host tree under
    ``root`` (its actuator, with an injected GPU reset and holder scan); ``kw`` may name the
    Remediator's keywords and ``Timing`` fields."""
    clock = clock or Clock()
    store = store or Store.open(":memory:", clock)
    cfg = cfg or config()
    root.mkdir(parents=True, exist_ok=True)
    paths = kw.pop("paths", None) or host_paths(root)
    delivery = KubeDelivery.from_config(cfg, node, clock, lambda: kube_for(fake, clock),
                                        namespace=NAMESPACE, drain=drain)
    actuator = HostActuator(paths, None, reboot_sentinel=cfg.remediation.reboot_sentinel,
                            holders=holders or (lambda: []), reset=resets or Resets(),
                            nvswitch=kw.pop("nvswitch", False))
    timing = Timing(**{k: kw.pop(k) for k in list(kw) if k in TIMING_FIELDS})
    return Remediator.from_config(store, cfg, node, delivery, actuator, clock=clock,
                                  retest=retest, timing=timing, **kw)


def our_conditions(node: dict) -> dict[str, dict]:
    from gpu_monitor.remediate.conditions import PROBLEM_CLASSES

    ours = set(PROBLEM_CLASSES.values()) | {"GPUProblem"}
    return {c["type"]: c for c in node["status"]["conditions"] if c["type"] in ours}


def our_taints(node: dict) -> list[dict]:
    return [t for t in node["spec"].get("taints") or [] if t["key"] == TAINT_KEY]


def events_for(fake: FakeApiServer, node: str) -> list[dict]:
    return [e for e in fake.list("", "events")
            if (e.get("involvedObject") or {}).get("name") == node]


def event_reasons(fake: FakeApiServer, node: str) -> list[str]:
    return [e["reason"] for e in events_for(fake, node)]


class JumpClock(Clock):
    """Real time that a test can also jump forward (``advance``): sleeps and waits are real, so
    the fake apiserver's kubelet and the drain share one timeline, but a five-minute healthy
    delay passes at once."""

    def __init__(self) -> None:
        import threading

        self._offset = 0.0
        self._lock = threading.Lock()

    def now(self):
        from datetime import timedelta

        with self._lock:
            return super().now() + timedelta(seconds=self._offset)

    def monotonic(self) -> float:
        with self._lock:
            return super().monotonic() + self._offset

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._offset += seconds


def patch_as_human(fake: FakeApiServer, node: str, body) -> dict:
    """A write by someone else (kubectl, another controller), through its own client."""
    kube = kube_for(fake)
    try:
        return kube.patch_node(node, body)
    finally:
        kube.close()


def writes_to(fake: FakeApiServer, path: str) -> list:
    return [r for r in fake.requests if r.method in ("PATCH", "PUT", "POST", "DELETE")
            and r.path == path]
