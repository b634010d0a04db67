"""Used by notebook 00 and ``python -m mgpu_helpers``. The course map: one entry per notebook, what
each does on CPU, one GPU and several GPUs, and which helper modules it imports; plus the package's
module table.

README.md shows both tables (unit tests keep them in step with this file, with the notebooks' real
imports and with the modules on disk; ``python tools/update_readme.py`` rewrites them).
"""

from __future__ import annotations

from dataclasses import dataclass

#: Where the course lives; Colab badges and the Colab install cell point here.
REPO_URL = "https://github.com/mgpu-course/mgpu-course"
REPO_SLUG = "mgpu-course/mgpu-course"


@dataclass(frozen=True)
class Notebook:
    """One notebook of the course and its behaviour per hardware configuration."""

    number: str
    file: str
    title: str
    teaches: str
    cpu: str
    one_gpu: str
    multi_gpu: str
    #: The ``mgpu_helpers`` modules the notebook imports (checked against its code by a test).
    helpers: tuple[str, ...] = ()
    ready: bool = True

    @property
    def colab_url(self) -> str:
        """Link that opens this notebook on Google Colab."""
        return f"https://colab.research.google.com/github/{REPO_SLUG}/blob/main/notebooks/{self.file}"

    def mode(self, gpu_count: int) -> str:
        """What this notebook does on a machine with ``gpu_count`` GPUs."""
        if gpu_count <= 0:
            return self.cpu
        return self.one_gpu if gpu_count == 1 else self.multi_gpu


NOTEBOOKS: tuple[Notebook, ...] = (
    Notebook(
        "00",
        "00_setup.ipynb",
        "Setup and how to read this course",
        "JupyterLab or Colab, the hardware check, how numbers are labelled, the course map",
        "full",
        "full",
        "full",
        helpers=("course", "exercises", "hardware", "labels"),
    ),
    Notebook(
        "01",
        "01_nodes_and_gpus.ipynb",
        "Nodes and GPUs",
        "single/multi node and GPU, torch.device, CUDA_VISIBLE_DEVICES, rank/local rank/world size "
        "via a real 2-node torchrun job, memory by category",
        "torchrun with gloo on 127.0.0.1; memory tracked on CPU",
        "same launch on gloo with GPUs hidden (NCCL needs a GPU per rank); tracker on cuda:0",
        "NCCL with 4+ GPUs (2 per simulated node), else gloo; tracker on cuda:0",
        helpers=("data", "exercises", "figures", "hardware", "launching", "memory", "models"),
    ),
    Notebook(
        "02",
        "02_model_parallel.ipynb",
        "Model parallel and pipelining",
        "naive split, idle time, GPipe and 1F1B micro-batching, torch.distributed.pipelining",
        "stages as CPU processes (gloo)",
        "CPU processes for the multi-stage parts",
        "stages on cuda:0, cuda:1",
        helpers=("exercises", "hardware", "labels", "launching", "memory", "pipeline"),
    ),
    Notebook(
        "03",
        "03_data_parallel.ipynb",
        "nn.DataParallel from the inside",
        "replicate → scatter → parallel_apply → gather, first-device memory imbalance, parallel criterion",
        "virtual devices, memory simulated",
        "virtual devices, memory simulated",
        "real nn.DataParallel, memory measured",
        helpers=("data", "data_parallel", "exercises", "hardware", "labels", "memory", "models"),
    ),
    Notebook(
        "04",
        "04_ddp.ipynb",
        "DistributedDataParallel",
        "process groups, all-reduce, DistributedSampler, launching from a notebook, torchrun",
        "2 gloo processes",
        "2 gloo processes (NCCL needs a GPU per rank)",
        "one NCCL process per GPU",
        helpers=("data", "ddp", "exercises", "hardware", "labels", "launching", "models", "processes"),
    ),
    Notebook(
        "05",
        "05_mixed_precision_and_memory.ipynb",
        "Mixed precision and memory",
        "Apex → torch.amp, bf16/fp16, loss scaling, memory predictor, ZeRO/FSDP, activation checkpointing",
        "bf16 autocast timed; ZeRO-1 and FSDP2 on 2 gloo processes",
        "fp16 + GradScaler and bf16 on cuda:0; sharding on gloo CPU processes",
        "ZeRO-1/FSDP2 with NCCL on 2 GPUs",
        helpers=("data", "exercises", "hardware", "labels", "launching", "memory", "models", "precision"),
    ),
    Notebook(
        "06",
        "06_hyperparameter_tuning.ipynb",
        "Hyperparameter tuning",
        "grid vs random vs Bayesian on equal budgets; Ray Tune with ASHA; a local Ray cluster",
        "Ray on CPU",
        "fractional GPUs per trial",
        "trials spread over GPUs",
        helpers=("exercises", "labels", "processes", "tuning"),
    ),
    Notebook(
        "07",
        "07_troubleshooting.ipynb",
        "Troubleshooting",
        "OOM, batch-size finder, leaks, monitoring, CUDA errors",
        "OOM in a memory-capped child process",
        "OOM under a capped memory fraction",
        "same, per device",
        helpers=("exercises", "hardware", "labels", "launching", "memory", "models", "troubleshoot"),
    ),
)


