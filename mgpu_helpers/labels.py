"""Used by notebooks 00 (which introduces it), 02a, 02c, 03b, 04b, 04c, 04d, 04e, 04f, 05a, 05b, 05c, 05d,
05e, 05h, 06a, 06b, 07a, 07b, 07c, 08 and 08b, and by the benchmarks: label every number the course
prints with how it was obtained.

Three kinds, used the same way in every notebook:

* **measured** — timed or counted on real hardware; the label names that hardware.
* **simulated** — produced by running a stand-in for hardware this machine lacks, e.g. several
  GPUs' memory accounted on a CPU; the label says what was stood in for.
* **estimated** — computed from a formula, not observed; the label names the formula.

Example::

    >>> str(estimated(16_016_008, "B", how="params + grads + Adam states"))
    '16,016,008 B (estimated: params + grads + Adam states)'
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Literal

__all__ = ["Labelled", "estimated", "measured", "simulated"]

Kind = Literal["measured", "simulated", "estimated"]
_KINDS: tuple[Kind, ...] = ("measured", "simulated", "estimated")

#: What the detail of each kind names, for error messages.
_DETAIL = {
    "measured": "on= names the hardware, e.g. on='1× NVIDIA A100'",
    "simulated": "what= names the stand-in, e.g. what='4 GPUs accounted on CPU'",
    "estimated": "how= names the formula, e.g. how='params + grads + Adam states'",
}


@dataclass(frozen=True)
class Labelled:
    """A number with its unit and its provenance; ``str()`` gives e.g. ``'3.1 s (measured on CPU: …)'``."""

    value: float
    unit: str
    kind: Kind
    detail: str

    def __post_init__(self) -> None:
        if isinstance(self.value, bool) or not isinstance(self.value, numbers.Real):
            hint = " (a tensor: pass tensor.item())" if hasattr(self.value, "item") else ""
            raise TypeError(f"value must be a number such as 3.1, not {self.value!r}{hint}")
        if not isinstance(self.unit, str):
            raise TypeError(f"unit must be a str such as 's', 'MiB' or '' (none), not {self.unit!r}")
        if self.kind not in _KINDS:
            raise ValueError(f"kind must be one of {_KINDS}, not {self.kind!r}")
        if not isinstance(self.detail, str) or not self.detail.strip():
            raise ValueError(
                f"a {self.kind} number needs a detail: {_DETAIL[self.kind]} (got {self.detail!r})"
            )

    def formatted_value(self) -> str:
        """The value with thousands separators (integers) or 3 significant digits (floats)."""
        if float(self.value).is_integer() and abs(self.value) >= 1:
            text = f"{int(self.value):,}"
        else:
            text = f"{self.value:.3g}"
        return f"{text} {self.unit}".rstrip()

    def __str__(self) -> str:
        joiner = " on " if self.kind == "measured" else ": "
        return f"{self.formatted_value()} ({self.kind}{joiner}{self.detail})"


def measured(value: float, unit: str = "", *, on: str | None = None) -> Labelled:
    """A number observed on real hardware; ``on`` defaults to this machine's hardware label.

    Args:
        value: the number (int or float).
        unit: its unit, e.g. ``"s"`` or ``"MiB"``; ``""`` for none.
        on: the hardware it was observed on; None asks :func:`mgpu_helpers.hardware.hardware_label`.
    """
    if on is None:
        from .hardware import hardware_label

        on = hardware_label()
    return Labelled(value, unit, "measured", on)


def simulated(value: float, unit: str = "", *, what: str) -> Labelled:
    """A number from a stand-in for missing hardware; ``what`` (non-empty) says what stood in for what."""
    return Labelled(value, unit, "simulated", what)


def estimated(value: float, unit: str = "", *, how: str) -> Labelled:
    """A number from a formula; ``how`` (non-empty) names the formula."""
    return Labelled(value, unit, "estimated", how)
