"""mgpu_helpers.figures: PNG rendering and notebook 01's diagrams, drawn headless (Agg)."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import pytest
from matplotlib.colors import to_hex
from matplotlib.figure import Figure
from matplotlib.patches import FancyBboxPatch

from mgpu_helpers.figures import (
    CPU_COLOR,
    GPU_COLOR,
    NODE_COLOR,
    draw_node_configurations,
    draw_rank_layout,
    figure_to_png,
)


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _boxes(ax, color=None):
    """The rounded boxes on ``ax``, optionally only those filled with ``color``."""
    boxes = [p for p in ax.patches if isinstance(p, FancyBboxPatch)]
    if color is not None:
        boxes = [p for p in boxes if to_hex(p.get_facecolor()) == to_hex(color)]
    return boxes


def _ranks(n_nodes, per_node, device="cpu"):
    return [
        {"rank": r, "node_rank": r // per_node, "local_rank": r % per_node, "device": device, "pid": 1000 + r}
        for r in range(n_nodes * per_node)
    ]


def test_figure_to_png_returns_png_bytes_whose_size_follows_dpi():
    fig, ax = plt.subplots(figsize=(2, 1))
    ax.plot([0, 1], [0, 1])
    small, large = figure_to_png(fig, dpi=40), figure_to_png(fig, dpi=120)
    assert small[:8] == large[:8] == b"\x89PNG\r\n\x1a\n"
    width = int.from_bytes(small[16:20], "big")  # IHDR: width, height after the 8-byte signature + 8
    assert int.from_bytes(large[16:20], "big") > 2 * width


def test_node_configurations_draw_four_panels_with_the_right_gpus():
    fig = draw_node_configurations()
    titles = [ax.get_title() for ax in fig.axes]
    assert titles == [
        "single node, single GPU",
        "single node, multi GPU",
        "multi node, single GPU each",
        "multi node, multi GPU",
    ]
    assert [len(_boxes(ax, GPU_COLOR)) for ax in fig.axes] == [1, 4, 2, 4]
    assert [len(_boxes(ax, NODE_COLOR)) for ax in fig.axes] == [1, 1, 2, 2]
    assert [len(_boxes(ax, CPU_COLOR)) for ax in fig.axes] == [1, 1, 2, 2]
    assert figure_to_png(fig)[:4] == b"\x89PNG"


def test_node_configurations_draw_on_given_axes():
    fig, axes = plt.subplots(2, 2)
    assert draw_node_configurations(axes) is fig  # a 2x2 grid works as well as a row
    assert sum(len(_boxes(ax, GPU_COLOR)) for ax in fig.axes) == 11


def test_rank_layout_draws_one_box_per_node_and_process():
    fig = draw_rank_layout(_ranks(n_nodes=2, per_node=2))
    ax = fig.axes[0]
    assert len(_boxes(ax)) == 2 + 4  # two nodes, four processes
    assert len(_boxes(ax, NODE_COLOR)) == 2
    assert len(_boxes(ax, CPU_COLOR)) == 4
    assert "world size 4: 2 node(s) × 2 process(es)" in ax.get_title()
    texts = [t.get_text() for t in ax.texts]
    assert "node 1  (--node-rank=1)" in texts
    assert any(t.startswith("rank 3\nlocal rank 1\ncpu\npid 1003") for t in texts)


def test_rank_layout_colours_gpu_processes_green():
    ax = draw_rank_layout(_ranks(n_nodes=1, per_node=3, device="cuda:0")).axes[0]
    assert len(_boxes(ax, GPU_COLOR)) == 3 and len(_boxes(ax, NODE_COLOR)) == 1


@pytest.mark.parametrize(
    ("func", "args", "kwargs", "exc", "message"),
    [
        (figure_to_png, ("figure",), {}, TypeError, r"fig must be a matplotlib Figure, not str"),
        (figure_to_png, (None,), {}, TypeError, r"fig must be a matplotlib Figure"),
        (
            figure_to_png,
            (plt.figure(),),
            {"dpi": 0},
            ValueError,
            r"dpi must be a positive number .* such as 80",
        ),
        (
            figure_to_png,
            (Figure(),),
            {"dpi": "80"},
            TypeError,
            r"dpi must be a number of dots per inch such as 80",
        ),
        (draw_node_configurations, ([1, 2],), {}, ValueError, r"ax_row must be 4 matplotlib Axes, .*got 2"),
        (draw_node_configurations, ("ax",), {}, ValueError, r"ax_row must be 4 matplotlib Axes"),
        (draw_rank_layout, ([],), {}, ValueError, r"identities must be a non-empty list of dicts"),
        (draw_rank_layout, ({"rank": 0},), {}, ValueError, r"identities must be a non-empty list"),
        (draw_rank_layout, ([("rank", 0)],), {}, TypeError, r"identities\[0\] must be a dict"),
        (draw_rank_layout, ([{"rank": 0}],), {}, ValueError, r"identities\[0\] lacks node_rank, local_rank"),
        (
            draw_rank_layout,
            ([{"rank": 0, "node_rank": "0", "local_rank": 0}],),
            {},
            ValueError,
            r"identities\[0\]\['node_rank'\] must be an int >= 0",
        ),
    ],
)
def test_bad_inputs_are_refused_with_what_to_pass(func, args, kwargs, exc, message):
    with pytest.raises(exc, match=message):
        func(*args, **kwargs)


def test_figure_to_png_points_an_axes_at_its_figure():
    _, ax = plt.subplots()
    with pytest.raises(TypeError, match=r"an Axes: pass ax.figure"):
        figure_to_png(ax)
