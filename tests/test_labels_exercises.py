"""Number labels and exercise checks."""

import pytest

from mgpu_helpers.labels import estimated, measured, simulated


def test_labels_say_how_a_number_was_obtained():
    assert (
        str(estimated(16_016_008, "B", how="params + grads + Adam"))
        == "16,016,008 B (estimated: params + grads + Adam)"
    )
    assert (
        str(simulated(2.5, "GiB", what="4 GPUs accounted on CPU"))
        == "2.5 GiB (simulated: 4 GPUs accounted on CPU)"
    )
    assert str(measured(0.1234, "s", on="CPU: test, 2 cores")) == "0.123 s (measured on CPU: test, 2 cores)"
    assert "measured on" in str(measured(1.0, "s"))  # defaults to this machine's hardware label


def test_measured_defaults_to_this_machines_hardware_label():
    from mgpu_helpers.hardware import hardware_label

    assert measured(2, "s").detail == hardware_label()


# --- graded exercises ---------------------------------------------------------------------------------

import mgpu_helpers.exercises as exercises_module
from mgpu_helpers.exercises import Wrong, exercise, grade


@exercise(
    "98z.1",
    "sum of squares",
    task="a function of a list of numbers returning the sum of their squares; checked on 3 lists.",
    hint="square each element, then add",
)
def _grade_sum_of_squares(fn):
    for xs in ([1, 2, 3], [], [-2]):
        if fn(xs) != sum(x * x for x in xs):
            raise Wrong(f"for {xs} your function returned {fn(xs)!r}.")
    return "checked on 3 lists"


def test_grade_reports_unwritten_correct_wrong_and_crashing_work(capsys):
    def unwritten(xs):
        raise NotImplementedError

    exercises_module._MISSES.pop("98z.1", None)
    assert not grade("98z.1", unwritten)
    assert capsys.readouterr().out.startswith("⏳ Exercise 98z.1 (sum of squares): not written yet")
    assert grade("98z.1", lambda xs: sum(x * x for x in xs))
    assert capsys.readouterr().out == "✅ Exercise 98z.1 (sum of squares): correct — checked on 3 lists\n"
    assert not grade("98z.1", lambda xs: sum(xs))
    out = capsys.readouterr().out
    assert out.startswith("❌") and "for [1, 2, 3] your function returned 6" in out
    assert not grade("98z.1", lambda xs: xs[len(xs)] ** 2)
    out = capsys.readouterr().out
    assert "your code raised IndexError: list index out of range." in out


def test_hints_come_in_steps_task_then_nudge_then_recipe(capsys):
    """⏳ shows the task and no recipe; the first two misses show only the grader's message; the third,
    or any call with hint=True, adds the hint."""

    def unwritten(xs):
        raise NotImplementedError

    exercises_module._MISSES.pop("98z.1", None)
    assert not grade("98z.1", unwritten)
    out = capsys.readouterr().out
    assert "sum of their squares; checked on 3 lists" in out and "square each" not in out
    assert "hint=True" in out
    assert not grade("98z.1", unwritten, hint=True)
    assert "Hint: square each element, then add" in capsys.readouterr().out
    for miss in (1, 2):
        assert not grade("98z.1", lambda xs: sum(xs))
        out = capsys.readouterr().out
        assert "your function returned 6" in out and "square each" not in out, (miss, out)
        assert f"after {3 - miss} more miss" in out
    assert not grade("98z.1", lambda xs: sum(xs))
    assert "Hint: square each element, then add" in capsys.readouterr().out  # the third miss
    exercises_module._MISSES.pop("98z.1", None)
    assert not grade("98z.1", lambda xs: sum(xs), hint=True)
    assert "Hint: square each element, then add" in capsys.readouterr().out  # on request, at once
    assert exercises_module._MISSES["98z.1"] == 1
    assert not grade("98z.1", unwritten)  # unwritten work is not a miss
    assert exercises_module._MISSES["98z.1"] == 1


def test_grade_with_the_wrong_number_of_arguments_says_so_instead_of_blaming_the_code(capsys):
    for work in ((), (sum, sum)):
        assert not grade("98z.1", *work)
        out = capsys.readouterr().out
        assert f"grade() got {len(work)} piece(s) of work after the id; it takes 1" in out
        assert "_grade" not in out and "TypeError" not in out


def test_static_methods_count_as_the_students_code(capsys):
    class Unwritten:  # an autograd.Function's forward / backward are static methods
        @staticmethod
        def square(xs):
            raise NotImplementedError

    class Forbidden:
        @classmethod
        def square(cls, xs):
            return answer_key(xs)

    assert not grade("98z.2", Unwritten.square) and capsys.readouterr().out.startswith("⏳")
    assert not grade("98z.2", Forbidden.square)
    assert "your code calls answer_key" in capsys.readouterr().out
    assert exercises_module._unwritten(Unwritten) and "answer_key" in exercises_module._names_used(Forbidden)


def test_grade_refuses_unknown_or_malformed_ids():
    with pytest.raises(ValueError, match="look like '04a.1'"):
        grade("4.1", print)
    with pytest.raises(ValueError, match="no graders for notebook 97"):
        grade("97.1", print)
    with pytest.raises(ValueError, match="registered twice"):
        exercise("98z.1", "other", task="t", hint="h")(lambda fn: None)
    with pytest.raises(TypeError, match="title, task and hint"):
        exercise("98z.3", "no task", task=" ", hint="h")


@exercise(
    "98z.2",
    "squares without the answer key",
    task="a function returning the squares of a list; checked on [3].",
    hint="square each element",
    forbid=("answer_key",),
)
def _grade_squares(fn):
    if fn([3]) != [9]:
        raise Wrong("for [3] your function did not return [9].")


def answer_key(xs):
    return [x * x for x in xs]


def test_grade_refuses_work_that_calls_a_forbidden_helper(capsys):
    assert not grade("98z.2", lambda xs: answer_key(xs))
    assert "your code calls answer_key, a ready-made answer to this exercise" in capsys.readouterr().out

    def nested(xs):
        return [(lambda x: answer_key([x])[0])(x) for x in xs]

    assert not grade("98z.2", nested)
    assert grade("98z.2", lambda xs: [x * x for x in xs])
