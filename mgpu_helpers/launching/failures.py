"""Used by notebook 01 through :func:`mgpu_helpers.launching.run_torchrun`: turning a failed
torchrun node's output into a message that names the failing rank and quotes its traceback.

When a worker fails, torchrun's agent prints a ``ChildFailedError`` table: per failed worker its global
``rank``, ``local_rank``, ``exitcode`` (negative: killed by that signal) and pid, and which one was the
*root cause* (first observed). The workers' own stderr is interleaved in the same stream; once a worker
has joined a process group torch prefixes each of its lines with ``[rankN]:``, which is how a rank's
traceback is told apart from the others'.
"""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass

__all__ = ["WorkerFailure", "describe_failure", "is_consequence", "parse_failures", "rank_output"]

_FIELD = re.compile(r"^\s+(rank|exitcode|traceback)\s*:\s*(.*)$")
_RANK = re.compile(r"(-?\d+) \(local_rank: (-?\d+)\)")
_EXIT = re.compile(r"(-?\d+) \(pid: (\d+)\)")
_PREFIX = re.compile(r"^\[rank(\d+)\]:\s?(.*)$")
_LOG_LINE = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ .*\] ")
_TRACEBACK = "Traceback (most recent call last):"
# Errors a rank gets *because* a peer died or its agent stopped it: never the root cause of a job.
_CHAINED = ("During handling of the above exception", "The above exception was the direct cause")
_CONSEQUENCES = ("Connection closed by peer", "Connection reset by peer", "Broken pipe")


@dataclass(frozen=True)
class WorkerFailure:
    """One failed worker as torchrun's agent reported it."""

    rank: int
    local_rank: int
    exitcode: int
    pid: int | None
    root_cause: bool

    @property
    def signal_name(self) -> str | None:
        """``"SIGKILL"`` etc. when the worker was killed by a signal, else None."""
        if self.exitcode >= 0:
            return None
        try:
            return signal.Signals(-self.exitcode).name
        except ValueError:
            return f"signal {-self.exitcode}"

    def how(self) -> str:
        """Either "exited with code 1" or "was killed by signal 9 (SIGKILL)", with the pid."""
        pid = f" (pid {self.pid})" if self.pid else ""
        if self.signal_name is None:
            return f"exited with code {self.exitcode}{pid}"
        return f"was killed by signal {-self.exitcode} ({self.signal_name}){pid}"


def _agent_part_start(lines: list[str]) -> int:
    """Index where the agent's own traceback starts (len(lines) if none): its ``ChildFailedError`` report,
    or the ``SignalException`` it raises when it is stopped."""
    for i, line in enumerate(lines):
        if ("ChildFailedError" in line or "SignalException" in line) and not _PREFIX.match(line):
            starts = [j for j in range(i) if lines[j].startswith(_TRACEBACK)]
            return starts[-1] if starts else i
    return len(lines)


def _lines(output: str) -> list[str]:
    if not isinstance(output, str):
        raise TypeError(f"output must be a node's text (NodeRun.stdout + NodeRun.stderr), not {output!r}")
    return output.splitlines()


def parse_failures(output: str) -> list[WorkerFailure]:
    """The failed workers listed in a torchrun agent's ``ChildFailedError`` table (root cause first)."""
    lines = _lines(output)
    found: list[WorkerFailure] = []
    in_root = False
    fields: dict[str, str] = {}

    def flush() -> None:
        rank, code = _RANK.search(fields.get("rank", "")), _EXIT.search(fields.get("exitcode", ""))
        if rank and code:
            found.append(
                WorkerFailure(int(rank[1]), int(rank[2]), int(code[1]), int(code[2]), fields["_root"] == "1")
            )
        fields.clear()

    for line in lines[_agent_part_start(lines) :]:
        if line.startswith("Root Cause"):
            in_root = True
        match = _FIELD.match(line)
        if re.match(r"^\[\d+\]:$", line.strip()) or line.startswith(("---", "===")):
            flush()
        if match:
            fields[match[1]] = match[2]
            fields["_root"] = "1" if in_root else "0"
    flush()
    return sorted(found, key=lambda f: not f.root_cause)


