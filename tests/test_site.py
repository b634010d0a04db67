"""The course website, read as a reader would: ``python tools/build_site.py`` builds it from the committed
notebooks, a local HTTP server serves the folder, and headless Chromium (Debian's, driven by Playwright)
opens every page.

Checked: every page loads without a console error or a failed request, asks nothing from outside but
MathJax (pages with formulas), and fits a phone's width (390 px) without scrolling sideways; every
internal link resolves (the page, and the section anchor when the link names one); the search box finds
a word that occurs in one notebook only, and lists that notebook alone; every widget's static picture is
visible; on every notebook page the *Open in Colab* / *Open in Kaggle* buttons are the course map's
links to that page's notebook and are visible, the slide deck is there, and the page says which
hardware its outputs came from; the syllabus links the sections it cites.

Marked ``site`` and so left out of the README's test command (a student's check of the course needs no
website tools): ``pip install -e ".[site]" && python -m pytest -m site tests`` runs it; ``.ci/run`` does,
after the README's command. Skips, saying what is missing, without the site tools, Playwright or
Debian's Chromium (``apt-get install -y chromium``; ``.ci/run`` installs it when missing).
"""

from __future__ import annotations

import functools
import http.server
import importlib.util
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import threading
import urllib.parse

import pytest

from mgpu_helpers.course import NOTEBOOKS

ROOT = pathlib.Path(__file__).resolve().parents[1]
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
#: The only resource the site's pages may load from elsewhere: MathJax, for the pages with formulas
#: (Sphinx's default). The test answers it with an empty script (the machine has no network).
ALLOWED_EXTERNAL = ("https://cdn.jsdelivr.net/npm/mathjax@",)
DESKTOP, PHONE = {"width": 1400, "height": 1000}, {"width": 390, "height": 844}


def _missing_site_tools() -> str | None:
    for module in ("sphinx", "myst_nb", "myst_parser", "sphinx_book_theme"):
        if importlib.util.find_spec(module) is None:
            return f'{module} is not installed (pip install -e ".[site]")'
    return None


def _missing() -> str | None:
    if _missing_site_tools():
        return _missing_site_tools()
    if importlib.util.find_spec("playwright") is None:
        return 'playwright is not installed (pip install -e ".[site]")'
    if not os.path.exists(CHROMIUM):
        return "no Chromium at /usr/bin/chromium (apt-get install -y chromium; .ci/run does it)"
    return None


pytestmark = pytest.mark.site
needs_site_tools = pytest.mark.skipif(_missing_site_tools() is not None, reason=str(_missing_site_tools()))
needs_browser = pytest.mark.skipif(_missing() is not None, reason=str(_missing()))


