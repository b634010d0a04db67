"""The course map, the README it feeds, CI's command, and `python -m mgpu_helpers`."""

import pathlib
import re
import subprocess
import sys

import torch

from mgpu_helpers.course import NOTEBOOKS, course_map_markdown, modes_here

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_readme_course_map_is_generated_from_the_package():
    assert course_map_markdown() in (ROOT / "README.md").read_text(), (
        "README's course map is stale: paste mgpu_helpers.course.course_map_markdown()"
    )


def test_ci_runs_exactly_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    commands = re.findall(r"^(pip install -e .*)$", readme, flags=re.M)
    test_cmd = next(c for c in commands if "pytest" in c)
    ci_lines = (ROOT / ".ci" / "run").read_text().splitlines()
    assert test_cmd in ci_lines
    assert "pip install torch==2.13.0" in ci_lines  # the local CPU wheel, never the CUDA download
    assert "--nbval-lax" in test_cmd and "notebooks" in test_cmd


def test_modes_follow_gpu_count():
    nb01 = next(nb for nb in NOTEBOOKS if nb.number == "01")
    assert nb01.mode(0) == nb01.cpu and nb01.mode(1) == nb01.one_gpu and nb01.mode(8) == nb01.multi_gpu
    assert [m[0] for m in modes_here(0)] == [nb.number for nb in NOTEBOOKS]
    assert nb01.colab_url.endswith("/blob/main/notebooks/01_nodes_and_gpus.ipynb")


def test_python_m_mgpu_helpers_prints_table_and_modes():
    proc = subprocess.run([sys.executable, "-m", "mgpu_helpers"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "Sources:" in proc.stdout and "What each notebook does" in proc.stdout
    assert "01 Nodes and GPUs" in proc.stdout
    if torch.cuda.device_count() == 0:
        assert "No GPU visible" in proc.stdout and "backend to use here: gloo" in proc.stdout


def test_importing_the_package_imports_neither_ray_nor_submodules():
    code = "import sys, mgpu_helpers; print('ray' in sys.modules, 'mgpu_helpers.memory' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]
