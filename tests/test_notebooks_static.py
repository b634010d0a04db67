"""Static checks of the committed notebooks: template, stored run, slide metadata, size, slides export."""

import json
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


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


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_template_sections(path):
    cells = _load(path)["cells"]
    markdown = [_src(c) for c in cells if c["cell_type"] == "markdown"]
    assert markdown[0].startswith(f"# {path.name[:2]} · "), "first cell: '# NN · Title'"
    headings = "\n".join(m.splitlines()[0] for m in markdown if m.startswith("#"))
    for part in ("Learning objectives", "Hardware note", "Summary", "Exercises", "Solutions"):
        assert part in headings, f"missing section {part!r}"
    note = next(m for m in markdown if m.startswith("### Hardware note"))
    for config in ("CPU only", "1 GPU", "N GPUs"):
        assert config in note, f"hardware note does not say what happens on {config}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_exercises_have_automatic_checks_and_solutions(path):
    cells = _load(path)["cells"]
    start = next(i for i, c in enumerate(cells) if _src(c).startswith("## Exercises"))
    end = next(i for i, c in enumerate(cells) if _src(c).startswith("## Solutions"))
    exercise_code = [_src(c) for c in cells[start:end] if c["cell_type"] == "code"]
    checks = [s for s in exercise_code if re.search(r"\bcheck(_function)?\(", s)]
    assert len(checks) >= 2, "at least two exercises with automatic checks"
    solutions = [c for c in cells[end:] if c["cell_type"] == "code"]
    assert solutions and all(c["metadata"].get("jupyter", {}).get("source_hidden") for c in solutions)
    assert all("assert check" in _src(c) for c in solutions), "solutions prove that the checks accept them"


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


def test_tuning_notebook_installs_exactly_the_tune_extra():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["tune"]
    first = next(
        c
        for c in _load(ROOT / "notebooks" / "06_hyperparameter_tuning.ipynb")["cells"]
        if c["cell_type"] == "code"
    )
    pip_lines = [
        line.split("install -q", 1)[1].split()
        for line in _src(first).splitlines()
        if "%pip install" in line and "git+" not in line
    ]
    assert len(pip_lines) == 1
    assert sorted(p.strip('"') for p in pip_lines[0]) == sorted(extra), "keep the cell and the extra in step"
