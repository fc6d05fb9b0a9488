#!/usr/bin/env bash
# The whole test suite on a fresh machine: installs what the tests need
# (CPU torch, cudnn-frontend 1.32, redis-server, nginx, the dev tools), then runs pytest.
# Usage: scripts/test.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
# torch 2.13.0 resolves to the CPU build on this workplace's machines; an
# unpinned torch would pull a multi-gigabyte CUDA build.
# cudnn-frontend 1.32 is the only frontend whose validate() runs without a GPU.
"$PY" -m pip install --quiet --disable-pip-version-check "torch==2.13.0" "nvidia-cudnn-frontend==1.32.0"
"$PY" -m pip install --quiet --disable-pip-version-check -e ".[dev,gpu]"

need_apt=()
command -v redis-server >/dev/null 2>&1 || need_apt+=(redis-server)
command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || need_apt+=(nginx)
if [ ${#need_apt[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

# Tests start their own redis-server and uvicorn servers on 127.0.0.1 and stop them.
exec "$PY" -m pytest "$@"
