"""Used by notebooks 00, 01, 02a, 02b, 02c, 03b, 04a, 04b, 04c, 04d, 04e, 04f, 05a, 05b, 05h, 06a, 06b, 07a,
07b, 07c, 08 and 08b (the others through the tuning and data-parallel helpers), by
``python -m mgpu_helpers``, the launchers and the benchmarks.
Describe the machine a notebook runs on (CPU, RAM and the NVIDIA GPUs, if any) and choose the
distributed backend for it.

Three libraries can tell us about GPUs and each fails in its own way, so all three are asked
and every answer (or failure) is kept as a sentence in ``NodeInfo.sources``:

* ``torch.cuda`` -- what *this* PyTorch build can use.
* ``nvml`` -- the NVIDIA driver library, through ``pynvml`` (package ``nvidia-ml-py``).
* ``gputil`` -- the ``GPUtil`` package, which parses the output of ``nvidia-smi``.

Fork safety
-----------
Code that forks worker processes (a DataLoader's workers, a student's own ``fork``; the course's launcher
never forks the kernel) breaks as soon as the parent process has touched CUDA ("Cannot re-initialize
CUDA in forked subprocess"). In PyTorch:

* ``torch.cuda.get_device_properties`` and ``torch.cuda.get_device_name`` (which calls it) run
  ``torch.cuda._lazy_init()`` and create the CUDA context.
* ``torch.cuda.mem_get_info(i)`` creates a context *on device i* (hundreds of MiB per GPU).
* ``torch.cuda.is_available()`` calls ``cudaGetDeviceCount`` unless
  ``PYTORCH_NVML_BASED_CUDA_CHECK=1`` is set; that does not create a context but does mark
  the process so that forked children may no longer use CUDA.
* ``torch.cuda.device_count()`` asks NVML first and stays fork-safe while NVML works.

So by default this package only calls ``torch.cuda.device_count()`` and reads names, memory
and utilisation from NVML (or GPUtil). Pass ``allow_cuda_init=True`` to
:func:`describe_node` to also ask torch (when NVML is missing, for example).
:func:`choose_backend` and :func:`recommended_device` make the same fork-safe check.

Importing this package is cheap: torch, psutil, pynvml and GPUtil are imported inside the
functions that need them.

Modules: :mod:`.sources` (host, NVML, GPUtil, torch queries), :mod:`.visible`
(``CUDA_VISIBLE_DEVICES``), :mod:`.node` (``GPUInfo``, ``NodeInfo``, ``describe_node``),
:mod:`.backend` (``choose_backend``, ``recommended_device``), :mod:`.report` (text table, labels),
:mod:`.peaks` (datasheet peak FLOP/s per GPU and format, for MFU in notebooks 05a and 08).
"""

from .backend import BACKENDS, choose_backend, recommended_device
from .node import GPUInfo, NodeInfo, describe_node
from .peaks import Peak, peak_flops, peak_for_name
from .report import format_node_table, hardware_label
from .sources import nvml_memory
from .visible import visible_gpu_count

__all__ = [
    "BACKENDS",
    "GPUInfo",
    "NodeInfo",
    "Peak",
    "choose_backend",
    "describe_node",
    "format_node_table",
    "hardware_label",
    "nvml_memory",
    "peak_flops",
    "peak_for_name",
    "recommended_device",
    "visible_gpu_count",
]
