#!/usr/bin/env bash
# Install released cudnn-frontend versions beside each other, with one shared
# cuDNN runtime, so tests/test_frontend_versions.py can run graphcache's
# dialect chain inside the real old bindings on a machine with no GPU.
#
# Layout (CACHE defaults to .cache/old-frontends in the repo, git-ignored):
#   CACHE/fe-1.7.0/cudnn/...          one folder per frontend (pip --target)
#   CACHE/runtime/nvidia/cudnn/lib    libcudnn.so.9, libcudnn_graph.so.9, libcudnn.so link
#
# A frontend folder goes first on PYTHONPATH, so it shadows only `cudnn`:
# graphcache and its dependencies come from the interpreter running the
# tests (a venv per frontend would have to reinstall all of those). 1.31
# also needs nvidia-cutlass-dsl and apache-tvm-ffi, which that interpreter
# has from 1.32 (scripts/test.sh installs it).
#
# Only the graph library of the runtime is kept: the old bindings dlopen
# libcudnn.so for the graph API, and nothing past validate() runs without a
# GPU driver anyway (docs/frontends.md). OLD_FRONTENDS_FULL_RUNTIME=1 keeps
# the whole wheel (about 0.9 GB instead of 0.15 GB).
#
# Idempotent: a finished folder has a .complete stamp and is not redone.
# Usage: scripts/tools/old_frontends.sh [CACHE]   (or GRAPHCACHE_OLD_FRONTENDS=CACHE)
set -euo pipefail
cd "$(dirname "$0")/../.."

PY=${PYTHON:-python3}
CACHE=${1:-${GRAPHCACHE_OLD_FRONTENDS:-$PWD/.cache/old-frontends}}
# Keep in step with tests/test_frontend_versions.py (FRONTENDS).
FRONTENDS=(1.3.0 1.5.0 1.7.0 1.9.0 1.10.0 1.12.0 1.24.0 1.27.0 1.28.0 1.31.0)
# cuDNN 9.24 for CUDA 13: also on this workplace's local package index, so
# no 0.5 GB download where that index is present; 9.28 (cu12 or cu13) behaves
# the same on CPU (docs/frontends.md).
RUNTIME=${OLD_FRONTENDS_RUNTIME:-nvidia-cudnn-cu13==9.24.0.43}

PIP=("$PY" -m pip install -qq --disable-pip-version-check --no-deps --no-compile)
mkdir -p "$CACHE"
start=$SECONDS

runtime="$CACHE/runtime"
if [ ! -f "$runtime/.complete" ] || [ "$(cat "$runtime/.complete")" != "$RUNTIME" ]; then
  rm -rf "$runtime"
  "${PIP[@]}" --target "$runtime" "$RUNTIME"
  lib="$runtime/nvidia/cudnn/lib"
  if [ "${OLD_FRONTENDS_FULL_RUNTIME:-0}" != 1 ]; then
    find "$lib" -name 'libcudnn*.so*' ! -name 'libcudnn.so.9' ! -name 'libcudnn_graph.so.9' -delete
  fi
  ln -sf libcudnn.so.9 "$lib/libcudnn.so"  # the frontends dlopen the unversioned name
  echo "$RUNTIME" >"$runtime/.complete"
fi

for v in "${FRONTENDS[@]}"; do
  dir="$CACHE/fe-$v"
  [ -f "$dir/.complete" ] && continue
  rm -rf "$dir"
  "${PIP[@]}" --target "$dir" "nvidia-cudnn-frontend==$v"
  touch "$dir/.complete"
done

echo "old frontends ready in $CACHE ($(du -sh "$CACHE" | cut -f1), $((SECONDS - start)) s)"
