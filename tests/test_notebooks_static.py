"""Static checks of the committed notebooks: template, stored run, slide metadata, size, provenance."""

import json
import os
import pathlib
import re

import pytest

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


GOING_DEEPER = "## Going deeper"


def required_path(cells: list[dict]) -> list[dict]:
    """The cells a student must study: everything before the optional "## Going deeper" section."""
    for i, c in enumerate(cells):
        if c["cell_type"] == "markdown" and _src(c).startswith(GOING_DEEPER):
            return cells[:i]
    return cells


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_going_deeper_is_optional_and_last(path):
    cells = _load(path)["cells"]
    required = required_path(cells)
    extra = cells[len(required) :]
    if not extra:
        return
    headings = [_src(c).splitlines()[0] for c in required if c["cell_type"] == "markdown" and _src(c)]
    assert any(h.startswith("## Further reading") for h in headings), (
        "'## Going deeper' comes last, after '## Further reading'"
    )
    for c in extra:
        src = _src(c)
        assert not src.startswith(("## Exercises", "## Summary", "## Further reading")), (
            "a required section sits inside 'Going deeper'"
        )
        assert not re.search(r"\bgrade\(", src), "graded exercises belong to the required path"
    assert "optional" in _src(extra[0])[:300].lower(), (
        "say in the first lines of 'Going deeper' that it is optional"
    )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_the_required_path_is_about_an_hour_with_the_lesson_in_cells(path):
    cells = _load(path)["cells"]
    required = required_path(cells)  # "Going deeper" is optional and not counted
    prose = [_src(c) for c in required if c["cell_type"] == "markdown"]  # code shown in prose is read too
    code = [_src(c) for c in required if c["cell_type"] == "code"]
    words = sum(len(m.split()) for m in prose)
    lines = sum(len(s.splitlines()) for s in code)  # blank lines included
    assert words <= 2000, f"{words} words of prose in the required path: trim, or move extras to Going deeper"
    assert lines <= 300, f"{lines} lines of code in the required path: trim, or move extras to Going deeper"
    code = [_src(c) for c in cells if c["cell_type"] == "code"]
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
def test_slide_metadata(path):
    """Sections are slides, subsections sub-slides; the decks themselves are exported by the website
    build (tools/build_site.py) and checked in tests/test_site.py."""
    cells = _load(path)["cells"]
    assert all("slide_type" in c["metadata"].get("slideshow", {}) for c in cells), (
        "slide metadata on every cell"
    )
    assert sum(c["metadata"]["slideshow"]["slide_type"] == "slide" for c in cells) >= 4


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


def test_the_course_maps_extras_are_pyprojects():
    from mgpu_helpers.course import EXTRAS
    from mgpu_helpers.course import NOTEBOOKS as COURSE

    for name, (packages, _modules) in EXTRAS.items():
        assert sorted(packages) == sorted(_extra_packages(name)), (
            f"course.EXTRAS[{name!r}] and pyproject differ"
        )
    assert {nb.extra for nb in COURSE} - {""} <= set(EXTRAS)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_badges_and_install_cell_are_the_ones_the_course_map_generates(path):
    from mgpu_helpers.course import NOTEBOOKS as COURSE

    entry = next(nb for nb in COURSE if nb.file == path.name)
    cells = _load(path)["cells"]
    assert entry.badges() in _src(cells[0]).splitlines(), (
        "the title cell lacks its Colab and Kaggle badges: run `python tools/update_readme.py`"
    )
    first = next(c for c in cells if c["cell_type"] == "code")
    assert _src(first) == entry.install_cell(), (
        "run `python tools/update_readme.py` (it rewrites install cells)"
    )


#: Runs one install cell once per case ``[hidden, platform, environ]``, each in a fork of one interpreter
#: that has imported IPython (a fresh interpreter per case cost ~1 s of CI each): the child hides the
#: packages, plays the platform, runs the cell with a recording ``%pip`` and prints the calls it recorded.
_RUN_INSTALL_CELL = """
import importlib.util, json, os, string, sys, traceback, types
from IPython.core.inputtransformer2 import TransformerManager

source, cases = json.loads(sys.argv[1])
code = TransformerManager().transform_cell(source)

def run(hidden, platform, environ):
    os.environ.update(environ)
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
    if platform == "colab":  # Colab's kernel has imported google.colab before the first cell runs
        sys.modules["google"] = types.ModuleType("google")
        sys.modules["google.colab"] = types.ModuleType("google.colab")
    if platform == "kaggle":
        os.environ["KAGGLE_KERNEL_RUN_TYPE"] = "Interactive"
    calls, namespace = [], {}

    class Shell:
        def run_line_magic(self, name, line):  # IPython expands {names} in a magic's line, as here
            calls.append(f"%{name} " + string.Formatter().vformat(line, [], namespace))

    namespace["get_ipython"] = Shell
    exec(code, namespace)
    return calls

results = []
for hidden, platform, environ in cases:
    read, write = os.pipe()
    if os.fork() == 0:  # the child: one case, in a copy of this interpreter
        os.close(read)
        try:
            reply = {"calls": run(hidden, platform, environ)}
        except BaseException:
            reply = {"error": traceback.format_exc()}
        os.write(write, json.dumps(reply).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as fh:
        results.append(json.loads(fh.read() or '{"error": "the child died without a reply"}'))
    os.wait()
print(json.dumps(results))
"""


