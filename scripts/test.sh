#!/usr/bin/env bash
# The whole test suite on a fresh machine: installs what the tests need at
# the versions the suite was last green with (requirements/test.lock, torch's
# CPU build, cudnn-frontend 1.32; redis-server, nginx and chromium from apt),
# checks that the venv holds exactly that, lints, builds the docs site, then
# runs pytest.
# Usage: scripts/test.sh [--latest | --torch VERSION] [pytest args...]
#   --latest: the newest releases inside pyproject.toml's ranges instead of the
#   lock (requirements/test.in's pins hold: torch's CPU build, cudnn-frontend
#   1.32), in .venv-latest; it prints what differs from the lock.
#   --torch VERSION: the torch a user's `pip install torch==VERSION` gives
#   (PyPI's: on Linux the CUDA build, several GB, which runs on a CPU), in
#   .venv-torchVERSION; everything else as the lock pins it, but for what that
#   torch itself requires; it prints what differs from the lock. A VERSION
#   ending in +cpu is torch's CPU build, from scripts/tools/cpu_torch.sh's source.
set -euo pipefail
cd "$(dirname "$0")/.."

LATEST=0
WANT_TORCH=""  # --torch's VERSION; empty: requirements/test.in's pin
case "${1:-}" in
  --latest) LATEST=1; shift ;;
  --torch | --torch=*)
    if [ "$1" = --torch ]; then WANT_TORCH=${2:-}; shift $(($# > 1 ? 2 : 1)); else WANT_TORCH=${1#--torch=}; shift; fi
    # A version as pip spells one (2.15.0, 2.14.1, 2.13.0+cpu), never an option or a range.
    [[ "$WANT_TORCH" =~ ^[0-9]+(\.[0-9]+)+[a-z0-9.]*(\+[a-z0-9.]+)?$ ]] ||
      { echo "error: --torch takes one torch version as pip spells it (e.g. --torch 2.15.0), not '$WANT_TORCH'" >&2; exit 2; }
    ;;
esac
case "${1:-}" in
  --latest | --torch*) echo "error: give one of --latest and --torch VERSION, before pytest's arguments" >&2; exit 2 ;;
esac

# Everything is installed into a virtual environment, never the system Python:
# current Debian and Ubuntu refuse pip installs there (PEP 668). PYTHON (or
# python3) is used as it is when it runs in a venv (an active one included);
# otherwise .venv (GRAPHCACHE_VENV; .venv-latest for --latest,
# .venv-torchVERSION for --torch) is created from it, once, and used. It does
# not see the system's packages: it holds the lock and nothing else, so the
# run is what the repository says.
PY=${PYTHON:-python3}
OWN_VENV=0  # 1: the venv is this script's (.venv), so it may remove what the lock no longer names
if [ -n "${VIRTUAL_ENV:-}" ] && [ -z "${PYTHON:-}" ]; then PY="$VIRTUAL_ENV/bin/python"; fi
if ! "$PY" -c 'import sys; sys.exit(sys.prefix == sys.base_prefix)'; then
  OWN_VENV=1
  if [ "$LATEST" = 1 ]; then VENV=${GRAPHCACHE_VENV:-.venv-latest}
  elif [ -n "$WANT_TORCH" ]; then VENV=${GRAPHCACHE_VENV:-.venv-torch$WANT_TORCH}
  else VENV=${GRAPHCACHE_VENV:-.venv}; fi
  if [ ! -x "$VENV/bin/python" ]; then
    if ! "$PY" -m venv "$VENV"; then
      # Debian and Ubuntu ship venv's ensurepip separately.
      if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
      $SUDO apt-get update -qq && $SUDO apt-get install -y -qq python3-venv >/dev/null
      rm -rf "$VENV"
      "$PY" -m venv "$VENV"
    fi
  fi
  PY="$VENV/bin/python"
fi
"$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' ||
  { echo "error: the test suite needs Python 3.11 or later (transformers 5.24+ does); $PY is $("$PY" -V 2>&1)" >&2; exit 1; }

PIP=("$PY" -m pip install --quiet --disable-pip-version-check)
TORCH=$(sed -n 's/^torch==\([^ ;]*\).*/\1/p' requirements/test.in)
if [ "$LATEST" = 1 ]; then
  # torch's CPU build (requirements/test.in's pin), from a wheel pip finds or
  # PyTorch's CPU index, decided before any download; one line says which.
  scripts/tools/cpu_torch.sh "$PY" "$TORCH"
  # The newest releases the ranges allow; test.in's pins hold (torch's CPU build above, cudnn-frontend 1.32).
  "${PIP[@]}" --upgrade --upgrade-strategy eager -c requirements/test.in -e ".[dev,gpu,hf]"
  "$PY" scripts/tools/lock_check.py requirements/test.lock --torch "$TORCH" --report-only
elif [ -n "$WANT_TORCH" ]; then
  # The lock, hash-checked, as below; then the torch a user's pip gives, its
  # own requirements resolved by pip (the lock's versions stay where they
  # satisfy it; what it needs beyond them, such as a CUDA build's nvidia-*
  # libraries, comes in), then graphcache itself with nothing more.
  "${PIP[@]}" --require-hashes --no-deps -r requirements/test.lock
  case "$WANT_TORCH" in
    *+cpu) scripts/tools/cpu_torch.sh "$PY" "$WANT_TORCH" ;;
    *)
      echo "torch $WANT_TORCH: from pip's sources as a user's 'pip install torch==$WANT_TORCH' takes it (on Linux PyPI's CUDA build: GBs once, then pip's cache)"
      "${PIP[@]}" "torch==$WANT_TORCH" || {
        echo "error: pip could not install torch==$WANT_TORCH (its reason above); where a pip constraint caps torch ('$PY -m pip config list' names it), lift it or choose a version it allows" >&2
        exit 1
      }
      ;;
  esac
  "${PIP[@]}" --no-deps -e .
  echo "torch $("$PY" -c 'import torch; print(torch.__version__, "(CUDA " + str(torch.version.cuda) + ")" if torch.version.cuda else "(CPU build)")') in place of requirements/test.in's $TORCH"
  "$PY" scripts/tools/lock_check.py requirements/test.lock --torch "$WANT_TORCH" --report-only
