"""Build the course website from the committed notebooks: one command, no network, no re-execution.

    python tools/build_site.py                  # → build/site/html/index.html (open it, or serve the folder)
    python tools/build_site.py --out DIR        # → DIR/html

What it makes (Sphinx with MyST-NB and sphinx-book-theme; ``website/conf.py`` holds the settings):

* the **course map** as the landing page, then one page per notebook in teaching order, with its stored
  outputs (the notebooks are never executed here) and, for every widget, the static picture saved with it;
* on every notebook page: *Open in Colab* / *Open in Kaggle* (the course map's links), the notebook's
  **slide deck** (nbconvert's reveal.js slides, built here too), and where its outputs came from — the
  hardware of the committed run, and the GPU reference run under ``docs/gpu-runs/`` that includes it, or
  a sentence saying that none does;
* pages for SYLLABUS.md, the helper-package module table, "how numbers are labelled" and each GPU run's
  summary (its per-notebook HTML copied beside it);
* full-text search (Sphinx's own index, searched in the browser: no server needed).

The page sources are generated into ``OUT/src`` (git-ignores ``build/``), the site into ``OUT/html``.
``tests/test_site.py`` builds it and reads it in headless Chromium.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import html
import json
import pathlib
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tools")]

from run_notebooks import RUN_KEY  # noqa: E402  (metadata: where a notebook's outputs were produced)

from mgpu_helpers.course import NOTEBOOKS, REPO_URL, Notebook, module_table_markdown  # noqa: E402

WEBSITE = ROOT / "website"
DEFAULT_OUT = ROOT / "build" / "site"
GPU_RUNS = ROOT / "docs" / "gpu-runs"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
#: A widget's static copy: what the site shows in its place.
STATIC_COPIES = ("image/png", "image/svg+xml", "text/html")
#: Cell tag the build gives every cell that displays a widget (MyST-NB turns it into the CSS class
#: ``tag_widget-static``; the browser test finds the static pictures by it).
WIDGET_TAG = "widget-static"
#: Outputs that are pictures: each needs alt text (:func:`figure_alt`) for readers who cannot see it.
FIGURES = ("image/png", "image/svg+xml", "image/jpeg")
#: The cell metadata key MyST-NB reads its per-cell options from (``image`` -> ``alt`` among them).
ALT_KEY = "mystnb"
#: A badge of the course map (an image from Colab's or Kaggle's site): the site draws its own buttons.
BADGE = re.compile(r"\[!\[Open In (Colab|Kaggle)\]\([^)]*\)\]\(([^)]+)\)")
#: The table of contents: one caption per chapter (a notebook's number without its letter).
CHAPTERS = {
    "00": "Start here",
    "01": "1 · Nodes, ranks and collectives",
    "02": "2 · Model, pipeline and tensor parallelism",
    "03": "3 · nn.DataParallel",
    "04": "4 · DistributedDataParallel",
    "05": "5 · Precision, memory and sharding",
    "06": "6 · Hyperparameter tuning",
    "07": "7 · Troubleshooting",
    "08": "8 · Capstone",
}


@dataclass
class GpuRun:
    """One folder of ``docs/gpu-runs/``: its summary and each notebook's result there."""

    name: str
    commit: str
    title: str
    results: dict[str, str] = field(default_factory=dict)  # notebook stem -> "pass" / "FAIL" / "skipped: …"
    pages: set[str] = field(default_factory=set)  # stems with an HTML copy of their run
    #: Notebook files changed after the run's commit; None where git cannot tell (a shallow clone).
    changed_since: set[str] | None = None
    #: The anchor of the report's "## After the fixes …" section (what failed, was fixed and re-run), or "".
    after_fixes: str = ""
    #: Results of notebooks re-run after fixes on the same machine (``reruns.tsv`` beside the report,
    #: written by whoever re-ran them: ``stem<TAB>result``).
    reruns: dict[str, str] = field(default_factory=dict)

    @property
    def gpus(self) -> int:
        """The number of GPUs in the run's name (``2xT4-…`` → 2; 0 when the name does not say)."""
        count = re.match(r"(\d+)x", self.name)
        return int(count.group(1)) if count else 0

    @property
    def label(self) -> str:
        """``1xH100-2026-11-26`` → ``1×H100, 2026-11-26``."""
        gpus, _, date = self.name.partition("-")
        return f"{gpus.replace('x', '×', 1)}, {date}" if date else self.name


