#!/usr/bin/env bash
# Builds a gpu-monitor image the one way that works on a registry base and on a bare Debian one
# alike (docs/deploy-images.md): on this host, `pip wheel` the project and `pip download
# --require-hashes` every wheel images/requirements.txt pins (for the image's Python and CPU);
# then the Dockerfile installs them `--no-index` into a venv inside the image, with no network.
#
#   images/build.sh passive|full [--tag T] [--engine docker|podman|buildah]
#                   [--base-image REF] [--python-version X.Y] [--debootstrap [SUITE]]
#                   [--smoke] [--archive FILE]
#
#   --engine          docker (default when a docker daemon answers), podman or buildah
#   --base-image      the Dockerfile's BASE_IMAGE (a tag, or tag@sha256:digest)
#   --python-version  the base's Python, for the wheels' tags (passive: 3.13, full: 3.11)
#   --debootstrap     build the base here with debootstrap (Debian SUITE, default stable, with
#                     python3) instead of pulling one; buildah only. CI does this (.ci/run):
#                     no registry is reachable there.
#   --smoke           run `gpu-monitor daemon --simulate h100-sxm-8 --once` in the image as its
#                     user; fail unless the verdict is healthy (buildah only)
#   --archive FILE    also write the image as a docker-archive (buildah only; its storage is
#                     temporary: `docker load -i FILE` / `podman load -i FILE`)
#
# Everything buildah stores (images, layers, the debootstrapped tree, pip's downloads) lives in
# one temporary folder, removed on exit: nothing is cached between runs.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
export DEBIAN_FRONTEND=noninteractive PIP_DISABLE_PIP_VERSION_CHECK=1

die() { echo "images/build.sh: $*" >&2; exit 2; }
[[ $# -ge 1 ]] || die "usage: images/build.sh passive|full [options] (see the header)"
flavor=$1; shift
case "$flavor" in
  passive) dockerfile=Dockerfile.passive; python_version=3.13 ;;
  full) dockerfile=Dockerfile; python_version=3.11 ;;
  *) die "no image '$flavor' (passive or full)" ;;
esac
version=$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' "$repo/gpu_monitor/__init__.py")
tag="gpu-monitor:$version"; [[ $flavor == passive ]] && tag="gpu-monitor:$version-passive"
engine="" base="" suite="" smoke=0 archive=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --tag) tag=$2; shift 2 ;;
    --engine) engine=$2; shift 2 ;;
    --base-image) base=$2; shift 2 ;;
    --python-version) python_version=$2; shift 2 ;;
    --debootstrap) suite=stable; if [[ ${2:-} != "" && ${2:0:1} != - ]]; then suite=$2; shift; fi; shift ;;
    --smoke) smoke=1; shift ;;
    --archive) archive=$(realpath -m "$2"); shift 2 ;;
    *) die "unknown option $1" ;;
  esac
done
if [[ -z $engine ]]; then
  if [[ -n $suite ]] || ! docker info >/dev/null 2>&1; then engine=buildah; else engine=docker; fi
fi
if [[ $engine != buildah && ( -n $suite || $smoke == 1 || -n $archive ) ]]; then
  die "--debootstrap, --smoke and --archive need --engine buildah"
fi

