"""tools/gpu_check.sh's pytest plugin (``-p gpu_check_plugin``, with tools/ on PYTHONPATH).

* ``GPU_CHECK_MISSING="ray sklearn"`` (optional modules absent here): the test files that
  gpu_check_info.TEST_NEEDS lists for one of them are skipped whole, and a test that fails because one
  of them cannot be imported is reported as skipped, naming it (what ``pytest.importorskip`` does);
* ``GPU_CHECK_OFFLINE=1``: the tests of gpu_check_info.NEEDS_NETWORK are skipped;
* ``GPU_CHECK_HTML=DIR``: each notebook run under nbval is also written as ``DIR/<name>.html`` with the
  outputs of *this* run — tracebacks included, and nbval's message under each failing cell — so one
  execution gives both the pass/fail (nbval, which compares the cells tagged ``nbval-check-output``)
  and the reference copy. Widget state is left out (a widget keeps a one-line text fallback).

A SIGTERM (tools/gpu_check.sh's step time-out) interrupts the run as Ctrl-C would, so that the HTML of
the cells run so far is still written.
"""

from __future__ import annotations

import copy
import os
import re
import signal
import sys
from pathlib import Path

import pytest
from gpu_check_info import NEEDS_NETWORK, TEST_NEEDS, missing_modules

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


# --- the pytest plugin ------------------------------------------------------------------------------


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def pytest_configure(config):
    if not hasattr(config, "workerinput"):  # the main process, not an xdist worker
        signal.signal(signal.SIGTERM, _interrupt)


def pytest_collection_modifyitems(config, items):
    missing, offline = set(missing_modules()), os.environ.get("GPU_CHECK_OFFLINE") == "1"
    for item in items:
        needed = {m for prefix, ms in TEST_NEEDS.items() if item.nodeid.startswith(prefix) for m in ms}
        absent = sorted(needed & missing)
        path = item.nodeid.split("::")[0]
        if absent:
            item.add_marker(pytest.mark.skip(reason=f"needs {', '.join(absent)}, not installed here"))
        elif offline and path in NEEDS_NETWORK:
            item.add_marker(pytest.mark.skip(reason=f"offline: {NEEDS_NETWORK[path]}"))


_NOTEBOOKS: dict[str, dict] = {}  # nbval file node id -> {"file": node, "cells": {cell_num: record}}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    report = (yield).get_result()
    if report.failed and missing_modules():
        text = report.longreprtext
        for module in missing_modules():
            m = re.escape(module)
            pattern = rf"No module named '{m}[.']|import of {m}(\.\S+)? halted|needs '{m}[.']"
            if re.search(pattern, text):
                report.outcome = "skipped"
                report.longrepr = (
                    str(item.path),
                    item.location[1] or 0,
                    f"Skipped: needs {module}, not installed here (gpu check)",
                )
                break
    if os.environ.get("GPU_CHECK_HTML") and hasattr(item, "cell_num") and hasattr(item.parent, "nb"):
        run = _NOTEBOOKS.setdefault(item.parent.nodeid, {"file": item.parent, "cells": {}})
        record = run["cells"].setdefault(item.cell_num, {"outputs": None, "failure": None})
        if call.when == "call" and hasattr(item, "test_outputs"):
            record["outputs"] = item.test_outputs
        if report.failed:
            record["failure"] = f"{call.when}: {ANSI.sub('', report.longreprtext)}"


def pytest_sessionfinish(session):
    folder = os.environ.get("GPU_CHECK_HTML")
    for run in _NOTEBOOKS.values() if folder else ():
        path = Path(folder) / f"{Path(str(run['file'].path)).stem}.html"
        try:
            write_html(run["file"].nb, run["cells"], path)
        except Exception as exc:  # the HTML is a by-product: never the reason a notebook fails
            print(f"\ngpu check: could not write {path}: {exc!r}", file=sys.stderr)