def gpu_runs(folder: pathlib.Path = GPU_RUNS) -> list[GpuRun]:
    """The GPU reference runs that ``tools/gpu_check.sh`` wrote, newest first."""
    runs = []
    for report in sorted(folder.glob("*/report.md"), reverse=True):
        text = report.read_text()
        commit = re.search(r"^Commit: `([0-9a-f]+)`", text, re.M)
        title = text.splitlines()[0].lstrip("# ").strip()
        run = GpuRun(report.parent.name, commit.group(1) if commit else "", title)
        for stem, result in re.findall(r"^\| notebook (\S+) \| ([^|]+?) \|", text, re.M):
            run.results[stem] = result
        run.pages = {p.stem for p in (report.parent / "notebooks").glob("*.html")}
        run.changed_since = _changed_since(run.commit)
        fixes = re.search(r"^## (After the fixes.*)$", text, re.M)
        run.after_fixes = _slug(fixes.group(1)) if fixes else ""
        reruns = report.parent / "reruns.tsv"
        if reruns.is_file():
            rows = [line.split("\t") for line in reruns.read_text().splitlines() if line and line[0] != "#"]
            run.reruns = {stem: result for stem, result in rows}
        runs.append(run)
    return runs


def _git(*args: str) -> str | None:
    """A git command's output in the repository, or None where git or the history is missing."""
    try:
        return subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=30, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None


def _head_commit() -> str:
    """The short hash of the commit the site is built from ("" outside a git checkout)."""
    return (_git("rev-parse", "--short", "HEAD") or "").strip()


def _changed_since(commit: str) -> set[str] | None:
    """Notebook files that differ between ``commit`` and the working tree (None where git can't say)."""
    out = _git("diff", "--name-only", commit, "--", "notebooks") if commit else None
    return None if out is None else {pathlib.PurePosixPath(line).name for line in out.split()}


def provenance(nb: Notebook, meta: dict, runs: list[GpuRun]) -> tuple[str, bool]:
    """The sentence under a notebook page's buttons: which hardware its outputs came from, and its GPU
    reference run (or that there is none). Returns ``(html, has_gpu_run)``."""
    stem = nb.file.removesuffix(".ipynb")
    run_meta = meta.get(RUN_KEY)
    if not run_meta:
        raise SystemExit(
            f"{nb.file} has no metadata.{RUN_KEY} (where its outputs come from): re-run it with "
            f"python tools/run_notebooks.py notebooks/{nb.file}"
        )
    parts = [
        "Outputs on this page are stored from a top-to-bottom run on "
        f"<b>{html.escape(run_meta['hardware'])}</b> "
        f"(torch {html.escape(run_meta['torch'])}, {html.escape(run_meta['date'])}); the site shows them "
        "as saved and never re-runs the notebook."
    ]
    ran = [r for r in runs if stem in r.results]
    for run in ran:
        result = run.results[stem]
        link = (
            f'<a href="../gpu-runs/{run.name}/notebooks/{stem}.html">its GPU reference run, {run.label}</a>'
            if stem in run.pages
            else f"its GPU reference run, {run.label}"
        )
        if run.changed_since is None:
            version = "whether the notebook changed since is unknown here (no git history)"
        elif nb.file in run.changed_since:
            version = "the notebook has changed since that run"
        else:
            version = "the same notebook as here"
        report = f"../gpu-runs/{run.name}/report.html"
        summary = f'<a href="{report}">run summary</a>'
        if result.startswith("skipped"):
            parts.append(f"The GPU check of {run.label} skipped it ({html.escape(result)}; {summary}).")
            continue
        fixes = f'<a href="{report}#{run.after_fixes}">after the fixes</a>' if run.after_fixes else ""
        if result != "pass" and stem in run.reruns:
            result_text = (
                f"<b>{html.escape(run.reruns[stem])}</b> ({html.escape(result)} in the first pass; what was "
                f"fixed: {fixes or 'run summary'})"
            )
        elif result != "pass" and fixes:
            result_text = f"<b>{html.escape(result)}</b> in its first pass (fixed and re-run: {fixes})"
        else:
            result_text = f"<b>{html.escape(result)}</b>"
        scope = " — one GPU, so the multi-GPU (NCCL) paths were not run" if run.gpus == 1 else ""
        parts.append(
            f"On a GPU: {link}{scope}: {result_text} at commit <code>{run.commit}</code>, {version} "
            f"({summary})."
        )
    if not [r for r in ran if not r.results[stem].startswith("skipped")]:
        parts.append(
            "No GPU reference run includes this notebook yet: its hardware note says what it does on "
            'GPUs, but no run has shown it (<a href="../gpu-runs/index.html">GPU runs</a>).'
        )
    return " ".join(parts), any(not r.results[stem].startswith("skipped") for r in ran)


