"""What a student's Colab or Kaggle runtime gets: the package built as a wheel, installed into a fresh
virtual environment beside Colab's ipywidgets 7.7.1 (not this repository's source tree), runs notebooks 00
and 01 under nbval — and the base install brings no Ray, Optuna, ipyparallel or scikit-learn (each
notebook that needs one installs its extra itself)."""

import importlib.metadata
import json
import os
import pathlib
import shutil
import subprocess
import sys

from packaging.requirements import Requirement

ROOT = pathlib.Path(__file__).resolve().parents[1]
#: Run under nbval here, from the installed wheel; the root conftest leaves them out of the suite's own
#: notebook run whenever this test is collected (the same cells, the same nbval flags: once is enough).
NOTEBOOKS = ["00_setup.ipynb", "01_nodes_and_gpus.ipynb"]


def _run(cmd, cwd, timeout=600, env=None):
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
    assert proc.returncode == 0, (
        f"{' '.join(map(str, cmd))} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    )
    return proc.stdout


def _build_isolation() -> list[str]:
    """Build with this environment's setuptools when it can make wheels by itself (>= 70.1, or with the
    ``wheel`` package); a fresh venv's older setuptools cannot ("invalid command 'bdist_wheel'"), so pip
    then builds in isolation, with the setuptools that pyproject.toml asks for."""
    import importlib.util

    from packaging.version import Version

    setuptools = importlib.metadata.version("setuptools")
    can = Version(setuptools) >= Version("70.1") or importlib.util.find_spec("wheel") is not None
    return ["--no-build-isolation"] if can else []


#: What Colab's and Kaggle's images come with (and nbval, which CI adds): taken from this environment.
PREINSTALLED = ("torch", "numpy", "matplotlib", "ipython", "ipykernel", "psutil", "pytest", "nbval")


def _preinstall(venv_python: pathlib.Path, folder: pathlib.Path) -> None:
    """Give the new venv what a Colab or Kaggle image carries already installed, torch above all: each
    package of PREINSTALLED and everything it requires is linked into ``folder``, put on the venv's path
    by a ``.pth`` file, so pip sees them installed and resolves the wheel's other dependencies (and
    ipywidgets 7.7.1) against them — no second copy of a ~1 GB torch unpacked, never the CUDA build."""
    folder.mkdir()
    seen, todo = set(), list(PREINSTALLED)
    while todo:
        dist = importlib.metadata.distribution(todo.pop())
        if dist.metadata["Name"].lower() in seen | {"setuptools"}:  # the venv's own, or the wheel's (3.12+)
            continue
        seen.add(dist.metadata["Name"].lower())
        assert dist.files, (  # else pip would install the package itself: for torch, the CUDA build
            f"{dist.metadata['Name']} lists no files (installed without a RECORD, e.g. by conda): "
            "run this test from a pip-installed environment"
        )
        for top in {f.parts[0] for f in dist.files or [] if f.parts[0] not in ("..", "__pycache__")}:
            if not top.endswith(".pth") and not (folder / top).exists():
                (folder / top).symlink_to(dist.locate_file(top))
        for text in dist.requires or []:
            requirement = Requirement(text)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(requirement.name)
    site = _run([venv_python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=folder)
    (pathlib.Path(site.strip()) / "preinstalled.pth").write_text(f"{folder}\n")


def _venv_path(python: pathlib.Path) -> dict[str, str]:
    """This environment with the venv's bin first on PATH and this environment's bin gone, so that a
    command a notebook types (``!torchrun``, ``!pip``) can only find the venv's (the linked packages
    bring no scripts: ``python -m torch.distributed.run`` is the way there)."""
    outer = os.path.dirname(sys.executable)
    path = [p for p in os.environ.get("PATH", "").split(os.pathsep) if p and p != outer]
    return {**os.environ, "PATH": os.pathsep.join([str(python.parent), *path])}


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
                *_build_isolation(),
                "-w",
                work,
                ROOT,
            ],
            cwd=tmp_path,
        )
        wheel = next(work.glob("mgpu_course-*.whl"))
        # No pip of its own (ensurepip would cost ~5 s of a 2-core CI machine): this environment's pip
        # installs into the venv (--python, pip >= 22.3); notebooks 00 and 01 run no pip command
        _run([sys.executable, "-m", "venv", "--without-pip", work / "venv"], cwd=tmp_path)
        python = work / "venv" / "bin" / "python"
        pip = [
            sys.executable,
            "-m",
            "pip",
            "--python",
            python,
            "install",
            "-q",
            "--no-compile",
            "--disable-pip-version-check",
        ]  # no .pyc: halves the time
        _preinstall(python, work / "preinstalled")
        _run([*pip, str(wheel), "ipywidgets==7.7.1"], cwd=tmp_path)

        probe = (
            "import importlib.util as u, json, ipywidgets, mgpu_helpers, torch; "
            "print(json.dumps([ipywidgets.__version__, mgpu_helpers.__file__, torch.__file__, "
            "[m for m in ('ray', 'optuna', 'ipyparallel', 'sklearn') if u.find_spec(m)]]))"
        )
        version, where, torch_file, extras = json.loads(_run([python, "-c", probe], cwd=tmp_path))
        assert version == "7.7.1"
        assert str(work / "venv") in where, f"mgpu_helpers came from {where}, not from the installed wheel"
        assert str(work / "preinstalled") in torch_file, f"pip installed a second torch: {torch_file}"
        assert extras == [], f"the base install brought {extras}: they belong in extras"

        for name in NOTEBOOKS:  # copied out of the repository: only the wheel can provide mgpu_helpers
            shutil.copy(ROOT / "notebooks" / name, work / name)
        shutil.copy(ROOT / "conftest.py", work)  # CI's checks: kernel start-up retry, no process left,
        shutil.copy(ROOT / "tests" / "_gpu_conditions.py", work)  # a GPU machine's state in every kernel
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
            env=_venv_path(python),
        )
        assert " passed" in out.splitlines()[-1] and "failed" not in out.splitlines()[-1], out[-2000:]
    finally:
        shutil.rmtree(work, ignore_errors=True)  # about 1 GB: never left for pytest's basetemp retention
