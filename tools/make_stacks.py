"""Write the pinned package stacks in ``mgpu_helpers/stacks/`` from the platforms' published lists.

The stacks are pip constraint files: every version a platform publishes, applied to whatever
``pip install -e ".[test]"`` (or the course's install cell) pulls in. ``noxfile.py`` builds one virtual
environment per stack from them, and the doctor (``mgpu_helpers.stacks``) compares this machine with them.

Run it where the two public repositories are cloned::

    python tools/make_stacks.py --colab-repo PATH/backend-info --kaggle-repo PATH/docker-python

* **colab**: googlecolab/backend-info's ``pip-freeze.gpu.txt`` at the commit named below (the newest
  published). Python's version comes from that commit's ``os-info-gpu.txt``.
* **kaggle**: Kaggle/docker-python builds its GPU image FROM Colab's runtime of the date in its
  ``Dockerfile.tmpl`` and then installs ``kaggle_requirements.txt``: so Colab's freeze of that date,
  overridden by Kaggle's ``==`` pins. Kaggle's unpinned packages (Ray, Optuna, JupyterLab, ...) took the
  newest release on the day the image was built, so they stay free here.
* **newest**: the newest releases of everything on Python 3.11, torch pinned to the newest release.

Lines installed from a URL (``pkg @ https://...``) are dropped (they are not on PyPI), so are CUDA's own
wheels (``nvidia-*``, ``cuda-*``: PyPI's torch pins those it was built with), and local version labels
are cut (``torch==2.11.0+cu128`` becomes ``torch==2.11.0``: PyPI's build of the same release).
"""

from __future__ import annotations

import argparse
import re
import subprocess
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "mgpu_helpers" / "stacks"

COLAB_COMMIT = "a724079"  # 2026-08-19, "Upgrade to Python 3.13": the newest published list
KAGGLE_COMMIT = "78aaa43"  # 2026-08-12, Kaggle/docker-python's newest commit
KAGGLE_BASE_COLAB_COMMIT = "0f0755b"  # 2026-05-14: the Colab runtime Kaggle's Dockerfile.tmpl builds FROM
NEWEST_TORCH = "2.15.0"
#: Colab's pins that Kaggle's own pins cannot stand beside: its image re-resolves them (``uv pip install``
#: keeps only tensorflow, keras, torch and jax from the base), so they stay free here too.
#: Found by resolving until it succeeds: ipywidgets 8.1.5 needs widgetsnbextension 4 and jupyterlab_widgets 3,
#: nbconvert 6.4.5 needs nbclient < 0.6 and mistune < 2.
KAGGLE_RESOLVED = {"widgetsnbextension", "jupyterlab_widgets", "nbclient", "mistune"}


