"""Used by notebooks 01, 01c, 02a, 02b, 02c, 04a, 04b, 04c, 04e, 04f, 05b, 05c, 05d, 05e, 05f, 07b, 07c,
08 and 08b: starting processes for a job from a notebook.

* :func:`launch` (:mod:`~mgpu_helpers.launching.notebook`, notebooks 02a, 02b, 04a, 04b, 05b, 07b and
  the graders) — run a function on N processes and get each rank's return value back;
* :func:`run_torchrun` (:mod:`~mgpu_helpers.launching.torchrun`, notebook 01 and grader 01.1) — real
  ``torchrun`` jobs, one or several simulated nodes, static or c10d rendezvous;
* ``python -m mgpu_helpers.launching.worker`` (:mod:`~mgpu_helpers.launching.worker`, the launcher
  tests and a terminal) — a torchrun worker that reports each rank's identity;
* :mod:`~mgpu_helpers.launching.agent`, :mod:`~mgpu_helpers.launching.loopback`,
  :mod:`~mgpu_helpers.launching.failures` — the torchrun agent wrapper, loopback-only stores, and
  failure reports.

Every job listens on 127.0.0.1 only, and every process it starts is gone when the call returns, raises,
is interrupted, or the kernel is killed.
"""

from .notebook import LaunchError, launch
from .torchrun import (
    RESULT_PREFIX,
    NodeRun,
    TorchrunError,
    gpu_slices,
    parse_results,
    run_torchrun,
    torchrun_command,
)

__all__ = [
    "RESULT_PREFIX",
    "LaunchError",
    "NodeRun",
    "TorchrunError",
    "gpu_slices",
    "launch",
    "parse_results",
    "run_torchrun",
    "torchrun_command",
]
