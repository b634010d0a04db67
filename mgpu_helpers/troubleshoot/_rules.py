"""Used by notebook 07b (errors and hangs), §5, through :func:`~mgpu_helpers.troubleshoot.diagnose`:
the table of error kinds it recognises — message patterns, a title, what it means, next steps.

Rules are tried in order and the first whose pattern matches wins (a device-side assert is reported
as an index error even though its text may also mention CUDA).
"""

from __future__ import annotations

from dataclasses import dataclass

from .oom import _OOM_PATTERNS


@dataclass(frozen=True)
class _Rule:
    """One kind of error: the patterns that identify it and the advice for it."""

    kind: str
    patterns: tuple[str, ...]
    title: str
    explanation: str
    next_steps: tuple[str, ...]


_RULES: tuple[_Rule, ...] = (
    _Rule(
        "index_out_of_range",
        (
            r"device-side assert",
            r"Target -?\d+ is out of bounds",
            r"index out of range",
            r"index -?\d+ is out of bounds",
            r"Assertion `t >= 0 && t < n_classes` failed",
            r"srcIndex < srcSelectDimSize",
        ),
        "An index is outside the tensor it indexes (on a GPU: a device-side assert)",
        "Typically a class label >= the number of classes (or negative) in cross_entropy, or a token id "
        ">= the embedding size. On a GPU the kernel only records an assert, so the message is vague and "
        "may point at a later line.",
        (
            "Check the indices against the size they index: labels in [0, num_classes) for cross_entropy, "
            "token ids in [0, num_embeddings) for an embedding (e.g. assert y.min() >= 0 and y.max() < C).",
            "Rerun the failing step on the CPU for a readable message, or on the GPU with "
            "CUDA_LAUNCH_BLOCKING=1 so the traceback points at the failing operation.",
            "After a device-side assert the process's CUDA context is broken: restart the kernel/process.",
        ),
    ),
    _Rule(
        "out_of_memory",
        _OOM_PATTERNS,
        "Out of memory",
        "An allocation failed: the step needs more memory than the device has free right now. The line in "
        "the traceback is only where the last allocation happened, not what filled the memory.",
        (
            "Halve the batch size (down to 1 to see whether the model fits at all); a grow-then-bisect "
            "search (notebook 07a §3) finds the largest that fits.",
            "Clean up before retrying: drop references (del; keep the message, not the exception), "
            "gc.collect(), torch.cuda.empty_cache(); check memory is back at its baseline.",
            "If memory grows every step, look for tensors kept across steps: total += loss -> loss.item(); "
            "evaluate under torch.no_grad().",
            "Need less per sample: mixed precision (torch.autocast), gradient checkpointing, or sharding "
            "across GPUs (FSDP/ZeRO).",
        ),
    ),
    _Rule(
        "device_mismatch",
        (
            r"Expected all tensors to be on the same device",
            r"is not on the expected device",
            r"found at least two devices",
            r"Input type \(torch\.cuda\.\w+\) and weight type \(torch\.[A-Z]\w*\)",
            r"Input type \(torch\.[A-Z]\w*\) and weight type \(torch\.cuda\.\w+\)",
        ),
        "Tensors on different devices meet in one operation",
        "Every operation needs all of its tensors on one device; one of them (often the labels, a newly "
        "created tensor, or the model) was left on another.",
        (
            "Move the odd one out with .to(device): inputs and labels every batch; the model once "
            "(model.to(device) moves its parameters in place), before creating the optimizer.",
            "Create new tensors where they are used: torch.zeros(n, device=x.device).",
            "In multi-GPU code pick the GPU from the local rank: torch.cuda.set_device(local_rank), "
            "device = f'cuda:{local_rank}'.",
        ),
    ),
    _Rule(
        "dtype_mismatch",
        (
            r"same dtype",
            r"expected scalar type \w+ but found \w+",
            r"expected target dtype",
            r"Found dtype \w+ but expected \w+",
            r"Input type \(.+\) and (weight|bias) type \(.+\) should be the same",
            r"result type \w+ can't be cast to the desired output type",
        ),
        "Tensors of different dtypes meet in one operation",
        "Matrix products and layers need matching floating dtypes (float32 vs float64 is the classic: NumPy "
        "arrays default to float64), and cross_entropy needs int64 class labels.",
        (
            "Convert the input to the model's dtype: x.to(model.weight.dtype), or "
            "torch.from_numpy(a).float() for NumPy data.",
            "Class labels must be int64: y.long().",
            "For mixed precision let torch.autocast choose the dtypes instead of calling .half() on parts.",
        ),
    ),
    _Rule(
        "collective_mismatch",
        (
            r"Detected mismatch between collectives",
            r"CollectiveFingerPrint",
        ),
        "Ranks called different collectives (or the same one with different shapes or dtypes)",
        "With TORCH_DISTRIBUTED_DEBUG=DETAIL every collective first compares a fingerprint across the ranks "
        "(kind, sequence number, shapes, dtypes); here they disagreed. Without DETAIL the same bug hangs "
        "until the timeout, or corrupts data when only the shapes differ.",
        (
            "Read both fingerprints in the message: which op, which shapes, on which rank.",
            "Make every rank call the same collectives in the same order with the same shapes: no "
            "rank-dependent `if` around a collective; reduce per-rank statistics of a fixed shape (e.g. "
            "[sum, count]) instead of one tensor per batch.",
            "Keep DETAIL for debugging only: the check costs an extra exchange per collective.",
        ),
    ),
    _Rule(
        "distributed_timeout",
        (
            r"Timed out waiting \d+ ?ms",
            r"Watchdog caught collective operation timeout",
            r"failed to pass monitoredBarrier",
            r"Socket Timeout",
            r"DistStoreError",
            r"(collective|barrier|rendezvous|store|gloo|nccl)[^\n]*timed? ?out|timed? ?out[^\n]*(collective|"
            r"barrier|rendezvous|store|gloo|nccl)",
        ),
        "A distributed operation timed out: some rank never joined",
        "A collective (all_reduce, barrier, ...) waits until every rank calls it. One rank did not, because "
        "it crashed, is stuck elsewhere, or took a different code path; the timeout turned the hang into "
        "this error.",
        (
            "Make every rank call the same collectives in the same order: no rank-dependent `if` around "
            "all_reduce/barrier, and the same number of batches per rank (DistributedSampler, drop_last).",
            "Find the missing rank: dist.monitored_barrier() (gloo) names it; TORCH_DISTRIBUTED_DEBUG=DETAIL "
            "logs collectives; NCCL_DEBUG=INFO for NCCL. Read every rank's log, not only rank 0's.",
            "While debugging pass a short init_process_group(timeout=timedelta(seconds=...)), so that a "
            "hang fails fast instead of waiting the default 10 minutes (NCCL) or 30 minutes (gloo).",
            "If it is the rendezvous that timed out: check MASTER_ADDR/MASTER_PORT, the firewall, and that "
            "every node was started.",
        ),
    ),
    _Rule(
        "unpicklable_target",
        (
            r"Can't get attribute '[^']+' on <module",
            r"Can't (pickle|get) local object",  # 3.13 says "get" (exceptions are told by type too)
            r"Can't pickle <function <lambda>",
            r"attribute lookup \S+ on __main__ failed",
            r"cannot pickle '[^']+' object",
        ),
        "A worker function or argument could not be pickled for a new process",
        "spawn (used by torch.multiprocessing.spawn and DataLoader workers on macOS/Windows, and needed with "
        "CUDA) starts a fresh Python that imports the function by module and name. A function defined in a "
        "notebook (module __main__), a lambda or a nested function cannot be found there.",
        (
            "Put the worker in a .py file and import it (from my_workers import train); pass settings as "
            "arguments (functools.partial works).",
            "Arguments must be picklable too: no open files, locks, generators or live connections; build "
            "them inside the worker.",
            "Or launch a script with torchrun instead of spawning from the notebook "
            "(mgpu_helpers.launching).",
        ),
    ),
    _Rule(
        "cuda_setup",
        (
            r"CUDNN_STATUS_NOT_INIT",
            r"CUDNN_STATUS_\w+",
            r"driver version is insufficient",
            r"no kernel image is available",
            r"Found no NVIDIA driver",
            r"Torch not compiled with CUDA",
            r"CUDA initialization",
            r"Cannot re-initialize CUDA in forked subprocess",
            r"NVML_SUCCESS == r",
        ),
        "CUDA could not start (driver, toolkit or library problem)",
        "The GPU libraries failed before any real work: the NVIDIA driver, the CUDA runtime PyTorch was "
        "built with and cuDNN must fit together. CUDNN_STATUS_NOT_INIT usually means cuDNN could not "
        "initialise: a version mismatch, or no GPU memory left when it started.",
        (
            "Compare versions: nvidia-smi shows the driver and the newest CUDA it supports; "
            "torch.version.cuda and torch.backends.cudnn.version() must not need newer.",
            "Reinstall torch from the index that matches the driver (pip install torch --index-url "
            "https://download.pytorch.org/whl/cu1XX); do not mix conda and pip CUDA libraries.",
            "Check for other processes filling the GPU (nvidia-smi) and restart the runtime; 'no kernel "
            "image' means the build does not support this GPU model.",
            "'Cannot re-initialize CUDA in forked subprocess': start workers with spawn, or touch CUDA only "
            "inside the workers.",
        ),
    ),
)

_UNKNOWN = _Rule(
    "unknown",
    (),
    "Not a pattern this helper knows",
    "Read the message from the bottom: the last line names the error, the deepest frame in your own code "
    "is usually where to look.",
    (
        "Reproduce with a tiny batch on the CPU: errors there are raised where they happen, with readable "
        "messages.",
        "On a GPU rerun with CUDA_LAUNCH_BLOCKING=1 so the traceback points at the failing operation.",
        "Search the exact last line of the message in the PyTorch forums and GitHub issues.",
    ),
)
