"""tools/gpu_check.sh, narrowed to a failing test selection, a one-cell notebook and one quick benchmark:
it runs each step, records pass/fail per step, keeps the benchmark's RESULT line and exits with the number
of failed steps."""

import os
import pathlib
import subprocess

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_a_narrowed_gpu_check_reports_every_step_and_counts_failures(tmp_path):
    import nbformat

    notebook = tmp_path / "tiny.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("assert 1 + 1 == 2")]), notebook)
    narrow = {
        "GPU_CHECK_TESTS": "tests/no_such_test_file.py",  # a step that fails
        "GPU_CHECK_NOTEBOOKS": str(notebook),
        "GPU_CHECK_BENCHMARKS": "benchmarks/memory_tracker.py",
    }
    proc = subprocess.run(
        ["bash", "tools/gpu_check.sh", str(tmp_path / "out"), "--quick"],
        cwd=ROOT,
        env={**os.environ, **narrow},
        capture_output=True,
        text=True,
        timeout=300,
    )
    report = (tmp_path / "out" / "report.md").read_text()
    assert proc.returncode == 1, report
    for step in (
        "| doctor and hardware table | pass",
        "| unit tests (gpu tests included) | FAIL",
        "| notebook tiny | pass",
        "| benchmark memory_tracker --quick | pass",
    ):
        assert step in report, report
    assert "- memory_tracker: `RESULT " in report and "Failed steps: 1" in report
    assert (tmp_path / "out" / "logs" / "nb-tiny.log").exists()
