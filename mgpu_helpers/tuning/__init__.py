"""Used by notebooks 06a (search methods), 06b (Ray Tune and ASHA) and 08 (capstone), and
``benchmarks/tuning.py``: the toy task, Ray on loopback, studies, plots.

The notebooks write ``from mgpu_helpers import tuning`` and ``tuning.<name>``.

* :mod:`.task` — :class:`ToyTask`, :func:`build_model`, :class:`TrialRun`, :func:`train_locally`
  (one trial's training, no Ray);
* :mod:`.trainables` — what Ray Tune runs: :func:`train_mlp`, the search spaces, ASHA's rungs,
  :class:`SimulatedCrash`, :func:`bohb_unavailable_reason`;
* :mod:`.ray_local` — Ray on 127.0.0.1 inside this process (:func:`local_ray`), :func:`quiet_logs`,
  :func:`ray_processes`;
* :mod:`.cluster` — :class:`LocalRayCluster`, a real ``ray start --head`` owned by this process;
* :mod:`.studies` — equal-budget studies of five methods with Optuna (``benchmarks/tuning.py``);
* :mod:`.regimes` — when ASHA pays: :data:`REGIMES` and the search loop of notebook 06b, section 3;
* :mod:`.plots` — :func:`epoch_progress`, :func:`results_table` and the notebook's plots.

Ray, Ray Tune, Optuna and pandas are the optional ``tune`` extra (``pip install "mgpu-course[tune]"``);
importing this package imports none of them: each function imports what it needs when called.
Ports, loopback checks and stopping processes live in :mod:`mgpu_helpers.processes`.
"""

from .cluster import LocalRayCluster
from .plots import (
    epoch_progress,
    plot_best_vs_epochs,
    plot_learning_curves,
    plot_search_layouts,
    results_table,
)
from .ray_local import local_ray, quiet_logs, ray_processes
from .regimes import REGIMES, Regime, SearchResult, asha_gain, sample_config, search
from .studies import (
    METHODS,
    Comparison,
    StudyTrace,
    compare_methods,
    grid_design,
    method_summary,
    run_study,
)
from .task import DIVERGED_LOSS, LR_RANGE, WIDTHS, ToyTask, TrialRun, build_model, train_locally
from .trainables import (
    NOTES_BATCH_SIZES,
    SimulatedCrash,
    asha_milestones,
    bohb_unavailable_reason,
    notes_search_space,
    optuna_search_space,
    train_mlp,
)

__all__ = [
    "DIVERGED_LOSS",
    "LR_RANGE",
    "METHODS",
    "REGIMES",
    "Regime",
    "SearchResult",
    "asha_gain",
    "sample_config",
    "search",
    "NOTES_BATCH_SIZES",
    "WIDTHS",
    "Comparison",
    "LocalRayCluster",
    "SimulatedCrash",
    "StudyTrace",
    "ToyTask",
    "TrialRun",
    "asha_milestones",
    "bohb_unavailable_reason",
    "build_model",
    "compare_methods",
    "epoch_progress",
    "grid_design",
    "local_ray",
    "method_summary",
    "notes_search_space",
    "optuna_search_space",
    "plot_best_vs_epochs",
    "plot_learning_curves",
    "plot_search_layouts",
    "quiet_logs",
    "ray_processes",
    "results_table",
    "run_study",
    "train_locally",
    "train_mlp",
]