else
  # Everything but torch exactly as the lock pins it (torch's requirements
  # included), each file checked against its hash; then torch's CPU build as
  # above, and graphcache itself, neither bringing anything more (--no-deps).
  "${PIP[@]}" --require-hashes --no-deps -r requirements/test.lock
  scripts/tools/cpu_torch.sh --no-deps "$PY" "$TORCH"
  "${PIP[@]}" --no-deps -e .
  # A package an earlier lock named and this one does not leaves the venv this
  # script made (a venv of yours is left as it is: the check below names it).
  extras=$("$PY" scripts/tools/lock_check.py requirements/test.lock --torch "$TORCH" --extras)
  if [ "$OWN_VENV" = 1 ] && [ -n "$extras" ]; then
    echo "removing from $VENV what requirements/test.lock no longer names: $extras"
    # shellcheck disable=SC2086  # one word per package
    "$PY" -m pip uninstall --quiet --yes $extras
  fi
  # The venv holds what the lock says and nothing else (a test of the install: CI fails here otherwise).
  "$PY" scripts/tools/lock_check.py requirements/test.lock --torch "$TORCH"
fi
"$PY" -m pip check --disable-pip-version-check >/dev/null || { "$PY" -m pip check; exit 1; }

need_apt=()
command -v redis-server >/dev/null 2>&1 || need_apt+=(redis-server)
# nginx: tests/test_http_cache.py runs docker/nginx.conf's proxy_cache in front of the service
command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || need_apt+=(nginx)
if [ ${#need_apt[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi
# chromium: tests/test_status_page.py and tests/test_docs_site.py render pages in a real headless
# browser. Where it cannot be installed (no Debian package, no sudo) those tests
# skip saying so; nothing else needs it.
if ! command -v chromium >/dev/null 2>&1 && ! command -v chromium-browser >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
  { $SUDO apt-get update -qq && $SUDO apt-get install -y -qq chromium >/dev/null; } ||
    echo "chromium could not be installed: the status page's browser test will skip" >&2
fi

# Old cudnn-frontend releases beside a shared cuDNN runtime, for
# tests/test_frontend_versions.py (their real bindings on CPU). About 30 s and
# 265 MB on a fresh clone, cached in .cache/old-frontends after that.
PYTHON="$PY" scripts/tools/old_frontends.sh

# Lint and types first: cheap, and they fail the run like a failing test.
"$PY" -m ruff check graphcache service tests scripts
"$PY" -m mypy graphcache service
# The docs site (mkdocs.yml, docs/): --strict fails on a broken link or anchor.
SITE_DIR=$(mktemp -d)
# Not --quiet: it hides the warnings --strict counts, and a broken link would
# pass. Its INFO lines are left out; pipefail keeps mkdocs' exit status.
NO_MKDOCS_2_WARNING=1 "$PY" -m mkdocs build --strict --site-dir "$SITE_DIR" 2>&1 | { grep -v "^INFO" || true; }
rm -rf "$SITE_DIR"

# One redis-server for the suite (tests that stop Redis or limit its memory
# start private ones); uvicorn servers are started by the tests themselves.
REDIS_BIN=$(command -v redis-server || echo /usr/bin/redis-server)
REDIS_PORT=$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$REDIS_BIN" --port "$REDIS_PORT" --bind 127.0.0.1 --save "" --appendonly no --daemonize no >/dev/null 2>&1 &
REDIS_PID=$!
trap 'kill "$REDIS_PID" 2>/dev/null; wait "$REDIS_PID" 2>/dev/null' EXIT
for _ in $(seq 1 100); do
  (exec 3<>"/dev/tcp/127.0.0.1/$REDIS_PORT") 2>/dev/null && break
  sleep 0.1
done
export GRAPHCACHE_TEST_REDIS_URL="redis://127.0.0.1:$REDIS_PORT/0"

"$PY" -m pytest "$@"
