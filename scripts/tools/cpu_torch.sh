#!/usr/bin/env bash
# Install torch's CPU build, one pinned version, into a Python (a venv's),
# from the first source that has it, decided before any download starts:
#   1. pip's own sources (its configuration: find-links, an index or mirror
#      the machine names): asked for the versions they list, with no retries;
#   2. PyTorch's CPU wheel index (https://download.pytorch.org/whl/cpu),
#      asked for its torch page, 5 s at most;
# else one line saying why neither, and what to do, and exit 1. Either way it
# prints one line saying which. PyPI's torch for Linux is the CUDA build
# (several GB): the version's local tag (+cpu) keeps it out.
#
# torch's own requirements come from the same source, unless --no-deps
# (scripts/test.sh: the lock installed them already, pinned and hashed).
#
# Usage: scripts/tools/cpu_torch.sh [--no-deps] PYTHON [VERSION]   (VERSION default: requirements/test.in's torch pin)
#        scripts/tools/cpu_torch.sh --which PYTHON [VERSION]   says where it would come from, installs nothing
set -euo pipefail
cd "$(dirname "$0")/../.."

which_only=0
deps=()
case "${1:-}" in
  --which) which_only=1; shift ;;
  --no-deps) deps=(--no-deps); shift ;;
esac
PY=${1:?usage: scripts/tools/cpu_torch.sh [--which] PYTHON [VERSION]}
VERSION=${2:-$(sed -n 's/^torch==\([^ ;]*\).*/\1/p' requirements/test.in)}
INDEX=${GRAPHCACHE_TORCH_INDEX:-https://download.pytorch.org/whl/cpu}
case "$VERSION" in
  *+cpu) ;;
  *) echo "scripts/tools/cpu_torch.sh: $VERSION is not a CPU build (its local tag is not +cpu)" >&2; exit 2 ;;
esac
PIP=("$PY" -m pip --disable-pip-version-check)

installed=$("$PY" -c 'import importlib.metadata as m; print(m.version("torch"))' 2>/dev/null || true)
if [ "$installed" = "$VERSION" ]; then
  echo "torch $VERSION (CPU build): already installed"
  exit 0
fi

# 1. What pip's own sources list for this Python (wheels whose tags fit it),
# no wheel downloaded, no retries: a few seconds where an index is down.
versions=$("${PIP[@]}" index versions torch --retries 0 --timeout 5 2>/dev/null | sed -n 's/^Available versions: //p' || true)
if [[ ", $versions, " == *", $VERSION, "* ]]; then
  sources=$("${PIP[@]}" config list 2>/dev/null | sed -n "s/^[^.]*\.\(find-links\|index-url\|extra-index-url\)='\(.*\)'$/\1 \2/p" | sort -u | paste -sd ';' - | sed 's/;/; /g')
  echo "torch $VERSION (CPU build): from pip's own sources (${sources:-its default index}), no PyTorch index needed"
  [ "$which_only" = 1 ] && exit 0
  exec "${PIP[@]}" install --quiet "${deps[@]}" "torch==$VERSION"
fi

# 2. PyTorch's CPU index, if it answers within 5 s and lists the wheel for this Python.
why=$("$PY" - "$INDEX" "$VERSION" <<'PY'
import sys
import urllib.error
import urllib.request

index, version = sys.argv[1].rstrip("/"), sys.argv[2]
tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
try:
    with urllib.request.urlopen(f"{index}/torch/", timeout=5) as answer:
        page = answer.read().decode("utf-8", "replace").replace("%2B", "+")
except urllib.error.HTTPError as exc:
    print(f"{index} answers but has no torch page (HTTP {exc.code})")
    sys.exit(0)
except (OSError, urllib.error.URLError) as exc:
    reason = getattr(exc, "reason", exc)
    print(f"{index} did not answer within 5 s ({reason})")
    sys.exit(0)
if f"torch-{version}-{tag}-" not in page:
    print(f"{index} answers but lists no torch-{version} wheel for {tag}")
    sys.exit(0)
print("ok")
PY
)
if [ "$why" = "ok" ]; then
  echo "torch $VERSION (CPU build): from PyTorch's CPU index, $INDEX (pip's own sources have no such wheel)"
  [ "$which_only" = 1 ] && exit 0
  exec "${PIP[@]}" install --quiet "${deps[@]}" --index-url "$INDEX" "torch==$VERSION"
fi

python_version=$("$PY" -c 'import sys; print(f"{sys.version_info.major}.{sys.version_info.minor}")')
echo "error: no CPU build of torch $VERSION for Python $python_version within reach: pip's own sources list none, and $why; reach that index (HTTPS_PROXY, or GRAPHCACHE_TORCH_INDEX=a mirror of it), or put the wheel where pip looks (PIP_FIND_LINKS=DIR)" >&2
exit 1
