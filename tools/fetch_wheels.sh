#!/usr/bin/env bash
# Fetch, on a machine with internet, the wheels that tools/gpu_check.sh needs on a GPU machine without:
#
#   bash tools/fetch_wheels.sh [--python 3.12] [--dest .whl] [--exclude NAME] [--include NAME]
#   bash tools/fetch_wheels.sh --print-requirements        # the top-level list only (no network)
#
# --python is the GPU machine's Python (default 3.12); the wheels are for CPython on manylinux x86_64.
# DEST (default .whl, git-ignored) gets the wheels of the course's dependencies and its `test` extra —
# not torch (the GPU machine keeps its own), not Ray (~80 MB) and not what only Ray's notebooks use, and
# not what runs without being installed (`--help` of tools/offline_wheels.py lists them; --include NAME
# brings one back) — plus the course's own wheel and requirements.txt (one name==version a line).
# Copy DEST beside the clone on the GPU machine and run: bash tools/gpu_check.sh --wheels .whl
set -uo pipefail
if [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ]; then
  sed -n '2,/^set /p' "$0" | grep '^#' | sed 's/^# \{0,1\}//'
  exit 0
fi
exec python "$(dirname "$0")/offline_wheels.py" fetch "$@"
