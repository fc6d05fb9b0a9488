#!/usr/bin/env bash
# The GPU check: one command for a machine with an NVIDIA GPU.
#   1. what the machine has (graphcache doctor),
#   2. the GPU tests (pytest -m gpu) and the CPU compiler tests,
#   3. class graphs (scripts/bench_classes_gpu.py) and the cold-vs-warm benchmark for SDPA bf16 b1 h32 d128 causal at seq 4096 and 512,
#   4. a summary table.
# Without a GPU it says so, runs the CPU part, and exits 0.
#
#   scripts/gpu_check.sh [OUT_DIR]      (default: $OUT, else ./gpu-check-out)
#
# On a machine without fastapi/diskcache/cudnn-frontend, run scripts/fetch_gpu_wheels.sh
# on a machine with pip access first; this script installs ./.whl/*.whl when present.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR=${1:-${OUT:-gpu-check-out}}
mkdir -p "$OUT_DIR"
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1

if compgen -G ".whl/*.whl" >/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/gc-site .whl/*.whl \
    || { echo "installing the carried wheels failed"; exit 1; }
  export PYTHONPATH="/tmp/gc-site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
else
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi

echo "== graphcache GPU check, $(date -u +%Y-%m-%dT%H:%M:%SZ)"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
"$PY" -m graphcache.cli doctor 2>&1 | tee "$OUT_DIR/doctor.txt"

has_gpu=$("$PY" - <<'PY'
try:
    from graphcache.target import Target
    print(Target.detect())
except Exception as exc:  # noqa: BLE001
    print("none:", exc)
PY
)
echo "target: $has_gpu"

if [[ "$has_gpu" == none:* ]]; then
  echo "== no GPU here: the GPU tests and the cold/warm benchmark need one. Running the CPU part."
  "$PY" -m pytest -q tests/test_compiler_cudnn.py tests/test_cudnn_build.py tests/test_torch_sdpa.py tests/test_cudnn_ragged.py tests/test_gpu.py tests/test_torch_gpu.py tests/test_varlen_gpu.py tests/test_classes_cudnn.py tests/test_classes_gpu.py -rs 2>&1 | tail -n 15
  exit 0
fi

echo "== GPU tests"
"$PY" -m pytest -v -rs -s -m gpu tests/test_gpu.py tests/test_torch_gpu.py tests/test_varlen_gpu.py tests/test_classes_gpu.py 2>&1 | tee "$OUT_DIR/gpu-tests.txt"
gpu_rc=${PIPESTATUS[0]}
echo "== CPU compiler tests (on this machine)"
"$PY" -m pytest -q tests/test_compiler_cudnn.py tests/test_cudnn_build.py tests/test_torch_sdpa.py tests/test_cudnn_ragged.py tests/test_classes_cudnn.py 2>&1 | tail -n 5
cpu_rc=${PIPESTATUS[0]}

echo "== class graphs: error at off-tile shapes, class-at-a-short-shape vs exact execute time"
"$PY" scripts/bench_classes_gpu.py --json "$OUT_DIR/classes.json" 2>&1 | tee "$OUT_DIR/classes.txt"

echo "== cold vs warm (fresh process per sample)"
"$PY" -m graphcache.cli --cache-dir "$OUT_DIR/cache" bench \
  --spec batch=1,heads_q=32,seq_q=4096,head_dim=128,dtype=bfloat16,mask=causal \
  --spec batch=1,heads_q=32,seq_q=512,head_dim=128,dtype=bfloat16,mask=causal \
  --repeat "${GC_REPEAT:-5}" --json "$OUT_DIR/bench.json" --plot "$OUT_DIR/bench.png" 2>&1 | tee "$OUT_DIR/bench.txt"
bench_rc=${PIPESTATUS[0]}

echo "== summary"
"$PY" - "$OUT_DIR/bench.json" "$gpu_rc" "$cpu_rc" "$bench_rc" <<'PY'
import json, sys
path, gpu_rc, cpu_rc, bench_rc = sys.argv[1], *map(int, sys.argv[2:])
print(f"GPU tests: {'passed' if gpu_rc == 0 else 'FAILED'}; CPU compiler tests: {'passed' if cpu_rc == 0 else 'FAILED'}")
try:
    report = json.load(open(path))
except OSError:
    print("bench: no report"); sys.exit(0)
print(f"target {report['target']}")
print(f"{'spec':44} {'cold ms':>10} {'warm ms':>10} {'speedup':>8}  goal >= 30x")
for r in report["specs"]:
    if "error" in r:
        print(f"{r['summary']:44} error: {r['error'][:80]}")
        continue
    s = r["speedup"]
    print(f"{r['summary']:44} {r['cold']['total']*1e3:>10.2f} {r['warm']['total']*1e3:>10.2f} {s:>7.1f}x  {'met' if s >= 30 else 'NOT met'}")
PY
[ "$gpu_rc" -eq 0 ] && [ "$cpu_rc" -eq 0 ] && [ "$bench_rc" -eq 0 ]
