"""Helpers for the mgpu course: the plumbing behind the notebooks, one module per concern.

* :mod:`~mgpu_helpers.hardware` — what this machine has (CPU, RAM, GPUs via torch.cuda / NVML / GPUtil)
* :mod:`~mgpu_helpers.memory` — exact memory accounting by category on any device
* :mod:`~mgpu_helpers.widgets` — a live memory panel for training loops
* :mod:`~mgpu_helpers.data`, :mod:`~mgpu_helpers.models` — toy datasets and models, made locally
* :mod:`~mgpu_helpers.launch` — real torchrun jobs from a notebook, cleaned up afterwards
* :mod:`~mgpu_helpers.labels` — "measured / simulated / estimated" labels for numbers
* :mod:`~mgpu_helpers.exercises` — automatic checks for exercises
* :mod:`~mgpu_helpers.plotting`, :mod:`~mgpu_helpers.diagrams` — plots and drawn diagrams
* :mod:`~mgpu_helpers.launcher` — run a function on N processes from a notebook
* :mod:`~mgpu_helpers.pipeline` — pipeline stages as processes, measured timelines
* :mod:`~mgpu_helpers.schedules` — GPipe / 1F1B / interleaved schedule simulator
* :mod:`~mgpu_helpers.virtual_dp` — nn.DataParallel rebuilt over virtual devices
* :mod:`~mgpu_helpers.dataloading` — measured DataLoader sweeps (num_workers, pin_memory)
* :mod:`~mgpu_helpers.ddp` — c10d torchrun jobs, DDP throughput, per-rank plots
* :mod:`~mgpu_helpers.predictor` — per-GPU memory predictions (precision, optimizer, ZeRO stage)
* :mod:`~mgpu_helpers.precision` — number formats, per-process state bytes, side-by-side step timing
* :mod:`~mgpu_helpers.troubleshoot` — safe OOM reproduction, batch-size finder, ``diagnose(exc)``
* :mod:`~mgpu_helpers.tuning` — Ray Tune on loopback, trainables, equal-budget studies (imports Ray lazily)
* :mod:`~mgpu_helpers.course` — the course map

Importing the package imports none of these (and never Ray); import the module you need.
Run ``python -m mgpu_helpers`` to see this machine and what each notebook will do on it.
"""

__version__ = "0.1.0"
