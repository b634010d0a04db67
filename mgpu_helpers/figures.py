"""Used by notebook 01 (node and rank diagrams), and through other modules by notebooks 02b, 05b and 07a:
figures as PNG bytes for widgets and saved notebooks (:func:`figure_to_png`), the course's shared
colours, and notebook 01's drawn diagrams.

matplotlib only, imported inside the functions, so the figures render offline, headless, on Colab
and in slides, and importing this module is cheap.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

__all__ = [
    "CPU_COLOR",
    "GPU_COLOR",
    "NODE_COLOR",
    "draw_node_configurations",
    "draw_rank_layout",
    "figure_to_png",
]

#: Fill of a GPU box (the usual accelerator green) and of GPU-related bars and lines.
GPU_COLOR = "#76B900"
#: Fill of a CPU (+ RAM) box, and of a process that runs on the CPU.
CPU_COLOR = "#9DB4D8"
#: Background of a node (one machine).
NODE_COLOR = "#F2F2F2"

_RANK_KEYS = ("rank", "node_rank", "local_rank")


def figure_to_png(fig: Any, dpi: int = 80) -> bytes:
    """Render a matplotlib figure to PNG bytes (widgets show images, not figures).

    Args:
        fig: a ``matplotlib.figure.Figure`` (``plt.subplots()[0]``, or ``ax.figure``).
        dpi: resolution in dots per inch, > 0.

    Returns:
        The PNG file's bytes (they start with ``b"\\x89PNG"``).
    """
    from matplotlib.figure import Figure

    if not isinstance(fig, Figure):
        hint = " (an Axes: pass ax.figure)" if hasattr(fig, "figure") else ""
        raise TypeError(f"fig must be a matplotlib Figure, not {type(fig).__name__}{hint}")
    if isinstance(dpi, bool) or not isinstance(dpi, int | float):
        raise TypeError(f"dpi must be a number of dots per inch such as 80, not {dpi!r}")
    if not 0 < dpi < math.inf:
        raise ValueError(f"dpi must be a positive number of dots per inch such as 80, not {dpi}")
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    return buf.getvalue()


def _node(
    ax: Any, x: float, y: float, w: float, h: float, title: str, n_gpus: int
) -> list[tuple[float, float]]:
    """Draw one node (a machine) with a CPU and ``n_gpus`` GPUs; return the GPUs' centres."""
    from matplotlib.patches import FancyBboxPatch

    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.02", fc=NODE_COLOR, ec="#555555", lw=1.2))
    ax.text(x + w / 2, y + h - 0.07, title, ha="center", va="top", fontsize=9, weight="bold")
    ax.add_patch(
        FancyBboxPatch(
            (x + 0.08, y + h - 0.38), w - 0.16, 0.18, boxstyle="round,pad=0.01", fc=CPU_COLOR, ec="none"
        )
    )
    ax.text(x + w / 2, y + h - 0.29, "CPU + RAM", ha="center", va="center", fontsize=7)
    centres = []
    gw = (w - 0.16 - 0.04 * (n_gpus - 1)) / n_gpus
    for i in range(n_gpus):
        gx = x + 0.08 + i * (gw + 0.04)
        ax.add_patch(
            FancyBboxPatch((gx, y + 0.1), gw, 0.3, boxstyle="round,pad=0.01", fc=GPU_COLOR, ec="none")
        )
        ax.text(
            gx + gw / 2,
            y + 0.25,
            f"GPU {i}",
            ha="center",
            va="center",
            fontsize=7,
            color="white",
            weight="bold",
        )
        centres.append((gx + gw / 2, y + 0.25))
    if n_gpus > 1:
        ax.plot([centres[0][0], centres[-1][0]], [y + 0.45, y + 0.45], color="#333333", lw=1)
        ax.text(x + w / 2, y + 0.47, "PCIe / NVLink", ha="center", va="bottom", fontsize=6)
    return centres


_PANELS = (
    ("single node, single GPU", (1,)),
    ("single node, multi GPU", (4,)),
    ("multi node, single GPU each", (1, 1)),
    ("multi node, multi GPU", (2, 2)),
)


