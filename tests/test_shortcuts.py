"""Every known shortcut of a graded exercise is rejected: each ``SHORTCUTS`` entry of ``solutions/nbXX.py``
is work that gets the right numbers without doing the lesson (the grader's own case builders as an answer
key, torch's built-in instead of the by-hand piece, communicating everything, the whole batch on every
rank …), and its grader must print ❌. A file of its own, so that pytest-xdist's ``--dist loadfile`` runs
it beside the reference solutions' file, not after it. 06b.1 and 08.2 run on the shared Ray cluster of
tests/test_tuning_ray.py."""

import pytest
from _scripts import graded, reference_solutions

from mgpu_helpers.exercises import exercises

ON_SHARED_RAY = {"06b.1", "08.2"}
HERE = [e for e in exercises() if e.id not in ON_SHARED_RAY]


def _shortcuts() -> list[tuple[str, str]]:
    """(exercise id, shortcut name) for every ``SHORTCUTS`` entry of the reference-solution modules."""
    found = []
    for ex in HERE:
        module = reference_solutions(ex.id.split(".")[0])
        found += [(ex.id, name) for name in getattr(module, "SHORTCUTS", {}).get(ex.id, {})]
    return found


@pytest.mark.parametrize(("exercise_id", "name"), _shortcuts(), ids=lambda v: v)
def test_grader_rejects_each_known_shortcut(exercise_id, name):
    work = reference_solutions(exercise_id.split(".")[0]).SHORTCUTS[exercise_id][name]
    ok, printed = graded(exercise_id, *work)
    assert not ok, f"the grader accepted the shortcut {name!r}: {printed}"
    assert printed.startswith(f"❌ Exercise {exercise_id}"), printed