def header(nb: Notebook, meta: dict, runs: list[GpuRun]) -> str:
    """The HTML block that replaces a notebook's badge line on its page."""
    stem = nb.file.removesuffix(".ipynb")
    text, has_gpu = provenance(nb, meta, runs)
    return (
        '<div class="mgpu-bar">'
        f'<a class="mgpu-btn mgpu-colab" href="{nb.colab_url}">Open in Colab</a>'
        f'<a class="mgpu-btn mgpu-kaggle" href="{nb.kaggle_url}">Open in Kaggle</a>'
        f'<a class="mgpu-btn mgpu-slides" href="../slides/{stem}.slides.html">Slides</a>'
        f'<a class="mgpu-btn mgpu-source" href="{REPO_URL}/blob/main/notebooks/{nb.file}">'
        "Notebook on GitHub</a>"
        "</div>\n"
        f'<div class="mgpu-provenance{" mgpu-gpu" if has_gpu else ""}">{text}</div>'
    )


def figure_alt(cell: dict) -> str:
    """The alt text of the figures a cell draws: its metadata ``mystnb.image.alt``, which MyST-NB puts on
    the page's ``<img>`` ("" where there is none)."""
    return str(cell.get("metadata", {}).get(ALT_KEY, {}).get("image", {}).get("alt", "")).strip()


def notebook_page(nb: Notebook, runs: list[GpuRun], data: dict | None = None) -> dict:
    """The notebook (``data``, else its committed file) as the site shows it: its badge line replaced by
    the header, badges in printed Markdown drawn as buttons, each widget replaced by its static copy (the
    cell tagged :data:`WIDGET_TAG`)."""
    if data is None:
        data = json.loads((ROOT / "notebooks" / nb.file).read_text())
    first = data["cells"][0]
    source = "".join(first["source"])
    if nb.badges() not in source:
        raise SystemExit(
            f"{nb.file}: its first cell lacks the course map's badges; run python tools/update_readme.py"
        )
    first["source"] = source.replace(nb.badges(), header(nb, data["metadata"], runs))
    for i, cell in enumerate(data["cells"]):
        outputs = cell.get("outputs", [])
        if any(kind in out.get("data", {}) for out in outputs for kind in FIGURES) and not figure_alt(cell):
            raise SystemExit(
                f"{nb.file}, cell {i}: a figure without alt text. Add one or two sentences saying what it "
                f'shows as the cell\'s metadata {{"{ALT_KEY}": {{"image": {{"alt": "..."}}}}}} '
                "(JupyterLab: the property inspector's cell metadata); the site's <img> reads it"
            )
        for out in outputs:  # Markdown printed by a cell (00's course map): the site's buttons, not badges
            if "text/markdown" in out.get("data", {}):
                md = "".join(out["data"]["text/markdown"])
                out["data"]["text/markdown"] = BADGE.sub(r'<a class="mgpu-btn mgpu-\1" href="\2">\1</a>', md)
        if not any(WIDGET_VIEW in out.get("data", {}) for out in outputs):
            continue
        if not any(kind in out.get("data", {}) for out in outputs for kind in STATIC_COPIES):
            raise SystemExit(
                f"{nb.file}, cell {i}: a widget without a static picture (PNG or HTML) in the same cell; "
                "display one beside the widget so that saved notebooks and the site show something"
            )
        for out in outputs:  # the live widget and its "[interactive widget: …]" text go; the picture stays
            if out.get("data", {}).pop(WIDGET_VIEW, None) is not None:
                out["data"].pop("text/plain", None)
        cell["outputs"] = [out for out in outputs if out.get("data", True)]
        tags = cell["metadata"].setdefault("tags", [])
        if WIDGET_TAG not in tags:
            tags.append(WIDGET_TAG)
    return data


