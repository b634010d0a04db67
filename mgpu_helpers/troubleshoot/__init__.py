"""Used by notebook 07 (troubleshooting). Reproduce out-of-memory errors safely, find the largest batch
that fits, spot leaks, name an error.

Every OOM in the course happens inside a fence, so that it cannot take the notebook kernel down:

* :mod:`.capped_child` — CPU: :func:`run_with_memory_limit` runs a function in a child process whose
  address space is capped (``RLIMIT_AS``), returning a :class:`ChildResult`;
* :mod:`.cuda_cap` — GPU: :func:`cuda_memory_cap` lowers the allocator's memory fraction for a block.

On top of that:

* :mod:`.memory_state` — :func:`process_rss`, :func:`memory_snapshot`, :func:`free_memory`;
* :mod:`.oom` — :func:`is_oom`, :class:`TrainingStep`, :func:`reproduce_oom` (fail, recover, fit);
* :mod:`.batch_size` — :func:`search_max_batch_size` (grow ×2, then bisect), :func:`find_max_batch_size`
  (that search on a real training step, under a fence), :class:`BatchSizeSearch`, :class:`Probe`;
* :mod:`.leaks` — :func:`memory_growth`, :class:`MemoryGrowth`: does memory grow step after step?
* :mod:`.diagnose` — :func:`diagnose` turns an exception or error text into a :class:`Diagnosis`
  (:data:`KINDS`);
* :mod:`.hang` — :func:`hang_worker`: ``python -m mgpu_helpers.troubleshoot hang --timeout 2`` under
  torchrun is a two-rank job in which rank 1 never joins rank 0's ``all_reduce``.

matplotlib and psutil are imported only when used.
"""

from .batch_size import BatchSizeSearch, Probe, find_max_batch_size, search_max_batch_size
from .capped_child import ChildResult, run_with_memory_limit
from .cuda_cap import cuda_memory_cap
from .diagnose import KINDS, Diagnosis, diagnose
from .hang import hang_worker
from .leaks import MemoryGrowth, memory_growth
from .memory_state import free_memory, memory_snapshot, process_rss
from .oom import TrainingStep, is_oom, reproduce_oom

__all__ = [
    "KINDS",
    "BatchSizeSearch",
    "ChildResult",
    "Diagnosis",
    "MemoryGrowth",
    "Probe",
    "TrainingStep",
    "cuda_memory_cap",
    "diagnose",
    "find_max_batch_size",
    "free_memory",
    "hang_worker",
    "is_oom",
    "memory_growth",
    "memory_snapshot",
    "process_rss",
    "reproduce_oom",
    "run_with_memory_limit",
    "search_max_batch_size",
]
