"""Every benchmark's --quick mode runs its real code path and still ends with its RESULT line.

Quick mode makes no timing claim (sizes are tiny); it keeps the benchmarks from rotting when the
package changes. Full runs are for a quiet machine: ``python benchmarks/<name>.py``.

All quick runs share one Python process (started once for this file), put first in the state a GPU
machine creates (autograd owns a thread: tests/_gpu_conditions.py), since on a GPU machine the scripts
that run before a script have run ``backward()``. Each script runs as
``__main__`` with ``--quick`` in its ``sys.argv``, its stdout captured on its own, torch's thread count
put back between scripts. A fresh interpreter, torch import and forkserver per script cost 2-3 s each
of a 2-core CI machine's time and tested nothing the script's own code path does not.
"""

import json
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
BENCHMARKS = sorted((ROOT / "benchmarks").glob("*.py"))
RESULT_LINE = re.compile(r"^RESULT( [a-z0-9_]+=(-?[0-9.]+(e[-+]?[0-9]+)?|nan|inf))+$")

#: Runs each script given as an argument the way ``python SCRIPT --quick`` would (``__main__``, its
#: folder first on ``sys.path``); a script that raises or exits non-zero is recorded and the next runs.
RUN_ALL_QUICK = r"""
import contextlib, io, json, runpy, sys, traceback
import torch
sys.path.insert(0, "tests")
import _gpu_conditions
_gpu_conditions.start_autograd_thread()  # what a GPU machine's first backward does: fork is now unsafe
del sys.path[0]
threads, path0, found = torch.get_num_threads(), list(sys.path), {}
for script in sys.argv[1:]:
    torch.set_num_threads(threads)
    sys.argv, sys.path[:] = [script, "--quick"], [str(__import__("pathlib").Path(script).parent), *path0]
    out, error = io.StringIO(), None
    with contextlib.redirect_stdout(out):
        try:
            runpy.run_path(script, run_name="__main__")
        except SystemExit as stop:
            if stop.code not in (None, 0):
                error = f"exited with {stop.code!r}"
        except BaseException:
            error = traceback.format_exc()
    found[script] = {"stdout": out.getvalue(), "error": error}
print(json.dumps(found))
"""


@pytest.fixture(scope="module")
def quick_runs() -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", RUN_ALL_QUICK, *map(str, BENCHMARKS)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_every_benchmark_is_found():
    assert {p.stem for p in BENCHMARKS} >= {"amp", "ddp", "launch", "memory_tracker", "pipeline", "tuning"}


@pytest.mark.parametrize("script", BENCHMARKS, ids=lambda p: p.stem)
def test_quick_mode_ends_with_a_result_line(script, quick_runs):
    run = quick_runs[str(script)]
    assert run["error"] is None, run["error"][-3000:]
    lines = run["stdout"].strip().splitlines()
    last = lines[-1] if lines else ""
    assert RESULT_LINE.match(last), f"last line is not a RESULT line: {last!r}"