def readme_section(heading: str) -> str:
    """A section of README.md (the heading line to the next heading of the same or a higher level)."""
    lines = (ROOT / "README.md").read_text().splitlines()
    level = len(heading) - len(heading.lstrip("#"))
    start = lines.index(heading)
    end = next(
        (
            i
            for i in range(start + 1, len(lines))
            if lines[i].startswith("#") and len(lines[i]) - len(lines[i].lstrip("#")) <= level
        ),
        len(lines),
    )
    return "\n".join(["# " + heading.lstrip("# "), *lines[start + 1 : end]]).strip() + "\n"


def course_map(runs: list[GpuRun]) -> str:
    """The landing page: what the course is, how to read this site, the course map, the tables of
    contents (one per chapter)."""
    readme = (ROOT / "README.md").read_text().split("\n\n")
    intro = "\n\n".join(readme[1:3])
    rows = ["| # | Notebook | Open | What it teaches | On a CPU · 1 GPU · N GPUs |", "|---|---|---|---|---|"]
    for nb in NOTEBOOKS:
        stem = nb.file.removesuffix(".ipynb")
        buttons = (
            f'<a class="mgpu-btn mgpu-colab" href="{nb.colab_url}">Colab</a> '
            f'<a class="mgpu-btn mgpu-kaggle" href="{nb.kaggle_url}">Kaggle</a> '
            f'<a class="mgpu-btn mgpu-slides" href="slides/{stem}.slides.html">Slides</a>'
        )
        hardware = f"**CPU:** {nb.cpu}<br>**1 GPU:** {nb.one_gpu}<br>**N GPUs:** {nb.multi_gpu}"
        cells = [nb.number, f"[{nb.title}](notebooks/{stem})", buttons, nb.teaches, hardware]
        rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    toctrees = []
    for chapter, caption in CHAPTERS.items():
        members = [
            f"notebooks/{nb.file.removesuffix('.ipynb')}" for nb in NOTEBOOKS if nb.number[:2] == chapter
        ]
        toctrees.append(
            "```{toctree}\n:hidden:\n:caption: " + caption + "\n\n" + "\n".join(members) + "\n```"
        )
    toctrees.append(
        "```{toctree}\n:hidden:\n:caption: Reference\n\nsyllabus\nmodules\nlabels\ngpu-runs/index\n```"
    )
    newest = f" The newest: [{runs[0].label}](gpu-runs/{runs[0].name}/report)." if runs else ""
    first = NOTEBOOKS[0]
    commit = _head_commit()
    built = f" This site was built from commit `{commit}`." if commit else ""
    return (
        "\n\n".join(
            [
                "# Multi-GPU training in PyTorch — a runnable course",
                intro,
                f"**New here? Start with [{first.number} · {first.title}](notebooks/"
                f"{first.file.removesuffix('.ipynb')}) →**",
                "**How to read this site.** Each page is a notebook of the course with the outputs of a real "
                "run, in teaching order (the table of contents is on the left, with search above it; "
                "Ctrl+K searches from anywhere). To run one, press *Open in Colab* or *Open in Kaggle* on "
                "its page, or clone the repository and "
                f"open it in JupyterLab ([README]({REPO_URL}#quickstart)). Instructors: every page links its "
                "slide deck. Where outputs came from: each page says; GPU reference runs are listed under "
                f"[GPU runs](gpu-runs/index).{newest}{built}",
                "## Course map",
                ":::{table}\n:class: mgpu-map\n\n" + "\n".join(rows) + "\n:::",
                "A number with a letter (02a, 02b) is one topic in parts of about an hour each, exercises "
                "included; take them in order. [The syllabus](syllabus) maps every point of the source "
                "lecture notes to the section that teaches it.",
                *toctrees,
            ]
        )
        + "\n"
    )


def gpu_runs_index(runs: list[GpuRun]) -> str:
    """The GPU runs page: one row per run, one column per notebook result."""
    lines = [
        "# GPU reference runs",
        "",
        "The notebooks' stored outputs come from a run on a CPU (each page names the hardware). "
        "`bash tools/gpu_check.sh` runs every notebook, the unit tests and the benchmarks on a GPU machine "
        "and writes a folder under `docs/gpu-runs/`; each is shown here with its summary and each "
        "notebook's run as HTML. A run tests the commit it names: notebooks changed since are marked.",
        "",
    ]
    if not runs:
        lines.append("No GPU run has been recorded yet.")
    for run in runs:
        lines += [f"## [{run.label}]({run.name}/report)", "", f"{run.title}; commit `{run.commit}`.", ""]
        lines += ["| notebook | result | changed since |", "|---|---|---|"]
        for nb in NOTEBOOKS:
            stem = nb.file.removesuffix(".ipynb")
            result = run.results.get(stem, "not in this run (newer)")
            if stem in run.reruns:
                result = f"{result} → {run.reruns[stem]}"
            if stem not in run.results or run.changed_since is None:
                changed = "—"
            else:
                changed = "yes" if nb.file in run.changed_since else "no"
            lines.append(f"| [{nb.number} {nb.title}](../notebooks/{stem}) | {result} | {changed} |")
        lines.append("")
    lines += ["```{toctree}", ":hidden:", "", *[f"{run.name}/report" for run in runs], "```", ""]
    return "\n".join(lines)


