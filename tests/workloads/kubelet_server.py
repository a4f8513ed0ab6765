"""A real gRPC server of v1.PodResourcesLister on a unix socket, for the attribution tests.

It serves whatever response the test sets, optionally after a delay (a slow kubelet), using the
same generated service code a kubelet's wire format is checked against.
"""

from __future__ import annotations

import threading
from concurrent import futures

import grpc

from gpu_monitor.workloads.podresources import api_pb2, api_pb2_grpc


def pod(namespace: str, name: str, containers: dict[str, list[tuple[str, list[str]]]]):
    """A PodResources message: containers maps a name to (resource_name, device_ids) pairs."""
    return api_pb2.PodResources(
        name=name, namespace=namespace,
        containers=[api_pb2.ContainerResources(
            name=cname,
            devices=[api_pb2.ContainerDevices(resource_name=resource, device_ids=ids)
                     for resource, ids in devices])
            for cname, devices in containers.items()])


class _Lister(api_pb2_grpc.PodResourcesListerServicer):
    def __init__(self, server: FakeKubelet):
        self._server = server

    def List(self, request, context):  # noqa: N802 - the service's method name
        self._server.calls += 1
        release = self._server.release
        if release is not None:
            release.wait()  # a slow kubelet: answers only when the test lets it
        return api_pb2.ListPodResourcesResponse(pod_resources=list(self._server.pods))


class FakeKubelet:
    def __init__(self, socket_path: str):
        self.socket_path = socket_path
        self.pods: list = []
        self.calls = 0
        self.release: threading.Event | None = None
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        api_pb2_grpc.add_PodResourcesListerServicer_to_server(_Lister(self), self._server)
        self._server.add_insecure_port(f"unix://{socket_path}")

    def __enter__(self) -> FakeKubelet:
        self._server.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.release is not None:
            self.release.set()
        self._server.stop(grace=None)
