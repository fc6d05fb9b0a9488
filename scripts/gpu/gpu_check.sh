#!/usr/bin/env bash
# The GPU check: one command for a machine with an NVIDIA GPU.
#   1. what the machine has (graphcache doctor),
#   2. each kind of graph (dense, class, bias, softcap, ragged, paged, layouts): built / served / refused and why,
#      with its cold build against its warm load, as a table (scripts/gpu/gpu_kinds.py),
#   3. the GPU tests (pytest -m gpu), and the backward graphs' probe (scripts/gpu/gpu_backward.py),
#   4. class graphs (scripts/gpu/bench_classes_gpu.py) and the cold-vs-warm benchmark for SDPA bf16 b1 h32 d128 causal at seq 4096 and 512,
#   5. the CPU compiler tests, and a summary: the kinds table and the benchmark's.
# Each step has a time limit (GC_T_KINDS 150, GC_T_TESTS 150, GC_T_BACKWARD 60, GC_T_CLASSES 45, GC_T_BENCH 90, GC_T_CPU 30,
# GC_T_GENERATE 90 seconds) so the whole fits one 10-minute command on a lent machine (about 9 minutes at most); GC_STEPS
# picks steps, run in the order given (default "kinds tests backward classes bench cpu"; "generate", scripts/gpu/gpu_generate.py:
# a tiny Llama's generate, plain torch against graphcache.torch, runs when named); each step prints its seconds.
# GC_PROFILE=short: the last short run (issue 43, at most about 240 s of work): GC_STEPS "tests generate kinds bench",
# the GPU tests of the 2026-12-04 fixes, the layouts and backward (GC_T_TESTS 90), the generate (GC_T_GENERATE 85),
# the kinds table's float32-bias and s_q > s_kv rows only (GC_KINDS, GC_T_KINDS 25) and the bench at seq 4096, one
# sample a side, no memory probe (GC_BENCH_SEQS, GC_REPEAT 1, GC_NO_MEMORY 1, GC_T_BENCH 25); any of these set in the
# environment wins.
# Without a GPU it says so, prints what each kind declares on the CPU, runs the CPU part, and exits 0 (under
# GC_PROFILE=short: each step's CPU form, timed: the tests collected and skipped, the generate's --cpu-dry-run,
# the bench on the reference compiler).
#
#   scripts/gpu/gpu_check.sh [OUT_DIR]      (default: $OUT, else ./gpu-check-out)
#
# On a machine without fastapi/diskcache/cudnn-frontend, run scripts/gpu/fetch_gpu_wheels.sh
# on a machine with pip access first; this script installs ./.whl/*.whl when present. On a lent
# H200 (docs/gpu-results.md): the device tool's run, command "scripts/gpu/gpu_check.sh $OUT",
# carry [".whl"], timeout_s 600 (GC_PROFILE=short: "GC_PROFILE=short scripts/gpu/gpu_check.sh $OUT", timeout_s 300).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT_DIR=${1:-${OUT:-gpu-check-out}}
mkdir -p "$OUT_DIR"
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1

if [[ "${GC_PROFILE:-}" == short ]]; then
  : "${GC_STEPS:=tests generate kinds bench}" "${GC_T_TESTS:=90}" "${GC_T_GENERATE:=85}" "${GC_T_KINDS:=25}"
  : "${GC_T_BENCH:=25}" "${GC_KINDS:=bias-fp32,bias-q>kv}" "${GC_BENCH_SEQS:=4096}" "${GC_REPEAT:=1}" "${GC_NO_MEMORY:=1}"
  # The fixed tests first (a run cut short by its limit keeps what ran), then the layouts' and backward's.
  TESTS=(tests/test_varlen_gpu.py tests/test_gpu.py::test_graph_cache_end_to_end
         tests/test_gpu.py::test_a_doctored_canary_rejects_the_plan_and_the_cache_rebuilds_it
         tests/test_torch_gpu.py tests/test_cudnn_backward.py tests/test_torch_door.py)  # the last: aten's door, capture