#: Every module (or subpackage) of ``mgpu_helpers``, in the order a newcomer should read them: shared
#: building blocks first, then one per notebook topic. README's module table is generated from it.
MODULES: dict[str, str] = {
    "course": "the course map and this module table",
    "labels": '"measured / simulated / estimated" labels for every printed number',
    "exercises": "`grade(id, work)`: runs a graded exercise's grader, prints ⏳ / ✅ / ❌ with a hint",
    "graders": "one grader module per notebook (runs the student's code for real; solutions live in "
    "`solutions/`)",
    "hardware": "what this machine has (CPU, RAM, GPUs via torch.cuda / NVML / GPUtil) and the one "
    "backend rule, `choose_backend`",
    "processes": "free ports, loopback-only checks, stopping a process tree, children that die with "
    "their parent",
    "figures": "static figures for saved notebooks (`figure_to_png`), shared colours, node and rank diagrams",
    "data": "small datasets made locally (classification blobs, images, sequences, tokens)",
    "models": "small models (MLP, CNN, RNN, transformer) and the one parameter-bytes count",
    "memory": "exact memory accounting by category (tracker, virtual devices), the one analytic "
    "estimator, memory plots and the live memory panel",
    "launching": "run a function on N processes from a notebook (`launch`), real torchrun jobs "
    "(`run_torchrun`) and the torchrun worker",
    "pipeline": "pipeline schedules (simulator), stages as real processes, measured timelines",
    "data_parallel": "nn.DataParallel rebuilt over virtual devices, DataLoader sweeps",
    "ddp": "DistributedDataParallel jobs, throughput, per-rank plots",
    "precision": "number formats, step timing side by side, per-process state bytes",
    "tuning": "Ray Tune on loopback, a local Ray cluster, trainables, equal-budget studies "
    "(needs the `tune` extra)",
    "troubleshoot": "memory-capped children, OOM, batch-size finder, leaks, `diagnose(exc)`",
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
        "| # | Notebook | What it teaches | CPU only | 1 GPU | N GPUs | Colab |\n"
        "|---|---|---|---|---|---|---|"
    )
    rows = []
    for nb in NOTEBOOKS:
        title = f"[{nb.title}](notebooks/{nb.file})" if nb.ready else f"{nb.title} (coming)"
        badge = (
            f"[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]({nb.colab_url})"
        )
        rows.append(
            f"| {nb.number} | {title} | {nb.teaches} | {nb.cpu} | {nb.one_gpu} | {nb.multi_gpu} | "
            f"{badge if nb.ready else '—'} |"
        )
    return "\n".join([head, *rows])


def modes_here(gpu_count: int) -> list[tuple[str, str, str]]:
    """``(number, title, mode)`` for every notebook on a machine with ``gpu_count`` GPUs."""
    return [(nb.number, nb.title + ("" if nb.ready else " (coming)"), nb.mode(gpu_count)) for nb in NOTEBOOKS]
