"""The kubelet's pod-resources API client: one ``List`` call over the kubelet's unix socket.

This is the only module that speaks gRPC. It returns what the kubelet said, flattened to one
row per (pod, container, resource, device id); mapping ids to this node's devices is
``attribution``'s job. Every failure is a ``KubeletUnavailable`` naming what failed.
"""

from __future__ import annotations

from dataclasses import dataclass

import grpc

from gpu_monitor.workloads.podresources import api_pb2, api_pb2_grpc

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"


@dataclass(frozen=True)
class DeviceAssignment:
    """One device id the kubelet says a container was allocated."""

    namespace: str
    pod: str
    container: str
    resource_name: str
    device_id: str


class KubeletUnavailable(Exception):
    """The pod-resources List could not be read; ``reason`` is a short metric-safe word."""

    def __init__(self, reason: str, detail: str):
        super().__init__(f"kubelet pod-resources {reason}: {detail}")
        self.reason = reason
        self.detail = detail


_REASONS = {
    grpc.StatusCode.UNAVAILABLE: "unavailable",
    grpc.StatusCode.DEADLINE_EXCEEDED: "timeout",
    grpc.StatusCode.UNIMPLEMENTED: "unimplemented",
    grpc.StatusCode.PERMISSION_DENIED: "permission_denied",
}


def list_assignments(socket_path: str, timeout_s: float) -> list[DeviceAssignment]:
    """Call ``v1.PodResourcesLister/List`` once, bounded by ``timeout_s`` in all (connect
    included), and flatten the answer."""
    try:
        with grpc.insecure_channel(f"unix://{socket_path}") as channel:
            stub = api_pb2_grpc.PodResourcesListerStub(channel)
            response = stub.List(api_pb2.ListPodResourcesRequest(), timeout=timeout_s,
                                 wait_for_ready=False)
    except grpc.RpcError as error:
        code = error.code() if hasattr(error, "code") else None
        detail = error.details() if hasattr(error, "details") else str(error)
        raise KubeletUnavailable(_REASONS.get(code, "error"),
                                 f"{code.name if code else 'error'}: {detail}") from error
    except Exception as error:  # noqa: BLE001 - a malformed answer is an unknown, not a crash
        raise KubeletUnavailable("error", f"{type(error).__name__}: {error}") from error
    return flatten(response)


def flatten(response: api_pb2.ListPodResourcesResponse) -> list[DeviceAssignment]:
    """One row per device id in a List answer."""
    rows = []
    for pod in response.pod_resources:
        for container in pod.containers:
            for devices in container.devices:
                for device_id in devices.device_ids:
                    rows.append(DeviceAssignment(pod.namespace, pod.name, container.name,
                                                 devices.resource_name, device_id))
    return rows
