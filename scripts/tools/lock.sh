#!/usr/bin/env bash
# Regenerate requirements/test.lock: every package the test suite installs,
# pinned with hashes, for CPython 3.11+ on any platform, made by uv (uv pip
# compile) from pyproject.toml's dev, gpu and hf extras and
# requirements/test.in (the suite's own pins: torch's CPU build, cudnn-frontend 1.32).
#
#   scripts/tools/lock.sh                       keep every pin that still fits; add what is new (a new dependency)
#   scripts/tools/lock.sh --upgrade             the newest releases inside the ranges
#   scripts/tools/lock.sh --upgrade-package X   the newest X only (and what it needs)
#
# Then run scripts/test.sh (it installs the lock and checks it) and commit
# requirements/ when green. torch itself is not in the lock: its CPU wheel
# comes from wherever scripts/tools/cpu_torch.sh finds it (a local wheel, or
# PyTorch's CPU index), whose bytes differ by Python version and source, so
# the lock holds no hash for it; its version and +cpu tag are pinned in
# requirements/test.in, and its own requirements (read from that wheel into
# requirements/torch-requires.txt) are locked here with hashes like the rest.
# uv comes from PyPI, into .cache/lock-tools (UV_VERSION pins it).
set -euo pipefail
cd "$(dirname "$0")/../.."

PY=${PYTHON:-python3}
UV_VERSION=0.13.9
TOOLS=.cache/lock-tools
if ! "$TOOLS/bin/uv" --version 2>/dev/null | grep -q "^uv $UV_VERSION "; then
  rm -rf "$TOOLS"
  "$PY" -m venv "$TOOLS"
  "$TOOLS/bin/python" -m pip install --quiet --disable-pip-version-check "uv==$UV_VERSION"
fi

# torch's own requirements, from the CPU wheel's metadata (pip reads it from
# the source scripts/tools/cpu_torch.sh picks; nothing is installed).
TORCH=$(sed -n 's/^torch==\([^ ;]*\).*/\1/p' requirements/test.in)
line=$(scripts/tools/cpu_torch.sh --which "$PY" "$TORCH")
echo "$line"
index=()
case "$line" in *"PyTorch's CPU index"*) index=(--index-url "${GRAPHCACHE_TORCH_INDEX:-https://download.pytorch.org/whl/cpu}") ;; esac
report=$(mktemp)
trap 'rm -f "$report"' EXIT
"$PY" -m pip install --quiet --disable-pip-version-check --dry-run --no-deps --ignore-installed \
  "${index[@]}" --report "$report" "torch==$TORCH"
{
  echo "# torch $TORCH's own requirements, as its CPU wheel declares them (written by scripts/tools/lock.sh)."
  "$PY" - "$report" <<'PY'
import json
import sys

(item,) = json.load(open(sys.argv[1]))["install"]
for text in item["metadata"].get("requires_dist", []):
    if "extra ==" not in text.replace('"', "'").replace("extra==", "extra =="):  # an extra's: not installed
        print(text)
PY
} > requirements/torch-requires.txt

# uv reads the existing lock as its preferences (every pin that still fits is
# kept) unless --upgrade says otherwise; torch is resolved out (its
# requirements stand in for it) and left out of the file.
overrides=.cache/lock-tools/no-torch.txt
echo 'torch ; sys_platform == "never"' > "$overrides"
"$TOOLS/bin/uv" pip compile pyproject.toml requirements/test.in requirements/torch-requires.txt \
  --extra dev --extra gpu --extra hf --universal --python-version 3.11 --generate-hashes \
  --override "$overrides" --no-emit-package torch --no-python-downloads \
  --custom-compile-command "scripts/tools/lock.sh" --quiet -o requirements/test.lock "$@"
echo "wrote requirements/test.lock: $(grep -c '^[a-z0-9]' requirements/test.lock) pins; now run scripts/test.sh"