def _install_calls(source: str, cases: list[tuple]) -> list[list[str]]:
    """The %pip lines an install cell runs in each case ``(hidden, platform, environ)``: with the
    ``hidden`` packages missing, on ``platform`` ("colab", "kaggle" or "" for anywhere else)."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("MGPU_COURSE_REPO", "KAGGLE_KERNEL_RUN_TYPE")}
    proc = subprocess.run(
        [sys.executable, "-c", _RUN_INSTALL_CELL, json.dumps([source, cases])],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert proc.returncode == 0, f"the install cell's runner failed:\n{proc.stderr[-2000:]}"
    results = json.loads(proc.stdout.splitlines()[-1])
    for case, result in zip(cases, results, strict=True):
        assert "error" not in result, f"the install cell raised in case {case}:\n{result['error'][-2000:]}"
    return [result["calls"] for result in results]


@pytest.mark.parametrize("extra", ["", "search", "tune", "interactive", "capstone"])
def test_install_cell_installs_on_colab_and_kaggle_only_and_its_extra_anywhere(extra):
    from mgpu_helpers.course import EXTRAS, REPO_URL, install_cell

    packages, modules = EXTRAS[extra] if extra else ((), ())
    tag = f"[{extra}]" if extra else ""
    fork = "https://github.com/someone/mgpu-course@fix-typo"
    cases = [
        (["google"], "", {}),  # a base install: no `google` namespace package at all (protobuf brings it)
        (["mgpu_helpers", *modules], "colab", {}),
        (["mgpu_helpers", *modules], "kaggle", {}),
        (["mgpu_helpers"], "kaggle", {"MGPU_COURSE_REPO": fork}),
        *((["google", module], "", {}) for module in modules),  # anywhere, one of the extra's modules missing
    ]
    anywhere, colab, kaggle, forked, *missing_one = _install_calls(install_cell(extra), cases)
    assert anywhere == []
    for calls in (colab, kaggle):
        assert calls[0] == f'%pip install -q "mgpu-course{tag} @ git+{REPO_URL}"'
    assert forked[0] == f'%pip install -q "mgpu-course{tag} @ git+{fork}"'
    pip = " ".join(f'"{p}"' if "[" in p else p for p in packages)
    for module, calls in zip(modules, missing_one, strict=True):  # the cell installs the extra's packages
        assert calls == [f"%pip install -q {pip}"], module


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_the_notebook_records_where_its_outputs_came_from(path):
    """tools/run_notebooks.py writes it; the course website prints it on the notebook's page."""
    run = _load(path)["metadata"].get("mgpu_run")
    assert run, "no metadata.mgpu_run: re-run the notebook with python tools/run_notebooks.py"
    assert set(run) >= {"hardware", "torch", "python", "date"} and all(run.values()), run
    assert re.fullmatch(r"\d{4}-\d\d-\d\d", run["date"]), run["date"]


#: ``name = !command``: IPython 7.34 (Colab's and Kaggle's) on Python >= 3.12 rejects it with "invalid
#: syntax" (its assignment transformer predates 3.12's tokenizer). ``mgpu_helpers.shell.shell`` replaces it.
_ASSIGN_FROM_SHELL = re.compile(r"^\s*[\w.\[\], ]+=\s*!", re.M)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_no_syntax_that_ipython_7_34_rejects(path):
    """Every code cell passes this IPython's own cell transformer and compiles, and none assigns from
    ``!``. Under the Colab stack (``nox -s colab``: IPython 7.34 on Python 3.13) the first part is the real
    parser the students have; the pattern keeps CI's newer IPython from letting the old failure back in."""
    from IPython.core.inputtransformer2 import TransformerManager

    manager = TransformerManager()
    for i, cell in enumerate(_load(path)["cells"]):
        if cell["cell_type"] != "code":
            continue
        src = _src(cell)
        assert src.startswith("%%") or not _ASSIGN_FROM_SHELL.search(src), (  # a %% cell's body is not Python
            f"cell {i}: `x = !command` is a SyntaxError under IPython 7.34 on Python >= 3.12 (Colab, "
            "Kaggle): use `x = shell(f'command')` from mgpu_helpers.shell"
        )
        try:
            compile(manager.transform_cell(src), f"{path.name} cell {i}", "exec")
        except SyntaxError as exc:
            import IPython

            pytest.fail(f"cell {i} is not valid under IPython {IPython.__version__}: {exc}")


def test_the_ipython_7_34_rule_catches_what_ipython_7_34_rejects():
    for bad in ("output = !ls", "a = 1\nlines = !echo {x}", "self.out = !date"):
        assert _ASSIGN_FROM_SHELL.search(bad), bad
    for fine in ("!ls", "x = %time 1 + 1", "if a != b:\n    pass", "ok = f(a) != b", "x = shell('ls')"):
        assert not _ASSIGN_FROM_SHELL.search(fine), fine
