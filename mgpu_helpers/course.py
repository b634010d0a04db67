"""Used by notebook 00 and ``python -m mgpu_helpers``. The course map: one entry per notebook, what
each does on CPU, one GPU and several GPUs, and which helper modules it imports; plus the package's
module table.

README.md shows both tables (unit tests keep them in step with this file, with the notebooks' real
imports and with the modules on disk; ``python tools/update_readme.py`` rewrites them).
"""

from __future__ import annotations

from dataclasses import dataclass

#: Where the course lives: badges and the notebooks' install cells point here. Whoever publishes the course
#: elsewhere changes these two lines and runs ``python tools/update_readme.py`` (README tables, badges and
#: every notebook's install cell follow).
REPO_URL = "https://github.com/mgpu-course/mgpu-course"
REPO_SLUG = "mgpu-course/mgpu-course"
#: Set in a notebook's environment, this overrides REPO_URL for its install cell (a fork; ``…@branch``).
REPO_ENV = "MGPU_COURSE_REPO"

#: Each extra of pyproject.toml (expanded; a test keeps them equal): the packages it installs and the
#: modules whose absence makes a notebook's first cell install them.
EXTRAS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "search": (("optuna",), ("optuna",)),
    "tune": (("ray[tune]", "optuna", "pandas"), ("ray", "optuna")),
    "interactive": (("ipyparallel",), ("ipyparallel",)),
    "capstone": (("ray[tune]", "optuna", "pandas", "scikit-learn"), ("ray", "optuna", "sklearn")),
}