def _git_show(repo: Path, commit: str, path: str) -> str:
    return subprocess.run(
        ["git", "--git-dir", str(repo), "show", f"{commit}:{path}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout


def _commit_line(repo: Path, commit: str) -> str:
    return subprocess.run(
        ["git", "--git-dir", str(repo), "log", "-1", "--date=short", "--format=%h of %ad (%s)", commit],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


#: CUDA's own wheels belong to the platform's build of torch (Colab's ``+cu128``); PyPI's build of the same
#: release pins the ones it was built with, so the platform's pins would make it uninstallable.
CUDA_WHEELS = re.compile(r"(nvidia|cuda)[-_](?!ml-py$)", re.I)  # nvidia-ml-py is NVML's Python API: kept


def pins(freeze: str) -> dict[str, str]:
    """``name -> version`` for each ``name==version`` line: local labels cut; URL and CUDA lines left out."""
    out = {}
    for line in freeze.splitlines():
        m = re.fullmatch(r"([A-Za-z0-9_.\-]+)==([^\s+;#]+)(\+\S+)?\s*", line.strip())
        if m and not CUDA_WHEELS.match(m.group(1).lower()):
            out[m.group(1)] = m.group(2)
    return out


def python_version(os_info: str) -> str:
    """``3.13`` from the line ``Python 3.13.15`` of an ``os-info`` file."""
    m = re.search(r"^Python (\d+)\.(\d+)\.(\d+)", os_info, re.M)
    if not m:
        raise SystemExit("no 'Python X.Y.Z' line in os-info-gpu.txt: has the file's format changed?")
    return f"{m.group(1)}.{m.group(2)}"


def write(name: str, header: list[str], versions: dict[str, str]) -> Path:
    path = OUT / f"{name}.txt"
    body = [f"{k}=={v}" for k, v in sorted(versions.items(), key=lambda kv: kv[0].lower())]
    path.write_text("\n".join([f"# {h}" for h in header] + body) + "\n")
    return path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--colab-repo", type=Path, required=True, help="a clone (or bare git dir) of googlecolab/backend-info"
    )
    p.add_argument(
        "--kaggle-repo", type=Path, required=True, help="a clone (or bare git dir) of Kaggle/docker-python"
    )
    a = p.parse_args()
    made = (
        "made by tools/make_stacks.py: URL-installed lines and CUDA wheels (nvidia-*, cuda-*: PyPI's torch "
        "brings its own) dropped, local version labels (+cu128) cut"
    )

    colab = pins(_git_show(a.colab_repo, COLAB_COMMIT, "pip-freeze.gpu.txt"))
    os_info = _git_show(a.colab_repo, COLAB_COMMIT, "os-info-gpu.txt")
    full = re.search(r"^Python (\S+)", os_info, re.M).group(1)
    write(
        "colab",
        [
            "stack: colab",
            f"python: {python_version(os_info)}",
            f"torch: {colab['torch']}",
            f"source: googlecolab/backend-info pip-freeze.gpu.txt and os-info-gpu.txt, commit "
            f"{_commit_line(a.colab_repo, COLAB_COMMIT)}; Colab's Python is {full}",
            made,
        ],
        colab,
    )

    base = pins(_git_show(a.colab_repo, KAGGLE_BASE_COLAB_COMMIT, "pip-freeze.gpu.txt"))
    base_os = _git_show(a.colab_repo, KAGGLE_BASE_COLAB_COMMIT, "os-info-gpu.txt")
    docker = _git_show(a.kaggle_repo, KAGGLE_COMMIT, "Dockerfile.tmpl")
    base_tag = re.search(r"runtime:(\S+)", docker).group(1)
    kaggle_req = _git_show(a.kaggle_repo, KAGGLE_COMMIT, "kaggle_requirements.txt")
    kaggle = {k: v for k, v in {**base, **pins(kaggle_req)}.items() if k.lower() not in KAGGLE_RESOLVED}
    write(
        "kaggle",
        [
            "stack: kaggle",
            f"python: {python_version(base_os)}",
            f"torch: {kaggle['torch']}",
            f"source: Kaggle/docker-python commit {_commit_line(a.kaggle_repo, KAGGLE_COMMIT)}: "
            f"its GPU image is FROM Colab's runtime {base_tag}, then kaggle_requirements.txt",
            f"source: that runtime's list, googlecolab/backend-info pip-freeze.gpu.txt, commit "
            f"{_commit_line(a.colab_repo, KAGGLE_BASE_COLAB_COMMIT)}; "
            "overridden by kaggle_requirements.txt's == pins",
            made + "; Kaggle's unpinned packages (ray, optuna, jupyterlab, ...) stay free, and so do "
            + ", ".join(sorted(KAGGLE_RESOLVED))
            + " (Kaggle's ipywidgets 8.1.5 and nbconvert 6.4.5 need other releases)",
        ],
        kaggle,
    )

    write(
        "newest",
        [
            "stack: newest",
            "python: 3.11",
            f"torch: {NEWEST_TORCH}",
            "source: the newest release of every package on the day the environment is built; "
            "torch pinned to the newest release",
        ],
        {"torch": NEWEST_TORCH},
    )


if __name__ == "__main__":
    main()
