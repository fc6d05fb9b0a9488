#!/usr/bin/env bash
# Download, into ./.whl, the wheels a GPU machine without package access needs
# to run scripts/gpu/gpu_check.sh (its Python has torch, cuDNN and pytest, but not
# these; transformers, pytest and httpx it has). cudnn-frontend 1.28: newer ones pull a 0.5 GB dependency.
#   scripts/gpu/fetch_gpu_wheels.sh [PYTHON_VERSION]   (default 3.12)
set -euo pipefail
cd "$(dirname "$0")/../.."
ver=${1:-3.12}
exclude="$(git rev-parse --git-common-dir)/info/exclude"  # a worktree's .git is a file: its exclude is the common one
mkdir -p "$(dirname "$exclude")"
grep -qx '/.whl/' "$exclude" 2>/dev/null || echo '/.whl/' >> "$exclude"
plat=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
      --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$ver" --implementation cp "${plat[@]}" -d .whl \
  nvidia-cudnn-frontend==1.28.0 fastapi starlette pydantic pydantic-core typing-inspection annotated-types \
  uvicorn diskcache redis swagger-ui-bundle-v2
ls -la .whl