def install_cell(extra: str = "") -> str:
    """The first code cell of a notebook that needs ``extra`` ("" for the base package only).

    On Colab and Kaggle it installs the course's package (with the extra) from :data:`REPO_URL`, or from
    the repository named by the environment variable :data:`REPO_ENV`; anywhere, it installs the extra's
    packages where one of its modules is missing; elsewhere it does nothing.
    """
    if extra:
        lines = [
            f"# Colab and Kaggle: install the course's package with its `{extra}` extra ({REPO_ENV} may "
            "name a",
            "# fork, add @branch); anywhere: install that extra's packages where missing (the base install "
            "leaves them out).",
        ]
    else:
        lines = [
            f"# Colab and Kaggle: install the course's package ({REPO_ENV} may name a fork, add @branch)."
        ]
    lines += ["import importlib", "import importlib.util"] if extra else ["import importlib.util"]
    lines += [
        "import os",
        "import sys",
        "",
        f'REPO = os.environ.get("{REPO_ENV}", "{REPO_URL}")',
        'HOSTED = "google.colab" in sys.modules or "KAGGLE_KERNEL_RUN_TYPE" in os.environ',
        'if HOSTED and importlib.util.find_spec("mgpu_helpers") is None:',
        f'    %pip install -q "mgpu-course{f"[{extra}]" if extra else ""} @ git+{{REPO}}"',
    ]
    if extra:
        packages, modules = EXTRAS[extra]
        names = ", ".join(f'"{m}"' for m in modules) + ("," if len(modules) == 1 else "")
        pip = " ".join(f'"{p}"' if "[" in p else p for p in packages)
        lines += [
            f"if any(importlib.util.find_spec(m) is None for m in ({names})):",
            f"    %pip install -q {pip}",
            "    importlib.invalidate_caches()",
        ]
    return "\n".join(lines)


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
    #: The package extra this notebook needs beyond the base install ("" for none); its first cell
    #: installs that extra's packages where they are missing (checked by a test).
    extra: str = ""

    @property
    def colab_url(self) -> str:
        """Link that opens this notebook on Google Colab."""
        return f"https://colab.research.google.com/github/{REPO_SLUG}/blob/main/notebooks/{self.file}"

    @property
    def kaggle_url(self) -> str:
        """Link that opens this notebook on Kaggle (choose the "GPU T4 x2" accelerator there)."""
        return f"https://kaggle.com/kernels/welcome?src=https://github.com/{REPO_SLUG}/blob/main/notebooks/{self.file}"

    def badges(self) -> str:
        """The notebook's "Open in Colab" and "Open in Kaggle" badges (Markdown, one line)."""
        return (
            f"[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]({self.colab_url}) "
            f"[![Open In Kaggle](https://kaggle.com/static/images/open-in-kaggle.svg)]({self.kaggle_url})"
        )

    def install_cell(self) -> str:
        """This notebook's first code cell (see :func:`install_cell`)."""
        return install_cell(self.extra)

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
        "JupyterLab, Colab or Kaggle, the environment doctor, the hardware check, how numbers are labelled, "
        "the course map",
        "full",
        "full",
        "full",
        helpers=("course", "doctor", "exercises", "hardware", "labels"),
    ),
    Notebook(
        "01",
        "01_nodes_and_gpus.ipynb",
        "Nodes and GPUs",
        "single/multi node and GPU, torch.device, CUDA_VISIBLE_DEVICES, rank/local rank/world size "
        "via a real 2-node torchrun job, memory by category",
        "torchrun with gloo on 127.0.0.1; memory tracked on CPU",
        "same launch on gloo with GPUs hidden (NCCL needs a GPU per rank); tracker on cuda:0",
        "NCCL on one node with 2+ GPUs, on two simulated nodes with 4+ GPUs, else gloo; tracker on cuda:0",
        helpers=("data", "exercises", "figures", "hardware", "launching", "memory", "models"),
    ),
    Notebook(
        "01b",
        "01b_interactive_ranks.ipynb",
        "Interactive multi-rank cells",
        "a live process group typed cell by cell with ipyparallel's %%px: ranks, send/recv, all_reduce, "
        "broadcast, all_gather, a mismatch caught by a timeout, clean shutdown",
        "2 engines on gloo (4 with NPROCS = 4 on a 4-core machine)",
        "2 engines on gloo on the CPU (NCCL needs a GPU per rank)",
        "one engine per GPU on NCCL",
        helpers=(
            "exercises",
            "interactive",
        ),
        extra="interactive",
    ),
    Notebook(
        "01c",
        "01c_distributed_mechanics.ipynb",
        "Mechanics: autograd through collectives, DTensor, Ψ and a communication spy",
        "why autograd does not see dist.all_reduce, Megatron's Copy/Reduce as autograd functions, "
        "a TorchDispatchMode spy and the course's byte convention, DTensor placements and redistribute, "
        "ColwiseParallel/RowwiseParallel defaults, Ψ and bytes per parameter",
        "2 gloo processes",
        "2 gloo processes on the CPU (the mechanics are the same on NCCL)",
        "2 gloo processes on the CPU (the mechanics are the same on NCCL)",
        helpers=("collectives", "exercises", "launching"),
    ),
    Notebook(
        "02a",
        "02a_model_parallel_by_hand.ipynb",
        "Model parallel: the naive split and pipelining by hand",
        "naive split across devices, measured idle time, GPipe micro-batching by hand, the bubble, "
        "a like-with-like speed-up measurement",
        "stages as CPU processes (gloo)",
        "CPU processes for the multi-stage parts",
        "stages on cuda:0, cuda:1",
        helpers=(
            "exercises",
            "hardware",
            "labels",
            "launching",
            "pipeline",
        ),
    ),
    Notebook(
        "02b",
        "02b_pipelining_api.ipynb",
        "Pipelining with torch.distributed.pipelining",
        "PipelineStage, GPipe and 1F1B schedules, activation memory counted with saved-tensor hooks, "
        "the schedule simulator",
        "stages as CPU processes (gloo)",
        "CPU processes for the stages",
        "stages on cuda:0, cuda:1",
        helpers=(
            "exercises",
            "hardware",
            "launching",
            "pipeline",
        ),
    ),
    Notebook(
        "02c",
        "02c_tensor_parallel.ipynb",
        "Tensor parallelism",
        "AlexNet's split as column/row-parallel linear layers by hand, then DTensor and "
        "parallelize_module; bytes per layer; TP vs PP vs DP",
        "2 gloo processes",
        "2 gloo processes (NCCL needs a GPU per rank)",
        "one NCCL process per GPU",
        helpers=(
            "collectives",
            "exercises",
            "hardware",
            "labels",
            "launching",
        ),
    ),
    Notebook(
        "03a",
        "03a_data_parallel.ipynb",
        "nn.DataParallel from the inside",
        "the 10-step flow, the tutorial's split batches, scatter → replicate → parallel_apply → gather, "
        "dim=1 (optional)",
        "virtual devices",
        "virtual devices (nn.DataParallel on one GPU is a pass-through)",
        "real nn.DataParallel and torch.nn.parallel, checked against the virtual version",
        helpers=("data", "data_parallel", "exercises", "memory", "models"),
    ),
    Notebook(
        "03b",
        "03b_data_parallel_limits.ipynb",
        "Where DataParallel falls short",
        "first-device memory imbalance, output_device, parallel criterion, the GIL, num_workers and "
        "pin_memory",
        "virtual devices, memory simulated; threads and loaders measured",
        "virtual devices, memory simulated; loader sweep adds pin_memory",
        "real nn.DataParallel, memory measured",
        helpers=("data_parallel", "exercises", "hardware", "labels", "models"),
    ),
    Notebook(
        "04a",
        "04a_ddp_fundamentals.ipynb",
        "DDP fundamentals: processes, process groups, all-reduce",
        "one process per device, init_process_group, collectives, ring all-reduce by hand (bytes per "
        "rank), DDP's buckets, DDP gradients equal one process",
        "2–4 gloo processes",
        "2–4 gloo processes (NCCL needs a GPU per rank)",
        "one NCCL process per GPU",
        helpers=("exercises", "hardware", "launching", "models", "processes"),
    ),
    Notebook(
        "04b",
        "04b_ddp_in_practice.ipynb",
        "DDP in practice: sampler, torchrun, scaling",
        "DistributedSampler, a script run with torchrun and mp.spawn, unused parameters, measured "
        "scaling (compute- vs communication-bound), choosing DP vs DDP",
        "2 gloo processes, one core each",
        "2 gloo processes (NCCL needs a GPU per rank)",
        "one NCCL process per GPU, larger models for the scaling study",
        helpers=("data", "ddp", "exercises", "hardware", "labels", "launching", "models", "processes"),
    ),
    Notebook(
        "04c",
        "04c_ddp_at_scale.ipynb",
        "DDP at scale: accumulation, batch-size rules, BatchNorm, evaluation",
        "gradient accumulation with no_sync, linear LR scaling with warm-up, SyncBatchNorm vs per-rank "
        "BatchNorm, distributed evaluation and sampler padding",
        "2 gloo processes",
        "2 gloo processes (NCCL needs a GPU per rank)",
        "one NCCL process per GPU; real SyncBatchNorm",
        helpers=("data", "exercises", "hardware", "labels", "launching", "models"),
    ),
    Notebook(
        "04d",
        "04d_fault_tolerance.ipynb",
        "Fault tolerance and per-rank logs",
        "torchrun --max-restarts with a worker that crashes once, snapshot resume equal to an "
        "uninterrupted run, --tee and --local-ranks-filter",
        "torchrun with 2 gloo processes",
        "same (NCCL needs a GPU per rank)",
        "one NCCL process per GPU",
        helpers=(
            "ddp",
            "exercises",
            "hardware",
            "labels",
        ),
    ),
    Notebook(
        "04e",
        "04e_build_ddp.ipynb",
        "Build DDP: gradient buckets and overlap",
        "a DDP wrapper written by hand: broadcast, post-accumulate-grad hooks, buckets in reverse order, "
        "asynchronous all-reduces during backward; timed against no overlap and torch's DDP",
        "2 gloo processes",
        "2 gloo processes on the CPU (the lesson's timings are CPU timings)",
        "2 gloo processes on the CPU; the text says what NCCL over NVLink changes",
        helpers=("exercises", "hardware", "labels", "launching", "models"),
    ),
    Notebook(
        "04f",
        "04f_build_zero1.ipynb",
        "Build ZeRO-1: a sharded optimizer",
        "Adam's state counted; ZeRO-1 written by hand (each rank steps its slice, then all-gathers), equal "
        "to DDP + Adam and to the planner's bytes per rank; compared with torch's ZeroRedundancyOptimizer",
        "2 gloo processes",
        "2 gloo processes on the CPU (the lesson's timings are CPU timings)",
        "2 gloo processes on the CPU; the text says what NCCL over NVLink changes",
        helpers=("exercises", "hardware", "labels", "launching", "memory", "models"),
    ),
    Notebook(
        "05a",
        "05a_mixed_precision.ipynb",
        "Mixed precision",
        "fp16/bf16 number formats, loss scaling with GradScaler, Apex → torch.amp, bf16 autocast measured, "
        "MFU",
        "bf16 autocast timed; fp16 + GradScaler for correctness",
        "fp32, bf16 (if supported) and fp16 + GradScaler timed on cuda:0, with their MFU",
        "same on cuda:0",
        helpers=(
            "exercises",
            "data",
            "hardware",
            "labels",
            "models",
            "precision",
        ),
    ),
    Notebook(
        "05b",
        "05b_memory_and_sharding.ipynb",
        "Training memory, ZeRO and FSDP",
        "bytes per parameter, predictor vs tracker, ZeRO-1 and FSDP2 per rank, activation checkpointing",
        "ZeRO-1 and FSDP2 on 2 gloo processes",
        "sharding on 2 gloo CPU processes; checkpointing on cuda:0",
        "ZeRO-1/FSDP2 with NCCL on 2 GPUs",
        helpers=(
            "exercises",
            "hardware",
            "labels",
            "launching",
            "memory",
            "models",
            "precision",
        ),
    ),
    Notebook(
        "05c",
        "05c_fsdp2_in_practice.ipynb",
        "FSDP2 in practice",
        "fully_shard with MixedPrecisionPolicy and reshard_after_forward, sharded checkpoints with "
        "torch.distributed.checkpoint loaded at another world size",
        "2 gloo processes",
        "2 gloo processes (NCCL needs a GPU per rank); the 1-process load on cuda:0",
        "one NCCL process per GPU",
        helpers=(
            "collectives",
            "exercises",
            "labels",
            "launching",
        ),
    ),
    Notebook(
        "05d",
        "05d_parallelism_planner.ipynb",
        "Planning a parallel layout",
        "memory and communication per step of DP, ZeRO-1/2/3, TP, PP and their combinations, from the "
        "Playbook's formulas, the bytes a GPU sends per step; optional: the state estimate against real runs",
        "planner + checks on 2 gloo processes",
        "same",
        "same; GPU memory read from the device",
        helpers=(
            "exercises",
            "labels",
            "launching",
            "memory",
            "planner",
        ),
    ),
    Notebook(
        "05e",
        "05e_sequence_and_context_parallel.ipynb",
        "Sequence and context parallelism",
        "Megatron sequence parallelism by hand (all-gather / reduce-scatter along the sequence) and with "
        "torch's SequenceParallel; online softmax and ring attention over gloo ranks; the planner's CP",
        "2 and 3 gloo processes",
        "2 and 3 gloo processes on the CPU",
        "2 and 3 gloo processes on the CPU; torch's context_parallel needs CUDA (Going deeper)",
        helpers=("collectives", "exercises", "labels", "launching", "planner"),
    ),
    Notebook(
        "05f",
        "05f_expert_parallel.ipynb",
        "Expert parallelism: routing tokens with all-to-all",
        "a mixture-of-experts layer (top-1/top-2 router, gates, load, capacity factor), expert parallelism "
        "by hand with all_to_all_single (counts, dispatch, combine, a differentiable all-to-all) equal to "
        "the unsplit layer; memory and traffic per rank",
        "2 gloo processes",
        "2 gloo processes on the CPU (the lesson is the routing)",
        "2 gloo processes on the CPU; the text says what the all-to-all costs over NVLink and between nodes",
        helpers=("exercises", "launching"),
    ),
    Notebook(
        "06a",
        "06a_search_methods.ipynb",
        "Hyperparameter search methods",
        "what to tune, data vs tuning, grid vs random vs Bayesian (Optuna TPE) on equal budgets, BOHB",
        "all on CPU",
        "all on CPU",
        "all on CPU",
        helpers=(
            "exercises",
            "hardware",
            "labels",
            "tuning",
        ),
        extra="search",
    ),
    Notebook(
        "06b",
        "06b_ray_tune.ipynb",
        "Ray Tune and ASHA",
        "Tune trainables, search spaces, ASHA rungs, best trial at equal budget, checkpoints (load the "
        "chosen model, resume a crashed trial), a local Ray cluster; optional: when early stopping pays",
        "Ray on CPU",
        "fractional GPUs per trial",
        "trials spread over GPUs",
        helpers=(
            "exercises",
            "hardware",
            "labels",
            "processes",
            "tuning",
        ),
        extra="tune",
    ),
    Notebook(
        "07a",
        "07a_memory_problems.ipynb",
        "Memory problems: OOM, batch size, leaks",
        "monitoring memory, reproducing OOM safely, the batch-size search, finding a leak, del vs "
        "empty_cache",
        "OOM in a memory-capped child process",
        "OOM under a capped memory fraction",
        "same, per device",
        helpers=(
            "exercises",
            "hardware",
            "labels",
            "memory",
            "models",
            "troubleshoot",
        ),
    ),
    Notebook(
        "07b",
        "07b_errors_and_hangs.ipynb",
        "Errors and hangs",
        "device-side asserts, device/dtype mismatches, a hang turned into an error, DETAIL, stack dumps, "
        "diagnose(exc)",
        "errors on the CPU; hangs between 2 gloo processes",
        "same, plus a device-side assert in a child process",
        "same as 1 GPU (the hang demos stay on gloo)",
        helpers=(
            "exercises",
            "hardware",
            "labels",
            "launching",
            "troubleshoot",
        ),
    ),
    Notebook(
        "07c",
        "07c_pytorch_debugging_tools.ipynb",
        "PyTorch's own debugging tools",
        "memory snapshot and visualiser, memory_summary, expandable_segments, torch.profiler on a DDP "
        "step, a hang lab with timeouts and Flight Recorder",
        "memory picture from a profiled CPU run; profiler and hang lab on 2 gloo processes",
        "plus a real CUDA memory snapshot and the fragmentation demo on cuda:0, in child processes",
        "as with 1 GPU; the profiled DDP step on NCCL, one GPU per rank",
        helpers=(
            "ddp",
            "exercises",
            "hardware",
            "labels",
            "launching",
            "memory",
            "troubleshoot",
        ),
    ),
    Notebook(
        "08",
        "08_capstone.ipynb",
        "Capstone: digits end to end",
        "scikit-learn's digits trained with DDP, mixed precision, checkpoint/resume and a small Ray "
        "Tune search; accuracy, the run's MFU, and time per epoch for 1 vs 2 processes",
        "2 gloo processes with bf16 autocast; Ray on CPU",
        "2 gloo processes on the CPU; Tune trials on cuda:0 with bf16, or fp16 + GradScaler on a T4",
        "one NCCL process per GPU, bf16 or fp16 + GradScaler per GPU, MFU per GPU; trials spread over the "
        "GPUs",
        helpers=(
            "exercises",
            "hardware",
            "labels",
            "launching",
            "processes",
            "tuning",
        ),
        extra="capstone",
    ),
    Notebook(
        "08b",
        "08b_capstone_2d_mesh.ipynb",
        "Capstone, part 2: the same task on a 2-D mesh",
        "the digits classifier on a 2 × 2 (dp, tp) mesh: TP with parallelize_module inside, FSDP2 across; "
        "the same accuracy as DDP, state per rank measured against the planner",
        "DDP on 2 gloo processes, the 2-D mesh on 4",
        "the same on the CPU (NCCL needs a GPU per process)",
        "DDP with NCCL; the 2-D mesh with NCCL from 4 GPUs on, else on gloo",
        helpers=("exercises", "hardware", "labels", "launching", "planner"),
        extra="capstone",
    ),
)