def _build_site_module():
    spec = importlib.util.spec_from_file_location("build_site", ROOT / "tools" / "build_site.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["build_site"] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_each_page_names_its_gpu_run_or_says_there_is_none(tmp_path):
    bs = _build_site_module()
    run = tmp_path / "2xT4-2027-01-02"
    (run / "notebooks").mkdir(parents=True)
    (run / "notebooks" / "02b_pipelining_api.html").write_text("<html></html>")
    (run / "report.md").write_text(
        "# GPU check — 2027-01-02\n\nCommit: `abc1234`\n\n| step | result | time | log |\n|---|---|---|---|\n"
        "| notebook 02b_pipelining_api | pass | 40s | x |\n| notebook 07a_memory_problems | FAIL | 9s | x |\n"
        "| notebook 06b_ray_tune | skipped: needs ray | - | - |\n"
    )
    (run / "reruns.tsv").write_text("# notebook\tresult\n07a_memory_problems\tpass (run 2)\n")
    runs = bs.gpu_runs(tmp_path)
    assert [(r.name, r.commit, r.label) for r in runs] == [("2xT4-2027-01-02", "abc1234", "2×T4, 2027-01-02")]
    by_number = {nb.number: nb for nb in NOTEBOOKS}
    meta = {"mgpu_run": {"hardware": "CPU: Test, 2 cores", "torch": "2.13.0", "date": "2027-01-01"}}
    text, has_gpu = bs.provenance(by_number["02b"], meta, runs)
    assert has_gpu and "CPU: Test, 2 cores" in text and "<b>pass</b>" in text and "one GPU" not in text
    assert "whether the notebook changed since is unknown" in text  # git does not know commit abc1234
    assert 'href="../gpu-runs/2xT4-2027-01-02/notebooks/02b_pipelining_api.html"' in text
    text, has_gpu = bs.provenance(by_number["06b"], meta, runs)
    assert not has_gpu and "skipped it (skipped: needs ray" in text and "No GPU reference run" in text
    text, has_gpu = bs.provenance(by_number["04e"], meta, runs)
    assert not has_gpu and "No GPU reference run includes this notebook yet" in text
    text, has_gpu = bs.provenance(by_number["07a"], meta, runs)
    assert has_gpu and "<b>pass (run 2)</b> (FAIL in the first pass" in text
    with pytest.raises(SystemExit, match="run_notebooks.py"):
        bs.provenance(by_number["04e"], {}, runs)


def test_a_widget_without_its_static_picture_stops_the_build():
    bs = _build_site_module()
    nb = NOTEBOOKS[0]
    widget = {"model_id": "x", "version_major": 2, "version_minor": 0}
    data = {
        "metadata": {"mgpu_run": {"hardware": "CPU", "torch": "2", "date": "2027"}},
        "cells": [
            {"cell_type": "markdown", "metadata": {}, "source": f"# 00\n\n{nb.badges()}\n"},
            {
                "cell_type": "code",
                "metadata": {},
                "source": "w",
                "outputs": [
                    {
                        "output_type": "display_data",
                        "data": {bs.WIDGET_VIEW: widget, "text/plain": "VBox()"},
                        "metadata": {},
                    }
                ],
            },
        ],
    }
    with pytest.raises(SystemExit, match="a widget without a static picture"):
        bs.notebook_page(nb, [], json.loads(json.dumps(data)))
    data["cells"][1]["outputs"][0]["data"]["image/png"] = "iVBORw0KGgo="
    data["cells"][1]["metadata"] = {"mystnb": {"image": {"alt": "Three sliders and a plot."}}}
    page = bs.notebook_page(nb, [], data)
    assert page["cells"][1]["metadata"]["tags"] == [bs.WIDGET_TAG]
    assert nb.badges() not in page["cells"][0]["source"] and nb.colab_url in page["cells"][0]["source"]


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> pathlib.Path:
    """The site, built by the README's command into a temporary folder; its ``html`` folder."""
    if _missing_site_tools():  # e.g. a students' stack (noxfile.py), which installs the test extra only
        pytest.skip(_missing_site_tools())
    out = tmp_path_factory.mktemp("site")
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "build_site.py"), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, f"build_site.py failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return out / "html"


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:  # the test reports failures itself
        pass


@pytest.fixture(scope="module")
def base_url(site):
    """The site served on 127.0.0.1 (a free port chosen by the kernel) for the module's tests."""
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(_QuietHandler, directory=site)
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


