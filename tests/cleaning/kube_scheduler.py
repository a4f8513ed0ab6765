"""A test stand-in for kube-scheduler over the fake apiserver: the two facts the hold relies on.

1. Pending pods are taken highest priority first (``priorityClassName`` resolved through
   ``classes``), ties in creation order: kube-scheduler's active queue sorts by priority.
2. A pod is bound only where its GPU request fits beside the non-terminal pods already bound
   (a terminating pod still holds its GPUs until its object is gone).

No preemption (our hold is ``preemptionPolicy: Never`` and the workloads here are of lower
priority, so none could preempt it), no backoff: the race it leaves out is named in
docs/cleaning.md#the-race-that-remains.
"""

from __future__ import annotations

import copy
import threading

from gpu_monitor.fabric.pods import GPU_RESOURCE, node_gpus, pod_gpu_request
from tests.kube.fake_apiserver import FakeApiServer


def _target(pod: dict) -> str | None:
    terms = (((pod["spec"].get("affinity") or {}).get("nodeAffinity") or {})
             .get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get(
                 "nodeSelectorTerms") or []
    for term in terms:  # the workloads pin by hostname label, the hold by the Node's name
        for e in [*(term.get("matchExpressions") or []), *(term.get("matchFields") or [])]:
            if (e.get("key") in ("kubernetes.io/hostname", "metadata.name")
                    and e.get("operator") == "In"):
                return e["values"][0]
    return None


class Scheduler:
    def __init__(self, api: FakeApiServer, classes: dict[str, int], *, tick: float = 0.01):
        self.api = api
        self.classes = classes
        self.tick = tick
        self.bound: list[str] = []  # ns/name in binding order
        self._halt = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="test-kube-scheduler",
                                        daemon=True)
        self.paused = threading.Event()

    def __enter__(self) -> Scheduler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._halt.set()
        self._thread.join(timeout=10)

    def _loop(self) -> None:
        while not self._halt.wait(self.tick):
            if not self.paused.is_set():
                self.schedule_once()

    def schedule_once(self) -> None:
        api = self.api
        with api._lock:
            pods_res = api.resource("", "pods")
            pods = list(api._bucket(pods_res).values())
            nodes = {n["metadata"]["name"]: n for n in api._bucket(api.resource("", "nodes")).values()}
            used: dict[str, int] = {}
            for p in pods:
                node = p["spec"].get("nodeName")
                if node and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
                    used[node] = used.get(node, 0) + pod_gpu_request(p)
            pending = [p for p in pods if not p["spec"].get("nodeName")
                       and not p["metadata"].get("deletionTimestamp")]
            pending.sort(key=lambda p: (-self.classes.get(p["spec"].get("priorityClassName", ""), 0),
                                        int(p["metadata"]["resourceVersion"])))
            for p in pending:
                node = _target(p)
                if node is None or node not in nodes:
                    continue
                want = pod_gpu_request(p)
                if used.get(node, 0) + want > node_gpus(nodes[node], GPU_RESOURCE):
                    continue
                used[node] = used.get(node, 0) + want
                pod = copy.deepcopy(p)
                pod["spec"]["nodeName"] = node
                api._write(pods_res, pod, "MODIFIED")
                self.bound.append(f"{pod['metadata']['namespace']}/{pod['metadata']['name']}")
