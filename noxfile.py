"""The course's test suite on the students' own package stacks: ``nox -s colab`` (or ``kaggle``, ``newest``).

Each session builds a virtual environment with the stack's Python (from pyenv, where the machine has it)
and installs the course, built as a wheel, with its test extra under the stack's constraint file in
``mgpu_helpers/stacks/``: every version the platform publishes (IPython 7.34, psutil 5.9.5, ipywidgets
7.7.1 and torch 2.11 on Colab, ...), so what Colab's students would get is what the tests run on, and
every notebook imports the installed wheel, not this tree. Then it runs README's test command there;
arguments after ``--`` replace pytest's (``nox -s colab -- tests/test_launch.py``), and ``-- --ci`` runs
:data:`CI_TESTS`, the part that ``.ci/run`` runs on Colab's stack.

On Linux, PyPI's torch for these Pythons is the CUDA build (about 3.5 GB with its NVIDIA libraries); it
runs on the CPU, as Colab's build would without a GPU. The environments live outside the repository,
in ``$MGPU_STACKS_DIR`` (default ``~/.cache/mgpu-course/stacks``), and are reused: a second run
installs nothing new.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import nox

ROOT = Path(__file__).resolve().parent
STACKS = ROOT / "mgpu_helpers" / "stacks"
README_PYTEST = ["-n", "3", "--dist", "loadfile", "notebooks", "tests", "--nbval-lax", "--nbval-current-env"]
#: ``nox -s colab -- --ci`` (what .ci/run runs): every notebook under nbval — they launch ranks, read
#: ports, fence OOMs, draw widgets and install through their first cell on the stack's packages — and the
#: quick tests of what a stack changes: the notebooks' syntax under this IPython, the doctor and the
#: stacks, process handling (psutil), diagnose() (pickling errors), the graders' correct variants (torch's
#: build). The launcher's own process-tree tests take ~6 more minutes there: ``nox -s colab`` runs them.
CI_TESTS = [
    "notebooks",
    "tests/test_notebooks_static.py",
    "tests/test_doctor.py",
    "tests/test_stacks.py",
    "tests/test_processes.py",
    "tests/test_troubleshoot_diagnose.py",
    "tests/test_grader_variants.py",
    "tests/test_shell.py",
]
CI_PYTEST = ["-n", "3", "--dist", "loadfile", *CI_TESTS, "--nbval-lax", "--nbval-current-env"]

#: Run in notebooks/: the kernels there import the installed wheel, and it holds this tree's code.
FROM_THE_WHEEL = """
import pathlib, sys, mgpu_helpers
source, installed = pathlib.Path(sys.argv[1]), pathlib.Path(mgpu_helpers.__file__).parent
assert installed.is_relative_to(sys.prefix), f"mgpu_helpers comes from {installed}, not the installed wheel"
stale = [str(f.relative_to(source)) for f in source.rglob("*.py")
         if not (installed / f.relative_to(source)).is_file()
         or f.read_bytes() != (installed / f.relative_to(source)).read_bytes()]
assert not stale, f"the installed wheel is not this tree's code: {stale[:5]}"
extra = [str(f.relative_to(installed)) for f in installed.rglob("*.py")
         if not (source / f.relative_to(installed)).is_file()]
assert not extra, f"the installed wheel has modules this tree has not: {extra[:5]}"
"""

nox.options.default_venv_backend = "uv"
nox.options.envdir = os.environ.get("MGPU_STACKS_DIR", str(Path.home() / ".cache" / "mgpu-course" / "stacks"))
nox.options.reuse_venv = "yes"
nox.options.sessions = ["colab"]
#: pip in every environment, as on Colab and Kaggle (%pip in the notebooks' install cells uses it)
SEED = ["--seed"]


def stack_header(name: str) -> dict[str, str]:
    """The ``# key: value`` lines at the top of ``mgpu_helpers/stacks/<name>.txt``."""
    out = {}
    for line in (STACKS / f"{name}.txt").read_text().splitlines():
        if not line.startswith("# "):
            break
        key, _, value = line[2:].partition(": ")
        out.setdefault(key, value)
    return out