def _clean(output, count):
    output = copy.deepcopy(output)
    if output.get("output_type") in ("display_data", "execute_result"):
        data = output.get("data", {})
        if WIDGET_VIEW in data:
            data.pop(WIDGET_VIEW)
            if "text/plain" in data and "children=" in data["text/plain"]:
                data["text/plain"] = "[interactive widget: its state is not kept in this copy]"
        if not data:
            return None
        output.setdefault("metadata", {})
        if output["output_type"] == "execute_result":
            output["execution_count"] = count
    return output


def write_html(notebook, cells: dict, path: Path) -> None:
    """``notebook`` with the outputs nbval recorded (``cells``: code cell number -> record) as HTML."""
    import nbformat
    from nbconvert import HTMLExporter
    from nbval.plugin import coalesce_streams

    nb = copy.deepcopy(notebook)
    nb.metadata.pop("widgets", None)
    failed, run, count = [], 0, 0
    code_cells = [c for c in nb.cells if c.cell_type == "code"]
    for number, cell in enumerate(code_cells):
        record = cells.get(number)
        cell.outputs, cell.execution_count = [], None
        if record is None or record["outputs"] is None and record["failure"] is None:
            continue  # not run (skipped by nbval, or after the run stopped)
        run += 1
        count += 1
        cell.execution_count = count
        outputs = coalesce_streams(list(record["outputs"] or []))
        cell.outputs = [o for o in (_clean(o, count) for o in outputs) if o is not None]
        if record["failure"]:
            failed.append(number)
            message = record["failure"]
            if any(o.get("output_type") == "error" for o in cell.outputs):  # its traceback is just above
                message = "\n".join(message.splitlines()[:2])
            if len(message) > 4000:
                message = message[:4000] + "\n[... cut: the whole message is in the step's log]"
            cell.outputs.append(
                nbformat.v4.new_output("stream", name="stderr", text=f"nbval FAILED at {message}\n")
            )
    label = os.environ.get("GPU_CHECK_LABEL", "")
    verdict = (
        f"**FAILED** — code cell{'s' if len(failed) > 1 else ''} {', '.join(map(str, failed))} (0-based)"
        if failed
        else "passed"
    )
    summary = (
        f"*GPU check{f' ({label})' if label else ''}: this copy holds the outputs of one run under nbval — "
        f"{verdict}; {run} of {len(code_cells)} code cells ran.*"
    )
    nb.cells.insert(0, nbformat.v4.new_markdown_cell(summary))
    body, _ = HTMLExporter(template_name="lab").from_notebook_node(nb)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(share_stylesheet(body, path.parent), encoding="utf-8")


STYLESHEET = "lab.css"


def share_stylesheet(html: str, folder: Path) -> str:
    """``html`` with the style blocks of its ``<head>`` (JupyterLab's theme, ~260 KB, the same in every
    notebook) moved into ``folder/lab.css`` and linked: a run's 20 notebooks take ~4 MB instead of ~9 MB
    in a commit. Also what ``python tools/gpu_check_plugin.py FILE.html ...`` does to files written before."""
    head_end = html.find("</head>")
    blocks = list(re.finditer(r"<style[^>]*>(.*?)</style>\s*", html[:head_end], re.S)) if head_end > 0 else []
    if not blocks:
        return html
    css = "\n".join(m.group(1) for m in blocks)
    sheet = folder / STYLESHEET
    if not sheet.exists() or sheet.read_text(encoding="utf-8") != css:
        sheet.write_text(css, encoding="utf-8")
    link = f'<link rel="stylesheet" href="{STYLESHEET}">\n'
    return (
        html[: blocks[0].start()]
        + link
        + "".join(html[a.end() : b.start()] for a, b in zip(blocks, blocks[1:], strict=False))
        + html[blocks[-1].end() :]
    )


if __name__ == "__main__":  # shrink HTML written before: python tools/gpu_check_plugin.py FILE.html ...
    for name in sys.argv[1:]:
        page = Path(name)
        page.write_text(share_stylesheet(page.read_text(encoding="utf-8"), page.parent), encoding="utf-8")
