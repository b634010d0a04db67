"""What a student's Colab or Kaggle runtime gets: the package built as a wheel, installed into a fresh
virtual environment beside Colab's ipywidgets 7.7.1 (not this repository's source tree), runs notebooks 00
and 01 under nbval — and the base install brings no Ray, Optuna, ipyparallel or scikit-learn (each
notebook that needs one installs its extra itself)."""

import os
import pathlib
import shutil
import subprocess
import sys

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOKS = ["00_setup.ipynb", "01_nodes_and_gpus.ipynb"]


def _run(cmd, cwd, timeout=600):
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, (
        f"{' '.join(map(str, cmd))} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    )
    return proc.stdout


def _torch_requirement() -> list[str]:
    """This environment's torch, as pip should fetch it: the same version, and for a CPU build without a
    local wheel folder (PIP_FIND_LINKS, as on the course's CI machines) PyTorch's CPU index, so that the
    test never pulls the multi-GB CUDA build."""
    version = torch.__version__.split("+")[0]
    cpu_index = (
        []
        if os.environ.get("PIP_FIND_LINKS") or torch.version.cuda
        else [
            "--index-url",
            "https://download.pytorch.org/whl/cpu",
            "--extra-index-url",
            "https://pypi.org/simple",
        ]
    )
    return [f"torch=={version}", *cpu_index]


def test_the_wheel_in_a_fresh_venv_with_ipywidgets_7_runs_notebooks_00_and_01(tmp_path):
    work = tmp_path / "wheel-install"
    try:
        _run(
            [
                sys.executable,
                "-m",
                "pip",
                "wheel",
                "-q",
                "--no-deps",
                "--no-build-isolation",
                "-w",
                work,
                ROOT,
            ],
            cwd=tmp_path,
        )
        wheel = next(work.glob("mgpu_course-*.whl"))
        _run([sys.executable, "-m", "venv", work / "venv"], cwd=tmp_path)
        python = work / "venv" / "bin" / "python"
        pip = [
            python,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-compile",
            "--disable-pip-version-check",
        ]  # no .pyc: halves the time
        _run([*pip, *_torch_requirement()], cwd=tmp_path)
        _run([*pip, str(wheel), "ipywidgets==7.7.1", "nbval", "pytest", "ipykernel"], cwd=tmp_path)

        probe = (
            "import importlib.util as u, ipywidgets, mgpu_helpers; "
            "print(ipywidgets.__version__, mgpu_helpers.__file__, "
            "[m for m in ('ray', 'optuna', 'ipyparallel', 'sklearn') if u.find_spec(m)])"
        )
        version, where, extras = _run([python, "-c", probe], cwd=tmp_path).split(maxsplit=2)
        assert version == "7.7.1"
        assert str(work / "venv") in where, f"mgpu_helpers came from {where}, not from the installed wheel"
        assert extras.strip() == "[]", f"the base install brought {extras.strip()}: they belong in extras"

        for name in NOTEBOOKS:  # copied out of the repository: only the wheel can provide mgpu_helpers
            shutil.copy(ROOT / "notebooks" / name, work / name)
        out = _run(
            [
                python,
                "-m",
                "pytest",
                "-q",
                "-p",
                "no:cacheprovider",
                "--nbval-lax",
                "--nbval-current-env",
                *NOTEBOOKS,
            ],
            cwd=work,
        )
        assert " passed" in out.splitlines()[-1] and "failed" not in out.splitlines()[-1], out[-2000:]
    finally:
        shutil.rmtree(work, ignore_errors=True)  # about 1 GB: never left for pytest's basetemp retention
