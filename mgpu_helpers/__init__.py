"""Helpers for the mgpu course: the plumbing behind the notebooks, laid out like the course.

Shared building blocks first, then one module or subpackage per notebook topic (README's module table
lists them with the notebooks that use them; ``mgpu_helpers.course.MODULES`` is its source):

* :mod:`~mgpu_helpers.course`, :mod:`~mgpu_helpers.labels`, :mod:`~mgpu_helpers.exercises` — the course
  map, "measured / simulated / estimated" labels, exercise checks
* :mod:`~mgpu_helpers.hardware` — what this machine has, and the one backend rule ``choose_backend``
* :mod:`~mgpu_helpers.processes` — free ports, loopback checks, stopping process trees
* :mod:`~mgpu_helpers.figures` — static figures, shared colours, node and rank diagrams
* :mod:`~mgpu_helpers.data`, :mod:`~mgpu_helpers.models` — small datasets and models, made locally
* :mod:`~mgpu_helpers.memory` — memory tracking by category, the analytic estimator, plots, the panel
* :mod:`~mgpu_helpers.launching` — ``launch`` from a notebook, ``run_torchrun`` jobs, the torchrun worker
* :mod:`~mgpu_helpers.exercises` — ``grade(id, work)`` for the graded exercises; graders in
  :mod:`~mgpu_helpers.graders`, one module per notebook
* one per topic: :mod:`~mgpu_helpers.pipeline` (02a, 02b), :mod:`~mgpu_helpers.data_parallel` (03a,
  03b), :mod:`~mgpu_helpers.ddp` (04b), :mod:`~mgpu_helpers.precision` (05a, 05b),
  :mod:`~mgpu_helpers.tuning` (06a with the ``search`` extra; 06b and 08 with the
  ``tune`` extra), :mod:`~mgpu_helpers.troubleshoot` (07a, 07b)

Importing the package imports none of these (and never Ray); import the module you need.
Run ``python -m mgpu_helpers`` to see this machine and what each notebook will do on it.
"""

import os as _os

# ``torch.cuda.is_available()`` then asks NVML instead of initialising the CUDA driver API, which would
# leave later *forked* processes unable to use CUDA ("Cannot re-initialize CUDA in forked subprocess")
# even though ``torch.cuda.is_initialized()`` stays False. The course's launcher never forks the kernel
# (mgpu_helpers.launching.server), but DataLoader workers and students' own code may; this keeps an
# innocent ``is_available()`` in a notebook cell from breaking them. (PyTorch's own switch; see
# torch/cuda/__init__.py.)
_os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")

__version__ = "0.1.0"
