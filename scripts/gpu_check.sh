#!/usr/bin/env bash
# The GPU check: one command for a machine with an NVIDIA GPU.
#   1. what the machine has (graphcache doctor),
#   2. each kind of graph (dense, class, bias, softcap, ragged, paged): built / served / refused and why,
#      with its cold build against its warm load, as a table (scripts/gpu_kinds.py),
#   3. the GPU tests (pytest -m gpu), and the backward graphs' probe (scripts/gpu_backward.py),
#   4. class graphs (scripts/bench_classes_gpu.py) and the cold-vs-warm benchmark for SDPA bf16 b1 h32 d128 causal at seq 4096 and 512,
#   5. the CPU compiler tests, and a summary: the kinds table and the benchmark's.
# Each step has a time limit (GC_T_KINDS 150, GC_T_TESTS 150, GC_T_BACKWARD 60, GC_T_CLASSES 45, GC_T_BENCH 90, GC_T_CPU 30 seconds)
# so the whole fits one 10-minute command on a lent machine (about 9 minutes at most); GC_STEPS picks steps.
# Without a GPU it says so, prints what each kind declares on the CPU, runs the CPU part, and exits 0.
#
#   scripts/gpu_check.sh [OUT_DIR]      (default: $OUT, else ./gpu-check-out)
#
# On a machine without fastapi/diskcache/cudnn-frontend, run scripts/fetch_gpu_wheels.sh
# on a machine with pip access first; this script installs ./.whl/*.whl when present. On a lent
# H200 (docs/gpu-results.md): the device tool's run, command "scripts/gpu_check.sh $OUT",
# carry [".whl"], timeout_s 600.
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

# Steps to run (GC_STEPS, default all): a rerun inside the same lease can ask for one, e.g. GC_STEPS=kinds.
want() { [[ " ${GC_STEPS:-kinds tests backward classes bench cpu} " == *" $1 "* ]]; }
kinds_rc=skip gpu_rc=skip bench_rc=skip cpu_rc=skip

kinds() {
  echo "== graph kinds: built / served / refused and why; cold build vs warm load"
  timeout "${GC_T_KINDS:-150}" "$PY" scripts/gpu_kinds.py --cache-dir "$OUT_DIR/kinds-cache" --json "$OUT_DIR/kinds.json" \
    2>&1 | tee "$OUT_DIR/kinds.txt"
  kinds_rc=${PIPESTATUS[0]}
}

if [[ "$has_gpu" == none:* ]]; then
  echo "== no GPU here: the GPU tests and the cold/warm benchmark need one. Running the CPU part."
  want kinds && kinds
  "$PY" -m pytest -q tests/test_compiler_cudnn.py tests/test_cudnn_build.py tests/test_torch_sdpa.py tests/test_cudnn_ragged.py tests/test_gpu.py tests/test_torch_gpu.py tests/test_varlen_gpu.py tests/test_classes_cudnn.py tests/test_classes_gpu.py tests/test_first_contact.py -rs 2>&1 | tail -n 15
  exit 0
fi

want kinds && kinds

if want tests; then
  echo "== GPU tests"
  timeout "${GC_T_TESTS:-150}" "$PY" -m pytest -v -rs -s -m gpu tests/test_gpu.py tests/test_torch_gpu.py tests/test_varlen_gpu.py tests/test_classes_gpu.py tests/test_cudnn_backward.py 2>&1 | tee "$OUT_DIR/gpu-tests.txt"
  gpu_rc=${PIPESTATUS[0]}
fi

if want backward; then
  echo "== backward graphs: built / refused per spec, determinism, aten's logsumexp, sdpa_backward against aten's backward"
  timeout "${GC_T_BACKWARD:-60}" "$PY" scripts/gpu_backward.py --json "$OUT_DIR/backward.json" 2>&1 | tee "$OUT_DIR/backward.txt"
fi

if want classes; then
  echo "== class graphs: error at off-tile shapes, class-at-a-short-shape vs exact execute time"
  timeout "${GC_T_CLASSES:-45}" "$PY" scripts/bench_classes_gpu.py --json "$OUT_DIR/classes.json" 2>&1 | tee "$OUT_DIR/classes.txt"
fi

if want bench; then
  echo "== cold vs warm (fresh process per sample)"
  timeout "${GC_T_BENCH:-90}" "$PY" -m graphcache.cli --cache-dir "$OUT_DIR/cache" bench \
    --spec batch=1,heads_q=32,seq_q=4096,head_dim=128,dtype=bfloat16,mask=causal \
    --spec batch=1,heads_q=32,seq_q=512,head_dim=128,dtype=bfloat16,mask=causal \
    --repeat "${GC_REPEAT:-2}" --json "$OUT_DIR/bench.json" --plot "$OUT_DIR/bench.png" 2>&1 | tee "$OUT_DIR/bench.txt"
  bench_rc=${PIPESTATUS[0]}
fi

if want cpu; then
  echo "== CPU compiler tests (on this machine)"
  timeout "${GC_T_CPU:-30}" "$PY" -m pytest -q tests/test_compiler_cudnn.py tests/test_cudnn_build.py tests/test_torch_sdpa.py tests/test_cudnn_ragged.py tests/test_classes_cudnn.py tests/test_first_contact.py 2>&1 | tail -n 5
  cpu_rc=${PIPESTATUS[0]}
fi

echo "== summary"
[ -f "$OUT_DIR/kinds.txt" ] && sed -n '/^kind /,$p' "$OUT_DIR/kinds.txt"
"$PY" - "$OUT_DIR/bench.json" "$gpu_rc" "$cpu_rc" "$bench_rc" "$kinds_rc" <<'PY'
import json, sys
path, *rcs = sys.argv[1:]
def said(rc):
    return {"skip": "skipped", "0": "passed", "124": "stopped at its time limit"}.get(rc, f"FAILED (rc {rc})")
for name, rc in zip(("GPU tests", "CPU compiler tests", "cold/warm bench", "kinds table"), rcs):
    print(f"{name}: {said(rc)}")
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
for rc in "$kinds_rc" "$gpu_rc" "$bench_rc" "$cpu_rc"; do [[ "$rc" == skip || "$rc" == 0 ]] || exit 1; done
