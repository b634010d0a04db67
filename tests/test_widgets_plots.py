"""Memory panel and memory plots: they render headless, show the tracker's numbers, and refuse wrong types."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import pytest
import torch

from mgpu_helpers.memory import (
    CATEGORIES,
    CATEGORY_LABELS,
    MemoryTracker,
    MemoryWidget,
    plot_device_bars,
    plot_memory_timeline,
)


@pytest.fixture(scope="module")
def tracked():
    torch.manual_seed(0)
    model = torch.nn.Linear(100, 10)
    opt = torch.optim.Adam(model.parameters())
    tracker = MemoryTracker(model, opt)
    with tracker:
        for i in range(3):
            model(torch.randn(4, 100)).sum().backward()
            opt.step()
            opt.zero_grad()
            tracker.mark(f"step {i}")
    yield tracker
    tracker.close()
    plt.close("all")


def test_widget_updates_from_the_loop_and_finishes_with_text(tracked, capsys):
    panel = MemoryWidget(tracked, title="test", plot_every_s=0.0)
    panel.update(step=1, loss=0.5)
    assert panel.updates == 1
    assert "step 1" in panel.header.value and "loss 0.5" in panel.header.value
    assert "optimizer state" in panel.table.value and "activations & other" in panel.table.value
    assert panel.image.value[:8] == b"\x89PNG\r\n\x1a\n"
    panel.finish()
    printed = capsys.readouterr().out
    assert "test — tracked tensor memory" in printed
    assert "3.95 KiB" in printed  # parameters: (100*10 + 10) * 4 B = 4,040 B
    assert "process RSS" in printed
    summary = printed[printed.index("test — tracked tensor memory") :].split("\n\n")[0].rstrip("\n")
    assert panel._repr_mimebundle_()["text/plain"] == summary  # frozen at finish (the live RSS moves on)
    plt.close("all")


def test_timeline_plot_stacks_four_categories(tracked):
    ax = plot_memory_timeline(tracked.timeline, tracked.marks)
    assert len(ax.collections) == 4
    assert [t.get_text() for t in ax.texts] == ["step 0", "step 1", "step 2"]
    shown = [c for c in CATEGORIES if any(s.bytes.get(c, 0) for s in tracked.timeline)]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [CATEGORY_LABELS[c] for c in shown]
    top = ax.collections[-1].get_paths()[0].vertices[:, 1].max()  # the stack's upper edge: the total
    assert top == pytest.approx(max(s.total for s in tracked.timeline) / 2**20)
    plt.close("all")


def test_device_bars_have_one_bar_per_device_and_category():
    ax = plot_device_bars(
        {"cuda:0": {"parameters": 10, "other": 30}, "cuda:1": {"parameters": 10}}, note="simulated", unit="B"
    )
    assert len(ax.patches) == 2 * 4
    assert [round(p.get_y() + p.get_height()) for p in ax.patches[-2:]] == [40, 10]  # stacked totals
    assert any(t.get_text() == "simulated" for t in ax.texts)
    legend = [t.get_text() for t in ax.get_legend().get_texts()]  # only what the bars show
    assert legend == [CATEGORY_LABELS["parameters"], CATEGORY_LABELS["other"]]
    plt.close("all")


@pytest.mark.parametrize(
    ("call", "args", "kwargs", "exc", "match"),
    [
        (
            MemoryWidget,
            ("not a tracker",),
            {},
            TypeError,
            r"MemoryWidget needs a MemoryTracker, e\.g\. MemoryWidget",
        ),
        (
            MemoryWidget,
            (MemoryTracker(),),
            {"plot_every_s": -1},
            ValueError,
            r"plot_every_s must be >= 0 seconds",
        ),
        (
            MemoryWidget,
            (MemoryTracker(),),
            {"plot_every_s": "1"},
            TypeError,
            r"plot_every_s must be a number",
        ),
        (MemoryWidget, (MemoryTracker(),), {"title": 3}, TypeError, r"title must be a string"),
        (MemoryWidget(MemoryTracker()).update, ("1",), {}, TypeError, r"step must be a whole number"),
        (
            MemoryWidget(MemoryTracker()).update,
            (),
            {"loss": torch.tensor(0.5)},
            TypeError,
            r"metric loss must be a number \(e\.g\. loss\.item\(\)\)",
        ),
        (
            plot_memory_timeline,
            (MemoryTracker(),),
            {},
            TypeError,
            r"pass tracker\.timeline and tracker\.marks",
        ),
        (plot_memory_timeline, ([],), {}, ValueError, r"timeline is empty"),
        (plot_memory_timeline, ([1, 2],), {}, TypeError, r"timeline must hold MemorySample objects"),
        (plot_memory_timeline, ("timeline",), {}, TypeError, r"timeline must be a list of MemorySample"),
        (
            plot_memory_timeline,
            (MemoryTracker().timeline,),
            {"unit": "MB"},
            ValueError,
            r"unit must be one of",
        ),
        (
            plot_memory_timeline,
            (MemoryTracker().timeline,),
            {"ax": "ax"},
            TypeError,
            r"ax must be a matplotlib Axes",
        ),
        (plot_device_bars, ([("cuda:0", 1)],), {}, TypeError, r"per_device must map a device name to bytes"),
        (plot_device_bars, ({},), {}, ValueError, r"per_device is empty"),
        (plot_device_bars, ({"cuda:0": 5},), {}, TypeError, r"per_device\['cuda:0'\] must map categories"),
        (
            plot_device_bars,
            ({"cuda:0": {"weights": 1}},),
            {},
            ValueError,
            r"unknown categories \['weights'\]",
        ),
        (plot_device_bars, ({"cuda:0": {"other": -1}},), {}, ValueError, r"must be a byte count >= 0"),
        (plot_device_bars, ({"cuda:0": {"other": 1}},), {"unit": "MB"}, ValueError, r"unit must be one of"),
        (plot_device_bars, ({"cuda:0": {"other": 1}},), {"note": 3}, TypeError, r"note must be a string"),
    ],
)
def test_bad_arguments_are_refused_with_a_fix(call, args, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        call(*args, **kwargs)


PANEL_CELL = """
import torch
from mgpu_helpers.memory import MemoryTracker, MemoryWidget

model = torch.nn.Linear(100, 10)
opt = torch.optim.Adam(model.parameters())
tracker = MemoryTracker(model, opt)
panel = MemoryWidget(tracker, title="once", plot_every_s=0.0).show()
with tracker:
    for step in range(2):
        model(torch.randn(4, 100)).sum().backward()
        opt.step()
        opt.zero_grad()
        panel.update(step=step)
panel.finish()
"""


def test_finished_panel_shows_its_table_and_chart_once():
    """In a real kernel: after finish(), the cell shows one table and one timeline. A live panel (a widget
    view: table and image) next to a printed table and a drawn figure would show both twice."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(PANEL_CELL)])
    nbclient.NotebookClient(nb, kernel_name="python3", timeout=120).execute()
    tables = images = 0
    for out in nb.cells[0].outputs:
        data = out.get("data", {})
        if "application/vnd.jupyter.widget-view+json" in data:  # a live panel: its table and its image
            tables, images = tables + 1, images + 1
        elif "text/html" in data:
            tables += data["text/html"].count("tracked tensor memory")
            images += data["text/html"].count("<img")
        elif "image/png" in data:
            images += 1
        else:
            tables += (out.get("text", "") + data.get("text/plain", "")).count("tracked tensor memory")
    assert (tables, images) == (1, 1), nb.cells[0].outputs
