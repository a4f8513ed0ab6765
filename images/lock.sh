#!/usr/bin/env bash
# Regenerates images/requirements.txt, the hashed lock both images install with
# `pip install --require-hashes` (docs/deploy-images.md). It resolves images/requirements.in
# against PyPI alone: this machine's pip settings (local wheel folders, constraints, mirrors)
# are ignored so that every hash in the lock is of a file PyPI serves. pip-tools runs from a
# throwaway virtual environment under a temporary folder; nothing is cached outside it.
#
#   images/lock.sh                      # re-resolve within the .in file's ranges
#   images/lock.sh --upgrade-package X  # any further pip-compile options are passed on
set -euo pipefail
cd "$(dirname "$0")"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
unset PIP_FIND_LINKS PIP_INDEX_URL PIP_EXTRA_INDEX_URL PIP_CONSTRAINT
export PIP_CONFIG_FILE=/dev/null PIP_CACHE_DIR="$tmp/cache" PIP_DISABLE_PIP_VERSION_CHECK=1
python3 -m venv "$tmp/venv"
"$tmp/venv/bin/pip" install -q "pip-tools==7.6.2"
CUSTOM_COMPILE_COMMAND="images/lock.sh" "$tmp/venv/bin/pip-compile" -q \
  --generate-hashes --allow-unsafe --no-strip-extras --no-emit-find-links \
  --index-url https://pypi.org/simple --cache-dir "$tmp/cache" \
  --output-file requirements.txt "$@" requirements.in
