"""Static checks of the committed notebooks: template, stored run, slide metadata, size, slides export."""

import json
import pathlib
import re

import pytest

from mgpu_helpers.course import REPO_SLUG

ROOT = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]*_*.ipynb"))


def _load(path: pathlib.Path) -> dict:
    return json.loads(path.read_text())


def _src(cell: dict) -> str:
    return "".join(cell["source"])


def test_notebooks_exist_in_teaching_order():
    from mgpu_helpers.course import NOTEBOOKS as COURSE

    ready = [nb.file for nb in COURSE if nb.ready]
    assert [p.name for p in NOTEBOOKS] == ready, (
        "notebooks/ and the course map (mgpu_helpers.course) disagree"
    )


def _number(path: pathlib.Path) -> str:
    return path.name.split("_")[0]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_template_sections(path):
    cells = _load(path)["cells"]
    markdown = [_src(c) for c in cells if c["cell_type"] == "markdown"]
    assert markdown[0].startswith(f"# {_number(path)} · "), "first cell: '# NN · Title'"
    headings = "\n".join(m.splitlines()[0] for m in markdown if m.startswith("#"))
    for part in ("Learning objectives", "Hardware note", "Summary", "Exercises", "Further reading"):
        assert part in headings, f"missing section {part!r}"
    assert "Solutions" not in headings, "reference solutions live in solutions/, not in the notebook"
    note = next(m for m in markdown if m.startswith("### Hardware note"))
    for config in ("CPU only", "1 GPU", "N GPUs"):
        assert config in note, f"hardware note does not say what happens on {config}"
    reading = next(m for m in markdown if m.startswith("## Further reading"))
    assert len(re.findall(r"\]\(https?://", reading)) >= 3, "further reading: at least three links"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_a_unit_of_30_to_45_minutes_with_the_lesson_in_cells(path):
    cells = _load(path)["cells"]
    prose = [_src(c) for c in cells if c["cell_type"] == "markdown"]  # code shown in prose is read too
    code = [_src(c) for c in cells if c["cell_type"] == "code"]
    words = sum(len(m.split()) for m in prose)
    lines = sum(len(s.splitlines()) for s in code)  # blank lines included
    assert words <= 2000, f"{words} words of prose: split or trim to <= 2000"
    assert lines <= 300, f"{lines} lines of code: split or trim to <= 300"
    for s in code:
        assert "getsource" not in s, "write the lesson in the cell instead of printing a helper's source"
        assert not re.search(r"\bcheck(_function)?\(", s), "answer checks show the answer: use grade(...)"
    assert not any(c["metadata"].get("jupyter", {}).get("source_hidden") for c in cells), "no hidden code"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_saved_outputs_are_clean(path):
    for c in _load(path)["cells"]:
        if c["cell_type"] != "code":
            continue
        kinds = {k for out in c["outputs"] for k in out.get("data", {})}
        if "application/vnd.jupyter.widget-view+json" in kinds:
            assert kinds & {"image/png", "text/html", "image/svg+xml"}, (
                f"a widget needs a static picture or table in the saved output: {_src(c)[:60]!r}"
            )
            texts = [
                "".join(o["data"].get("text/plain", ""))
                for o in c["outputs"]
                if "application/vnd.jupyter.widget-view+json" in o.get("data", {})
            ]
            assert all(t.startswith("[interactive widget") for t in texts), (
                f"widget repr saved for static viewers; re-run tools/run_notebooks.py: {texts[0][:50]!r}"
            )
        for out in c["outputs"]:
            text = "".join(out.get("text", [])) + "".join(out.get("data", {}).get("text/plain", []))
            assert not re.search(r"(^|\s)0%\|", text), f"progress bar saved at 0 %: {_src(c)[:60]!r}"
            if out.get("name") == "stderr":
                assert len(text) <= 400, f"summarise warnings instead of dumping them: {text[:200]!r}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_stored_outputs_come_from_a_clean_run(path):
    nb = _load(path)
    assert "widgets" not in nb["metadata"], "widget state stored: re-run with tools/run_notebooks.py"
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    counts = [c["execution_count"] for c in code]
    assert counts == list(range(1, len(code) + 1)), "not executed top to bottom in one run"
    for c in code:
        for out in c["outputs"]:
            assert out["output_type"] != "error", f"stored error in cell: {_src(c)[:60]!r}"
            assert "Traceback" not in "".join(out.get("text", []))
    assert path.stat().st_size < 1_000_000, "keep stored outputs small"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_nbval_markers_are_tags_and_colab_cell(path):
    cells = [c for c in _load(path)["cells"] if c["cell_type"] == "code"]
    code = [_src(c) for c in cells]
    assert "google.colab" in code[0] and "%pip install" in code[0], "first code cell installs on Colab"
    tags = [c["metadata"].get("tags", []) for c in cells]
    assert any("nbval-check-output" in t for t in tags), "deterministic cells are checked"
    for s, t in zip(code, tags, strict=True):
        assert "NBVAL" not in s, f"nbval markers belong in cell tags, not in code students read: {s[:60]!r}"
        if "measured(" in s or "describe_node()" in s or "time.perf_counter" in s:
            assert "nbval-check-output" not in t, f"hardware/time-dependent cell is checked: {s[:60]!r}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_slides_export(path):
    cells = _load(path)["cells"]
    assert all("slide_type" in c["metadata"].get("slideshow", {}) for c in cells), (
        "slide metadata on every cell"
    )
    assert sum(c["metadata"]["slideshow"]["slide_type"] == "slide" for c in cells) >= 4
    from nbconvert import SlidesExporter  # what `jupyter nbconvert --to slides` runs, in-process

    html, _ = SlidesExporter().from_filename(str(path))
    assert html.count("<section") >= 4 and "reveal" in html.lower()


