"""Used by the exercises of notebooks 00, 01, 02, 03, 04, 05, 06 and 07: automatic checks with a clear
pass/fail line and a hint.

An exercise cell leaves ``answer = None`` for the student to fill in and ends with::

    check("1a", answer, expected=8_008_008, hint="Adam keeps two fp32 tensors per parameter.")

which prints one of

* ``⏳ Exercise 1a: not answered yet — replace None with your answer. Hint: …``
* ``✅ Exercise 1a: correct.``
* ``❌ Exercise 1a: not quite (got 4004000). Hint: …``

and returns a :class:`CheckResult` that is truthy only when correct, so a solution cell can
``assert check(...)``; as the last line of a cell it displays nothing more. A missing or wrong answer
never raises, so an unanswered exercise does not stop "Run all"; a check that is itself written wrongly
(no name, negative tolerances, a ``func`` that is not a function, no cases) raises ``TypeError`` /
``ValueError`` saying what to pass.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["CheckResult", "check", "check_function"]


class CheckResult:
    """Outcome of a check: truthy when correct; shows nothing when it is a cell's last value."""

    def __init__(self, ok: bool) -> None:
        self.ok = ok

    def __bool__(self) -> bool:
        return self.ok

    def __repr__(self) -> str:
        return f"CheckResult(ok={self.ok})"

    def _ipython_display_(self) -> None:
        """The printed line already said everything; display nothing else."""


def _check_call(name: Any, hint: Any, **tolerances: Any) -> None:
    """Refuse a malformed check (the author's mistake, not the student's) with what to pass instead."""
    if not isinstance(name, str) or not name.strip():
        raise TypeError(f"name must be the exercise's label as a non-empty str such as '1a', not {name!r}")
    if not isinstance(hint, str):
        raise TypeError(f"hint must be a str (may be empty), not {type(hint).__name__}")
    for key, value in tolerances.items():
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise TypeError(f"{key} must be a number such as 1e-6, not {value!r}")
        if not 0 <= value < math.inf:
            raise ValueError(f"{key} must be a finite tolerance >= 0 such as 1e-6, not {value}")


def _close(got: Any, expected: Any, rel_tol: float, abs_tol: float) -> bool:
    if isinstance(expected, bool) or isinstance(got, bool):
        return got is expected
    if isinstance(expected, int | float) and isinstance(got, int | float):
        return math.isclose(float(got), float(expected), rel_tol=rel_tol, abs_tol=abs_tol)
    if isinstance(expected, list | tuple) and isinstance(got, list | tuple):
        return len(got) == len(expected) and all(
            _close(g, e, rel_tol, abs_tol) for g, e in zip(got, expected, strict=True)
        )
    if isinstance(expected, str) and isinstance(got, str):
        return got.strip().lower() == expected.strip().lower()
    return bool(got == expected)


def check(
    name: str,
    answer: Any,
    expected: Any,
    *,
    hint: str,
    rel_tol: float = 1e-6,
    abs_tol: float = 0.0,
) -> CheckResult:
    """Compare a student's ``answer`` with ``expected`` and print pass/fail with a hint.

    Numbers compare with ``math.isclose(rel_tol, abs_tol)``, strings without case or surrounding
    spaces, lists and tuples element-wise, anything else with ``==``. ``None`` means "not answered".

    Args:
        name: the exercise's label, e.g. ``"1a"``.
        answer: the student's answer; None when not answered yet.
        expected: the right answer.
        hint: what to think about, printed unless correct.
        rel_tol, abs_tol: tolerances (>= 0) for numbers, as in ``math.isclose``.
    """
    _check_call(name, hint, rel_tol=rel_tol, abs_tol=abs_tol)
    if answer is None:
        print(f"⏳ Exercise {name}: not answered yet — replace None with your answer. Hint: {hint}")
        return CheckResult(False)
    try:
        ok = _close(answer, expected, rel_tol, abs_tol)
    except Exception as exc:  # a malformed answer is feedback, not a crash
        print(
            f"❌ Exercise {name}: could not compare your answer ({type(exc).__name__}: {exc}). Hint: {hint}"
        )
        return CheckResult(False)
    if ok:
        print(f"✅ Exercise {name}: correct.")
    else:
        print(f"❌ Exercise {name}: not quite (got {answer!r}). Hint: {hint}")
    return CheckResult(ok)


def check_function(
    name: str,
    func: Callable[..., Any] | None,
    cases: list[tuple[tuple[Any, ...], Any]],
    *,
    hint: str,
    rel_tol: float = 1e-6,
) -> CheckResult:
    """Call the student's ``func`` on each ``(args, expected)`` case; report the first mismatch.

    Args:
        name: the exercise's label, e.g. ``"2"``.
        func: the student's function; None when not written yet.
        cases: at least one ``(args, expected)`` pair, ``args`` a tuple of positional arguments.
        hint: what to think about, printed unless correct.
        rel_tol: relative tolerance (>= 0) for numbers.
    """
    _check_call(name, hint, rel_tol=rel_tol)
    if isinstance(cases, str) or not isinstance(cases, Sequence) or not cases:
        raise ValueError("cases must be a non-empty list of (args, expected) pairs, e.g. [((2, 3), 5)]")
    for i, case in enumerate(cases):
        if not (isinstance(case, tuple | list) and len(case) == 2 and isinstance(case[0], tuple)):
            raise TypeError(
                f"cases[{i}] must be an (args, expected) pair, args a tuple, e.g. ((2, 3), 5); got {case!r}"
            )
    if func is not None and not callable(func):
        raise TypeError(
            f"func must be a function (a def or a lambda) or None, not {type(func).__name__}: "
            "pass the function itself, not the result of calling it"
        )
    if func is None:
        print(f"⏳ Exercise {name}: not answered yet — write the function. Hint: {hint}")
        return CheckResult(False)
    for args, expected in cases:
        try:
            got = func(*args)
        except Exception as exc:
            print(
                f"❌ Exercise {name}: calling it with {args} raised {type(exc).__name__}: {exc}. Hint: {hint}"
            )
            return CheckResult(False)
        if not _close(got, expected, rel_tol, 0.0):
            print(f"❌ Exercise {name}: for input {args} expected {expected!r}, got {got!r}. Hint: {hint}")
            return CheckResult(False)
    print(f"✅ Exercise {name}: correct on all {len(cases)} cases.")
    return CheckResult(True)
