"""Used by notebook 00 (through :mod:`mgpu_helpers.course`) and ``python -m mgpu_helpers``. The package's
module table and the Markdown tables README.md shows, generated from the catalogue.
"""

from __future__ import annotations

from .catalogue import NOTEBOOKS

#: Every module (or subpackage) of ``mgpu_helpers``, in the order a newcomer should read them: shared
#: building blocks first, then one per notebook topic. README's module table is generated from it.
MODULES: dict[str, str] = {
    "course": "the course map (its catalogue of notebooks, their install cells) and this module table",
    "doctor": "the environment doctor: platform, Python, torch/CUDA builds, GPUs, bf16, peer access, an NCCL "
    "smoke test, start method, widget versions, the published stack it matches — and what the course does "
    "about each",
    "labels": '"measured / simulated / estimated" labels for every printed number',
    "exercises": "`grade(id, work)`: runs an exercise's grader, prints ⏳ / ✅ / ❌, a hint on request",
    "graders": "one grader module per notebook (runs the student's code for real; solutions live in "
    "`solutions/`)",
    "hardware": "what this machine has (CPU, RAM, GPUs via torch.cuda / NVML / GPUtil) and the one "
    "backend rule, `choose_backend`; datasheet peak FLOP/s per GPU for MFU, `peak_flops`",
    "stacks": "the students' package stacks (Colab's, Kaggle's, the newest) as pip constraint files, "
    "compared with this machine by the doctor and built by `noxfile.py`",
    "processes": "free ports, loopback-only checks, stopping a process tree, children that die with "
    "their parent",
    "figures": "static figures for saved notebooks (`figure_to_png`), shared colours, node and rank diagrams",
    "data": "small datasets made locally (classification blobs, images, sequences, tokens)",
    "models": "small models (MLP, CNN, RNN, transformer) and the one parameter-bytes count",
    "memory": "exact memory accounting by category (tracker, virtual devices), the one analytic "
    "estimator, memory plots and the live memory panel",
    "launching": "run a function on N processes from a notebook (`launch`: ranks from a forkserver, the "
    "function sent by value, never a fork of the kernel), real torchrun jobs "
    "(`run_torchrun`) and the torchrun worker",
    "collectives": "`CollectiveSpy`, the course's one communication spy (every collective a rank calls, "
    "with its full-tensor bytes), and ring traffic per rank",
    "pipeline": "pipeline schedules (simulator), stages as real processes, measured timelines",
    "data_parallel": "nn.DataParallel rebuilt over virtual devices, DataLoader sweeps",
    "shell": "`shell(command)`: a shell command's output lines, as `x = !command` gives them, on every "
    "IPython",
    "ddp": "`!torchrun` cells on loopback, capturing DDP's C++ warnings, c10d torchrun jobs",
    "precision": "number formats, step timing side by side, per-process state bytes",
    "tuning": "Ray Tune on loopback, a local Ray cluster, trainables, equal-budget studies "
    "(Ray needs the `tune` extra; 06a's Optuna alone, the `search` extra)",
    "interactive": "a live multi-rank group for `%%px` cells (ipyparallel engines in one process group) "
    "and its clean shutdown (needs the `interactive` extra)",
    "planner": "memory and communication per step for DP / ZeRO / TP / PP layouts (the Playbook's formulas) "
    "and the planner widget (its *measure this layout* button runs `scale.dry_run`)",
    "scale": "one process as one rank of a fake job of up to 1,024 ranks, Llama 3's block, its TP plan and "
    "its context parallelism, "
    "bytes by category counted from the rank's real tensors; `dry_run(shape, layout)` measures any layout",
    "troubleshoot": "OOM fences (memory-capped children, a capped GPU fraction), memory readings, `is_oom`, "
    "leak trends, `diagnose(exc)`",
}


def module_users(module: str) -> list[str]:
    """Numbers of the notebooks that import ``mgpu_helpers.<module>`` directly."""
    if module not in MODULES:
        raise ValueError(f"unknown module {module!r}; known: {', '.join(MODULES)}")
    return [nb.number for nb in NOTEBOOKS if module in nb.helpers]


def module_table_markdown() -> str:
    """The README's module table (Markdown), generated from :data:`MODULES` and the notebooks' imports."""
    rows = ["| module | what is inside | notebooks |", "|---|---|---|"]
    for name, what in MODULES.items():
        users = ", ".join(module_users(name)) or "via other modules"
        rows.append(f"| `mgpu_helpers.{name}` | {what} | {users} |")
    return "\n".join(rows)


def course_map_markdown() -> str:
    """The README's course-map table (Markdown), generated from :data:`NOTEBOOKS`."""
    head = (
        "| # | Notebook | What it teaches | CPU only | 1 GPU | N GPUs | Open on |\n"
        "|---|---|---|---|---|---|---|"
    )
    rows = []
    for nb in NOTEBOOKS:
        title = f"[{nb.title}](notebooks/{nb.file})" if nb.ready else f"{nb.title} (coming)"
        badge = nb.badges()
        rows.append(
            f"| {nb.number} | {title} | {nb.teaches} | {nb.cpu} | {nb.one_gpu} | {nb.multi_gpu} | "
            f"{badge if nb.ready else '—'} |"
        )
    return "\n".join([head, *rows])


def modes_here(gpu_count: int) -> list[tuple[str, str, str]]:
    """``(number, title, mode)`` for every notebook on a machine with ``gpu_count`` GPUs."""
    return [(nb.number, nb.title + ("" if nb.ready else " (coming)"), nb.mode(gpu_count)) for nb in NOTEBOOKS]