def draw_node_configurations(ax_row: Sequence[Any] | None = None) -> Any:
    """The four ways to arrange GPUs: {single, multi} node × {single, multi} GPU.

    A *node* is one machine (its own CPU, RAM and operating system). GPUs inside one node talk over
    PCIe or NVLink; nodes talk over the network, which is much slower — the reason multi-node
    training cares so much about how many bytes cross between nodes.

    Args:
        ax_row: four matplotlib Axes to draw on (e.g. ``plt.subplots(1, 4)[1]``), or None for a new
            figure.

    Returns:
        The figure.
    """
    import matplotlib.pyplot as plt
    from matplotlib.axes import Axes

    if ax_row is None:
        fig, ax_row = plt.subplots(1, 4, figsize=(13, 3.0))
    else:
        axes = list(getattr(ax_row, "flat", ax_row)) if not isinstance(ax_row, str) else [ax_row]
        if len(axes) != len(_PANELS) or not all(isinstance(ax, Axes) for ax in axes):
            raise ValueError(
                f"ax_row must be {len(_PANELS)} matplotlib Axes, e.g. plt.subplots(1, 4)[1], or None; "
                f"got {len(axes)} item(s)"
            )
        ax_row = axes
        fig = ax_row[0].figure
    for ax, (title, nodes) in zip(ax_row, _PANELS, strict=True):
        ax.set_xlim(0, 2.2)
        ax.set_ylim(0, 1.6)
        ax.axis("off")
        ax.set_title(title, fontsize=10)
        if len(nodes) == 1:
            _node(ax, 0.2, 0.3, 1.8, 1.1, "node 0", nodes[0])
        else:
            for k, g in enumerate(nodes):
                _node(ax, 0.05 + k * 1.1, 0.3, 1.0, 1.1, f"node {k}", g)
            ax.plot([0.55, 0.55, 1.65, 1.65], [0.28, 0.15, 0.15, 0.28], color="#B22222", lw=2)
            ax.text(1.1, 0.02, "network (Ethernet / InfiniBand)", ha="center", fontsize=7, color="#B22222")
    fig.tight_layout()
    return fig


def _check_identities(identities: Any) -> list[dict[str, Any]]:
    """Refuse anything but a non-empty list of dicts with integer rank, node_rank and local_rank."""
    if isinstance(identities, dict | str) or not isinstance(identities, Sequence) or not identities:
        raise ValueError(
            "identities must be a non-empty list of dicts, one per process, as "
            "mgpu_helpers.launching.worker gathers them (keys rank, node_rank, local_rank)"
        )
    for i, ident in enumerate(identities):
        if not isinstance(ident, dict):
            raise TypeError(f"identities[{i}] must be a dict, not {type(ident).__name__}")
        missing = [k for k in _RANK_KEYS if k not in ident]
        if missing:
            raise ValueError(
                f"identities[{i}] lacks {', '.join(missing)}; each needs {', '.join(_RANK_KEYS)}"
            )
        for key in _RANK_KEYS:
            value = ident[key]
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"identities[{i}][{key!r}] must be an int >= 0, not {value!r}")
    return list(identities)


def draw_rank_layout(identities: Sequence[dict[str, Any]]) -> Any:
    """Draw the processes of a job grouped by node, each labelled with its rank and local rank.

    Args:
        identities: one dict per process, as :func:`mgpu_helpers.launching.worker.identity` gives them
            (keys ``rank``, ``node_rank``, ``local_rank``; optional ``device`` and ``pid``). A process
            whose ``device`` starts with ``cuda`` is drawn green, any other blue.

    Returns:
        The figure.
    """
    identities = _check_identities(identities)
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyBboxPatch

    nodes = sorted({i["node_rank"] for i in identities})
    per_node = {
        n: sorted((i for i in identities if i["node_rank"] == n), key=lambda i: i["local_rank"])
        for n in nodes
    }
    width = max(len(v) for v in per_node.values())
    fig, ax = plt.subplots(figsize=(2.6 * len(nodes) * max(1, width / 2), 2.6))
    ax.axis("off")
    node_w = 1.2 * width + 0.2
    for k, n in enumerate(nodes):
        x0 = k * (node_w + 0.4)
        ax.add_patch(
            FancyBboxPatch((x0, 0), node_w, 1.6, boxstyle="round,pad=0.03", fc=NODE_COLOR, ec="#555555")
        )
        title = f"node {n}  (--node-rank={n})"
        ax.text(x0 + node_w / 2, 1.5, title, ha="center", va="top", fontsize=9, weight="bold")
        for j, ident in enumerate(per_node[n]):
            px = x0 + 0.2 + j * 1.2
            color = GPU_COLOR if str(ident.get("device", "cpu")).startswith("cuda") else CPU_COLOR
            ax.add_patch(FancyBboxPatch((px, 0.15), 1.0, 1.0, boxstyle="round,pad=0.02", fc=color, ec="none"))
            lines = [
                f"rank {ident['rank']}",
                f"local rank {ident['local_rank']}",
                str(ident.get("device", "")),
            ]
            if "pid" in ident:
                lines.append(f"pid {ident['pid']}")
            ax.text(px + 0.5, 0.65, "\n".join(lines), ha="center", va="center", fontsize=8)
    ax.set_xlim(-0.1, len(nodes) * (node_w + 0.4))
    ax.set_ylim(-0.1, 1.7)
    world = len(identities)
    ax.set_title(f"world size {world}: {len(nodes)} node(s) × {world // len(nodes)} process(es)", fontsize=10)
    fig.tight_layout()
    return fig
