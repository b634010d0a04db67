#!/usr/bin/env bash
# The GPU check: run everything the course has on whatever GPUs this machine has, and write a short report.
#
#   bash tools/gpu_check.sh [OUT_DIR] [--quick]
#
# 1. the environment doctor and hardware table (`python -m mgpu_helpers`);
# 2. the unit tests (tests marked `gpu` run here instead of being skipped);
# 3. every notebook under nbval, one at a time, with its time;
# 4. every benchmark (full runs; `--quick` for smoke runs), keeping its last `RESULT ...` line.
#
# OUT_DIR (default: gpu-check-<date>) gets report.md plus one log per step. Nothing else is written
# outside it; the exit code is the number of failed steps (0 = everything passed). Run it from a clone
# with the test extra installed: pip install -e ".[test]". On a lab server: pick the GPUs first, e.g.
# CUDA_VISIBLE_DEVICES=0,1 bash tools/gpu_check.sh; on Kaggle (2 x T4) it runs as is in a terminal or a
# `!bash tools/gpu_check.sh` cell. GPU_CHECK_TESTS, GPU_CHECK_NOTEBOOKS and GPU_CHECK_BENCHMARKS (paths or
# globs) narrow a run to some tests, notebooks or benchmarks.
set -uo pipefail
cd "$(dirname "$0")/.."
QUICK=""
OUT=""
for arg in "$@"; do
  case "$arg" in
    --quick) QUICK="--quick" ;;
    -h|--help) sed -n '2,/^set /p' "$0" | grep '^#'; exit 0 ;;
    *) OUT="$arg" ;;
  esac
done
OUT="${OUT:-gpu-check-$(date +%Y%m%d-%H%M)}"
mkdir -p "$OUT/logs"
REPORT="$OUT/report.md"
FAILED=0

step() {  # step NAME LOG COMMAND...: run, record pass/fail and seconds
  local name="$1" log="$2"; shift 2
  local start=$SECONDS
  if "$@" >"$log" 2>&1; then status="pass"; else status="FAIL"; FAILED=$((FAILED + 1)); fi
  printf '| %s | %s | %ss | `%s` |\n' "$name" "$status" "$((SECONDS - start))" "${log#"$OUT"/}" >>"$REPORT"
}

{
  echo "# GPU check — $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo
  echo "Commit: \`$(git rev-parse --short HEAD 2>/dev/null || echo unknown)\`"
  echo
  echo '```'
  nvidia-smi --query-gpu=index,name,compute_cap,memory.total,driver_version --format=csv 2>&1 || echo "nvidia-smi: not available"
  python -c "import sys, torch; print('Python', sys.version.split()[0], '| torch', torch.__version__, '| CUDA build', torch.version.cuda, '| GPUs', torch.cuda.device_count())"
  echo '```'
  echo
  echo "| step | result | time | log |"
  echo "|---|---|---|---|"
} >"$REPORT"

step "doctor and hardware table" "$OUT/logs/doctor.log" python -m mgpu_helpers
# shellcheck disable=SC2086  # the globs are meant to expand
step "unit tests (gpu tests included)" "$OUT/logs/unit.log" python -m pytest -q -p no:cacheprovider ${GPU_CHECK_TESTS:-tests}
for nb in ${GPU_CHECK_NOTEBOOKS:-notebooks/[0-9][0-9]*_*.ipynb}; do
  name="$(basename "$nb" .ipynb)"
  step "notebook $name" "$OUT/logs/nb-$name.log" python -m pytest -q -p no:cacheprovider --nbval-lax --nbval-current-env "$nb"
done
for bench in ${GPU_CHECK_BENCHMARKS:-benchmarks/*.py}; do
  name="$(basename "$bench" .py)"
  step "benchmark $name ${QUICK:-(full)}" "$OUT/logs/bench-$name.log" python "$bench" $QUICK
done

{
  echo
  echo "## Benchmark results"
  echo
  for log in "$OUT"/logs/bench-*.log; do
    echo "- $(basename "$log" .log | sed 's/^bench-//'): \`$(grep '^RESULT' "$log" | tail -n 1 || true)\`"
  done
  echo
  echo "## Unit tests"
  echo
  echo "\`$(tail -n 1 "$OUT/logs/unit.log")\`"
  echo
  echo "Failed steps: $FAILED"
} >>"$REPORT"
cat "$REPORT"
exit "$FAILED"
