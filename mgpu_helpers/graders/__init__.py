"""Used by the graded exercises of every notebook, through :func:`mgpu_helpers.exercises.grade`: one
module per notebook (``nb04a`` grades the ids ``"04a.*"``), each registering its graders with
:func:`mgpu_helpers.exercises.exercise`. A grader runs the student's code for real (processes,
autocast, Ray …) and raises :class:`~mgpu_helpers.exercises.Wrong` saying what is off — never the
answer. Reference solutions are in ``solutions/`` at the repository root, outside the notebooks.
"""

from __future__ import annotations

import pkgutil

#: The notebooks that have graders (module ``nb<number>`` each), found on disk.
NOTEBOOKS: tuple[str, ...] = tuple(
    sorted(m.name[2:] for m in pkgutil.iter_modules(__path__) if m.name.startswith("nb"))
)