def rank_output(output: str, rank: int | None) -> list[str]:
    """The lines one rank wrote after joining a process group (``[rankN]:`` prefix removed).

    ``rank=None``: the workers' unlabelled lines (written before joining a group, or never joining one),
    without torchrun's own log lines and its ``ChildFailedError`` report.
    """
    if rank is not None and (isinstance(rank, bool) or not isinstance(rank, int) or rank < 0):
        raise ValueError(f"rank must be a global rank >= 0 (or None for unlabelled lines), not {rank!r}")
    lines = _lines(output)
    lines = lines[: _agent_part_start(lines)]
    if rank is None:
        return [line for line in lines if not _PREFIX.match(line) and not _LOG_LINE.match(line)]
    picked = []
    for line in lines:
        match = _PREFIX.match(line)
        if match and int(match[1]) == rank:
            picked.append(match[2])
    return picked


def _traceback_blocks(lines: list[str]) -> list[list[str]]:
    """Python tracebacks in ``lines``, from "Traceback" to the next one (chained exceptions kept whole)."""
    starts = [i for i, line in enumerate(lines) if line.startswith(_TRACEBACK)]
    blocks: list[list[str]] = []
    for k, start in enumerate(starts):
        end = starts[k + 1] if k + 1 < len(starts) else len(lines)
        chained = any(m in line for line in lines[max(0, start - 3) : start] for m in _CHAINED)
        if blocks and chained:
            blocks[-1] = blocks[-1] + lines[start:end]
        else:
            blocks.append(lines[start:end])
    return blocks


def _clip(lines: list[str], max_lines: int) -> list[str]:
    """At most ``max_lines``: the beginning and the end (the exception itself is at the end)."""
    lines = [line for line in lines if line.strip()] if len(lines) > max_lines else lines
    if len(lines) <= max_lines:
        return lines
    head = max_lines // 3
    return [
        *lines[:head],
        f"... ({len(lines) - max_lines} lines left out) ...",
        *lines[-(max_lines - head) :],
    ]


def is_consequence(failure: WorkerFailure, output: str) -> bool:
    """True when the rank only failed because a peer died or its agent stopped it."""
    if failure.signal_name == "SIGTERM":
        return True
    text = "\n".join(rank_output(output, failure.rank))
    return any(marker in text for marker in _CONSEQUENCES)


def describe_failure(failure: WorkerFailure | None, output: str, max_lines: int = 40) -> str:
    """The failed rank's traceback (or, without one, the end of its output), as quoted text."""
    if failure is not None and not isinstance(failure, WorkerFailure):
        raise TypeError(f"failure must be a WorkerFailure from parse_failures() or None, not {failure!r}")
    if isinstance(max_lines, bool) or not isinstance(max_lines, int) or max_lines < 3:
        raise ValueError(f"max_lines must be an integer >= 3, not {max_lines!r}")
    parts = []
    own = rank_output(output, failure.rank) if failure is not None else []
    blocks = _traceback_blocks(own)
    if failure is not None and blocks:
        parts.append(f"--- rank {failure.rank}'s traceback ---\n" + "\n".join(_clip(blocks[-1], max_lines)))
    elif own:
        parts.append(f"--- end of rank {failure.rank}'s output ---\n" + "\n".join(own[-max_lines:]))
    else:
        unlabelled = rank_output(output, None)
        blocks = _traceback_blocks(unlabelled)
        if blocks:
            note = (
                ""
                if len(blocks) == 1
                else f" (1 of {len(blocks)}; before joining a group, lines carry no rank)"
            )
            parts.append(f"--- worker traceback{note} ---\n" + "\n".join(_clip(blocks[0], max_lines)))
        elif failure is None or failure.signal_name is None:
            tail = [line for line in unlabelled if line.strip()][-max_lines:]
            parts.append(
                "--- end of output ---\n" + "\n".join(tail) if tail else "(the node printed nothing)"
            )
    if failure is not None and failure.signal_name is not None and not blocks:
        parts.append(
            f"(no Python traceback: {failure.signal_name} stops a process at once; the out-of-memory killer, "
            "a crash in native code or someone's kill are the usual senders)"
        )
    return "\n".join(parts)
