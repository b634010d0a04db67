"""Used by notebook 00 (through :mod:`mgpu_helpers.course`) and ``tools/update_readme.py``. Where the course
lives, the package's extras, a notebook's first (install) cell, and :class:`Notebook`, one row of the course
map.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Where the course lives: badges and the notebooks' install cells point here. Whoever publishes the course
#: elsewhere changes these two lines and runs ``python tools/update_readme.py`` (README tables, badges and
#: every notebook's install cell follow).
REPO_URL = "https://github.com/mgpu-course/mgpu-course"
REPO_SLUG = "mgpu-course/mgpu-course"
#: Set in a notebook's environment, this overrides REPO_URL for its install cell (a fork; ``…@branch``).
REPO_ENV = "MGPU_COURSE_REPO"

#: Each extra of pyproject.toml (expanded; a test keeps them equal): the packages it installs and the
#: modules whose absence makes a notebook's first cell install them.
EXTRAS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "search": (("optuna",), ("optuna",)),
    "tune": (("ray[tune]", "optuna", "pandas"), ("ray", "optuna")),
    "interactive": (("ipyparallel",), ("ipyparallel",)),
    "capstone": (("ray[tune]", "optuna", "pandas", "scikit-learn"), ("ray", "optuna", "sklearn")),
}


def install_cell(extra: str = "") -> str:
    """The first code cell of a notebook that needs ``extra`` ("" for the base package only).

    On Colab and Kaggle it installs the course's package (with the extra) from :data:`REPO_URL`, or from
    the repository named by the environment variable :data:`REPO_ENV`; anywhere, it installs the extra's
    packages where one of its modules is missing; elsewhere it does nothing.
    """
    if extra:
        lines = [
            f"# Colab and Kaggle: install the course's package with its `{extra}` extra ({REPO_ENV} may "
            "name a",
            "# fork, add @branch); anywhere: install that extra's packages where missing (the base install "
            "leaves them out).",
        ]
    else:
        lines = [
            f"# Colab and Kaggle: install the course's package ({REPO_ENV} may name a fork, add @branch)."
        ]
    lines += ["import importlib", "import importlib.util"] if extra else ["import importlib.util"]
    lines += [
        "import os",
        "import sys",
        "",
        f'REPO = os.environ.get("{REPO_ENV}", "{REPO_URL}")',
        'HOSTED = "google.colab" in sys.modules or "KAGGLE_KERNEL_RUN_TYPE" in os.environ',
        'if HOSTED and importlib.util.find_spec("mgpu_helpers") is None:',
        f'    %pip install -q "mgpu-course{f"[{extra}]" if extra else ""} @ git+{{REPO}}"',
    ]
    if extra:
        packages, modules = EXTRAS[extra]
        names = ", ".join(f'"{m}"' for m in modules) + ("," if len(modules) == 1 else "")
        pip = " ".join(f'"{p}"' if "[" in p else p for p in packages)
        lines += [
            f"if any(importlib.util.find_spec(m) is None for m in ({names})):",
            f"    %pip install -q {pip}",
            "    importlib.invalidate_caches()",
        ]
    return "\n".join(lines)


@dataclass(frozen=True)
class Notebook:
    """One notebook of the course and its behaviour per hardware configuration."""

    number: str
    file: str
    title: str
    teaches: str
    cpu: str
    one_gpu: str
    multi_gpu: str
    #: The ``mgpu_helpers`` modules the notebook imports (checked against its code by a test).
    helpers: tuple[str, ...] = ()
    ready: bool = True
    #: The package extra this notebook needs beyond the base install ("" for none); its first cell
    #: installs that extra's packages where they are missing (checked by a test).
    extra: str = ""

    @property
    def colab_url(self) -> str:
        """Link that opens this notebook on Google Colab."""
        return f"https://colab.research.google.com/github/{REPO_SLUG}/blob/main/notebooks/{self.file}"

    @property
    def kaggle_url(self) -> str:
        """Link that opens this notebook on Kaggle (choose the "GPU T4 x2" accelerator there)."""
        return f"https://kaggle.com/kernels/welcome?src=https://github.com/{REPO_SLUG}/blob/main/notebooks/{self.file}"

    def badges(self) -> str:
        """The notebook's "Open in Colab" and "Open in Kaggle" badges (Markdown, one line)."""
        return (
            f"[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]({self.colab_url}) "
            f"[![Open In Kaggle](https://kaggle.com/static/images/open-in-kaggle.svg)]({self.kaggle_url})"
        )

    def install_cell(self) -> str:
        """This notebook's first code cell (see :func:`install_cell`)."""
        return install_cell(self.extra)

    def mode(self, gpu_count: int) -> str:
        """What this notebook does on a machine with ``gpu_count`` GPUs."""
        if gpu_count <= 0:
            return self.cpu
        return self.one_gpu if gpu_count == 1 else self.multi_gpu
