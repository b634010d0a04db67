"""Used by notebook 07b (errors and hangs), §3 and §5, and its grader of exercise 07b.1: name an error
and say what to do next.

:func:`diagnose` turns a caught exception (or an error text, e.g. a worker's stderr) into a short
:class:`Diagnosis`: out of memory, device or dtype mismatch, index out of range / device-side assert,
a distributed timeout or mismatched collectives, an unpicklable spawn target, CUDA setup problems — or
"unknown" with general advice. The patterns and advice live in :mod:`._rules`.
"""

from __future__ import annotations

import pickle
import re
from dataclasses import dataclass, field

import torch

from ._rules import _RULES, _UNKNOWN

__all__ = ["KINDS", "Diagnosis", "diagnose"]

#: Kinds :func:`diagnose` can return, in the order the rules are tried.
KINDS: tuple[str, ...] = (*(r.kind for r in _RULES), _UNKNOWN.kind)


@dataclass(frozen=True)
class Diagnosis:
    """A short reading of an error: what kind it is, what it means, what to do next.

    Only text is kept (never the exception), so holding a diagnosis does not keep the failed step's
    tensors alive through the exception's traceback.
    """

    kind: str
    title: str
    explanation: str
    next_steps: tuple[str, ...]
    evidence: str = ""
    details: dict[str, str] = field(default_factory=dict)

    def __str__(self) -> str:
        lines = [f"[{self.kind}] {self.title}"]
        if self.evidence:
            lines.append(f"  evidence: {self.evidence}")
        lines.append(f"  meaning:  {self.explanation}")
        for key, value in self.details.items():
            lines.append(f"  {key}: {value}")
        lines.append("  next steps:")
        lines += [f"    {i}. {s}" for i, s in enumerate(self.next_steps, 1)]
        return "\n".join(lines)


def _error_text(error: BaseException | str) -> tuple[str, list[type]]:
    """All messages of an exception and its causes (or the text itself), and the exception types."""
    if isinstance(error, str):
        return error, []
    parts, types, seen = [], [], set()
    exc: BaseException | None = error
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        types.append(type(exc))
        parts.append(f"{type(exc).__name__}: {exc}")
        exc = exc.__cause__ or exc.__context__
    return "\n".join(parts), types


def _details(kind: str, text: str) -> dict[str, str]:
    """Numbers and names worth repeating, read from the message (requested bytes, seconds waited, ...)."""
    details: dict[str, str] = {}
    if kind == "out_of_memory":
        m = re.search(r"Tried to allocate ([\d.]+ ?[KMGT]?i?B)", text)
        if m:
            details["requested"] = m.group(1)
        m = re.search(r"you tried to allocate (\d+) bytes", text)
        if m:
            details["requested"] = f"{int(m.group(1)):,} B (host RAM)"
        m = re.search(r"([\d.]+ ?[KMGT]i?B) is reserved by PyTorch but unallocated", text)
        if m:
            details["reserved but unallocated"] = (
                f"{m.group(1)} (if large: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "
                "against fragmentation)"
            )
    if kind == "unpicklable_target":
        m = re.search(r"Can't get attribute '([^']+)'", text)
        if m:
            details["missing in the child"] = m.group(1)
    if kind == "distributed_timeout":
        m = re.search(r"Timed out waiting (\d+) ?ms", text) or re.search(r"ran for (\d+) milliseconds", text)
        if m:
            details["waited"] = f"{int(m.group(1)) / 1000:g} s"
    return details


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "")[:240]


def _line_of(text: str, pos: int) -> str:
    start = text.rfind("\n", 0, pos) + 1
    end = text.find("\n", pos)
    return text[start : end if end >= 0 else len(text)].strip()[:240]


def _pickling_failed(error: BaseException | str) -> bool:
    """Did pickling fail in ``error``'s chain? Told by type, not by CPython's wording, which changes
    between releases (3.13 says "Can't get local object" where 3.12 said "Can't pickle local object"):
    a ``PicklingError`` / ``UnpicklingError``, or an ``AttributeError`` about a name that only exists
    where it was defined: a qualified name with ``<locals>`` or ``<lambda>`` (PEP 3155), or a lookup on
    ``__main__``'s module object."""
    exc = error if isinstance(error, BaseException) else None
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, pickle.PicklingError | pickle.UnpicklingError):
            return True
        local_name = r"\.<locals>\.|<lambda>|<module '__main__'"
        if isinstance(exc, AttributeError) and re.search(local_name, str(exc)):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def diagnose(error: BaseException | str) -> Diagnosis:
    """Name the kind of ``error`` and suggest next steps.

    ``error`` is a caught exception (its ``__cause__``/``__context__`` chain is read too) or an error
    text, such as a worker's stderr or the message of a failed torchrun job. Known kinds are listed in
    :data:`KINDS`; anything else gets the ``"unknown"`` diagnosis with general advice.
    """
    if not isinstance(error, BaseException | str):
        raise TypeError(
            "diagnose takes a caught exception (except Exception as exc: diagnose(exc)) or an error "
            f"text such as a worker's stderr, not {type(error).__name__}"
        )
    if isinstance(error, str) and not error.strip():
        raise ValueError(
            "diagnose got an empty error text; pass the exception, or a text that holds its message"
        )
    text, types = _error_text(error)
    if any(issubclass(t, torch.OutOfMemoryError | MemoryError) for t in types):
        rule, evidence = next(r for r in _RULES if r.kind == "out_of_memory"), _first_line(text)
    elif _pickling_failed(error):
        rule, evidence = next(r for r in _RULES if r.kind == "unpicklable_target"), _first_line(text)
    else:
        rule, evidence = _UNKNOWN, ""
        for candidate in _RULES:
            match = next((m for p in candidate.patterns if (m := re.search(p, text))), None)
            if match:
                rule, evidence = candidate, _line_of(text, match.start())
                break
        if rule is _UNKNOWN:
            evidence = _first_line(text)
    return Diagnosis(
        rule.kind, rule.title, rule.explanation, rule.next_steps, evidence, _details(rule.kind, text)
    )
