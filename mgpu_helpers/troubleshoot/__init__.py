"""Used by notebooks 07a (memory problems), 07b (errors and hangs) and 07c, and by their graders: the plumbing
around the lessons, whose concept code (the OOM reproduction, the batch-size search, the hangs) is written
in the notebooks themselves.

Every OOM in the course happens inside a fence, so that it cannot take the notebook kernel down:

* :mod:`.capped_child` — CPU: :func:`run_with_memory_limit` runs a function in a child process whose
  address space is capped (``RLIMIT_AS``), returning a :class:`ChildResult`;
* :mod:`.cuda_cap` — GPU: :func:`cuda_memory_cap` lowers the allocator's memory fraction for a block.

On top of that:

* :mod:`.memory_state` — :func:`process_rss`, :func:`memory_snapshot`, :func:`free_memory`;
* :mod:`.oom` — :func:`is_oom`: does an exception mean "an allocation failed"?
* :mod:`.leaks` — :func:`memory_growth`, :class:`MemoryGrowth`: does memory grow step after step?
* :mod:`.diagnose` — :func:`diagnose` turns an exception or error text into a :class:`Diagnosis`
  (:data:`KINDS`); its table of patterns and advice is :mod:`._rules`;
* :mod:`.flight_recorder` — :func:`unmatched_collective`: the collective not every rank joined, from
  PyTorch's ``fr_trace`` analyser where it says so, else from the Flight Recorder dumps (notebook 07c).

matplotlib and psutil are imported only when used.
"""

from .capped_child import ChildResult, run_with_memory_limit
from .cuda_cap import cuda_memory_cap
from .diagnose import KINDS, Diagnosis, diagnose
from .flight_recorder import unmatched_collective
from .leaks import MemoryGrowth, memory_growth
from .memory_state import free_memory, memory_snapshot, process_rss
from .oom import is_oom

__all__ = [
    "KINDS",
    "ChildResult",
    "Diagnosis",
    "MemoryGrowth",
    "cuda_memory_cap",
    "diagnose",
    "free_memory",
    "is_oom",
    "memory_growth",
    "memory_snapshot",
    "process_rss",
    "run_with_memory_limit",
    "unmatched_collective",
]
