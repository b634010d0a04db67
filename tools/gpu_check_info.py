"""What tools/gpu_check.sh asks before it runs anything (standard library and torch only: it may be asked
before the test tools are installed), and what needs which optional package.

    python tools/gpu_check_info.py slug             # 1xH100, 2xT4, 1xA100+1xT4, or cpu (the visible GPUs)
    python tools/gpu_check_info.py describe         # the slug, then a line: Python, torch, CUDA, GPUs
    python tools/gpu_check_info.py missing          # the optional modules absent here, e.g. "ray sklearn"
    python tools/gpu_check_info.py skips FILE...    # "FILE<TAB>needs ray" for each that cannot run here
    python tools/gpu_check_info.py order FILE...    # the files, longest first (conftest.py's _LONG_FILES)
    python tools/gpu_check_info.py alone FILE...    # those of the notebooks that must run alone (RUN_ALONE)

``skips`` reads the absent modules from GPU_CHECK_MISSING (what ``missing`` printed).
"""

from __future__ import annotations

import ast
import collections
import importlib.util
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: Optional modules (import name -> what brings it) and what needs them: notebooks by number, benchmarks
#: by name, tests by node id prefix (a file, or one test). Everything else runs with the base install and
#: the test tools. A test that fails *because* one of them cannot be imported is reported as skipped by
#: the plugin anyway; these are the ones that fail otherwise, or waste time first.
OPTIONAL = {
    "ray": "ray[tune]",
    "optuna": "optuna",
    "pandas": "pandas",
    "sklearn": "scikit-learn",
    "ipyparallel": "ipyparallel",
}
NOTEBOOK_NEEDS = {
    "01b": ("ipyparallel",),
    "06a": ("optuna",),
    "06b": ("ray", "optuna", "pandas"),
    "08": ("ray", "optuna", "pandas", "sklearn"),
}
BENCHMARK_NEEDS = {"tuning": ("ray",)}
_INSTALL_CELL = (
    "tests/test_notebooks_static.py::test_install_cell_installs_on_colab_and_kaggle_only_and_its_extra"
)
TEST_NEEDS = {
    "tests/test_tuning_ray.py": ("ray", "pandas"),
    # asserts that the first cell installs nothing where the extra's modules are all there
    f"{_INSTALL_CELL}_anywhere[search]": ("optuna",),
    f"{_INSTALL_CELL}_anywhere[tune]": ("ray", "optuna"),
    f"{_INSTALL_CELL}_anywhere[capstone]": ("ray", "optuna", "sklearn"),
    f"{_INSTALL_CELL}_anywhere[interactive]": ("ipyparallel",),
}
#: Notebooks that time themselves against an idle machine (speed-ups): they run after the parallel
#: steps, with nothing beside them.
RUN_ALONE = {"04b": "times DDP's speed-up over one process"}
#: Test files that need PyPI, skipped offline (tools/gpu_check.sh --offline or --wheels), with the reason.
#: None since the wheel's install beside Colab's packages moved to noxfile.py (nox -s colab).
NEEDS_NETWORK: dict[str, str] = {}


def missing_modules() -> list[str]:
    """GPU_CHECK_MISSING as a list."""
    return os.environ.get("GPU_CHECK_MISSING", "").replace(",", " ").split()


def needs(path: str) -> tuple[str, ...]:
    """The optional modules that a notebook, benchmark or test file needs (known by its name)."""
    name = Path(path).name
    if name.endswith(".ipynb"):
        match = re.match(r"(\d+[a-z]?)_", name)
        return NOTEBOOK_NEEDS.get(match[1], ()) if match else ()
    if name.startswith("test_"):
        return next((v for k, v in TEST_NEEDS.items() if Path(k).name == name), ())  # whole files
    return BENCHMARK_NEEDS.get(Path(name).stem, ())


def runs_alone(path: str) -> bool:
    """Whether a notebook is one of RUN_ALONE."""
    match = re.match(r"(\d+[a-z]?)_", Path(path).name)
    return bool(match) and match[1] in RUN_ALONE


def short_gpu_name(name: str) -> str:
    """``NVIDIA H100 80GB HBM3`` -> ``H100``, ``Tesla T4`` -> ``T4``, ``GeForce RTX 4090`` -> ``RTX4090``."""
    vendor = ("nvidia", "tesla", "geforce", "quadro")
    words = [w for w in re.split(r"[\s_-]+", name) if w and w.lower() not in vendor]
    if words and words[0].upper() in ("RTX", "GTX", "TITAN") and len(words) > 1:
        words = [words[0] + words[1]]
    return (re.sub(r"[^A-Za-z0-9.]", "", words[0]) if words else "") or "GPU"


def gpu_slug(names: list[str]) -> str:
    """``["NVIDIA H100 80GB HBM3"] * 2`` -> ``2xH100``; mixed GPUs: ``1xA100+1xT4``; none: ``cpu``."""
    counts = collections.Counter(short_gpu_name(n) for n in names)
    return "+".join(f"{n}x{name}" for name, n in counts.items()) or "cpu"


def visible_gpu_names() -> list[str]:
    """The names of the GPUs this process sees (CUDA_VISIBLE_DEVICES applies); none without torch."""
    try:
        import torch

        if not torch.cuda.is_available():
            return []
        return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    except Exception:
        return []


def describe() -> str:
    """One line: this Python, torch and its CUDA build, and how many GPUs torch sees."""
    python = f"Python {sys.version.split()[0]}"
    try:
        import torch
    except Exception as exc:
        return f"{python} | torch cannot be imported: {exc!r}"
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return f"{python} | torch {torch.__version__} | CUDA build {torch.version.cuda} | GPUs {gpus}"


def long_first(paths: list[str], conftest: Path = ROOT / "conftest.py") -> list[str]:
    """``paths`` with the files of conftest.py's ``_LONG_FILES`` first, in its order (a stable sort)."""
    try:
        tree = ast.parse(conftest.read_text())
        value = next(
            node.value
            for node in tree.body
            if isinstance(node, ast.Assign)
            and any(getattr(t, "id", "") == "_LONG_FILES" for t in node.targets)
        )
        long_files = [Path(p).name for p in ast.literal_eval(value)]
    except (OSError, SyntaxError, StopIteration, ValueError):
        long_files = []
    rank = {name: i for i, name in enumerate(long_files)}
    return sorted(paths, key=lambda p: rank.get(Path(p).name, len(rank)))


def main(argv: list[str]) -> int:
    command, args = (argv[0], argv[1:]) if argv else ("", [])
    if command in ("slug", "describe"):
        print(gpu_slug(visible_gpu_names()))
        if command == "describe":
            print(describe())
    elif command == "missing":
        absent = []
        for module in OPTIONAL:
            try:
                if importlib.util.find_spec(module) is None:
                    absent.append(module)
            except (ImportError, ValueError):
                absent.append(module)
        print(" ".join(absent))
    elif command == "skips":
        missing = set(missing_modules())
        for path in args:
            absent = [m for m in needs(path) if m in missing]
            if absent:
                print(f"{path}\tneeds {', '.join(absent)}")
    elif command == "order":
        print("\n".join(long_first(args)))
    elif command == "alone":
        print("\n".join(p for p in args if runs_alone(p)))
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
