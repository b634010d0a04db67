"""Memory panel, plots and diagrams: they render headless and show the tracker's numbers."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import pytest
import torch
from matplotlib.patches import FancyBboxPatch

from mgpu_helpers.diagrams import draw_node_configurations, draw_rank_layout
from mgpu_helpers.memory import MemoryTracker
from mgpu_helpers.plotting import plot_device_bars, plot_memory_timeline
from mgpu_helpers.widgets import MemoryWidget


@pytest.fixture
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


def test_timeline_plot_stacks_four_categories(tracked):
    ax = plot_memory_timeline(tracked.timeline, tracked.marks)
    assert len(ax.collections) == 4
    assert [t.get_text() for t in ax.texts] == ["step 0", "step 1", "step 2"]
    with pytest.raises(ValueError, match="unit"):
        plot_memory_timeline(tracked.timeline, unit="MB")


def test_device_bars_have_one_bar_per_device_and_category():
    ax = plot_device_bars(
        {"cuda:0": {"parameters": 10, "other": 30}, "cuda:1": {"parameters": 10}}, note="simulated"
    )
    assert len(ax.patches) == 2 * 4
    assert any(t.get_text() == "simulated" for t in ax.texts)


def test_diagrams():
    fig = draw_node_configurations()
    assert [ax.get_title() for ax in fig.axes][0] == "single node, single GPU"
    ids = [{"rank": r, "node_rank": r // 2, "local_rank": r % 2, "device": "cpu"} for r in range(4)]
    fig = draw_rank_layout(ids)
    boxes = [p for p in fig.axes[0].patches if isinstance(p, FancyBboxPatch)]
    assert len(boxes) == 2 + 4  # two nodes, four processes
    assert "world size 4" in fig.axes[0].get_title()