# buildah and debootstrap come from Debian's archive where they are missing (as .ci/run installs
# promtool); elsewhere install them yourself.
need=()
[[ $engine == buildah ]] && ! command -v buildah >/dev/null 2>&1 && need+=(buildah)
[[ -n $suite ]] && ! command -v debootstrap >/dev/null 2>&1 && need+=(debootstrap)
if [[ ${#need[@]} -gt 0 ]]; then
  [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null 2>&1 || die "install ${need[*]} first"
  echo "== apt-get install ${need[*]}"
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

tmp=$(mktemp -d)
cleanup() {
  # vfs layers are plain folders; buildah's own rm first (it unmounts), then the folder.
  if [[ $engine == buildah ]]; then bah rm --all >/dev/null 2>&1 || true; fi
  rm -rf "$tmp"
}
trap cleanup EXIT
bah() { buildah --root "$tmp/storage" --runroot "$tmp/run" --storage-driver vfs "$@"; }
export BUILDAH_ISOLATION=chroot

# --- the build context: the Dockerfile, the lock, the health check, the wheels --------------
ctx=$tmp/context
mkdir -p "$ctx/wheels"
cp "$repo/$dockerfile" "$ctx/Dockerfile"
cp "$repo/images/requirements.txt" "$repo/images/healthcheck.py" "$ctx/"
arch=$(uname -m)
platforms=()
for p in manylinux_2_28 manylinux_2_17 manylinux2014 manylinux_2_12 manylinux2010 manylinux_2_5 manylinux1; do
  platforms+=(--platform "${p}_${arch}")
done
echo "== [${SECONDS}s] wheels for CPython $python_version on $arch"
python3 -m pip wheel -q --no-cache-dir --no-deps --wheel-dir "$ctx/wheels" "$repo"
python3 -m pip download -q --no-cache-dir --no-deps --require-hashes --only-binary=:all: \
  --implementation cp --python-version "$python_version" "${platforms[@]}" \
  --dest "$ctx/wheels" -r "$ctx/requirements.txt"

# --- the base ----------------------------------------------------------------------------------
build_args=()
if [[ -n $suite ]]; then
  mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
  echo "== [${SECONDS}s] base: debootstrap $suite ($mirror) with python3"
  rootfs=$tmp/rootfs
  debootstrap --variant=minbase --include=python3 "$suite" "$rootfs" "$mirror" >"$tmp/debootstrap.log" 2>&1 \
    || { tail -20 "$tmp/debootstrap.log" >&2; die "debootstrap failed"; }
  have=$(chroot "$rootfs" python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
  [[ $have == "$python_version" ]] || die "$suite has Python $have, the wheels are for $python_version (--python-version)"
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* "${rootfs:?}"/dev/*
  ctr=$(bah from scratch)
  cp -a "$rootfs/." "$(bah mount "$ctr")/"
  bah umount "$ctr" >/dev/null
  bah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin --cmd /bin/sh "$ctr"
  base=localhost/gpu-monitor-base:debian-$suite
  bah commit -q --rm "$ctr" "$base" >/dev/null
  rm -rf "$rootfs"
fi
[[ -n $base ]] && build_args+=(--build-arg "BASE_IMAGE=$base")

# --- the image ---------------------------------------------------------------------------------
echo "== [${SECONDS}s] $engine: $tag from ${base:-its default BASE_IMAGE}"
case "$engine" in
  buildah) bah bud -q --format docker --isolation chroot --pull=false "${build_args[@]}" \
             -f "$ctx/Dockerfile" -t "$tag" "$ctx" ;;
  docker | podman) "$engine" build "${build_args[@]}" -f "$ctx/Dockerfile" -t "$tag" "$ctx" ;;
  *) die "no engine '$engine' (docker, podman or buildah)" ;;
esac

if [[ $smoke == 1 ]]; then
  echo "== [${SECONDS}s] smoke: gpu-monitor daemon --simulate h100-sxm-8 --once, as the image's user"
  ctr=$(bah from -q --pull=false "$tag")
  user=$(bah inspect --format '{{.OCIv1.Config.User}}' "$tag")
  health=$(bah inspect --format '{{.Docker.Config.Healthcheck.Test}}' "$tag")
  [[ $health == *healthcheck.py* ]] || die "the image lost its HEALTHCHECK ($health)"
  out=$(bah run --isolation chroot --user "$user" "$ctr" -- \
          gpu-monitor daemon --simulate h100-sxm-8 --once) || { echo "$out" >&2; die "smoke run failed"; }
  echo "$out" | tail -1
  grep -q '^verdict: healthy' <<<"$out" || die "smoke run: the simulated node is not healthy"
  # The health check's script loads under the image's Python and reads a config as the daemon
  # would (asking /healthz itself would reach this host's network: buildah's chroot shares it).
  bah run --isolation chroot --user "$user" "$ctr" -- python -c '
import sys; sys.path.insert(0, "/opt/gpu-monitor"); import healthcheck as h
open("/tmp/c.yaml", "w").write("daemon:\n  listen: 0.0.0.0:9600\n")
assert h.listen_port(["gpu-monitor", "daemon", "--config=/tmp/c.yaml"]) == 9600
assert h.listen_port(["gpu-monitor", "fabric-scheduler"]) == 9426' || die "smoke run: healthcheck.py"
  bah rm "$ctr" >/dev/null
fi
if [[ -n $archive ]]; then
  bah push -q "$tag" "docker-archive:$archive:$tag"
  echo "== wrote $archive"
fi
echo "== [${SECONDS}s] built $tag"
