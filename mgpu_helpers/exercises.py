"""Used by the exercises of every notebook: graded coding exercises (:func:`grade`).

**Graded exercises.** The student writes or repairs real code in the notebook and hands it to
:func:`grade` with the exercise's id; nothing in the cell gives the answer away::

    def ddp_step(rank, world_size):
        ...                          # the student's code
        raise NotImplementedError    # delete this line when done

    grade("04a.1", ddp_step)

The grader is a function in :mod:`mgpu_helpers.graders` (module ``nb04a`` for ids ``"04a.*"``),
registered with :func:`exercise`; it runs the student's code (often on real processes) and raises
:class:`Wrong` with a message that says *what* is off, never what the answer is. :func:`grade` prints

* ``⏳ Exercise 04a.1 (title): not written yet. <task>`` while the code still raises
  ``NotImplementedError`` (or an answer is still ``None``): what to write and how it is checked, not how,
* ``✅ Exercise 04a.1 (title): <what was checked>``, or
* ``❌ Exercise 04a.1 (title): <what is wrong>``: the grader's message, aimed at what failed. The
  exercise's hint (the recipe) follows only from the third failed attempt in a kernel, or at once with
  ``grade("04a.1", work, hint=True)``,

and returns a :class:`CheckResult` (truthy when correct). It never raises for the student's mistakes,
so "Run all" goes on. Reference solutions live outside the notebooks, in ``solutions/nbXX.py`` at the
repository root, and ``tests/test_solutions.py`` runs each through its grader (and checks that the
grader rejects a known-wrong attempt).
"""

from __future__ import annotations

import importlib
import inspect
import re
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from types import CodeType
from typing import Any

__all__ = [
    "CheckResult",
    "Exercise",
    "Wrong",
    "calls_during",
    "exercise",
    "exercises",
    "grade",
    "run_refusing",
]


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


# --- graded exercises -------------------------------------------------------------------------------

_ID = re.compile(r"^(\d\d[a-z]?)\.(\d+)$")


class Wrong(Exception):
    """Raised by a grader: the student's work ran but is not right; the message says what is off."""


@dataclass(frozen=True)
class Exercise:
    """One graded exercise: its id (``"04a.1"``), a short title, the task (what to write and how it is
    checked, shown while unwritten), the hint (how, shown on request or after repeated misses) and the
    grader function."""

    id: str
    title: str
    task: str
    hint: str
    grader: Callable[..., str | None]
    #: Names the student's code may not use: helpers that are the answer key (e.g. the package's own
    #: implementation of what the exercise asks for).
    forbid: tuple[str, ...] = ()


_REGISTRY: dict[str, Exercise] = {}
#: Failed attempts per exercise id in this Python process (a notebook's kernel): the hint comes with
#: the ``HINT_AFTER``-th.
_MISSES: dict[str, int] = {}
HINT_AFTER = 3


