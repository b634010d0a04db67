"""Every benchmark's --quick mode runs its real code path and still ends with its RESULT line.

Quick mode makes no timing claim (sizes are tiny); it keeps the benchmarks from rotting when the
package changes. Full runs are for a quiet machine: ``python benchmarks/<name>.py``.
"""

import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
BENCHMARKS = sorted((ROOT / "benchmarks").glob("*.py"))
RESULT_LINE = re.compile(r"^RESULT( [a-z0-9_]+=(-?[0-9.]+(e[-+]?[0-9]+)?|nan|inf))+$")


def test_every_benchmark_is_found():
    assert {p.stem for p in BENCHMARKS} >= {"amp", "ddp", "launch", "memory_tracker", "pipeline", "tuning"}


@pytest.mark.parametrize("script", BENCHMARKS, ids=lambda p: p.stem)
def test_quick_mode_ends_with_a_result_line(script):
    proc = subprocess.run(
        [sys.executable, str(script), "--quick"], capture_output=True, text=True, timeout=600, cwd=ROOT
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    last = proc.stdout.strip().splitlines()[-1]
    assert RESULT_LINE.match(last), f"last line is not a RESULT line: {last!r}"
