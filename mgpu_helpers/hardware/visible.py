"""Used by every notebook through :func:`mgpu_helpers.hardware.describe_node` (notebook 01 teaches it):
``CUDA_VISIBLE_DEVICES`` parsed the way CUDA parses it, and applied to the NVML / GPUtil rows, which
number GPUs as the driver does, so that their indices become the ``cuda:<index>`` torch uses.
"""

from __future__ import annotations

import re

from ._rows import _Row


def _parse_visible_devices(value: str) -> list[int] | list[str] | None:
    """Parse ``CUDA_VISIBLE_DEVICES`` the way CUDA (and torch) does.

    Returns physical indices, or ``"GPU-..."`` UUID prefixes, or None when the entries cannot
    be mapped to NVML/GPUtil rows (MIG instances). An invalid entry ends the list, a repeated
    entry makes the list empty, and ``""`` or ``"-1"`` hide every GPU.
    """
    tokens = [token.strip() for token in value.split(",")]
    if tokens[0].startswith("MIG-"):
        return None
    if tokens[0].startswith("GPU-"):
        uuids: list[str] = []
        for token in tokens:
            if not token.startswith("GPU-"):
                break
            if token in uuids:
                return []
            uuids.append(token)
        return uuids
    indices: list[int] = []
    for token in tokens:
        match = re.match(r"\+?(\d+)", token)
        if match is None:
            break
        number = int(match.group(1))
        if number in indices:
            return []
        indices.append(number)
    return indices


def visible_gpu_count(value: str | None, physical: int) -> int:
    """How many GPUs a process sees with ``CUDA_VISIBLE_DEVICES=value`` on a machine with ``physical``.

    CUDA's rule (notebook 01 checks it on real processes): unset shows every GPU; ``""`` or ``"-1"``
    hide all; the list is read in order up to the first entry that names no GPU (so ``"1,0"`` on a
    1-GPU machine shows **0**), and a repeated entry hides every GPU.

    Args:
        value: the variable's value, or None when it is unset.
        physical: the number of GPUs the driver has (``torch.cuda.device_count()`` with it unset).
    """
    if isinstance(physical, bool) or not isinstance(physical, int) or physical < 0:
        raise ValueError(f"physical must be a GPU count >= 0, such as 2, not {physical!r}")
    if value is None:
        return physical
    if not isinstance(value, str):
        raise TypeError(f"value must be the variable's text such as '1,0', or None when unset, not {value!r}")
    parsed = _parse_visible_devices(value)
    if parsed is None or any(isinstance(entry, str) for entry in parsed):
        raise ValueError(f"{value!r} names GPUs by UUID or MIG instance: count them with torch in a process")
    count = 0
    for index in parsed:
        if index >= physical:
            break
        count += 1
    return count


def _apply_visible_devices(rows: list[_Row], wanted: list[int] | list[str]) -> list[_Row] | None:
    """Keep the rows CUDA can see, in CUDA order, re-indexed from 0; None if UUIDs are missing.

    Like CUDA, the first entry that matches no device ends the list.
    """
    picked: list[_Row] = []
    for entry in wanted:
        if isinstance(entry, int):
            matches = [row for row in rows if row.index == entry]
        else:
            if any(row.uuid is None for row in rows):
                return None
            matches = [row for row in rows if row.uuid is not None and row.uuid.startswith(entry)]
        if len(matches) != 1:
            break
        picked.append(matches[0])
    return [
        _Row(i, row.name, row.memory_total_bytes, row.memory_used_bytes, row.utilization_percent, row.uuid)
        for i, row in enumerate(picked)
    ]


def _filter_rows(
    rows: list[_Row], value: str | None, parsed: list[int] | list[str] | None, label: str
) -> tuple[list[_Row], str | None]:
    """Apply ``CUDA_VISIBLE_DEVICES`` to one library's rows; returns (rows, note or None)."""
    if value is None or not rows:
        return rows, None
    if parsed is None:
        return rows, f"{label} rows are not filtered (MIG entries cannot be matched), indices may differ"
    filtered = _apply_visible_devices(rows, parsed)
    if filtered is None:
        return rows, f"{label} gave no UUIDs to match, so its rows are not filtered"
    return filtered, None


def _visible_devices_sentence(value: str, parsed: list[int] | list[str] | None, notes: list[str]) -> str:
    """Sentence for ``sources["CUDA_VISIBLE_DEVICES"]``."""
    head = f"CUDA_VISIBLE_DEVICES={value!r}: "
    if parsed is None:
        body = (
            "MIG instances cannot be mapped to NVML/GPUtil rows; those are listed as the driver numbers them"
        )
    elif not parsed:
        body = "hides every GPU from CUDA"
    else:
        shown = ",".join(str(entry) for entry in parsed)
        body = (
            f"CUDA sees physical GPU(s) {shown}; NVML/GPUtil rows were limited to them "
            "and re-indexed from 0 as torch numbers them"
        )
    return head + body + "".join(f"; {note}" for note in notes)
