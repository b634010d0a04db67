#!/usr/bin/env bash
# The GPU check: run everything the course has on whatever GPUs this machine has, and write a short report.
#
#   bash tools/gpu_check.sh [OUT_DIR] [--quick] [--jobs N] [--test-workers K] [--step-timeout S]
#                           [--wheels DIR [--target DIR]] [--offline] [--without MODULES]
#
# 1. with --wheels DIR (a machine without internet): install the wheels that tools/fetch_wheels.sh
#    fetched on a connected machine — offline (pip --no-index --no-deps), nothing that is installed
#    already (torch stays as it is); --target DIR installs into DIR instead (a read-only site-packages)
#    and puts DIR on PYTHONPATH for every step;
# 2. the environment doctor and hardware table (`python -m mgpu_helpers`);
# 3. the unit tests (tests marked `gpu` run here instead of being skipped), in K pytest-xdist workers
#    (default N/2; 0: none);
# 4. every notebook under nbval, each also written as HTML with this run's outputs (a failing cell shows
#    its traceback and nbval's message);
# 5. every benchmark (full runs; `--quick` for smoke runs), keeping its last `RESULT ...` line.
# Steps 2-4 run N at a time (--jobs, default: half the cores), longest first; full benchmarks and the
# notebooks that time speed-ups (04b) run one at a time after them, so that nothing else runs beside
# their timings (--quick benchmarks run with the rest).
#
# A step that needs an optional package missing here is skipped, named in one line at the start and in
# the report: without Ray (its ~76 MiB wheel is fetched only with --include ray) notebooks 06b and 08, the tuning benchmark and
# the tests that need Ray. Offline (--wheels or --offline), tests that need PyPI are skipped and a
# notebook's `%pip install` fails at once instead of retrying. --without ray,sklearn runs as if those
# modules were missing (to try the skips on a machine that has them). Each step ends after S seconds
# (--step-timeout, default 900).
#
# OUT_DIR (default: docs/gpu-runs/<GPUs>-<date>, e.g. docs/gpu-runs/1xH100-2026-11-26; `cpu` without
# GPUs) gets report.md — the hardware, pass/fail and time per step, each benchmark's RESULT line —,
# notebooks/<name>.html and logs/ (one log per step, timeline.tsv). The exit code is the number of failed
# steps (0 = everything passed). Run it from a clone with the test extra installed (pip install -e
# ".[test]"), or with --wheels. On a lab server: pick the GPUs first, e.g. CUDA_VISIBLE_DEVICES=0,1 bash
# tools/gpu_check.sh; on Kaggle (2 x T4) it runs as is in a terminal or a `!bash tools/gpu_check.sh` cell.
# PYTHON names the interpreter (default: `python`, else `python3`).
# GPU_CHECK_TESTS, GPU_CHECK_NOTEBOOKS and GPU_CHECK_BENCHMARKS (paths or globs) narrow a run to some
# tests, notebooks or benchmarks.
set -uo pipefail
CALLER_PWD="$PWD"
ROOT="$(cd "$(dirname "$0")/.." && pwd)" || exit 64
cd "$ROOT" || exit 64