def exercise(
    exercise_id: str, title: str, *, task: str, hint: str, forbid: tuple[str, ...] = ()
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register the decorated function as the grader of ``exercise_id`` (e.g. ``"04a.1"``).

    ``task`` says what to write and how the grader checks it, never how to write it (it is what a
    saved notebook shows under an unwritten exercise); ``hint`` is the recipe, shown only when asked
    for or after repeated misses. The grader receives what the student passed to :func:`grade`,
    raises :class:`Wrong` (or lets the student's own exception through) when the work is not right,
    and may return a sentence saying what was checked, printed after ✅. ``forbid`` names helpers that
    would be the answer key (the package's own version of what the exercise asks for): work that uses
    one of them is not accepted.
    """
    if not isinstance(exercise_id, str) or not _ID.match(exercise_id):
        raise ValueError(f"exercise id must look like '04a.1' (notebook, dot, number), not {exercise_id!r}")
    texts = (title, task, hint)
    if not all(isinstance(t, str) and t.strip() for t in texts):
        raise TypeError("title, task and hint must be non-empty strings")

    def register(grader: Callable[..., Any]) -> Callable[..., Any]:
        if exercise_id in _REGISTRY and _REGISTRY[exercise_id].grader.__qualname__ != grader.__qualname__:
            raise ValueError(f"exercise {exercise_id} is registered twice")
        _REGISTRY[exercise_id] = Exercise(
            exercise_id, title.strip(), task.strip(), hint.strip(), grader, tuple(forbid)
        )
        return grader

    return register


def _load_graders(notebook: str) -> None:
    try:
        importlib.import_module(f"{__package__}.graders.nb{notebook}")
    except ModuleNotFoundError as exc:
        if exc.name != f"{__package__}.graders.nb{notebook}":
            raise
        raise ValueError(f"no graders for notebook {notebook}: is the exercise id right?") from None


def exercises(notebook: str | None = None) -> list[Exercise]:
    """The registered exercises of one notebook (``"04a"``) or, with None, of every notebook."""
    from . import graders

    wanted = [notebook] if notebook else list(graders.NOTEBOOKS)
    for name in wanted:
        _load_graders(name)
    return sorted(
        (e for e in _REGISTRY.values() if e.id.split(".")[0] in wanted),
        key=lambda e: (e.id.split(".")[0], int(e.id.split(".")[1])),
    )


def _unwritten(work: Any) -> bool:
    """True while the student's function still contains ``raise NotImplementedError`` (or is None)."""
    if work is None:
        return True
    code = getattr(work, "__code__", None)
    if code is None and isinstance(work, type):  # a class: look at the methods it defines itself
        return any(_unwritten(f) for f in _methods(work))
    return code is not None and "NotImplementedError" in code.co_names


def _methods(cls: type) -> list[Any]:
    """The functions a class defines itself, static and class methods included (an autograd.Function's
    forward and backward are static methods, which have no ``__code__`` of their own)."""
    import inspect

    found = [getattr(v, "__func__", v) for v in vars(cls).values()]  # a decorator's wrapper: its original
    found = [inspect.unwrap(f) if callable(f) else f for f in found]  # (TorchDispatchMode's dispatch)
    return [f for f in found if hasattr(f, "__code__")]


def _names_used(work: Any) -> set[str]:
    """Global and attribute names the student's function (or class's methods) refers to, nested code too."""
    codes = [getattr(work, "__code__", None)]
    if isinstance(work, type):
        codes += [f.__code__ for f in _methods(work)]
    names: set[str] = set()
    while codes:
        code = codes.pop()
        if code is not None:
            names.update(code.co_names)
            codes += [c for c in code.co_consts if hasattr(c, "co_names")]
    return names


def _where(exc: BaseException) -> str:
    """' (line N of your cell)' when the innermost frame of the traceback is in notebook code."""
    frames = [
        f for f in traceback.extract_tb(exc.__traceback__) if "ipykernel" in f.filename or "<" in f.filename
    ]
    return f" (line {frames[-1].lineno} of your code)" if frames else ""


def _arity_problem(grader: Callable[..., Any], work: tuple[Any, ...]) -> str:
    """An empty string when ``work`` fits the grader's parameters, else what to pass instead (a wrong
    count would otherwise surface as a TypeError naming the grader, an internal function, as the student's
    fault)."""
    try:
        inspect.signature(grader).bind(*work)
    except TypeError:
        params = inspect.signature(grader).parameters.values()
        names = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        required = [p.name for p in params if p.default is p.empty and p.kind != p.VAR_POSITIONAL]
        count = f"{len(required)}" + (f" to {len(names)}" if len(names) > len(required) else "")
        return f"it takes {count}: pass what the grade(...) line at the end of the exercise cell passes."
    return ""


def grade(exercise_id: str, *work: Any, hint: bool = False) -> CheckResult:
    """Run the grader of ``exercise_id`` on the student's ``work`` and print ⏳ / ✅ / ❌.

    Args:
        exercise_id: the id printed in the exercise's heading, e.g. ``"04a.1"``.
        *work: what the exercise asks for (functions, classes, numbers), in the order it names them.
        hint: print the exercise's hint (the recipe) now; otherwise it comes with the third miss.
    """
    match = _ID.match(exercise_id) if isinstance(exercise_id, str) else None
    if not match:
        raise ValueError(f"exercise id must look like '04a.1', not {exercise_id!r}")
    if exercise_id not in _REGISTRY:
        _load_graders(match.group(1))
    if exercise_id not in _REGISTRY:
        raise ValueError(f"notebook {match.group(1)} has no exercise {exercise_id}")
    ex = _REGISTRY[exercise_id]
    label = f"Exercise {ex.id} ({ex.title})"
    wanted = _arity_problem(ex.grader, work)
    if wanted:
        print(f"❌ {label}: grade() got {len(work)} piece(s) of work after the id; {wanted}")
        return CheckResult(False)
    if any(_unwritten(w) for w in work):
        return _not_written(ex, label, hint)
    used = sorted({name for w in work for name in _names_used(w)} & set(ex.forbid))
    if used:
        return _missed(
            ex,
            label,
            f"your code calls {', '.join(used)}, a ready-made answer to this exercise; write it yourself.",
            hint,
        )
    try:
        detail = ex.grader(*work)
    except NotImplementedError:
        return _not_written(ex, label, hint)
    except Wrong as exc:
        return _missed(ex, label, str(exc), hint)
    except Exception as exc:  # the student's code raised: feedback, not a crash
        message = str(exc).strip().splitlines()[-1] if str(exc).strip() else ""
        return _missed(ex, label, f"your code raised {type(exc).__name__}{_where(exc)}: {message}", hint)
    print(f"✅ {label}: correct" + (f" — {detail}" if detail else "."))
    return CheckResult(True)


def _not_written(ex: Exercise, label: str, hint: bool) -> CheckResult:
    """⏳: what to write and how it is checked; the recipe only when asked for."""
    more = f" Hint: {ex.hint}" if hint else " (Stuck? Add hint=True to the grade(...) call for a hint.)"
    print(f"⏳ {label}: not written yet. {ex.task}{more}")
    return CheckResult(False)


def _missed(ex: Exercise, label: str, what: str, hint: bool) -> CheckResult:
    """❌: the grader's message; the hint too on request or from the :data:`HINT_AFTER`-th miss."""
    _MISSES[ex.id] = misses = _MISSES.get(ex.id, 0) + 1
    what = what.strip() if what.strip().endswith((".", "?", "!")) else what.strip() + "."
    if hint or misses >= HINT_AFTER:
        more = f" Hint: {ex.hint}"
    else:
        left = HINT_AFTER - misses
        more = f" (A hint follows after {left} more miss{'es' if left > 1 else ''}, or now with hint=True.)"
    print(f"❌ {label}: {what}{more}")
    return CheckResult(False)


def calls_during(
    fn: Callable[..., Any], watched: Callable[[CodeType], bool], *args: Any
) -> tuple[Any, list[CodeType]]:
    """``fn(*args)``, and the code of every watched function it called, under whatever name: for graders
    that refuse a ready-made answer (the course's own estimator, the grader's own cases) renamed or
    reached through an attribute, which :func:`grade`'s static ``forbid`` check cannot see."""
    hits: list[CodeType] = []

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call" and watched(frame.f_code):
            hits.append(frame.f_code)

    previous = sys.getprofile()
    sys.setprofile(profile)
    try:
        result = fn(*args)
    finally:
        sys.setprofile(previous)
    return result, hits


def run_refusing(work: Callable[..., Any], answer_keys: dict[CodeType, str], *args: Any) -> Any:
    """``work(*args)``, raising :class:`Wrong` if it ran one of ``answer_keys`` (code object → its name
    for the message) under whatever name (:func:`calls_during`)."""
    result, codes = calls_during(work, answer_keys.__contains__, *args)
    if codes:
        raise Wrong(
            f"your function ran {answer_keys[codes[0]]}, a ready-made answer (under another name); "
            "write the formula."
        )
    return result
