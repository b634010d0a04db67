"""Label every number the course prints with how it was obtained.

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

from dataclasses import dataclass
from typing import Literal

Kind = Literal["measured", "simulated", "estimated"]
KINDS: tuple[Kind, ...] = ("measured", "simulated", "estimated")


@dataclass(frozen=True)
class Labelled:
    """A number with its unit and its provenance; ``str()`` gives e.g. ``'3.1 s (measured on CPU: …)'``."""

    value: float
    unit: str
    kind: Kind
    detail: str

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, not {self.kind!r}")
        if not self.detail:
            raise ValueError(f"a {self.kind} number needs a detail: the hardware, stand-in or formula")

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
    """A number observed on real hardware; ``on`` defaults to this machine's hardware label."""
    if on is None:
        from .hardware import hardware_label

        on = hardware_label()
    return Labelled(value, unit, "measured", on)


def simulated(value: float, unit: str = "", *, what: str) -> Labelled:
    """A number from a stand-in for missing hardware; ``what`` says what stood in for what."""
    return Labelled(value, unit, "simulated", what)


def estimated(value: float, unit: str = "", *, how: str) -> Labelled:
    """A number from a formula; ``how`` names the formula."""
    return Labelled(value, unit, "estimated", how)
