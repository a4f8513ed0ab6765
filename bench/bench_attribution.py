"""What a workload-attribution read costs: one kubelet pod-resources List round trip against a
local gRPC server on a unix socket (N pods, 8 GPUs and 8 RDMA devices allocated), then mapped
onto the node's devices, side by side with a read when no kubelet listens (the socket path
does not exist) and one against a kubelet that never answers (bounded by timeout_s).

Usage: python bench/bench_attribution.py [--reads N] [--pods P] [--timeout S]
Prints per-read figures (median, p95) and the ratios between the cases.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time
from concurrent import futures

import grpc

from bench._util import percentile
from gpu_monitor.workloads.attribution import (
    DEFAULT_GPU_RESOURCES,
    GpuIdentity,
    Refresher,
    kubelet_reader,
)
from gpu_monitor.workloads.podresources import api_pb2, api_pb2_grpc

GPUS = tuple(GpuIdentity(i, f"GPU-{i:08x}-0000-0000-0000-000000000000") for i in range(8))
RDMA = {f"0000:{0x10 + i:02x}:00.0": f"mlx5_{i}" for i in range(8)}


def _response(pods: int) -> api_pb2.ListPodResourcesResponse:
    out = []
    for p in range(pods):
        devices = []
        if p < 8:
            devices = [api_pb2.ContainerDevices(resource_name="nvidia.com/gpu",
                                                device_ids=[GPUS[p].uuid]),
                       api_pb2.ContainerDevices(resource_name="rdma/hca",
                                                device_ids=[list(RDMA)[p]])]
        out.append(api_pb2.PodResources(name=f"pod-{p}", namespace="bench", containers=[
            api_pb2.ContainerResources(name="main", devices=devices, cpu_ids=[p])]))
    return api_pb2.ListPodResourcesResponse(pod_resources=out)


class _Lister(api_pb2_grpc.PodResourcesListerServicer):
    def __init__(self, response, hang: threading.Event | None):
        self.response, self.hang = response, hang

    def List(self, request, context):  # noqa: N802 - the service's method name
        if self.hang is not None:
            self.hang.wait()
        return self.response


def _serve(path: str, response, hang=None):
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    api_pb2_grpc.add_PodResourcesListerServicer_to_server(_Lister(response, hang), server)
    server.add_insecure_port(f"unix://{path}")
    server.start()
    return server


def _times_ms(refresher: Refresher, reads: int) -> list[float]:
    out = []
    for _ in range(reads):
        t0 = time.perf_counter()
        refresher.refresh_once()
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def _line(name: str, ms: list[float]) -> str:
    return f"{name:<34} median {percentile(ms, 0.5):8.3f} ms   p95 {percentile(ms, 0.95):8.3f} ms"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reads", type=int, default=200)
    ap.add_argument("--pods", type=int, default=110)  # the kubelet's default max-pods
    ap.add_argument("--timeout", type=float, default=0.2)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="ba") as tmp:
        live, dead, hung = (os.path.join(tmp, n) for n in ("live.sock", "dead.sock", "hung.sock"))

        def refresher(path):
            return Refresher(kubelet_reader(path, args.timeout, lambda: GPUS, lambda: RDMA,
                                            DEFAULT_GPU_RESOURCES, ("rdma/hca",)),
                             refresh_s=60, source="kubelet")

        hang = threading.Event()
        servers = [_serve(live, _response(args.pods)), _serve(hung, _response(1), hang)]
        try:
            r = refresher(live)
            r.refresh_once()  # warm up
            ok = _times_ms(r, args.reads)
            assert r.current().state == "ok" and len(r.current().gpus) == 8
            absent_r = refresher(dead)
            absent = _times_ms(absent_r, args.reads)
            assert absent_r.current().state == "unknown"
            hung_r = refresher(hung)
            slow = _times_ms(hung_r, max(3, args.reads // 40))
            assert hung_r.reads == {"timeout": len(slow)}
        finally:
            hang.set()
            for s in servers:
                s.stop(grace=None)
    print(f"{args.pods} pods, 8 GPUs + 8 RDMA devices allocated, timeout_s={args.timeout:g}")
    print(_line("List + map (kubelet answers)", ok))
    print(_line("no kubelet (socket absent)", absent))
    print(_line("kubelet hangs (hits timeout_s)", slow))
    print(f"absent / live = {percentile(absent, 0.5) / percentile(ok, 0.5):.2f}x   "
          f"hung / timeout_s = {percentile(slow, 0.5) / (args.timeout * 1e3):.2f}x")


if __name__ == "__main__":
    main()
