"""Number labels and exercise checks."""

import pytest

from mgpu_helpers.exercises import check, check_function
from mgpu_helpers.labels import Labelled, estimated, measured, simulated


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


def test_check_pass_fail_and_unanswered(capsys):
    assert check("1", 8_008_008, 8_008_008, hint="h")
    assert "✅ Exercise 1: correct." in capsys.readouterr().out
    assert not check("1", 4_004_000, 8_008_008, hint="two states")
    out = capsys.readouterr().out
    assert "❌" in out and "two states" in out and "4004000" in out
    assert not check("1", None, 3, hint="h")
    assert "not answered yet" in capsys.readouterr().out


def test_check_compares_by_type():
    assert check("f", 0.30000001, 0.3, hint="", rel_tol=1e-6)
    assert not check("f", 0.31, 0.3, hint="")
    assert check("s", "  NCCL ", "nccl", hint="")
    assert check("l", [1, 2.0], (1, 2), hint="")
    assert not check("l", [1, 2], [1, 2, 3], hint="")
    assert not check("b", 1, True, hint="")  # a bool answer must be a bool
    assert not check("x", object(), 3, hint="")


def test_check_function(capsys):
    assert check_function("f", lambda m, p: (p - 1) / (m + p - 1), [((4, 2), 0.2), ((1, 4), 0.75)], hint="")
    assert not check_function("f", lambda m, p: 0.0, [((4, 2), 0.2)], hint="bubble")
    assert "expected 0.2" in capsys.readouterr().out
    assert not check_function("f", lambda m, p: 1 / 0, [((4, 2), 0.2)], hint="")
    assert "ZeroDivisionError" in capsys.readouterr().out
    assert not check_function("f", None, [((4, 2), 0.2)], hint="")
    assert "not answered yet" in capsys.readouterr().out


def _f(m, p):
    return m + p


@pytest.mark.parametrize(
    ("func", "args", "kwargs", "exc", "message"),
    [
        (measured, ("x", "s"), {"on": "CPU"}, TypeError, r"value must be a number such as 3.1, not 'x'"),
        (measured, (1.0, 5), {"on": "CPU"}, TypeError, r"unit must be a str such as 's'"),
        (
            measured,
            (1.0, "s"),
            {"on": ""},
            ValueError,
            r"measured number needs a detail: on= names the hardware",
        ),
        (measured, (True, "s"), {"on": "CPU"}, TypeError, r"value must be a number"),
        (simulated, (1.0, "GiB"), {"what": ""}, ValueError, r"simulated number needs a detail: what= names"),
        (simulated, (1.0, "GiB"), {"what": "   "}, ValueError, r"needs a detail"),
        (
            estimated,
            (1, "B"),
            {"how": ""},
            ValueError,
            r"estimated number needs a detail: how= names the formula",
        ),
        (estimated, (1, "B"), {"how": None}, ValueError, r"how= names the formula"),
        (Labelled, (1, "B", "guessed", "x"), {}, ValueError, r"kind must be one of"),
        (
            check,
            ("1", 3, 3),
            {"hint": "h", "rel_tol": -1e-6},
            ValueError,
            r"rel_tol must be a finite tolerance >= 0",
        ),
        (check, ("1", 3, 3), {"hint": "h", "abs_tol": float("nan")}, ValueError, r"abs_tol must be a finite"),
        (
            check,
            ("1", 3, 3),
            {"hint": "h", "rel_tol": "1e-6"},
            TypeError,
            r"rel_tol must be a number such as 1e-6",
        ),
        (
            check,
            ("", 3, 3),
            {"hint": "h"},
            TypeError,
            r"name must be the exercise's label as a non-empty str",
        ),
        (check, (1, 3, 3), {"hint": "h"}, TypeError, r"name must be the exercise's label"),
        (check, ("1", 3, 3), {"hint": None}, TypeError, r"hint must be a str"),
        (
            check_function,
            ("2", 42, [((1, 2), 3)]),
            {"hint": ""},
            TypeError,
            r"func must be a function .* not int",
        ),
        (
            check_function,
            ("2", _f(1, 2), [((1, 2), 3)]),
            {"hint": ""},
            TypeError,
            r"not the result of calling",
        ),
        (check_function, ("2", _f, []), {"hint": ""}, ValueError, r"cases must be a non-empty list"),
        (
            check_function,
            ("2", _f, [(1, 3)]),
            {"hint": ""},
            TypeError,
            r"cases\[0\] must be an \(args, expected\)",
        ),
        (
            check_function,
            ("2", _f, [((1, 2), 3)]),
            {"hint": "", "rel_tol": -1},
            ValueError,
            r"rel_tol must be",
        ),
    ],
)
def test_bad_inputs_are_refused_with_what_to_pass(func, args, kwargs, exc, message):
    with pytest.raises(exc, match=message):
        func(*args, **kwargs)


# --- graded exercises ---------------------------------------------------------------------------------

from mgpu_helpers.exercises import Wrong, exercise, grade  # noqa: E402


@exercise("98z.1", "sum of squares", hint="square each element, then add")
def _grade_sum_of_squares(fn):
    for xs in ([1, 2, 3], [], [-2]):
        if fn(xs) != sum(x * x for x in xs):
            raise Wrong(f"for {xs} your function returned {fn(xs)!r}.")
    return "checked on 3 lists"


def test_grade_reports_unwritten_correct_wrong_and_crashing_work(capsys):
    def unwritten(xs):
        raise NotImplementedError

    assert not grade("98z.1", unwritten)
    assert capsys.readouterr().out.startswith("⏳ Exercise 98z.1 (sum of squares): not written yet")
    assert grade("98z.1", lambda xs: sum(x * x for x in xs))
    assert capsys.readouterr().out == "✅ Exercise 98z.1 (sum of squares): correct — checked on 3 lists\n"
    assert not grade("98z.1", lambda xs: sum(xs))
    out = capsys.readouterr().out
    assert out.startswith("❌") and "for [1, 2, 3] your function returned 6" in out and "square each" in out
    assert not grade("98z.1", lambda xs: xs[len(xs)] ** 2)
    out = capsys.readouterr().out
    assert "your code raised IndexError" in out and "Hint: square each" in out


def test_grade_refuses_unknown_or_malformed_ids():
    with pytest.raises(ValueError, match="look like '04a.1'"):
        grade("4.1", print)
    with pytest.raises(ValueError, match="no graders for notebook 97"):
        grade("97.1", print)
    with pytest.raises(ValueError, match="registered twice"):
        exercise("98z.1", "other", hint="h")(lambda fn: None)
