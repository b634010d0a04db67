"""Correct work that differs from the reference solution must pass its grader too: every ``VARIANTS``
entry of the reference-solution modules (``solutions/nbXX.py``), e.g. 07a.1's loop that keeps each
batch's predicted classes (1 KiB a step, no graph), which is not a leak."""

import pytest
from _scripts import graded, reference_solutions, solution_entries


@pytest.mark.parametrize(("exercise_id", "name"), solution_entries("VARIANTS"))
def test_grader_accepts_each_correct_variant(exercise_id, name):
    work = reference_solutions(exercise_id.split(".")[0]).VARIANTS[exercise_id][name]
    ok, printed = graded(exercise_id, *work)
    assert ok, printed
