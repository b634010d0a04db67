"""Every graded exercise: its reference solution (``solutions/nbXX.py``) passes its grader, a known-wrong
attempt fails it with feedback, unwritten work is reported as not written, and each notebook hands exactly
its registered exercises to ``grade``. Known shortcuts: tests/test_shortcuts.py; correct variants:
tests/test_grader_variants.py."""

import json
import pathlib
import re

import pytest
from _scripts import graded, reference_solutions

from mgpu_helpers.exercises import _MISSES as MISSES
from mgpu_helpers.exercises import exercises

ROOT = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]*_*.ipynb"))
ALL = exercises()
#: Graded on the Ray cluster that tests/test_tuning_ray.py starts once for its module, instead of
#: starting a private Ray here twice.
ON_SHARED_RAY = {"06b.1", "08.2"}
HERE = [e for e in ALL if e.id not in ON_SHARED_RAY]


@pytest.mark.parametrize("ex", HERE, ids=lambda e: e.id)
def test_reference_solution_passes_its_grader(ex):
    module = reference_solutions(ex.id.split(".")[0])
    ok, printed = graded(ex.id, *module.SOLUTIONS[ex.id])
    assert ok, printed
    assert printed.startswith(f"✅ Exercise {ex.id}")


#: Graders that train a real model for several epochs (about 12 s a run under CI's load): CI runs their
#: reference solutions; their wrong attempts run in the slow set (-m slow), as their shortcuts do.
SLOW = frozenset({"08.1"})


@pytest.mark.parametrize(
    "ex", [pytest.param(e, marks=[pytest.mark.slow] if e.id in SLOW else [], id=e.id) for e in HERE]
)
def test_grader_rejects_a_wrong_attempt_with_a_nudge_then_its_hint(ex):
    module = reference_solutions(ex.id.split(".")[0])
    MISSES.pop(ex.id, None)
    ok, printed = graded(ex.id, *module.WRONG[ex.id])
    assert not ok, f"the grader accepted a wrong attempt: {printed}"
    assert printed.startswith(f"❌ Exercise {ex.id}") and ex.hint not in printed, printed
    assert "hint=True" in printed, printed
    ok, printed = graded(ex.id, *module.WRONG[ex.id], hint=True)  # the recipe on request
    assert not ok and printed.startswith(f"❌ Exercise {ex.id}") and ex.hint in printed, printed


def test_unwritten_work_is_reported_as_not_written_with_its_task_and_no_recipe():
    def unwritten():
        raise NotImplementedError

    for ex in ALL:
        n_parts = len(reference_solutions(ex.id.split(".")[0]).SOLUTIONS[ex.id])
        ok, printed = graded(ex.id, *[unwritten] * n_parts)
        assert not ok and printed.startswith(f"⏳ Exercise {ex.id}"), printed
        assert ex.task in printed and ex.hint not in printed, printed


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_grades_exactly_its_exercises_and_shows_no_solution(path):
    number = path.name.split("_")[0]
    code = "\n".join(
        "".join(c["source"]) for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"
    )
    used = re.findall(r"\bgrade\(\s*\"(\d\d[a-z]?\.\d+)\"", code)
    registered = [e.id for e in ALL if e.id.split(".")[0] == number]
    assert len(registered) >= 2, "every notebook has at least two graded coding exercises"
    assert sorted(used) == sorted(registered), "grade(...) calls and registered graders disagree"
    assert "solutions" not in code, "the notebook must not import or load reference solutions"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_saved_outputs_of_exercises_show_the_task_and_no_recipe(path):
    """Under each grade(...) call the committed notebook shows the ⏳ state: the exercise's task, never
    its hint (the recipe comes only on request or after repeated misses) and never a ✅ / ❌."""
    by_id = {e.id: e for e in ALL}
    for cell in json.loads(path.read_text())["cells"]:
        ids = re.findall(r"\bgrade\(\s*\"(\d\d[a-z]?\.\d+)\"", "".join(cell["source"]))
        if cell["cell_type"] != "code" or not ids:
            continue
        shown = "".join("".join(o.get("text", "")) for o in cell.get("outputs", []))
        for exercise_id in ids:
            ex = by_id[exercise_id]
            assert f"⏳ Exercise {ex.id} ({ex.title}): not written yet. {ex.task}" in shown, shown
            assert ex.hint not in shown and "Hint:" not in shown, f"{ex.id}'s saved output shows its hint"
            assert "✅" not in shown and "❌" not in shown, shown