def run_report(run: GpuRun) -> str:
    """A run's report.md, its links to the notebooks' HTML and its log files as plain links to the files
    copied beside it."""
    folder = GPU_RUNS / run.name
    text = (folder / "report.md").read_text()
    text = re.sub(r"\[html\]\((notebooks/[^)]+\.html)\)", r'<a href="\1">html</a>', text)

    def log_link(m: re.Match) -> str:
        path = m.group(1)
        return f'<a href="{path}"><code>{path}</code></a>' if (folder / path).is_file() else m.group(0)

    text = re.sub(r"`(logs/[^`\s]+)`", log_link, text)
    logs = sorted(p.relative_to(folder).as_posix() for p in (folder / "logs").rglob("*") if p.is_file())
    if logs:
        text += "\n## Every log of this run\n\n" + "\n".join(f'* <a href="{p}">{p}</a>' for p in logs) + "\n"
    return text


#: How SYLLABUS.md cites a section: ``04a §3`` (notebook 04a, section 3), or ``§3`` after such a citation.
CITATION = re.compile(r"(?:(?<![\w`])(\d\d[a-z]?) )?§(\d+)\b")


def _slug(heading: str) -> str:
    """The anchor MyST gives a heading (GitHub's rule), from its Markdown source."""
    try:
        from myst_parser.slugs import github_slugify
    except ImportError:  # myst-parser < 5.2
        from myst_parser.mdit_to_docutils.base import default_slugify as github_slugify
    return github_slugify(re.sub(r"[`*]", "", heading))


def section_anchors() -> dict[tuple[str, str], str]:
    """``(notebook number, section number) -> "notebooks/<stem>.ipynb#<anchor>"`` for every numbered
    section (``## 3. Title``) of every notebook."""
    anchors = {}
    for nb in NOTEBOOKS:
        cells = json.loads((ROOT / "notebooks" / nb.file).read_text())["cells"]
        for cell in cells:
            if cell["cell_type"] != "markdown":
                continue
            for k, title in re.findall(r"^## (\d+)\. (.+)$", "".join(cell["source"]), re.M):
                anchors.setdefault((nb.number, k), f"notebooks/{nb.file}#{_slug(f'{k}. {title}')}")
    return anchors


def syllabus(text: str | None = None) -> str:
    """SYLLABUS.md (or ``text``) with every section it cites linked to that section of the notebook's page:
    ``04a §3``, and a bare ``§4`` after it in the same table cell (the same notebook). A citation of a
    section that does not exist stops the build."""
    anchors, missing = section_anchors(), []

    def cell(text: str) -> str:
        current = None

        def link(m: re.Match) -> str:
            nonlocal current
            number, k = m.group(1) or current, m.group(2)
            if m.group(1):
                current = m.group(1)
            if number is None:
                return m.group(0)
            target = anchors.get((number, k))
            if target is None:
                missing.append(f"{number} §{k}")
                return m.group(0)
            return f"[{m.group(0)}]({target})"

        return CITATION.sub(link, text)

    lines = [
        "|".join(cell(part) for part in line.split("|"))
        for line in (text if text is not None else (ROOT / "SYLLABUS.md").read_text()).splitlines()
    ]
    if missing:
        raise SystemExit(f"SYLLABUS.md cites sections that do not exist: {', '.join(sorted(set(missing)))}")
    # The repository's syllabus names the issues that added rows; the site's readers have no use for them.
    return re.sub(r" \(issue \d+\)|issue \d+, |, issue \d+(?=\))", "", "\n".join(lines) + "\n")


