# syntax=docker/dockerfile:1
#
# The gpu-monitor DaemonSet image: the daemon, every check, and torch for the active
# (bootstrap) checks. The daemon process itself never imports torch: active checks run torch in
# subprocesses (gpu_monitor/workers), so a hung CUDA context cannot take the daemon down.
#
# Build:  images/build.sh full --tag gpu-monitor:0.1.0      (docs/deploy-images.md)
# Slim passive-only variant (no torch, no active checks): Dockerfile.passive.
# The build context is the folder images/build.sh assembles (this file, the hashed lock
# images/requirements.txt, images/healthcheck.py, and wheels/: the project's wheel and every
# wheel the lock pins, for the base's Python). pip installs `--no-index --require-hashes` from
# wheels/ into a venv; only apt reaches a network (Ubuntu's and NVIDIA's repositories).
#
# torch, its CUDA libraries and numpy (the `active` extra) are the base image's: the venv sees
# them (--system-site-packages), and pinning the base pins them. The base is pinned by tag; pin
# it by digest in your own registry:
#   --base-image pytorch/pytorch:2.7.1-cuda12.8-cudnn9-runtime@sha256:<digest>
# Its Python (3.11) is the one images/build.sh downloads wheels for (--python-version).
ARG BASE_IMAGE=pytorch/pytorch:2.7.1-cuda12.8-cudnn9-runtime

FROM ${BASE_IMAGE}
# DCGM's dcgmi for dcgm_diag, from NVIDIA's CUDA apt repository for the base's Ubuntu (22.04 for
# the pinned PyTorch runtime image; x86_64, or sbsa on arm64). Pinned: dcgmi must speak the
# protocol of the host engine it connects to, so keep DCGM_VERSION on the major version of the
# GPU operator's (or the host's) nv-hostengine (docs/coexistence.md). The image does not start a
# host engine of its own. The other versions are Ubuntu 22.04's (jammy, jammy-updates); the
# archive drops a superseded update, so bump them with the base (docs/deploy-images.md).
ARG CUDA_REPO=ubuntu2204/x86_64
ARG CUDA_KEYRING=cuda-keyring_1.1-1_all.deb
ARG DCGM_VERSION=1:3.3.9
ARG PERFTEST_VERSION=4.4+0.37-1
ARG IBVERBS_PROVIDERS_VERSION=39.0-1
ARG CA_CERTIFICATES_VERSION=20260816ubuntu0.22.04.2
ARG CURL_VERSION=7.81.0-1ubuntu1.30
LABEL org.opencontainers.image.title="gpu-monitor" \
      org.opencontainers.image.description="GPU node-health daemon: bootstrap and passive checks, SDC detection, remediation" \
      org.opencontainers.image.licenses="Apache-2.0"

# perftest (ib_write_bw) for rdma_loopback and the verbs providers it needs (mlx5), and DCGM
# (dcgmi) for dcgm_diag: a bootstrap requires both where the profile expects RDMA ports / GPUs,
# so an image without them cannot pass one. nvidia-smi and libnvidia-ml come from the host
# driver through the NVIDIA container runtime. The keyring package installs NVIDIA's signing
# key and the repository entry; curl, needed only to fetch it, is removed again.
RUN set -e; apt-get update \
 && apt-get install -y --no-install-recommends "ca-certificates=${CA_CERTIFICATES_VERSION}" \
        "curl=${CURL_VERSION}" \
 && curl -fsSLo /tmp/${CUDA_KEYRING} \
        https://developer.download.nvidia.com/compute/cuda/repos/${CUDA_REPO}/${CUDA_KEYRING} \
 && dpkg -i /tmp/${CUDA_KEYRING} && rm -f /tmp/${CUDA_KEYRING} \
 && apt-get update \
 && apt-get install -y --no-install-recommends "perftest=${PERFTEST_VERSION}" \
        "ibverbs-providers=${IBVERBS_PROVIDERS_VERSION}" "datacenter-gpu-manager=${DCGM_VERSION}" \
 && apt-get purge -y --auto-remove curl \
 && rm -rf /var/lib/apt/lists/* \
 && command -v dcgmi && command -v ib_write_bw

# The venv's own pip is the lock's (run from its wheel to install itself and the rest), not the
# base's. --ignore-installed: the venv sees the base's packages, and pip would otherwise keep
# one of the base's where its version matches the lock, unchecked by the lock's hashes. No
# `pip check`: it would judge the base's own (conda) packages too.
# The context is bind-mounted for this one step (BuildKit, buildah, podman), so neither the
# wheels nor the lock stay in a layer.
RUN --mount=type=bind,source=.,target=/tmp/image \
    set -e; w=/tmp/image/wheels; \
    python3 -m venv --without-pip --system-site-packages /opt/gpu-monitor \
 && /opt/gpu-monitor/bin/python "$(ls $w/pip-*.whl)/pip" install --no-cache-dir --no-index \
        --find-links $w --only-binary=:all: --require-hashes --ignore-installed \
        -r /tmp/image/requirements.txt \
 && /opt/gpu-monitor/bin/pip install --no-cache-dir --no-index --no-deps $w/gpu_monitor-*.whl \
 && install -m 0644 /tmp/image/healthcheck.py /opt/gpu-monitor/healthcheck.py \
 && /opt/gpu-monitor/bin/python -c "import gpu_monitor, checks, torch, numpy; print('gpu-monitor', gpu_monitor.__version__, 'torch', torch.__version__)"

# A non-root user for everything that does not need the host: `gpu-monitor bootstrap` on a
# workstation, `gpu-monitor breaker ...`, CI. The DaemonSet overrides it (runAsUser: 0) because
# it reads /dev/kmsg, other processes' /proc/<pid>/fd (who holds a GPU) and resets GPUs;
# docs/install.md explains each privilege.
RUN useradd --uid 10001 --user-group --no-create-home --home-dir /tmp gpu-monitor
USER 10001:10001
ENV PATH=/opt/gpu-monitor/bin:/opt/conda/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp \
    NVIDIA_DRIVER_CAPABILITIES=utility,compute

# 9425: the daemon's /metrics /healthz /readyz (daemonset/daemonset.yaml). The health check asks
# the port of whatever PID 1 serves: the daemon's, or the fabric scheduler's (its --listen,
# daemonset/fabric/deployment.yaml), which this image also runs.
EXPOSE 9425
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
    CMD ["/opt/gpu-monitor/bin/python", "/opt/gpu-monitor/healthcheck.py"]
ENTRYPOINT ["gpu-monitor"]
CMD ["daemon", "--log-format", "json"]
