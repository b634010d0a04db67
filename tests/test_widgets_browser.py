"""The course's three interactive widgets in a real browser: notebook 01's memory panel, 02b's schedule
simulator and 05d's planner form are opened in JupyterLab (headless Chromium driven by Playwright) on a
small generated notebook; each must render and must update after an input changes.

Not part of ``.ci/run``: it starts a JupyterLab server and a browser (about a minute). It skips, saying
what is missing, without Playwright (``pip install playwright``), Debian's Chromium (``apt-get install -y
chromium``, used through ``executable_path``, so ``playwright install`` is not needed) or JupyterLab
(``pip install jupyterlab``).
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ROOT = pathlib.Path(__file__).resolve().parents[1]


def _missing() -> str | None:
    if importlib.util.find_spec("playwright") is None:
        return "Playwright is not installed (pip install playwright)"
    if not os.path.exists(CHROMIUM):
        return "no Chromium at /usr/bin/chromium (apt-get install -y chromium)"
    if importlib.util.find_spec("jupyterlab") is None:
        return "JupyterLab is not installed (pip install jupyterlab)"
    from importlib.metadata import version

    widgets, lab = version("ipywidgets"), version("jupyterlab")
    if int(widgets.split(".")[0]) < 8 and int(lab.split(".")[0]) >= 4:
        return (
            f"ipywidgets {widgets} does not render in JupyterLab {lab} (JupyterLab 4 needs ipywidgets 8); "
            "no platform ships that pair: Colab serves ipywidgets 7.7.1 in its own front end, Kaggle "
            "ipywidgets 8.1.5 in JupyterLab 4"
        )
    return None


pytestmark = pytest.mark.skipif(_missing() is not None, reason=str(_missing()))

#: One cell per widget, as the notebooks use them, and a last cell that feeds the memory panel one more step
#: after a pause (the panel's input is the training loop).
CELLS = [
    """import torch
from mgpu_helpers.memory import MemoryTracker, MemoryWidget

model = torch.nn.Linear(100, 10)
opt = torch.optim.Adam(model.parameters())
tracker = MemoryTracker(model, opt)
panel = MemoryWidget(tracker, title="browser check", plot_every_s=0.0).show()
with tracker:
    for step in range(2):
        model(torch.randn(4, 100)).sum().backward()
        opt.step()
        opt.zero_grad()
        panel.update(step=step)""",
    """from mgpu_helpers.pipeline import ScheduleSimulator

simulator = ScheduleSimulator(schedule="1f1b", p=4, m=8, ratio=2.0, v=2).show()""",
    """from IPython.display import display
from mgpu_helpers.planner import planner_form

display(planner_form(n_gpus=8, gpu_gib=80.0))""",
    """import time

time.sleep(10)  # the browser first sees step 1, then this update
with tracker:
    panel.update(step=42, loss=0.25)""",
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def lab(tmp_path):
    """A JupyterLab server on 127.0.0.1 serving the generated notebook; stopped (with its kernel) before
    the root conftest checks that the test left no process."""
    import nbformat

    folder = tmp_path
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in CELLS])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, folder / "widgets.ipynb")
    port, token = _free_port(), secrets.token_hex(16)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    with open(folder / "lab.log", "w") as log:
        server = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "jupyterlab",
                "--no-browser",
                "--allow-root",
                "--expose-app-in-browser",  # window.jupyterapp: run cells through JupyterLab's own commands
                "--ip=127.0.0.1",
                f"--port={port}",
                f"--IdentityProvider.token={token}",
                f"--ServerApp.root_dir={folder}",
                "--LabApp.news_url=",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=folder,
        )
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=2)
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    server.kill()
                    server.wait()
                    pytest.fail(f"JupyterLab did not start:\n{(folder / 'lab.log').read_text()[-2000:]}")
                time.sleep(0.5)
        try:
            yield f"{url}/lab/tree/widgets.ipynb?token={token}"
        finally:
            server.send_signal(signal.SIGINT)  # a clean shutdown stops the kernel too
            try:
                server.wait(timeout=5)
            except subprocess.TimeoutExpired:
                server.send_signal(signal.SIGINT)  # the second ^C skips the confirmation
                try:
                    server.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    server.kill()
                    server.wait()


def _close_dialogs(page) -> None:
    """Dismiss any modal dialog JupyterLab shows at start (they take the focus and cover the cells)."""
    for _ in range(3):
        dialogs = page.locator(".jp-Dialog")
        if dialogs.count() == 0:
            return
        dialogs.first.locator("button").last.click()
        page.wait_for_timeout(300)


def test_widgets_render_and_update_in_jupyterlab(lab):
    from playwright.sync_api import expect, sync_playwright

    timeout_ms = 120_000  # a loaded 2-core machine: the kernel may take a while for each cell
    expect.set_options(timeout=timeout_ms)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.set_default_timeout(timeout_ms)
            page.goto(lab)
            page.wait_for_function("() => window.jupyterapp !== undefined")
            page.evaluate(
                """async () => {
                    const app = window.jupyterapp;
                    await app.started; await app.restored;
                    const notebook = () => Array.from(app.shell.widgets('main')).find(w => w.sessionContext);
                    while (!notebook()) await new Promise(r => setTimeout(r, 200));
                    app.shell.activateById(notebook().id);
                    await notebook().sessionContext.ready;
                    app.commands.execute('notebook:run-all-cells');  // runs on; the checks below wait
                }"""
            )
            _close_dialogs(page)  # e.g. an extension's start-up message: it would cover the widgets
            cells = page.locator(".jp-Notebook .jp-Cell")
            expect(cells).to_have_count(len(CELLS))

            # 01's memory panel: its table and timeline render, and the next loop step updates it.
            memory = cells.nth(0)
            expect(memory.locator(".widget-html").first).to_contain_text("step 1")
            expect(memory.locator("table")).to_contain_text("optimizer state")
            expect(memory.locator(".widget-image")).to_be_visible()
            expect(memory.locator(".widget-html").first).to_contain_text("step 42")

            _close_dialogs(page)
            # 02b's schedule simulator: another schedule re-simulates the numbers and the chart.
            simulator = cells.nth(1)
            info = simulator.locator(".widget-html").first
            expect(info).to_contain_text("bubble")
            before = info.inner_text()
            simulator.locator("select").first.select_option(label="GPipe")
            expect(info).not_to_have_text(before)
            expect(simulator.locator(".widget-image")).to_be_visible()

            # 05d's planner form: more GPUs re-plan the table.
            planner = cells.nth(2)
            out = planner.locator(".widget-html").last
            expect(out).to_contain_text("B parameters")
            before = out.inner_text()
            gpus = planner.locator(".widget-text", has_text="GPUs").locator("input")
            gpus.fill("64")
            gpus.press("Tab")
            expect(out).not_to_have_text(before)
        finally:
            browser.close()