def link_modules(text: str) -> str:
    """The module table with each module linked to its source and each notebook number to its page."""
    pages = {nb.number: f"notebooks/{nb.file.removesuffix('.ipynb')}" for nb in NOTEBOOKS}

    def row(m: re.Match) -> str:
        name, what, users = m.group(1), m.group(2), m.group(3)
        path = f"mgpu_helpers/{name}" + ("" if (ROOT / "mgpu_helpers" / name).is_dir() else ".py")
        kind = "tree" if path.endswith(name) else "blob"
        users = re.sub(r"\b(\d\d[a-z]?)\b", lambda u: f"[{u.group(1)}]({pages[u.group(1)]})", users)
        return f"| [`mgpu_helpers.{name}`]({REPO_URL}/{kind}/main/{path}) | {what} | {users} |"

    text = re.sub(r"^\| `mgpu_helpers\.(\w+)` \| (.*) \| ([^|]*) \|$", row, text, flags=re.M)
    # the table as a MyST table with a class, so that the module names do not break on a phone
    return re.sub(
        r"((?:^\|.*\n)+)", r":::{table}\n:class: mgpu-modules\n\n\1:::\n", text, count=1, flags=re.M
    )


def write_sources(src: pathlib.Path, runs: list[GpuRun]) -> None:
    """Every page source of the site, generated into ``src``."""
    if src.exists():
        shutil.rmtree(src)
    (src / "notebooks").mkdir(parents=True)
    for nb in NOTEBOOKS:
        (src / "notebooks" / nb.file).write_text(json.dumps(notebook_page(nb, runs), ensure_ascii=False))
    (src / "index.md").write_text(course_map(runs))
    (src / "syllabus.md").write_text(syllabus())
    (src / "labels.md").write_text(readme_section("## How numbers are labelled"))
    modules = readme_section("### The helper package, module by module")
    assert module_table_markdown() in modules, "README's module table is stale: python tools/update_readme.py"
    (src / "modules.md").write_text(link_modules(modules))
    (src / "gpu-runs").mkdir()
    (src / "gpu-runs" / "index.md").write_text(gpu_runs_index(runs))
    for run in runs:
        (src / "gpu-runs" / run.name).mkdir()
        (src / "gpu-runs" / run.name / "report.md").write_text(run_report(run))


def write_slides(dest: str) -> int:
    """Every notebook's reveal.js deck, as ``jupyter nbconvert --to slides`` writes it (runs in a child
    process beside Sphinx)."""
    from nbconvert import SlidesExporter

    exporter = SlidesExporter(reveal_scroll=True)  # a long section scrolls instead of overflowing
    pathlib.Path(dest).mkdir(parents=True, exist_ok=True)
    for nb in NOTEBOOKS:
        body, _ = exporter.from_filename(str(ROOT / "notebooks" / nb.file))
        (pathlib.Path(dest) / nb.file.replace(".ipynb", ".slides.html")).write_text(body)
    return len(NOTEBOOKS)


def build(out: pathlib.Path = DEFAULT_OUT, quiet: bool = True) -> pathlib.Path:
    """Build the site into ``out/html``; return the path of its ``index.html``."""
    from sphinx.cmd.build import build_main

    runs = gpu_runs()
    src, site = out / "src", out / "html"
    write_sources(src, runs)
    if site.exists():
        shutil.rmtree(site)
    with concurrent.futures.ProcessPoolExecutor(max_workers=1) as pool:
        slides = pool.submit(write_slides, str(out / "slides"))
        args = ["-b", "html", "-c", str(WEBSITE), "-W", "--keep-going", "-j", "auto"]
        code = build_main([*args, *(["-q"] if quiet else []), str(src), str(site)])
        if code:
            raise SystemExit(f"sphinx-build failed (exit {code}); its warnings are printed above")
        slides.result()
    shutil.copytree(out / "slides", site / "slides")
    for run in runs:
        for kind in ("notebooks", "logs"):  # each notebook's run as HTML, and the logs the summary names
            if (GPU_RUNS / run.name / kind).is_dir():
                shutil.copytree(GPU_RUNS / run.name / kind, site / "gpu-runs" / run.name / kind)
    (site / ".nojekyll").write_text("")  # GitHub Pages: serve _static/ as it is
    return site / "index.html"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=pathlib.Path, default=DEFAULT_OUT, help="folder (default build/site)")
    parser.add_argument("--verbose", action="store_true", help="Sphinx's progress, not only its warnings")
    args = parser.parse_args()
    start = time.monotonic()
    index = build(args.out.resolve(), quiet=not args.verbose)
    print(f"site built in {time.monotonic() - start:.1f} s: {index}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
