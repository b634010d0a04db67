"""Drawn diagrams for the notebooks (matplotlib only, so they render offline, on Colab and in slides)."""

from __future__ import annotations

from typing import Any

GPU_COLOR = "#76B900"  # the usual accelerator green
CPU_COLOR = "#9DB4D8"
NODE_COLOR = "#F2F2F2"


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


def draw_node_configurations(ax_row: Any = None) -> Any:
    """The four ways to arrange GPUs: {single, multi} node × {single, multi} GPU.

    A *node* is one machine (its own CPU, RAM and operating system). GPUs inside one node talk over
    PCIe or NVLink; nodes talk over the network, which is much slower — the reason multi-node
    training cares so much about how many bytes cross between nodes. Returns the figure.
    """
    import matplotlib.pyplot as plt

    if ax_row is None:
        fig, ax_row = plt.subplots(1, 4, figsize=(13, 3.0))
    else:
        fig = ax_row[0].figure
    panels = [
        ("single node, single GPU", [1]),
        ("single node, multi GPU", [4]),
        ("multi node, single GPU each", [1, 1]),
        ("multi node, multi GPU", [2, 2]),
    ]
    for ax, (title, nodes) in zip(ax_row, panels, strict=True):
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


def draw_rank_layout(identities: list[dict[str, Any]]) -> Any:
    """Draw the processes of a job grouped by node, each labelled with its rank and local rank.

    ``identities`` are the dicts that :mod:`mgpu_helpers.whoami` gathers (keys ``rank``, ``node_rank``,
    ``local_rank``, ``device``, ``pid``). Returns the figure.
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyBboxPatch

    nodes = sorted({int(i["node_rank"]) for i in identities})
    per_node = {
        n: sorted((i for i in identities if int(i["node_rank"]) == n), key=lambda i: int(i["local_rank"]))
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
        ax.text(
            x0 + node_w / 2,
            1.5,
            f"node {n}  (--node-rank={n})",
            ha="center",
            va="top",
            fontsize=9,
            weight="bold",
        )
        for j, ident in enumerate(per_node[n]):
            px = x0 + 0.2 + j * 1.2
            color = GPU_COLOR if str(ident.get("device", "cpu")).startswith("cuda") else CPU_COLOR
            ax.add_patch(FancyBboxPatch((px, 0.15), 1.0, 1.0, boxstyle="round,pad=0.02", fc=color, ec="none"))
            ax.text(
                px + 0.5,
                0.65,
                "\n".join(
                    (
                        f"rank {ident['rank']}",
                        f"local rank {ident['local_rank']}",
                        str(ident.get("device", "")),
                    )
                    + ((f"pid {ident['pid']}",) if "pid" in ident else ())
                ),
                ha="center",
                va="center",
                fontsize=8,
            )
    ax.set_xlim(-0.1, len(nodes) * (node_w + 0.4))
    ax.set_ylim(-0.1, 1.7)
    world = len(identities)
    ax.set_title(
        f"world size {world}: {len(nodes)} node(s) × {world // max(1, len(nodes))} process(es)", fontsize=10
    )
    fig.tight_layout()
    return fig