elif [[ -n "${GC_PROFILE:-}" ]]; then
  echo "GC_PROFILE=${GC_PROFILE}: the one profile is 'short'"; exit 2
else
  TESTS=(tests/test_gpu.py tests/test_torch_gpu.py tests/test_varlen_gpu.py tests/test_classes_gpu.py tests/test_cudnn_backward.py)
fi
STEPS=${GC_STEPS:-kinds tests backward classes bench cpu}

if compgen -G ".whl/*.whl" >/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/gc-site .whl/*.whl \
    || { echo "installing the carried wheels failed"; exit 1; }
  export PYTHONPATH="/tmp/gc-site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
else
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi

# The frontend wheel loads libcudnn.so.9: torch's own (its nvidia/cudnn/lib) where torch ships one.
cudnn_lib=$("$PY" -c 'import nvidia.cudnn, os; print(os.path.join(list(nvidia.cudnn.__path__)[0], "lib"))' 2>/dev/null)
[[ -n "$cudnn_lib" && -d "$cudnn_lib" ]] && export LD_LIBRARY_PATH="$cudnn_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

echo "== graphcache GPU check, $(date -u +%Y-%m-%dT%H:%M:%SZ)${GC_PROFILE:+, profile $GC_PROFILE}: steps $STEPS"
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

kinds_rc=skip gpu_rc=skip bench_rc=skip cpu_rc=skip generate_rc=skip
gpu=1
[[ "$has_gpu" == none:* ]] && gpu=0

kinds() {
  echo "== graph kinds: built / served / refused and why; cold build vs warm load"
  timeout "${GC_T_KINDS:-150}" "$PY" scripts/gpu/gpu_kinds.py --cache-dir "$OUT_DIR/kinds-cache" --json "$OUT_DIR/kinds.json" \
    ${GC_KINDS:+--only "$GC_KINDS"} 2>&1 | tee "$OUT_DIR/kinds.txt"
  kinds_rc=${PIPESTATUS[0]}
}

tests() {
  if ((gpu)); then
    echo "== GPU tests"
    timeout "${GC_T_TESTS:-150}" "$PY" -m pytest -v -rs -s -m gpu "${TESTS[@]}" 2>&1 | tee "$OUT_DIR/gpu-tests.txt"
    gpu_rc=${PIPESTATUS[0]}
  else
    echo "== GPU tests: no GPU here, collected and skipped (each says why)"
    timeout "${GC_T_TESTS:-150}" "$PY" -m pytest -q -rs -m gpu "${TESTS[@]}" 2>&1 | tail -n 4
    gpu_rc=${PIPESTATUS[0]}
    [[ "$gpu_rc" == 0 ]] && gpu_rc=nogpu
  fi
}

backward() {
  echo "== backward graphs: built / refused per spec, determinism, aten's logsumexp, sdpa_backward against aten's backward"
  timeout "${GC_T_BACKWARD:-60}" "$PY" scripts/gpu/gpu_backward.py --json "$OUT_DIR/backward.json" 2>&1 | tee "$OUT_DIR/backward.txt"
}

classes() {
  echo "== class graphs: error at off-tile shapes, class-at-a-short-shape vs exact execute time"
  timeout "${GC_T_CLASSES:-45}" "$PY" scripts/gpu/bench_classes_gpu.py --json "$OUT_DIR/classes.json" 2>&1 | tee "$OUT_DIR/classes.txt"
}

generate() {
  echo "== a tiny Llama's generate: plain torch against graphcache.torch (patch(), install()) over a warmed store"
  timeout "${GC_T_GENERATE:-90}" "$PY" scripts/gpu/gpu_generate.py --cache-dir "$OUT_DIR/generate-cache" \
    --json "$OUT_DIR/generate.json" $( ((gpu)) || echo --cpu-dry-run) 2>&1 | tee "$OUT_DIR/generate.txt"
  generate_rc=${PIPESTATUS[0]}
}

bench() {
  echo "== cold vs warm (fresh process per sample)$( ((gpu)) || echo ': no GPU here, on the reference compiler')"
  local specs=() seqs=${GC_BENCH_SEQS:-4096 512}
  ((gpu)) || seqs=128  # the reference compiler's float32 on this CPU: the flow, at a size a CPU runs in seconds
  for seq in $seqs; do
    specs+=(--spec "batch=1,heads_q=32,seq_q=$seq,head_dim=128,dtype=bfloat16,mask=causal")
  done
  local plot=()  # the chart where matplotlib is there (a device image may lack it: bench refuses --plot then)
  "$PY" -c 'import matplotlib' 2>/dev/null && plot=(--plot "$OUT_DIR/bench.png")
  timeout "${GC_T_BENCH:-90}" "$PY" -m graphcache.cli --cache-dir "$OUT_DIR/cache" bench "${specs[@]}" \
    --repeat "${GC_REPEAT:-2}" --json "$OUT_DIR/bench.json" "${plot[@]}" \
    ${GC_NO_MEMORY:+--no-memory} $( ((gpu)) || echo --compiler reference) 2>&1 | tee "$OUT_DIR/bench.txt"
  bench_rc=${PIPESTATUS[0]}
}

cpu() {
  echo "== CPU compiler tests (on this machine)"
  timeout "${GC_T_CPU:-30}" "$PY" -m pytest -q tests/test_compiler_cudnn.py tests/test_cudnn_build.py tests/test_torch_sdpa.py tests/test_cudnn_ragged.py tests/test_classes_cudnn.py tests/test_first_contact.py 2>&1 | tail -n 5
  cpu_rc=${PIPESTATUS[0]}
}

if ((!gpu)) && [[ "${GC_PROFILE:-}" != short ]]; then
  echo "== no GPU here: the GPU tests and the cold/warm benchmark need one. Running the CPU part."
  [[ " $STEPS " == *" kinds "* ]] && kinds
  "$PY" -m pytest -q tests/test_compiler_cudnn.py tests/test_cudnn_build.py tests/test_torch_sdpa.py tests/test_cudnn_ragged.py tests/test_gpu.py tests/test_torch_gpu.py tests/test_varlen_gpu.py tests/test_classes_cudnn.py tests/test_classes_gpu.py tests/test_first_contact.py -rs 2>&1 | tail -n 15
  exit 0
fi
((gpu)) || echo "== no GPU here: each step's CPU part (no GPU figure), timed"

for step in $STEPS; do
  case "$step" in
    kinds|tests|backward|classes|generate|bench|cpu) ;;
    *) echo "GC_STEPS: no step '$step' (kinds tests backward classes generate bench cpu)"; exit 2 ;;
  esac
  started=$SECONDS
  "$step"
  echo "== step $step: $((SECONDS - started))s"
done

echo "== summary"
[ -f "$OUT_DIR/kinds.txt" ] && sed -n '/^kind /,$p' "$OUT_DIR/kinds.txt"
[ -f "$OUT_DIR/generate.txt" ] && grep -A8 -- ' new tokens after ' "$OUT_DIR/generate.txt"
"$PY" - "$OUT_DIR/bench.json" "$gpu_rc" "$cpu_rc" "$bench_rc" "$kinds_rc" "$generate_rc" <<'PY'
import json, sys
path, *rcs = sys.argv[1:]
def said(rc):
    said = {"skip": "skipped", "0": "passed", "124": "stopped at its time limit", "nogpu": "collected, skipped: no GPU"}
    return said.get(rc, f"FAILED (rc {rc})")
for name, rc in zip(("GPU tests", "CPU compiler tests", "cold/warm bench", "kinds table", "generate"), rcs):
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
((gpu)) || echo "no GPU here: every step above ran its CPU part; nothing here is a GPU figure"
for rc in "$kinds_rc" "$gpu_rc" "$bench_rc" "$cpu_rc" "$generate_rc"; do [[ "$rc" =~ ^(skip|0|nogpu)$ ]] || exit 1; done
((gpu)) || echo "gpu_check: no GPU here; the CPU parts passed (exit 0)"
