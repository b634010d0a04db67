"""Used by notebook 00 (through :mod:`mgpu_helpers.course`). The course map's data: one :class:`Notebook` per
notebook, in teaching order, with what it does on CPU, one GPU and several GPUs, the helper modules it
imports and the extra it needs (tests keep them in step with the notebooks).
"""

from __future__ import annotations

from .notebook import Notebook

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
        helpers=("data", "exercises", "figures", "hardware", "launching", "memory", "models", "shell"),
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
        helpers=("exercises", "interactive"),
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
        helpers=("exercises", "hardware", "labels", "launching", "pipeline"),
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
        helpers=("exercises", "hardware", "launching", "pipeline"),
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
        helpers=("collectives", "exercises", "hardware", "labels", "launching"),
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
        helpers=("ddp", "exercises", "hardware", "labels", "shell"),
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
        helpers=("collectives", "exercises", "hardware", "launching", "memory", "models"),
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
        helpers=("exercises", "data", "hardware", "labels", "models", "precision"),
    ),
    Notebook(
        "05b",
        "05b_memory_and_sharding.ipynb",
        "Training memory, ZeRO and FSDP",
        "bytes per parameter, predictor vs tracker, ZeRO-1 and FSDP2 per rank, activation checkpointing",
        "ZeRO-1 and FSDP2 on 2 gloo processes",
        "sharding on 2 gloo CPU processes; checkpointing on cuda:0",
        "ZeRO-1/FSDP2 with NCCL on 2 GPUs",
        helpers=("exercises", "hardware", "labels", "launching", "memory", "models", "precision"),
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
        helpers=("collectives", "exercises", "labels", "launching"),
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
        helpers=("exercises", "labels", "launching", "memory", "planner"),
    ),
    Notebook(
        "05e",
        "05e_sequence_and_context_parallel.ipynb",
        "Sequence and context parallelism",
        "Megatron sequence parallelism by hand (all-gather / reduce-scatter along the sequence); online "
        "softmax and ring attention over gloo ranks, its backward ring counted; the planner's CP",
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
        helpers=("collectives", "exercises", "launching"),
    ),
    Notebook(
        "05g",
        "05g_scale_lab.ipynb",
        "The scale lab: one rank of a 1,024-GPU job",
        "torch's fake process-group backend, a Llama 3 block on meta, bytes per rank counted storage by "
        "storage; DP, ZeRO-1 (torch's whole-tensor partition), ZeRO-2/3 (FSDP2), TP (a per-projection plan "
        "sends 1.75×), TP × FSDP, a pipeline stage and context parallelism (Llama 3's all-gathered K/V) "
        "at 256 ranks and 70B on 1,024, each equal to the planner or the difference counted; an exact "
        "activation formula for a Llama block",
        "one process as rank 3 of 256 or 1,024, tensors on the CPU",
        "the same, on the CPU (the fake backend has no GPU side; bytes do not depend on the device)",
        "the same, on the CPU",
        helpers=("collectives", "exercises", "planner", "scale"),
    ),
    Notebook(
        "05h",
        "05h_rooflines_and_step_time.ipynb",
        "Step time from rooflines: what bounds a GPU, and how busy it is",
        "datasheet peaks, memory bandwidths and links from the T4 to the B200, each GPU's ridge point; the "
        "roofline of a matrix product (decoding memory-bound, training compute-bound); a 70B layout's step "
        "time estimated with and without overlap, its critical path and MFU; Llama 3 405B's published MFU; "
        "FP8 e4m3 scaling and an FP8 matrix product (torch._scaled_mm), run on the CPU",
        "all of it: arithmetic on datasheet numbers; FP8 casts and the FP8 product on the CPU",
        "the same, on the CPU (every machine prints the same numbers)",
        "the same",
        helpers=("exercises", "hardware", "labels", "planner"),
    ),
    Notebook(
        "06a",
        "06a_search_methods.ipynb",
        "Hyperparameter search methods",
        "what to tune, data vs tuning, grid vs random vs Bayesian (Optuna TPE) on equal budgets, BOHB",
        "all on CPU",
        "all on CPU",
        "all on CPU",
        helpers=("exercises", "hardware", "labels", "tuning"),
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
        helpers=("exercises", "hardware", "labels", "processes", "tuning"),
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
        helpers=("exercises", "hardware", "labels", "memory", "models", "troubleshoot"),
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
        helpers=("exercises", "hardware", "labels", "launching", "troubleshoot"),
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
        helpers=("ddp", "exercises", "hardware", "labels", "launching", "memory", "troubleshoot"),
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
        helpers=("exercises", "hardware", "labels", "launching", "processes", "tuning"),
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
