"""Used by notebook 07c (PyTorch's debugging tools), §4: which collective did not every rank join?

PyTorch's analyser, ``python -m torch.distributed.flight_recorder.fr_trace <folder>``, prints its
findings as log text, and that text is not an interface: torch 2.13 prints a block that starts with
``Not all ranks joining collective, sequence number: N``; torch 2.11 (Colab's) printed no such line for
the same dumps. :func:`unmatched_collective` therefore reads the analyser's block where there is one and
otherwise derives the same facts from the dumps themselves — each rank's records, numbered per process
group by ``collective_seq_id`` — and says which of the two it used (``source``).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["unmatched_collective"]

_HEADER = "Not all ranks joining collective"


def _frames(frames: Iterable[Mapping[str, Any]] | None) -> list[str]:
    """A record's Python stack, innermost first, as the analyser writes it ("name at file:line")."""
    return [f"{f.get('name', '?')} at {f.get('filename', '?')}:{f.get('line', '?')}" for f in frames or ()]


def _from_report(lines: list[str]) -> dict[str, Any] | None:
    """The analyser's first "Not all ranks" block as a finding, or None when there is none (or it does
    not read as expected: then the dumps answer)."""
    start = next((i for i, ln in enumerate(lines) if ln.startswith(_HEADER)), None)
    if start is None:
        return None
    try:
        block = [lines[start]]
        fields: dict[str, str] = {}
        for ln in lines[start + 1 :]:
            key, sep, value = ln.partition(":")
            if not sep or ln.startswith(_HEADER) or key.startswith("Collective sequence number"):
                break
            block.append(ln)
            fields.setdefault(key.strip(), value.strip())
            if key.strip() == "collective stack trace":
                break
        stack = []  # the frames right after "collective stack trace:", "name at file:line" each
        for ln in lines[start + len(block) :]:
            if " at " not in ln or ":" not in ln.rsplit(" at ", 1)[1]:
                break
            stack.append(ln)
        return {
            "source": "fr_trace",
            "sequence number": int(lines[start].rsplit(":", 1)[1]),
            "collective": fields["collective"],
            "missing ranks": set(ast.literal_eval(fields["missing ranks"])),
            "input sizes": fields.get("input sizes", "?"),
            "stack": stack[:8],
            "lines": block,
        }
    except (KeyError, ValueError, SyntaxError, TypeError, IndexError):
        return None


def _from_dumps(dumps: Mapping[int, Mapping[str, Any]]) -> dict[str, Any] | None:
    """The first collective sequence number, per process group, that some rank never issued; None when
    every rank issued the same collectives (as far as the ring buffers reach). A group's members are the
    ranks with records in it: a rank that never issued any collective of a group is not seen (in the
    default group every rank has at least the launcher's barrier)."""
    by_group: dict[str, dict[int, dict[int, Mapping[str, Any]]]] = {}  # group -> rank -> seq -> record
    for rank, dump in dumps.items():
        for e in dump.get("entries", ()):
            if e.get("is_p2p") or not e.get("collective_seq_id"):
                continue  # point-to-point records are numbered apart
            group = str((e.get("process_group") or ("?",))[0])
            by_group.setdefault(group, {}).setdefault(rank, {})[int(e["collective_seq_id"])] = e
    for group, per_rank in sorted(by_group.items()):
        last = {rank: max(records) for rank, records in per_rank.items()}  # the group's members in the dumps
        if len(set(last.values())) < 2:
            continue
        seq = min(last.values()) + 1  # the first number not every rank reached
        missing = {rank for rank, n in last.items() if n < seq}
        record = next(per_rank[r][seq] for r in sorted(per_rank) if seq in per_rank[r])
        name = record.get("profiling_name", "?")
        lines = [
            f"{_HEADER} (read from the dumps), sequence number: {seq}",
            f"process group: {group}",
            f"collective: {name}",
            f"missing ranks: {missing}",
            f"input sizes: {record.get('input_sizes', '?')}",
            f"last sequence number per rank: {dict(sorted(last.items()))}",
        ]
        return {
            "source": "dumps",
            "sequence number": seq,
            "collective": name,
            "missing ranks": missing,
            "input sizes": str(record.get("input_sizes", "?")),
            "stack": _frames(record.get("frames"))[:8],
            "lines": lines,
        }
    return None


def unmatched_collective(
    dumps: Mapping[int, Mapping[str, Any]], report: str | Iterable[str] | None = None
) -> dict[str, Any] | None:
    """The collective that not every rank joined, from the analyser's ``report`` or else the ``dumps``.

    ``dumps`` maps each rank to its unpickled Flight Recorder dump (``_dump_fr_trace()``); ``report`` is
    what ``fr_trace`` printed (text or lines), or None. Returns a dict with ``source`` ("fr_trace" or
    "dumps"), ``sequence number``, ``collective`` (its ``profiling_name``), ``missing ranks`` (a set),
    ``input sizes``, ``stack`` (the issuing Python frames, innermost first), ``lines`` (to print) and
    ``note`` (why the dumps answered, if they did); None when every rank issued the same collectives.
    """
    if not isinstance(dumps, Mapping) or not all(isinstance(d, Mapping) for d in dumps.values()):
        raise TypeError("dumps must map each rank to its unpickled Flight Recorder dump (a dict)")
    lines = report.splitlines() if isinstance(report, str) else list(report or ())
    lines = [ln.strip() for ln in lines]
    finding = _from_report(lines) if lines else None
    if finding is not None:
        finding["note"] = ""
        return finding
    finding = _from_dumps(dumps)
    if finding is not None:
        if report is None:
            finding["note"] = "no analyser report was given"
        else:
            finding["note"] = (
                f'the analyser printed no "{_HEADER}" block here (its output differs by release)'
            )
    return finding