usage() { sed -n '2,/^set /p' "$0" | grep '^#' | sed 's/^# \{0,1\}//'; }
die() { echo "gpu_check: $*" >&2; exit 64; }
absolute() { case "$1" in /*) printf '%s\n' "$1" ;; *) printf '%s\n' "$CALLER_PWD/$1" ;; esac; }
number() { case "$2" in '' | *[!0-9]*) die "$1 wants a number, not '$2'" ;; esac; printf '%s\n' "$2"; }
now() { printf '%s\n' "${EPOCHREALTIME:-$(date +%s)}"; }
prepend_pythonpath() { export PYTHONPATH="$1${PYTHONPATH:+:$PYTHONPATH}"; }

QUICK="" OUT="" WHEELS="" TARGET="" OFFLINE="" WITHOUT="${GPU_CHECK_WITHOUT:-}" STEP_TIMEOUT=900
CORES="$(nproc 2>/dev/null || getconf _NPROCESSORS_ONLN 2>/dev/null || echo 2)"
JOBS=$((CORES / 2 > 0 ? CORES / 2 : 1))
TEST_WORKERS=""
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) QUICK="--quick" ;;
    --offline) OFFLINE=1 ;;
    --jobs) JOBS="$(number --jobs "${2:-}")" || exit 64; shift ;;
    --test-workers) TEST_WORKERS="$(number --test-workers "${2:-}")" || exit 64; shift ;;
    --step-timeout) STEP_TIMEOUT="$(number --step-timeout "${2:-}")" || exit 64; shift ;;
    --wheels) WHEELS="${2:?--wheels wants a folder}"; shift ;;
    --target) TARGET="${2:?--target wants a folder}"; shift ;;
    --without) WITHOUT="${2:?--without wants module names, e.g. ray,sklearn}"; shift ;;
    -h | --help) usage; exit 0 ;;
    -*) die "unknown option $1 (see --help)" ;;
    *) OUT="$1" ;;
  esac
  shift
done
[ "$JOBS" -ge 1 ] || JOBS=1
PY="${PYTHON:-$(command -v python || command -v python3)}"  # some GPU images have python3 alone
[ -n "$PY" ] || die "no python or python3 on PATH (or name one: PYTHON=/path/to/python bash $0)"
TEST_WORKERS="${TEST_WORKERS:-$((JOBS / 2))}"
START=$SECONDS

# The environment every step inherits.
prepend_pythonpath "$ROOT/tools"  # the pytest plugin (-p gpu_check_plugin) and gpu_check_info
if [ -n "$WITHOUT" ]; then
  export GPU_CHECK_WITHOUT="$WITHOUT"
  prepend_pythonpath "$ROOT/tools/gpu_check_without"  # its sitecustomize hides those modules
fi
if [ -n "$TARGET" ]; then
  TARGET="$(absolute "$TARGET")"
  prepend_pythonpath "$TARGET"
  export PATH="$TARGET/bin:$PATH" JUPYTER_PATH="$TARGET/share/jupyter${JUPYTER_PATH:+:$JUPYTER_PATH}"
fi
if [ -n "$WHEELS" ]; then
  WHEELS="$(absolute "$WHEELS")"
  [ -d "$WHEELS" ] || die "no folder $WHEELS (fetch it on a connected machine: bash tools/fetch_wheels.sh)"
  OFFLINE=1
  export PIP_FIND_LINKS="$WHEELS"  # a notebook's %pip install finds what the folder has, and nothing else
fi
if [ -n "$OFFLINE" ]; then
  export GPU_CHECK_OFFLINE=1 PIP_NO_INDEX=1
fi

# 1. Install (its log moves into OUT once OUT is known: OUT's name needs torch, which is there already).
INSTALL_LOG="" INSTALL_ROW=""
if [ -n "$WHEELS" ]; then
  INSTALL_LOG="$(mktemp)"
  t0=$SECONDS
  echo "Installing the wheels of $WHEELS${TARGET:+ into $TARGET} (offline) ..."
  if "$PY" tools/offline_wheels.py install --wheels "$WHEELS" ${TARGET:+--target "$TARGET"} \
    --skip mgpu-course >"$INSTALL_LOG" 2>&1; then
    INSTALL_ROW="pass	$((SECONDS - t0))"
  else
    INSTALL_ROW="FAIL	$((SECONDS - t0))"
    tail -n 5 "$INSTALL_LOG" >&2
  fi
fi
if ! (cd / && "$PY" -c "import mgpu_helpers") >/dev/null 2>&1; then
  prepend_pythonpath "$ROOT"  # not installed: notebook kernels (cwd notebooks/) import it from here
fi

DESCRIPTION="$("$PY" tools/gpu_check_info.py describe 2>&1)"
SLUG="$(head -n 1 <<<"$DESCRIPTION")"
[[ "$SLUG" =~ ^[A-Za-z0-9.+]+$ ]] || SLUG="cpu"
GPU_CHECK_LABEL="$SLUG, $(date '+%Y-%m-%d')"  # named in each notebook's HTML
export GPU_CHECK_LABEL
OUT="$(absolute "${OUT:-docs/gpu-runs/$SLUG-$(date +%Y-%m-%d)}")"
mkdir -p "$OUT/logs" "$OUT/notebooks" || die "cannot create $OUT"
rm -f "$OUT"/logs/*.log "$OUT/logs/timeline.tsv" "$OUT"/notebooks/*.html  # a rerun on the same day
REPORT="$OUT/report.md"
ROWS="$(mktemp -d)"
trap 'rm -rf "$ROWS"' EXIT
[ -z "$INSTALL_LOG" ] || mv "$INSTALL_LOG" "$OUT/logs/install.log"

MISSING="$("$PY" tools/gpu_check_info.py missing 2>/dev/null)"
export GPU_CHECK_MISSING="$MISSING"
XDIST=()
if [ "$TEST_WORKERS" -ge 2 ] && "$PY" -c "import xdist" >/dev/null 2>&1; then
  XDIST=(-n "$TEST_WORKERS" --dist loadfile)
fi
TIMEOUT=()
if command -v timeout >/dev/null 2>&1; then
  TIMEOUT=(timeout -k 30 "$STEP_TIMEOUT")  # TERM (the plugin turns it into Ctrl-C), KILL 30 s later
fi

# The steps, in the report's order: NAME, KIND (doctor, unit, notebook, benchmark), ARG, LOG, and why
# one is skipped (empty: it runs).
NAME=() KIND=() ARG=() LOG=() SKIP=()
add_step() { NAME+=("$1"); KIND+=("$2"); ARG+=("$3"); LOG+=("$4"); SKIP+=("${5:-}"); }
declare -A WHY=()
# shellcheck disable=SC2206  # the globs are meant to expand
NOTEBOOKS=(${GPU_CHECK_NOTEBOOKS:-notebooks/[0-9][0-9]*_*.ipynb})
# shellcheck disable=SC2206
BENCHMARKS=(${GPU_CHECK_BENCHMARKS:-benchmarks/*.py})
while IFS=$'\t' read -r path reason; do
  [ -n "$path" ] && WHY["$path"]="$reason"
done < <("$PY" tools/gpu_check_info.py skips "${NOTEBOOKS[@]}" "${BENCHMARKS[@]}")

add_step "doctor and hardware table" doctor "" "$OUT/logs/doctor.log"
add_step "unit tests (gpu tests included)" unit "${GPU_CHECK_TESTS:-tests}" "$OUT/logs/unit.log"
FIRST_NOTEBOOK=${#NAME[@]}
while IFS= read -r nb; do
  [ -n "$nb" ] || continue
  name="$(basename "$nb" .ipynb)"
  add_step "notebook $name" notebook "$nb" "$OUT/logs/nb-$name.log" "${WHY[$nb]:-}"
done < <(printf '%s\n' "${NOTEBOOKS[@]}" | sort)
FIRST_BENCHMARK=${#NAME[@]}
for bench in "${BENCHMARKS[@]}"; do
  name="$(basename "$bench" .py)"
  add_step "benchmark $name ${QUICK:-(full)}" benchmark "$bench" "$OUT/logs/bench-$name.log" "${WHY[$bench]:-}"
done

SKIPPED=()
for i in "${!NAME[@]}"; do
  [ -z "${SKIP[$i]}" ] || SKIPPED+=("${NAME[$i]#* } (${SKIP[$i]})")
done
if [ -n "$MISSING" ]; then
  SKIP_LINE="Not installed here: ${MISSING// /, } — skipped:"
  for item in ${SKIPPED[@]+"${SKIPPED[@]}"}; do SKIP_LINE="$SKIP_LINE $item;"; done
  SKIP_LINE="$SKIP_LINE the unit tests that need them."
else
  SKIP_LINE="Every optional package is installed: nothing skipped for lack of one."
fi
[ -z "$OFFLINE" ] || SKIP_LINE="$SKIP_LINE Offline: the tests that need PyPI are skipped."
echo "$SKIP_LINE"

# shellcheck disable=SC2086  # GPU_CHECK_TESTS's globs are meant to expand; QUICK is empty or one word
run_kind() {  # run_kind KIND ARG: one step's command
  case "$1" in
    doctor) ${TIMEOUT[@]+"${TIMEOUT[@]}"} "$PY" -m mgpu_helpers ;;
    unit)
      ${TIMEOUT[@]+"${TIMEOUT[@]}"} "$PY" -m pytest -q -rs -p no:cacheprovider -p gpu_check_plugin \
        ${XDIST[@]+"${XDIST[@]}"} $2
      ;;
    notebook)
      GPU_CHECK_HTML="$OUT/notebooks" ${TIMEOUT[@]+"${TIMEOUT[@]}"} "$PY" -m pytest -q -p no:cacheprovider \
        -p gpu_check_plugin --nbval-lax --nbval-current-env "$2"
      ;;
    benchmark) ${TIMEOUT[@]+"${TIMEOUT[@]}"} "$PY" "$2" $QUICK ;;
  esac
}

run_step() {  # run_step I: run step I; its result goes to $ROWS/I, its times to logs/timeline.tsv
  local i="$1" start=$SECONDS t0 rc status
  t0="$(now)"
  run_kind "${KIND[$i]}" "${ARG[$i]}" >"${LOG[$i]}" 2>&1
  rc=$?
  case "$rc" in
    0) status="pass" ;;
    124 | 137) status="FAIL (timed out after ${STEP_TIMEOUT}s)" ;;
    *) status="FAIL" ;;
  esac
  printf '%s\t%s\t%s\t%s\n' "${NAME[$i]}" "$t0" "$(now)" "$status" >>"$OUT/logs/timeline.tsv"
  printf '%s\t%s\n' "$status" "$((SECONDS - start))" >"$ROWS/$i"
}

PIDS=()
# shellcheck disable=SC2317  # called by the trap
stop_all() {  # Ctrl-C: end the steps still running (each `timeout` passes the signal to its step's group)
  local pid child
  for pid in "${PIDS[@]}"; do
    for child in $(pgrep -P "$pid" 2>/dev/null); do kill -TERM "$child" 2>/dev/null; done
    kill -TERM "$pid" 2>/dev/null
  done
  exit 130
}
trap stop_all INT TERM

pool() {  # pool I...: run the steps N at a time, the first ones first
  local i
  for i in "$@"; do
    [ -z "${SKIP[$i]}" ] || continue
    while [ "$(jobs -pr | wc -l)" -ge "$JOBS" ]; do wait -n; done
    run_step "$i" &
    PIDS+=($!)
  done
  wait
}

# Longest first (conftest.py's list), so that short steps fill the gaps at the end; the notebooks that
# time themselves against an idle machine (gpu_check_info.RUN_ALONE) run after the rest, one at a time,
# and so do full benchmarks.
declare -A ALONE=()
while IFS= read -r nb; do
  [ -n "$nb" ] && ALONE["$nb"]=1
done < <("$PY" tools/gpu_check_info.py alone "${ARG[@]:FIRST_NOTEBOOK:FIRST_BENCHMARK-FIRST_NOTEBOOK}")
PARALLEL=(0 1) SERIAL=()
while IFS= read -r nb; do
  for ((i = FIRST_NOTEBOOK; i < FIRST_BENCHMARK; i++)); do
    [ "${ARG[$i]}" = "$nb" ] || continue
    if [ -n "${ALONE[$nb]:-}" ]; then SERIAL+=("$i"); else PARALLEL+=("$i"); fi
  done
done < <("$PY" tools/gpu_check_info.py order "${ARG[@]:FIRST_NOTEBOOK:FIRST_BENCHMARK-FIRST_NOTEBOOK}")
for ((i = FIRST_BENCHMARK; i < ${#NAME[@]}; i++)); do
  if [ -n "$QUICK" ]; then PARALLEL+=("$i"); else SERIAL+=("$i"); fi
done
echo "Running ${#NAME[@]} steps, $JOBS at a time (unit tests: ${XDIST[1]:-no} xdist workers); logs in $OUT/logs"
pool "${PARALLEL[@]}"
JOBS=1 pool ${SERIAL[@]+"${SERIAL[@]}"}
RAN_ALONE=""
for i in ${SERIAL[@]+"${SERIAL[@]}"}; do [ -n "${SKIP[$i]}" ] || RAN_ALONE="$RAN_ALONE ${NAME[$i]#* }"; done

FAILED=0
{
  echo "# GPU check — $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo
  if COMMIT="$(git rev-parse --short HEAD 2>/dev/null)"; then
    git diff --quiet HEAD 2>/dev/null || COMMIT="$COMMIT (with uncommitted changes)"
  else
    COMMIT="unknown (not a git clone)"
  fi
  echo "Commit: \`$COMMIT\`"
  echo
  echo '```'
  if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi --query-gpu=index,name,compute_cap,memory.total,driver_version --format=csv 2>&1
  else
    echo "nvidia-smi: not available"
  fi
  tail -n +2 <<<"$DESCRIPTION"
  echo "$CORES cores; $JOBS steps at a time; unit tests in ${XDIST[1]:-no} xdist workers${OFFLINE:+; offline}${WHEELS:+ (wheels: $WHEELS)}"
  [ -z "$RAN_ALONE" ] || echo "Run alone, after the rest:$RAN_ALONE"
  echo '```'
  echo
  echo "$SKIP_LINE"
  echo
  echo "| step | result | time | log |"
  echo "|---|---|---|---|"
  if [ -n "$INSTALL_ROW" ]; then
    IFS=$'\t' read -r status secs <<<"$INSTALL_ROW"
    [ "$status" = pass ] || FAILED=$((FAILED + 1))
    # shellcheck disable=SC2016  # backquotes for Markdown
    printf '| install the wheels | %s | %ss | `logs/install.log` |\n' "$status" "$secs"
  fi
  for i in "${!NAME[@]}"; do
    log="${LOG[$i]#"$OUT"/}"
    if [ -n "${SKIP[$i]}" ]; then
      printf '| %s | skipped: %s | - | - |\n' "${NAME[$i]}" "${SKIP[$i]}"
      continue
    fi
    status="FAIL (no result)" secs="?"
    [ -f "$ROWS/$i" ] && IFS=$'\t' read -r status secs <"$ROWS/$i"
    [ "$status" = pass ] || FAILED=$((FAILED + 1))
    html=""
    if [ "${KIND[$i]}" = notebook ]; then
      html="notebooks/$(basename "${ARG[$i]}" .ipynb).html"
      if [ -f "$OUT/$html" ]; then html=", [html]($html)"; else html=""; fi
    fi
    # shellcheck disable=SC2016
    printf '| %s | %s | %ss | `%s`%s |\n' "${NAME[$i]}" "$status" "$secs" "$log" "$html"
  done
  echo
  echo "## Benchmark results"
  echo
  for log in "$OUT"/logs/bench-*.log; do
    [ -f "$log" ] || continue
    echo "- $(basename "$log" .log | sed 's/^bench-//'): \`$(grep '^RESULT' "$log" | tail -n 1 || true)\`"
  done
  echo
  echo "## Unit tests"
  echo
  echo "\`$(tail -n 1 "$OUT/logs/unit.log" 2>/dev/null)\`"
  echo
  echo "Wall time: $((SECONDS - START)) s. Failed steps: $FAILED"
} >"$REPORT.tmp"  # (a group, not a subshell: FAILED counts on)
mv "$REPORT.tmp" "$REPORT"
cat "$REPORT"
echo
echo "Report: $REPORT"
exit "$FAILED"
