"""A one-node remediating daemon in its own process, for the kill -9 tests.

It is what the real daemon does for remediation, minus the checks: open the (file) state store,
feed the standing Xid 79 result (the xid check re-reports it after every restart), and tick
until the lifecycle reaches ``--until``. The test kills it at random points and restarts it.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from gpu_monitor.clock import Clock
from gpu_monitor.host_actuator import HostActuator
from gpu_monitor.remediate.k8s.delivery import KubeDelivery
from gpu_monitor.remediate.k8s.drain import DrainPolicy
from gpu_monitor.remediate.remediator import Remediator
from gpu_monitor.remediate.settings import Timing
from gpu_monitor.state import Store
from tests.remediate.remediate_helpers import NAMESPACE, config, host_paths, xid


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--node", required=True)
    ap.add_argument("--state", required=True)
    ap.add_argument("--root", required=True)
    ap.add_argument("--until", default="reboot-required")
    args = ap.parse_args()

    from kubernetes import client

    from gpu_monitor.kube.client import Kube

    clock = Clock()
    store = Store.open(args.state, clock)

    def factory():
        return Kube(client.ApiClient(client.Configuration(host=args.url)), clock,
                    retry_deadline_s=30.0, qps=0)

    drain = DrainPolicy(timeout_s=30.0, poll_s=0.05, retry_base_s=0.2, retry_max_s=1.0)
    cfg = config()
    delivery = KubeDelivery.from_config(cfg, args.node, clock, factory, namespace=NAMESPACE,
                                        drain=drain)
    actuator = HostActuator(host_paths(Path(args.root)), None,
                            reboot_sentinel=cfg.remediation.reboot_sentinel,
                            holders=lambda: [], nvswitch=False)
    r = Remediator.from_config(store, cfg, args.node, delivery, actuator, clock=clock,
                               timing=Timing(report_poll_s=3600))
    r.on_results([xid(79)])
    print("started", flush=True)
    while store.node_state().state != args.until:
        r.tick()
        time.sleep(0.02)
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
