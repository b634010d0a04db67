"""The course map: one entry per notebook, and what each does on CPU, one GPU and several GPUs.

README.md shows the same table (a unit test keeps the two in step), ``python -m mgpu_helpers`` prints
which mode each notebook will use on this machine, and notebook 00 renders it.
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
    ),
    Notebook(
        "02",
        "02_model_parallel.ipynb",
        "Model parallel and pipelining",
        "naive split, idle time, GPipe and 1F1B micro-batching, torch.distributed.pipelining",
        "stages as CPU processes (gloo)",
        "CPU processes for the multi-stage parts",
        "stages on cuda:0, cuda:1",
    ),
    Notebook(
        "03",
        "03_data_parallel.ipynb",
        "nn.DataParallel from the inside",
        "replicate → scatter → parallel_apply → gather, first-device memory imbalance, parallel criterion",
        "virtual devices, memory simulated",
        "virtual devices, memory simulated",
        "real nn.DataParallel, memory measured",
    ),
    Notebook(
        "04",
        "04_ddp.ipynb",
        "DistributedDataParallel",
        "process groups, all-reduce, DistributedSampler, launching from a notebook, torchrun",
        "2 gloo processes",
        "2 gloo processes (NCCL needs a GPU per rank)",
        "one NCCL process per GPU",
    ),
    Notebook(
        "05",
        "05_mixed_precision_and_memory.ipynb",
        "Mixed precision and memory",
        "Apex → torch.amp, bf16/fp16, loss scaling, memory predictor, ZeRO/FSDP, activation checkpointing",
        "bf16 autocast timed; ZeRO-1 and FSDP2 on 2 gloo processes",
        "fp16 + GradScaler and bf16 on cuda:0; sharding on gloo CPU processes",
        "ZeRO-1/FSDP2 with NCCL on 2 GPUs",
    ),
    Notebook(
        "06",
        "06_hyperparameter_tuning.ipynb",
        "Hyperparameter tuning",
        "grid vs random vs Bayesian on equal budgets; Ray Tune with ASHA; a local Ray cluster",
        "Ray on CPU",
        "fractional GPUs per trial",
        "trials spread over GPUs",
    ),
    Notebook(
        "07",
        "07_troubleshooting.ipynb",
        "Troubleshooting",
        "OOM, batch-size finder, leaks, monitoring, CUDA errors",
        "OOM in a memory-capped child process",
        "OOM under a capped memory fraction",
        "same, per device",
    ),
)


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