#: Every module (or subpackage) of ``mgpu_helpers``, in the order a newcomer should read them: shared
#: building blocks first, then one per notebook topic. README's module table is generated from it.
MODULES: dict[str, str] = {
    "course": "the course map and this module table",
    "doctor": "the environment doctor: platform, Python, torch/CUDA builds, GPUs, bf16, peer access, an NCCL "
    "smoke test, start method, widget versions — and what the course does about each",
    "labels": '"measured / simulated / estimated" labels for every printed number',
    "exercises": "`grade(id, work)`: runs a graded exercise's grader, prints ⏳ / ✅ / ❌ with a hint",
    "graders": "one grader module per notebook (runs the student's code for real; solutions live in "
    "`solutions/`)",
    "hardware": "what this machine has (CPU, RAM, GPUs via torch.cuda / NVML / GPUtil) and the one "
    "backend rule, `choose_backend`; datasheet peak FLOP/s per GPU for MFU, `peak_flops`",
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
    "ddp": "`!torchrun` cells on loopback, capturing DDP's C++ warnings, c10d torchrun jobs",
    "precision": "number formats, step timing side by side, per-process state bytes",
    "tuning": "Ray Tune on loopback, a local Ray cluster, trainables, equal-budget studies "
    "(Ray needs the `tune` extra; 06a's Optuna alone, the `search` extra)",
    "interactive": "a live multi-rank group for `%%px` cells (ipyparallel engines in one process group) "
    "and its clean shutdown (needs the `interactive` extra)",
    "planner": "memory and communication per step for DP / ZeRO / TP / PP layouts (the Playbook's formulas) "
    "and the planner widget",
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
