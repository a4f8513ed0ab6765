# syntax=docker/dockerfile:1
#
# The gpu-monitor DaemonSet image: the daemon, every check, and torch for the active
# (bootstrap) checks. The daemon process itself never imports torch: active checks run torch in
# subprocesses (gpu_monitor/workers), so a hung CUDA context cannot take the daemon down.
#
# Build:  docker build -t gpu-monitor:0.1.0 .
# Slim passive-only variant (no torch, no active checks): Dockerfile.passive.
#
# The base is pinned by tag; pin it by digest in your own registry (BASE_IMAGE=...@sha256:...).
# Its torch (CUDA 12.8 build) satisfies the `active` extra (torch>=2.4), so pip keeps it.
ARG BASE_IMAGE=pytorch/pytorch:2.7.1-cuda12.8-cudnn9-runtime

# --- build: a wheel from the source tree ---------------------------------------------------------
FROM ${BASE_IMAGE} AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY gpu_monitor/ gpu_monitor/
COPY checks/ checks/
RUN python -m pip wheel --no-cache-dir --no-deps --wheel-dir /dist .

# --- runtime ----------------------------------------------------------------------------------------
FROM ${BASE_IMAGE}
ARG PERFTEST_VERSION=""
# DCGM's dcgmi for dcgm_diag, from NVIDIA's CUDA apt repository for the base's Ubuntu (22.04 for
# the pinned PyTorch runtime image; x86_64, or sbsa on arm64). Pinned: dcgmi must speak the
# protocol of the host engine it connects to, so keep DCGM_VERSION on the major version of the
# GPU operator's (or the host's) nv-hostengine (docs/coexistence.md). The image does not start a
# host engine of its own.
ARG CUDA_REPO=ubuntu2204/x86_64
ARG CUDA_KEYRING=cuda-keyring_1.1-1_all.deb
ARG DCGM_VERSION=1:3.3.9
LABEL org.opencontainers.image.title="gpu-monitor" \
      org.opencontainers.image.description="GPU node-health daemon: bootstrap and passive checks, SDC detection, remediation" \
      org.opencontainers.image.licenses="Apache-2.0"

# perftest (ib_write_bw) for rdma_loopback and the verbs providers it needs (mlx5), and DCGM
# (dcgmi) for dcgm_diag: a bootstrap requires both where the profile expects RDMA ports / GPUs,
# so an image without them cannot pass one. nvidia-smi and libnvidia-ml come from the host
# driver through the NVIDIA container runtime. The keyring package installs NVIDIA's signing
# key and the repository entry; curl, needed only to fetch it, is removed again.
RUN set -e; apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates curl \
 && curl -fsSLo /tmp/${CUDA_KEYRING} \
        https://developer.download.nvidia.com/compute/cuda/repos/${CUDA_REPO}/${CUDA_KEYRING} \
 && dpkg -i /tmp/${CUDA_KEYRING} && rm -f /tmp/${CUDA_KEYRING} \
 && apt-get update \
 && apt-get install -y --no-install-recommends perftest${PERFTEST_VERSION:+=$PERFTEST_VERSION} \
        ibverbs-providers "datacenter-gpu-manager=${DCGM_VERSION}" \
 && apt-get purge -y --auto-remove curl \
 && rm -rf /var/lib/apt/lists/* \
 && command -v dcgmi && command -v ib_write_bw

COPY --from=build /dist/ /tmp/dist/
RUN set -e; whl=$(ls /tmp/dist/gpu_monitor-*.whl); \
    python -m pip install --no-cache-dir "${whl}[active]" \
 && rm -rf /tmp/dist \
 && python -c "import gpu_monitor, checks, torch; print('gpu-monitor', gpu_monitor.__version__, 'torch', torch.__version__)"

# A non-root user for everything that does not need the host: `gpu-monitor bootstrap` on a
# workstation, `gpu-monitor breaker ...`, CI. The DaemonSet overrides it (runAsUser: 0) because
# it reads /dev/kmsg, other processes' /proc/<pid>/fd (who holds a GPU) and resets GPUs;
# docs/install.md explains each privilege.
RUN useradd --uid 10001 --user-group --no-create-home --home-dir /tmp gpu-monitor
USER 10001:10001
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp \
    NVIDIA_DRIVER_CAPABILITIES=utility,compute

EXPOSE 9425
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:9425/healthz', timeout=4)"]
ENTRYPOINT ["gpu-monitor"]
CMD ["daemon", "--log-format", "json"]