def _extra_packages(extra: str) -> list[str]:
    """The packages of a pyproject extra, with ``mgpu-course[other]`` references expanded."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    out: list[str] = []
    for item in extras[extra]:
        if item.startswith("mgpu-course["):
            for inner in item[len("mgpu-course[") : -1].split(","):
                out += _extra_packages(inner)
        else:
            out.append(item)
    return out


#: The module each extra package is imported as (what the install cell looks for; pandas comes with
#: Ray Tune, so the cell need not look for it).
_MODULE_OF = {
    "ray[tune]": "ray",
    "optuna": "optuna",
    "pandas": "pandas",
    "scikit-learn": "sklearn",
    "ipyparallel": "ipyparallel",
}


def _course_entry(path: pathlib.Path):
    from mgpu_helpers.course import NOTEBOOKS as COURSE

    return next(nb for nb in COURSE if nb.file == path.name)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_a_notebook_with_an_extra_installs_exactly_that_extra(path):
    extra = _course_entry(path).extra
    first = next(c for c in _load(path)["cells"] if c["cell_type"] == "code")
    pip_lines = [
        line.split("install -q", 1)[1].split()
        for line in _src(first).splitlines()
        if "%pip install" in line and "git+" not in line
    ]
    if not extra:
        assert pip_lines == [], "only notebooks with an extra (course.py) install packages off Colab"
        return
    assert len(pip_lines) == 1
    assert sorted(p.strip('"') for p in pip_lines[0]) == sorted(_extra_packages(extra)), (
        "cell and extra differ"
    )


_RUN_INSTALL_CELL = """
import importlib.util, json, sys, types
from IPython.core.inputtransformer2 import TransformerManager

hidden, colab, source = json.loads(sys.argv[1])
real_find_spec = importlib.util.find_spec

def find_spec(name, package=None):  # as if the hidden packages were not installed
    if name.split(".")[0] in hidden:
        if "." in name:  # what find_spec does when the parent package is missing
            raise ModuleNotFoundError(f"No module named {name.split('.')[0]!r}")
        return None
    return real_find_spec(name, package)

importlib.util.find_spec = find_spec
for name in [n for n in sys.modules if n.split(".")[0] in hidden]:
    del sys.modules[name]
if colab:  # Colab's kernel has imported google.colab before the first cell runs
    sys.modules["google"] = types.ModuleType("google")
    sys.modules["google.colab"] = types.ModuleType("google.colab")
calls = []

class Shell:
    def run_line_magic(self, name, line):
        calls.append(f"%{name} {line}")

exec(TransformerManager().transform_cell(source), {"get_ipython": Shell})
print(json.dumps(calls))
"""


def _install_calls(path: pathlib.Path, hidden: list[str], colab: bool) -> list[str]:
    """The %pip lines the notebook's first code cell runs with ``hidden`` packages missing."""
    import subprocess
    import sys

    first = next(c for c in _load(path)["cells"] if c["cell_type"] == "code")
    proc = subprocess.run(
        [sys.executable, "-c", _RUN_INSTALL_CELL, json.dumps([hidden, colab, _src(first)])],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, f"{path.name}'s install cell raised:\n{proc.stderr[-2000:]}"
    return json.loads(proc.stdout.splitlines()[-1])


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_install_cell_does_nothing_off_colab_and_installs_on_colab(path):
    extra = _course_entry(path).extra
    modules = [_MODULE_OF[p] for p in _extra_packages(extra) if p != "pandas"] if extra else []
    # A base install: no `google` namespace package at all (it arrives only with e.g. protobuf).
    assert _install_calls(path, ["google"], colab=False) == []
    on_colab = _install_calls(path, ["mgpu_helpers", *modules], colab=True)
    tag = f"[{extra}]" if extra else ""
    assert on_colab[0] == f'%pip install -q "mgpu-course{tag} @ git+https://github.com/{REPO_SLUG}"'
    for module in modules:  # anywhere without one of the extra's packages, the cell installs the extra's
        packages = " ".join(f'"{p}"' if "[" in p else p for p in _extra_packages(extra))
        assert _install_calls(path, ["google", module], colab=False) == [f"%pip install -q {packages}"]
