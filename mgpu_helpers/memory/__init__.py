"""Used by notebooks 01, 03a, 03b, 04f, 05b, 05d, 07a and 07c (and the data-parallel, pipeline and
troubleshooting helpers):
memory by category — parameters, gradients, optimizer state, activations & other — measured exactly on
any device, estimated analytically, plotted and shown live.

* :mod:`.tracker` — :class:`MemoryTracker`, exact live-tensor accounting (a ``TorchDispatchMode``);
* :mod:`.virtual` — :func:`virtual_device`: several GPUs simulated on one CPU (notebook 03);
* :mod:`.estimate` — the one analytic estimator: :func:`estimate_training_memory` (from a real model and
  optimizer) and :func:`predict_memory` (from a parameter count, precision, optimizer, ZeRO stage), both
  returning a :class:`MemoryPrediction`;
* :mod:`.plots` — :func:`plot_memory_timeline`, :func:`plot_device_bars`, :data:`CATEGORY_COLORS`;
* :mod:`.widgets` — :class:`MemoryWidget` (live panel) and :func:`predictor_form` (ipywidgets 7.7 and 8);
* :mod:`.categories` — :data:`CATEGORIES`, :data:`CATEGORY_LABELS`, :func:`format_bytes`.

Importing this package imports torch but neither matplotlib nor ipywidgets: they are imported when
something is drawn or a widget is made.
"""

from .categories import CATEGORIES, CATEGORY_LABELS, MemorySample, format_bytes
from .estimate import (
    MemoryPrediction,
    TransformerShape,
    estimate_training_memory,
    predict_memory,
    transformer_activation_bytes,
)
from .plots import CATEGORY_COLORS, plot_device_bars, plot_memory_timeline
from .tracker import MemoryTracker
from .virtual import active_trackers, current_virtual_device, virtual_device
from .widgets import MemoryWidget, predictor_form

__all__ = [
    "CATEGORIES",
    "CATEGORY_COLORS",
    "CATEGORY_LABELS",
    "MemoryPrediction",
    "MemorySample",
    "MemoryTracker",
    "MemoryWidget",
    "TransformerShape",
    "active_trackers",
    "current_virtual_device",
    "estimate_training_memory",
    "format_bytes",
    "plot_device_bars",
    "plot_memory_timeline",
    "predict_memory",
    "predictor_form",
    "transformer_activation_bytes",
    "virtual_device",
]