def interpreter(version: str) -> str:
    """A Python ``version`` that runs: ``pythonX.Y`` on PATH, else pyenv's newest ``X.Y.*``, else the bare
    version (nox then says it found none)."""
    found = shutil.which(f"python{version}")
    if found and subprocess.run([found, "-c", ""], capture_output=True).returncode == 0:
        return found  # a pyenv shim of a version that is not active fails this call
    root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    found_here = [p for p in root.glob(f"{version}.*/bin/python{version}") if p.parts[-3].count(".") == 2]
    newest = max(
        found_here, key=lambda p: [int(x) for x in p.parts[-3].split(".") if x.isdigit()], default=None
    )
    return str(newest) if newest else version


def run_stack(session: nox.Session, name: str) -> None:
    header = stack_header(name)
    session.log(
        f"stack {name}: Python {header['python']}, torch {header['torch']} — {header.get('source', '')}"
    )
    # The course as a student's runtime gets it: built into a wheel and installed (not editable), always
    # anew (a kept environment holds an earlier build). Every notebook then runs from the wheel, beside
    # the platform's own packages: ipywidgets 7.7.1 on Colab, its preinstalled torch kept (the constraint
    # pins it, so a course that asked for another torch would fail to resolve here).
    constraints = str(STACKS / f"{name}.txt")
    # setuptools copies the package into build/lib and keeps what is there: a module deleted here would
    # still be built into the wheel (FROM_THE_WHEEL catches it); start that copy afresh
    shutil.rmtree(ROOT / "build" / "lib", ignore_errors=True)
    session.install(
        "-c", constraints, "--reinstall-package", "mgpu-course", "--refresh-package", "mgpu-course",
        f"{ROOT}[test]",
    )
    # uv writes no bytecode, and where PYTHONDONTWRITEBYTECODE is set (as on these CI machines) no import
    # writes it either: every process would compile torch's Python anew (import torch 4-9 s instead of
    # 2.4 s; the notebooks ran 3x slower than under pip's install). Once per environment (~40 s), then ~3 s.
    venv = session.virtualenv.location
    # exit status 1 where a file is for a newer Python (torch 2.15's py312_intrinsics.py on 3.11): never
    # imported there, and every other file is compiled all the same
    compile_all = ["python", "-W", "ignore", "-m", "compileall", "-qq", "-j0", venv]
    session.run(*compile_all, silent=True, success_codes=[0, 1])
    session.run("python", "-m", "mgpu_helpers.stacks", name)  # the versions installed, against the stack
    with session.chdir(ROOT / "notebooks"):  # where nbval starts each notebook's kernel
        session.run("python", "-c", FROM_THE_WHEEL, str(ROOT / "mgpu_helpers"), silent=True)
    session.run("ruff", "check", str(ROOT))
    # ipykernel 6.17's debugger warns about Python 3.13's frozen modules in every kernel's stderr
    session.env["PYDEVD_DISABLE_FILE_VALIDATION"] = "1"
    args = CI_PYTEST if session.posargs == ["--ci"] else (session.posargs or README_PYTEST)
    session.run("python", "-m", "pytest", *args)


@nox.session(name="colab", python=interpreter(stack_header("colab")["python"]), venv_params=SEED)
def colab(session: nox.Session) -> None:
    """Colab's GPU runtime as published (Python 3.13, torch 2.11, IPython 7.34, ipywidgets 7.7.1)."""
    run_stack(session, "colab")


@nox.session(name="kaggle", python=interpreter(stack_header("kaggle")["python"]), venv_params=SEED)
def kaggle(session: nox.Session) -> None:
    """Kaggle's GPU image (Colab's runtime of 2026-05-14 plus Kaggle's pins: Python 3.12, torch 2.10)."""
    run_stack(session, "kaggle")


@nox.session(name="newest", python=interpreter(stack_header("newest")["python"]), venv_params=SEED)
def newest(session: nox.Session) -> None:
    """The newest release of everything on Python 3.11, torch 2.15."""
    run_stack(session, "newest")