@pytest.fixture
def browser():
    """Chromium for one test (its helper processes are the test's children, stopped when it ends)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, headless=True)
        try:
            yield chromium
        finally:
            chromium.close()


class Reader:
    """One browser page that records console errors, uncaught exceptions, failed requests and what it
    asked of other hosts (answered with an empty body: this machine has no network)."""

    def __init__(self, browser, base_url: str):
        self.base = base_url
        self.page = browser.new_page(viewport=DESKTOP)
        self.errors: list[str] = []
        self.external: set[str] = set()
        self.page.on(
            "console", lambda m: self.errors.append(f"console: {m.text}") if m.type == "error" else None
        )
        self.page.on("pageerror", lambda e: self.errors.append(f"uncaught: {e}"))
        self.page.on("requestfailed", lambda r: self.errors.append(f"request failed: {r.url}"))
        self.page.on(
            "response",
            lambda r: self.errors.append(f"HTTP {r.status}: {r.url}") if r.status >= 400 else None,
        )
        self.page.route("**/*", self._route)

    def _route(self, route) -> None:
        url = route.request.url
        if url.startswith(self.base):
            route.continue_()
        else:
            self.external.add(url)
            route.fulfill(status=200, body="", content_type="application/javascript")

    def open(self, path: str) -> None:
        self.errors.clear()
        self.page.goto(self.base + path, wait_until="load")

    def close(self) -> None:
        self.page.close()


@pytest.fixture
def reader(browser, base_url):
    r = Reader(browser, base_url)
    yield r
    r.close()


def _site_pages(site: pathlib.Path) -> list[str]:
    """The pages Sphinx made (not the slide decks or the GPU runs' notebook copies: other tools' HTML)."""
    skip = ("_static/", "_images/", "slides/", "_sources/")
    pages = [p.relative_to(site).as_posix() for p in site.rglob("*.html")]
    return sorted(
        p for p in pages if not p.startswith(skip) and not (p.startswith("gpu-runs/") and "/notebooks/" in p)
    )


def _ids(path: pathlib.Path) -> set[str]:
    return set(re.findall(r'\bid="([^"]+)"', path.read_text(errors="replace")))


@needs_site_tools
def test_a_figure_without_alt_text_stops_the_build_and_its_alt_text_reaches_the_page():
    bs = _build_site_module()
    nb = NOTEBOOKS[0]
    figure = {"output_type": "display_data", "data": {"image/png": "iVBORw0KGgo="}, "metadata": {}}
    data = {
        "metadata": {"mgpu_run": {"hardware": "CPU", "torch": "2", "date": "2027"}},
        "cells": [
            {"cell_type": "markdown", "metadata": {}, "source": f"# 00\n\n{nb.badges()}\n"},
            {"cell_type": "code", "metadata": {}, "source": "plt.plot()", "outputs": [figure]},
        ],
    }
    with pytest.raises(SystemExit, match="cell 1: a figure without alt text"):
        bs.notebook_page(nb, [], json.loads(json.dumps(data)))
    data["cells"][1]["metadata"] = {"mystnb": {"image": {"alt": "A line chart."}}}
    assert bs.figure_alt(bs.notebook_page(nb, [], data)["cells"][1]) == "A line chart."


def test_the_site_has_a_page_and_a_slide_deck_per_notebook(site):
    for nb in NOTEBOOKS:
        stem = nb.file.removesuffix(".ipynb")
        page = (site / "notebooks" / f"{stem}.html").read_text()
        assert f"{nb.number} · " in page and 'class="mgpu-provenance' in page, f"{stem}: its page"
        assert "[interactive widget" not in page, (
            f"{stem}: a widget's text stand-in is shown, not its picture"
        )
        for alt in re.findall(r'<img alt="([^"]*)"', page):  # MyST-NB's default alt is the file name
            assert len(alt) > 30 and not alt.endswith((".png", ".svg", ".jpg")), f"{stem}: <img alt={alt!r}>"
        deck = (site / "slides" / f"{stem}.slides.html").read_text()  # nbconvert --to slides
        assert deck.count("<section") >= 4 and "reveal" in deck.lower(), f"{stem}: its slide deck"
        assert f"{nb.number} · " in deck, f"{stem}: its slide deck lacks the notebook's title"
    printed_map = (site / "notebooks" / "00_setup.html").read_text()  # 00 §4 prints the course map
    others = NOTEBOOKS[1:]  # (its own row links to the page itself)
    linked = {nb.file for nb in others if f'href="{nb.file.replace(".ipynb", ".html")}' in printed_map}
    assert len(linked) == len(others) and "| # |" not in printed_map, "00 prints the course map as a table"
    syllabus = (site / "syllabus.html").read_text()
    assert len(re.findall(r'href="notebooks/\w+\.html#', syllabus)) >= 50, "syllabus: §-links to sections"


@needs_browser
def test_every_page_loads_cleanly_and_every_internal_link_resolves(site, reader):
    pages = _site_pages(site)
    notebook_pages = {f"notebooks/{nb.file.removesuffix('.ipynb')}.html" for nb in NOTEBOOKS}
    assert notebook_pages <= set(pages), f"notebook pages missing: {sorted(notebook_pages - set(pages))}"
    assert {
        "index.html",
        "search.html",
        "syllabus.html",
        "modules.html",
        "labels.html",
        "gpu-runs/index.html",
    } <= set(pages)
    problems, ids = [], {}
    for path in pages:
        reader.open(path)
        problems += [f"{path}: {e}" for e in reader.errors]
        if path in notebook_pages:
            bar = reader.page.locator(".mgpu-bar a")
            if bar.count() != 4 or not all(bar.nth(i).is_visible() for i in range(4)):
                problems.append(f"{path}: the Colab / Kaggle / Slides / GitHub buttons are not all visible")
        hrefs = reader.page.eval_on_selector_all("a[href]", "els => els.map(e => e.href)")
        reader.page.set_viewport_size(PHONE)  # on a phone, wide content scrolls in its own box, not the page
        width = reader.page.evaluate("document.documentElement.scrollWidth")
        if width > PHONE["width"] + 1:
            problems.append(f"{path}: {width} px wide on a {PHONE['width']} px phone screen")
        reader.page.set_viewport_size(DESKTOP)
        for href in hrefs:
            if not href.startswith(reader.base):
                continue
            url = urllib.parse.urlsplit(href)
            target = site / urllib.parse.unquote(
                url.path.removeprefix(urllib.parse.urlsplit(reader.base).path)
            )
            if target.is_dir():
                target = target / "index.html"
            if not target.is_file():
                problems.append(f"{path}: link to a missing file: {href}")
            elif url.fragment and target.suffix == ".html":
                if target not in ids:
                    ids[target] = _ids(target)
                if urllib.parse.unquote(url.fragment) not in ids[target]:
                    problems.append(f"{path}: link to a missing anchor: {href}")
    outside = sorted(u for u in reader.external if not u.startswith(ALLOWED_EXTERNAL))
    assert not problems, "\n".join(problems[:40])
    assert not outside, f"pages load resources from other hosts: {outside}"


def _unique_word(site: pathlib.Path, stem: str) -> str:
    """A word of notebook ``stem``'s prose whose search term (Sphinx's stem of it) belongs to that page
    alone: no other page has it, in its text or its titles, nor any term containing it."""
    import snowballstemmer

    text = (site / "searchindex.js").read_text()
    index = json.loads(text[text.index("(") + 1 : text.rindex(")")])
    doc = index["docnames"].index(f"notebooks/{stem}")
    terms, titles = index["terms"], index["titleterms"]
    stemmer = snowballstemmer.stemmer("english")
    prose = "".join(
        "".join(c["source"])
        for c in json.loads((ROOT / "notebooks" / f"{stem}.ipynb").read_text())["cells"]
        if c["cell_type"] == "markdown"
    )
    for word in sorted(set(re.findall(r"\b[a-z]{7,}\b", prose)), key=lambda w: (-len(w), w)):
        term = stemmer.stemWord(word)
        others = [k for k in (*terms, *titles) if term in k and k != term]
        if terms.get(term) == doc and term not in titles and not others:
            return word
    raise AssertionError(f"no word of {stem} is unique to its page: cannot test search with it")


@needs_browser
def test_search_finds_a_word_of_one_notebook_and_lists_that_notebook_alone(site, reader):
    stem = "05f_expert_parallel"
    word = _unique_word(site, stem)
    reader.open("index.html")
    box = reader.page.locator("form.bd-search input[name=q]").first
    if not box.is_visible():  # narrow layouts hide the sidebar's box behind the search button
        reader.page.keyboard.press("Control+k")
        box = reader.page.locator("input[name=q]:visible").first
    box.fill(word)
    box.press("Enter")
    reader.page.wait_for_url(re.compile(r"search\.html\?q="))
    results = reader.page.locator("#search-results ul.search li a")
    results.first.wait_for(timeout=30_000)
    hrefs = sorted(
        {urllib.parse.urlsplit(h).path for h in results.evaluate_all("els => els.map(e => e.href)")}
    )
    assert hrefs == [f"/notebooks/{stem}.html"], f"searching {word!r} listed {hrefs}"
    assert not reader.errors, reader.errors


@needs_browser
def test_every_widget_shows_its_static_picture(site, reader):
    seen_picture = False
    for nb in NOTEBOOKS:
        data = json.loads((ROOT / "notebooks" / nb.file).read_text())
        widgets = sum(
            any("application/vnd.jupyter.widget-view+json" in o.get("data", {}) for o in c.get("outputs", []))
            for c in data["cells"]
        )
        if not widgets:
            continue
        reader.open(f"notebooks/{nb.file.removesuffix('.ipynb')}.html")
        cells = reader.page.locator(".tag_widget-static")
        assert cells.count() == widgets, f"{nb.file}: {widgets} widget cells, {cells.count()} on the page"
        for i in range(widgets):
            cell = cells.nth(i)
            cell.scroll_into_view_if_needed()
            images = cell.locator(".cell_output img")
            if images.count():
                image = images.first
                assert image.is_visible(), f"{nb.file}: widget picture not visible"
                width, height = image.evaluate("i => [i.naturalWidth, i.naturalHeight]")
                box = image.bounding_box()
                assert width > 100 and height > 100 and box["height"] > 100, (
                    f"{nb.file}: picture {width}×{height}"
                )
                seen_picture = True
            else:  # a table or text saved as the widget's static copy
                static = cell.locator(".cell_output table, .cell_output pre").first
                assert static.is_visible() and len(static.inner_text()) > 40, (
                    f"{nb.file}: no static copy shown"
                )
    assert seen_picture, "no widget picture (PNG) found on any page"


@needs_site_tools
def test_notebook_pages_open_their_own_notebook_on_colab_and_kaggle(site):
    """The buttons are static HTML: read from the built pages (the page walk above checks that they are
    visible in the browser)."""
    for nb in NOTEBOOKS:
        stem = nb.file.removesuffix(".ipynb")
        page = (site / "notebooks" / f"{stem}.html").read_text()
        colab = re.findall(r'<a class="mgpu-btn mgpu-colab" href="([^"]+)"', page)
        kaggle = re.findall(r'<a class="mgpu-btn mgpu-kaggle" href="([^"]+)"', page)
        assert colab == [nb.colab_url] and nb.colab_url.endswith(f"/notebooks/{nb.file}"), (stem, colab)
        assert kaggle == [nb.kaggle_url] and nb.kaggle_url.endswith(f"/notebooks/{nb.file}"), (stem, kaggle)
        assert (ROOT / "notebooks" / nb.file).is_file()
        provenance = re.search(r'<div class="mgpu-provenance[^"]*">(.*?)</div>', page, re.S).group(1)
        hardware = json.loads((ROOT / "notebooks" / nb.file).read_text())["metadata"]["mgpu_run"]["hardware"]
        assert hardware in provenance, f"{stem}: the page does not say where its outputs came from"
        assert "GPU" in provenance, f"{stem}: the page says nothing about GPU runs"


@needs_site_tools
def test_the_syllabus_links_the_sections_it_cites_and_stops_at_one_that_does_not_exist():
    bs = _build_site_module()
    page = bs.syllabus("| ring all-reduce | 04a §3 (by hand), §4 (DDP) | Kaplan et al. (2020) §2.1 |\n")
    anchors = bs.section_anchors()
    assert f"[04a §3]({anchors[('04a', '3')]})" in page and f"[§4]({anchors[('04a', '4')]})" in page
    assert "(2020) §2.1 |" in page  # a cell that names no notebook: a paper's section, left alone
    with pytest.raises(SystemExit, match="04a §7"):
        bs.syllabus("| ring all-reduce | 04a §3, §7 |\n")
