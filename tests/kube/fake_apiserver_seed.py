"""Seeding the fake apiserver from a test: nodes, pods, DaemonSets, PDBs, and pod-lifecycle knobs.

Why a mixin of FakeApiServer: objects seeded this way skip admission and get realistic content
(what kubelet, the scheduler and the controllers would have written), which tests cannot create
through the API; they still get uids, resourceVersions and watch events like any other write.
"""

from __future__ import annotations

import copy
import uuid
from typing import Any

from tests.kube.fake_apiserver_api import MIRROR_ANNOTATION, PodRuntime, rfc3339, running_pod_status


class SeedingMixin:
    """The `add_*`/`set_*` helpers and the kubelet knobs; state lives in FakeApiServer."""

    # ------------------------------------------------------------------------- test helpers

    def add_namespace(self, name: str, *, terminating: bool = False) -> dict:
        return self._insert(
            {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {"name": name, "labels": {"kubernetes.io/metadata.name": name}},
                "spec": {"finalizers": ["kubernetes"]},
                "status": {"phase": "Terminating" if terminating else "Active"},
            }
        )

    def add_node(
        self,
        name: str,
        *,
        labels: dict | None = None,
        annotations: dict | None = None,
        unschedulable: bool = False,
        taints: list[dict] | None = None,
        conditions: list[dict] | None = None,
        gpus: int = 0,
        ready: bool = True,
    ) -> dict:
        """A node as kubelet registers it (Ready and pressure conditions, capacity, addresses)."""
        now = rfc3339()
        cond = [
            {
                "type": t,
                "status": s,
                "lastHeartbeatTime": now,
                "lastTransitionTime": now,
                "reason": r,
                "message": m,
            }
            for t, s, r, m in (
                (
                    "MemoryPressure",
                    "False",
                    "KubeletHasSufficientMemory",
                    "kubelet has sufficient memory available",
                ),
                (
                    "DiskPressure",
                    "False",
                    "KubeletHasNoDiskPressure",
                    "kubelet has no disk pressure",
                ),
                (
                    "PIDPressure",
                    "False",
                    "KubeletHasSufficientPID",
                    "kubelet has sufficient PID available",
                ),
                (
                    "Ready",
                    "True" if ready else "False",
                    "KubeletReady" if ready else "KubeletNotReady",
                    "kubelet is posting ready status" if ready else "container runtime is down",
                ),
            )
        ]
        capacity = {
            "cpu": "64",
            "memory": "527938692Ki",
            "pods": "110",
            "ephemeral-storage": "1919703308Ki",
        }
        all_labels = {
            "kubernetes.io/hostname": name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
        }
        if gpus:
            capacity["nvidia.com/gpu"] = str(gpus)
            all_labels["nvidia.com/gpu.present"] = "true"
        all_labels.update(labels or {})
        spec: dict[str, Any] = {"podCIDR": "10.244.0.0/24", "podCIDRs": ["10.244.0.0/24"]}
        if unschedulable:
            spec["unschedulable"] = True
        if taints:
            spec["taints"] = copy.deepcopy(taints)
        return self._insert(
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": name,
                    "labels": all_labels,
                    "annotations": dict(annotations or {}),
                },
                "spec": spec,
                "status": {
                    "capacity": capacity,
                    "allocatable": dict(capacity),
                    "conditions": copy.deepcopy(conditions) if conditions is not None else cond,
                    "addresses": [
                        {"type": "InternalIP", "address": "10.0.0.1"},
                        {"type": "Hostname", "address": name},
                    ],
                    "nodeInfo": {
                        "kubeletVersion": "v1.37.1",
                        "kernelVersion": "6.8.0",
                        "osImage": "Ubuntu 24.04",
                        "containerRuntimeVersion": "containerd://2.0.0",
                        "operatingSystem": "linux",
                        "architecture": "amd64",
                        "machineID": "",
                        "systemUUID": "",
                        "bootID": "",
                        "kubeProxyVersion": "",
                        "swap": {},
                    },
                },
            }
        )

    def add_daemonset(self, namespace: str, name: str, *, labels: dict | None = None) -> dict:
        self._ensure_namespace(namespace)
        labels = labels or {"app": name}
        return self._insert(
            {
                "apiVersion": "apps/v1",
                "kind": "DaemonSet",
                "metadata": {"name": name, "namespace": namespace, "labels": dict(labels)},
                "spec": {
                    "selector": {"matchLabels": dict(labels)},
                    "template": {
                        "metadata": {"labels": dict(labels)},
                        "spec": {"containers": [{"name": name, "image": f"{name}:1"}]},
                    },
                },
                "status": {
                    "currentNumberScheduled": 1,
                    "desiredNumberScheduled": 1,
                    "numberReady": 1,
                    "numberMisscheduled": 0,
                    "observedGeneration": 1,
                },
            }
        )

    def add_object(self, obj: dict) -> dict:
        """Seed any object of a served type (ConfigMap, Lease, custom resource, ...)."""
        ns = obj.get("metadata", {}).get("namespace")
        if ns:
            self._ensure_namespace(ns)
        return self._insert(copy.deepcopy(obj))

    def _ensure_namespace(self, ns: str) -> None:
        if ns and ("", ns) not in self._bucket(self.resource("", "namespaces")):
            self.add_namespace(ns)

    def add_pod(
        self,
        namespace: str,
        name: str,
        *,
        node: str | None = None,
        labels: dict | None = None,
        annotations: dict | None = None,
        phase: str = "Running",
        ready: bool = True,
        owner: tuple[str, str] | None = None,
        daemonset: str | None = None,
        mirror: bool = False,
        empty_dir: bool = False,
        gpus: int = 0,
        grace_period: int = 30,
        stop_after: float | None = None,
        finalizers: list[str] | None = None,
    ) -> dict:
        """A pod as the scheduler and kubelet leave it. `owner` = (kind, name) of an apps/v1
        controller (ReplicaSet, StatefulSet, ...); `daemonset` = a DaemonSet's name (seeded if
        absent); `mirror` = a static pod's mirror (annotation + Node owner); `stop_after` = how
        long its process takes to exit after SIGTERM (default: the whole grace period)."""
        self._ensure_namespace(namespace)
        meta: dict[str, Any] = {
            "name": name,
            "namespace": namespace,
            "labels": dict(labels or {}),
            "annotations": dict(annotations or {}),
        }
        refs = []
        if daemonset:
            ds = self.get("apps", "daemonsets", daemonset, namespace) or self.add_daemonset(
                namespace, daemonset
            )
            refs.append(
                {
                    "apiVersion": "apps/v1",
                    "kind": "DaemonSet",
                    "name": daemonset,
                    "uid": ds["metadata"]["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            )
        elif owner:
            refs.append(
                {
                    "apiVersion": "apps/v1",
                    "kind": owner[0],
                    "name": owner[1],
                    "uid": str(uuid.uuid4()),
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            )
        if mirror:
            meta["annotations"][MIRROR_ANNOTATION] = uuid.uuid4().hex
            meta["annotations"]["kubernetes.io/config.source"] = "file"
            if node:
                node_obj = self.get("", "nodes", node)
                refs.append(
                    {
                        "apiVersion": "v1",
                        "kind": "Node",
                        "name": node,
                        "controller": True,
                        "uid": node_obj["metadata"]["uid"] if node_obj else str(uuid.uuid4()),
                    }
                )
        if refs:
            meta["ownerReferences"] = refs
        if finalizers:
            meta["finalizers"] = list(finalizers)
        container: dict[str, Any] = {
            "name": "main",
            "image": "registry.k8s.io/pause:3.10",
            "resources": {},
        }
        if gpus:
            container["resources"] = {
                "limits": {"nvidia.com/gpu": str(gpus)},
                "requests": {"nvidia.com/gpu": str(gpus)},
            }
        spec: dict[str, Any] = {
            "containers": [container],
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": grace_period,
            "dnsPolicy": "ClusterFirst",
            "schedulerName": "default-scheduler",
            "serviceAccountName": "default",
            "enableServiceLinks": True,
            "priority": 0,
        }
        if node:
            spec["nodeName"] = node
        if empty_dir:
            spec["volumes"] = [{"name": "scratch", "emptyDir": {}}]
            container["volumeMounts"] = [{"name": "scratch", "mountPath": "/scratch"}]
        status = (
            running_pod_status(node)
            if phase == "Running"
            else {"phase": phase, "qosClass": "BestEffort"}
        )
        if phase == "Running" and not ready:
            for c in status["conditions"]:
                if c["type"] in ("Ready", "ContainersReady"):
                    c["status"] = "False"
        pod = self._insert(
            {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec, "status": status}
        )
        with self._lock:
            self._pods[(namespace, name)] = PodRuntime(
                uid=pod["metadata"]["uid"], stop_after=stop_after
            )
        return pod

    def set_pdb(
        self,
        namespace: str,
        name: str,
        *,
        match_labels: dict | None = None,
        selector: dict | None = None,
        min_available: int | str | None = None,
        max_unavailable: int | str | None = None,
        unhealthy_pod_eviction_policy: str | None = None,
        disruptions_allowed: int | None = None,
        stale: bool = False,
    ) -> dict:
        """Create or replace a policy/v1 PDB. Its status is computed like the disruption
        controller does unless `disruptions_allowed` pins it (evictions still decrement it);
        `stale` leaves status.observedGeneration behind (the eviction then answers 429, retry 10 s)."""
        self._ensure_namespace(namespace)
        spec: dict[str, Any] = {"selector": selector or {"matchLabels": dict(match_labels or {})}}
        if min_available is not None:
            spec["minAvailable"] = min_available
        if max_unavailable is not None:
            spec["maxUnavailable"] = max_unavailable
        if unhealthy_pod_eviction_policy:
            spec["unhealthyPodEvictionPolicy"] = unhealthy_pod_eviction_policy
        with self._lock:
            key = (namespace, name)
            if disruptions_allowed is None:
                self._pdb_overrides.pop(key, None)
            else:
                self._pdb_overrides[key] = disruptions_allowed
            (self._pdb_stale.add if stale else self._pdb_stale.discard)(key)
            old = self.get("policy", "poddisruptionbudgets", name, namespace)
            meta: dict[str, Any] = {"name": name, "namespace": namespace}
            if old:
                meta["generation"] = old["metadata"].get("generation", 1) + 1
            self._insert(
                {
                    "apiVersion": "policy/v1",
                    "kind": "PodDisruptionBudget",
                    "metadata": meta,
                    "spec": spec,
                    "status": (old or {}).get("status", {}),
                }
            )
            self._refresh_pdbs(namespace, force=True)
            return self.get("policy", "poddisruptionbudgets", name, namespace)

    def hang_pod_deletion(self, namespace: str, name: str, hang: bool = True) -> None:
        """The pod's process never exits: its deletion stays pending until `finish_pod_deletion`."""
        with self._lock:
            self._runtime(namespace, name).hang = hang

    def recreate_pod_on_deletion(self, namespace: str, name: str, recreate: bool = True) -> None:
        """StatefulSet behaviour: once deleted, a pod with the same name and a new UID appears."""
        with self._lock:
            self._runtime(namespace, name).recreate = recreate

    def finish_pod_deletion(self, namespace: str, name: str) -> None:
        """Complete a pending pod deletion now (hung or not), as a kubelet finally would."""
        with self._lock:
            if (namespace, name) in self._bucket(self.resource("", "pods")):
                self._finalize_pod((namespace, name))

    def set_namespace_terminating(self, namespace: str, terminating: bool = True) -> None:
        self.add_namespace(namespace, terminating=terminating)

    def _runtime(self, ns: str, name: str) -> PodRuntime:
        pod = self._bucket(self.resource("", "pods")).get((ns, name))
        if pod is None:
            raise KeyError(f"pod {ns}/{name}")
        return self._pods.setdefault((ns, name), PodRuntime(uid=pod["metadata"]["uid"]))
