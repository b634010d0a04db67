"""Notebook 06b's Tune results folder: a kernel killed before the notebook's last cell (which removes it)
leaves it behind; running the cell again, in any kernel, removes it (``temp_prefix``)."""

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from mgpu_helpers.processes import temp_prefix

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "06b_ray_tune.ipynb"


def _storage_line() -> str:
    """The line of 06b that makes the folder Tune writes its results to."""
    cells = json.loads(NOTEBOOK.read_text())["cells"]
    lines = [line for c in cells for line in "".join(c["source"]).splitlines()]
    lines = [line for line in lines if line.startswith("storage =")]
    assert len(lines) == 1, lines
    return lines[0]


def test_the_results_folder_of_a_killed_kernel_goes_when_the_cell_runs_again(tmp_path, monkeypatch):
    line = _storage_line()
    assert re.search(r"TemporaryDirectory\(prefix=temp_prefix\(\"[a-z0-9]+\"\)\)", line), line
    kernel = (
        "import os, signal, tempfile\n"
        "from mgpu_helpers.processes import temp_prefix\n"
        f"{line}\n"
        "print(storage.name, flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)  # killed: TemporaryDirectory's cleanup never runs\n"
    )
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", kernel], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == -signal.SIGKILL, done.stderr
    stale = done.stdout.strip()
    assert os.path.isdir(stale) and Path(stale).parent == tmp_path

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    cell = {"tempfile": tempfile, "temp_prefix": temp_prefix}
    exec(line, cell)  # the cell, run again in a live kernel
    try:
        assert not os.path.exists(stale)
        assert os.path.isdir(cell["storage"].name)
    finally:
        cell["storage"].cleanup()
