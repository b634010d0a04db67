"""Every known shortcut of a graded exercise is rejected: each ``SHORTCUTS`` entry of ``solutions/nbXX.py``
is work that gets the right numbers without doing the lesson (the grader's own case builders as an answer
key, torch's built-in instead of the by-hand piece, communicating everything, the whole batch on every
rank …), and its grader must print ❌. A file of its own, so that pytest-xdist's ``--dist loadfile`` runs
it beside the reference solutions' file, not after it. 06b.1 and 08.2 run on the shared Ray cluster of
tests/test_tuning_ray.py."""

import pytest
import test_solutions
from _scripts import graded, reference_solutions, solution_entries

#: Graded on the Ray cluster that tests/test_tuning_ray.py starts once for its module.
ON_SHARED_RAY = frozenset({"06b.1", "08.2"})
#: Graders that train a real model for several epochs per run (about 10 s each under CI's load): their
#: shortcuts run in the slow set (``python -m pytest -m slow tests/test_shortcuts.py``), which keeps
#: ``.ci/run`` within its budget; their reference solutions and wrong attempts stay in CI.
SLOW = test_solutions.SLOW


@pytest.mark.parametrize(
    ("exercise_id", "name"),
    solution_entries(
        "SHORTCUTS", skip=ON_SHARED_RAY, marks=lambda e: [pytest.mark.slow] if e in SLOW else []
    ),
)
def test_grader_rejects_each_known_shortcut(exercise_id, name):
    work = reference_solutions(exercise_id.split(".")[0]).SHORTCUTS[exercise_id][name]
    ok, printed = graded(exercise_id, *work)
    assert not ok, f"the grader accepted the shortcut {name!r}: {printed}"
    assert printed.startswith(f"❌ Exercise {exercise_id}"), printed
