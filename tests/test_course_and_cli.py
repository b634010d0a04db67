"""The course map, the README it feeds, CI's command, and `python -m mgpu_helpers`."""

import importlib
import json
import pathlib
import pkgutil
import re
import subprocess
import sys

import torch

import mgpu_helpers
from mgpu_helpers.course import (
    MODULES,
    NOTEBOOKS,
    course_map_markdown,
    modes_here,
    module_table_markdown,
    module_users,
)

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


def _code_of(notebook: str) -> str:
    nb = json.loads((ROOT / "notebooks" / notebook).read_text())
    return "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")


def _helpers_used(code: str) -> set[str]:
    """Top-level mgpu_helpers modules named in the code: imports, attribute paths, ``-m`` targets."""
    used = set(re.findall(r"\bmgpu_helpers\.(\w+)", code))
    for names in re.findall(r"from\s+mgpu_helpers\s+import\s+(\([^)]*\)|[^\n]+)", code):
        used |= {n.split(" as ")[0].strip() for n in names.strip("()").split(",") if n.strip()}
    return {name for name in used if not name.startswith("_")}  # mgpu_helpers.__version__ is no module


def test_course_records_the_helper_modules_each_notebook_imports():
    for nb in NOTEBOOKS:
        assert set(nb.helpers) == _helpers_used(_code_of(nb.file)), (
            f"mgpu_helpers.course: notebook {nb.number}'s helpers= differs from what its code imports"
        )
        assert set(nb.helpers) <= set(MODULES), f"notebook {nb.number} imports a module missing from MODULES"


def test_every_module_is_in_the_readme_module_table():
    on_disk = {m.name for m in pkgutil.iter_modules(mgpu_helpers.__path__) if not m.name.startswith("_")}
    assert set(MODULES) == on_disk, f"course.MODULES vs files: {sorted(set(MODULES) ^ on_disk)}"
    assert module_table_markdown() in (ROOT / "README.md").read_text(), (
        "README's module table is stale: run python tools/update_readme.py"
    )


def _all_modules() -> list[str]:
    names = []
    for info in pkgutil.walk_packages(mgpu_helpers.__path__, prefix="mgpu_helpers."):
        names.append(info.name)
    return names


def test_every_module_docstring_opens_with_the_notebooks_that_use_it():
    for name in _all_modules():
        doc = importlib.import_module(name).__doc__ or ""
        assert doc.startswith("Used by"), f"{name}: the docstring must open with 'Used by notebook …'"
    for module in MODULES:
        first_paragraph = (importlib.import_module(f"mgpu_helpers.{module}").__doc__ or "").split("\n\n")[0]
        users = module_users(module)
        if "of every notebook" in first_paragraph:  # "Used by the exercises of every notebook"
            assert not users or set(users) == {nb.number for nb in NOTEBOOKS}, f"{module}: not everywhere"
            continue
        for number in users:
            assert re.search(rf"\b{number}\b", first_paragraph), (
                f"mgpu_helpers.{module} is imported by notebook {number}, but its docstring does not say so"
            )
