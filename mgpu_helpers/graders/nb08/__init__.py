"""Used by notebook 08's exercises: the capstone's DDP training with a learning-rate schedule, run end to
end on 2 gloo processes with a crash and a resume (08.1), and a Ray Tune trainable that reports every
epoch with a checkpoint of the model, run by a real ``tune.Tuner`` with ASHA on the Ray the notebook is
connected to; the last reported accuracy is recomputed from the last checkpoint (08.2).

The graders build their own data from scikit-learn's digits (a fixed subset, no download), so the
student's code must read the data from what it is given, never from notebook globals.

Layout: :mod:`.scheduled` (08.1), :mod:`.trainable` (08.2) and :mod:`._common` (the data both use).
"""

from . import scheduled, trainable  # noqa: F401  (importing them registers the graders)
