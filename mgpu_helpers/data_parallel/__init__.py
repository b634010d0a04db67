"""Used by notebooks 03a and 03b (data parallelism). ``nn.DataParallel`` over virtual devices; loaders.

Without two GPUs, ``torch.nn.parallel`` cannot be watched (it refuses CPU tensors, and ``nn.DataParallel``
on a CPU just calls the module). This package rebuilds it with the same names and signatures over
*virtual devices* (``"vcuda:0"``, ``"vcuda:1"``, …: names for memory accounting, see
:func:`mgpu_helpers.memory.virtual_device`), with real threads, chunks and copies, so outputs and
gradients equal the real ones:

* :mod:`.devices` — device names, :func:`to_device`, :func:`chunk_sizes`, :func:`virtual_device_of`
* :mod:`.comm` — :func:`replicate`, :func:`scatter`, :func:`scatter_kwargs`, :func:`parallel_apply`,
  :func:`gather`
* :mod:`.modules` — :class:`VirtualDataParallel`, :class:`VirtualDataParallelModel`,
  :class:`DataParallelModel`, :class:`DataParallelCriterion`, and :func:`backend` (real GPUs when there
  are at least two, virtual devices otherwise)
* :mod:`.plots` — :class:`PhaseTimer`, :func:`plot_phases`, :func:`plot_peak_comparison`,
  :func:`draw_data_parallel_flow` (matplotlib is imported only when drawing)
* :mod:`.loaders` — :class:`SlowDataset`, a dataset whose items cost a known time to load

Usage: ``from mgpu_helpers import data_parallel as dp`` then ``dp.VirtualDataParallel(model, [0, 1])``.
"""

from .comm import gather, parallel_apply, replicate, scatter, scatter_kwargs
from .devices import chunk_sizes, current_device, device_name, to_device, virtual_device_of
from .loaders import SlowDataset
from .modules import (
    Backend,
    DataParallelCriterion,
    DataParallelModel,
    VirtualDataParallel,
    VirtualDataParallelModel,
    backend,
)
from .plots import PhaseTimer, draw_data_parallel_flow, plot_peak_comparison, plot_phases

__all__ = [
    "Backend",
    "DataParallelCriterion",
    "DataParallelModel",
    "PhaseTimer",
    "SlowDataset",
    "VirtualDataParallel",
    "VirtualDataParallelModel",
    "backend",
    "chunk_sizes",
    "current_device",
    "device_name",
    "draw_data_parallel_flow",
    "gather",
    "parallel_apply",
    "plot_peak_comparison",
    "plot_phases",
    "replicate",
    "scatter",
    "scatter_kwargs",
    "to_device",
    "virtual_device_of",
]
