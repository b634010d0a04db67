"""Used by notebook 00 through the doctor: the students' package stacks, pinned in this folder —
Colab's, Kaggle's and the newest releases.

The doctor (``python -m mgpu_helpers``) says which published stack this machine matches and what
differs; ``noxfile.py``, which builds each stack as a virtual environment
and runs the tests there. Each ``<name>.txt`` is a pip constraint file written by ``tools/make_stacks.py``
from the platform's own published package list; its ``# key: value`` header names the Python, the torch
release and the source with its date.

``python -m mgpu_helpers.stacks colab`` prints this environment's versions of the packages the course
depends on beside the stack's, and exits 1 where one differs (nox runs it to show that a stack's
environment really is that stack).
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

__all__ = ["KEY_PACKAGES", "STACKS", "Stack", "compare", "describe", "installed_versions", "load"]

STACKS = ("colab", "kaggle", "newest")

#: The packages whose versions decide whether the course runs: what the doctor compares and reports.
KEY_PACKAGES = (
    "torch",
    "ipython",
    "ipykernel",
    "jupyter_client",
    "traitlets",
    "ipywidgets",
    "psutil",
    "numpy",
)

_PLATFORM_STACK = {"Colab": "colab", "Kaggle": "kaggle"}


@dataclass(frozen=True)
class Stack:
    """One pinned stack: its Python, its ``name -> version`` pins and where they were published."""

    name: str
    python: tuple[int, int]
    sources: tuple[str, ...]
    pins: dict[str, str]

    @property
    def date(self) -> str:
        """The newest date (YYYY-MM-DD) the sources name."""
        dates = re.findall(r"\d{4}-\d\d-\d\d", " ".join(self.sources))
        return max(dates) if dates else "the day it is built"


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def load(name: str) -> Stack:
    """The stack ``name`` (one of :data:`STACKS`) from ``mgpu_helpers/stacks/<name>.txt``."""
    if name not in STACKS:
        raise ValueError(f"no stack {name!r}: choose one of {', '.join(STACKS)}")
    header: dict[str, list[str]] = {}
    pins: dict[str, str] = {}
    for line in (Path(__file__).parent / f"{name}.txt").read_text().splitlines():
        if line.startswith("# "):
            key, _, value = line[2:].partition(": ")
            header.setdefault(key, []).append(value)
        elif "==" in line:
            package, _, version = line.partition("==")
            pins[_norm(package)] = version.strip()
    major, minor = header["python"][0].split(".")
    return Stack(name, (int(major), int(minor)), tuple(header.get("source", ())), pins)


def installed_versions(packages: tuple[str, ...] = KEY_PACKAGES) -> dict[str, str | None]:
    """This environment's version of each package (None where it is not installed)."""
    out: dict[str, str | None] = {}
    for package in packages:
        try:
            out[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            out[package] = None
    return out


def _release(version: str | None) -> str | None:
    """``2.11.0`` from ``2.11.0+cu128``: the platform's build and PyPI's are the same release."""
    return version.split("+")[0] if version else None


def compare(
    stack: Stack, versions: dict[str, str | None], python: tuple[int, int]
) -> list[tuple[str, str | None, str | None]]:
    """``(package, pinned, here)`` for Python and each key package the stack pins, where they differ."""
    rows = []
    if python != stack.python:
        rows.append(("python", "{}.{}".format(*stack.python), "{}.{}".format(*python)))
    for package, here in versions.items():
        pinned = stack.pins.get(_norm(package))
        if pinned and _release(here) != pinned:
            rows.append((package, pinned, _release(here)))
    return rows


def _major(version: str | None) -> int:
    m = re.match(r"\d+", version or "")
    return int(m[0]) if m else 0


def adaptations(versions: dict[str, str | None], python: tuple[int, int]) -> list[str]:
    """What the course does about the older releases in ``versions`` (each one a platform ships)."""
    out = []
    if _major(versions.get("ipython")) == 7:
        where = " on Python ≥ 3.12" if python >= (3, 12) else ""
        out.append(
            f"IPython {versions['ipython']}: the course avoids `x = !cmd`, which 7.x{where} cannot parse"
        )
    if versions.get("psutil") and _major(versions["psutil"]) < 6:
        out.append(f"psutil {versions['psutil']}: ports are read with Process.connections() (6.0 renamed it)")
    if _major(versions.get("ipywidgets")) == 7:
        out.append(f"ipywidgets {versions['ipywidgets']}: the widgets use only what 7 and 8 share")
    return out


def describe(
    platform: str, versions: dict[str, str | None], python: tuple[int, int]
) -> tuple[str, str, str] | None:
    """``(status, fact, action)`` for the doctor: which published stack this platform's machine matches,
    what differs and what the course does about it; None off Colab and Kaggle."""
    name = _PLATFORM_STACK.get(platform)
    if name is None:
        return None
    stack = load(name)
    differs = compare(stack, versions, python)
    shown = ", ".join(
        f"{p} {versions[p]}" for p in ("torch", "ipython", "psutil", "ipywidgets") if versions.get(p)
    )
    if differs:
        fact = f"{platform}'s published stack of {stack.date}, except " + ", ".join(
            f"{p} {here or 'missing'} here ({pinned} published)" for p, pinned, here in differs
        )
    else:
        fact = f"matches {platform}'s published stack of {stack.date} (Python %d.%d, {shown})" % python
    action = "; ".join(adaptations(versions, python)) or "nothing to adapt"
    return ("ok" if not differs else "note"), fact, action


def main(argv: list[str] | None = None) -> int:
    """``python -m mgpu_helpers.stacks NAME``: this environment beside the stack; 1 where they differ."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0] not in STACKS:
        print(f"usage: python -m mgpu_helpers.stacks {{{','.join(STACKS)}}}", file=sys.stderr)
        return 2
    stack = load(args[0])
    versions = installed_versions()
    python = sys.version_info[:2]
    print(f"stack {stack.name} ({stack.date}): Python %d.%d here, %d.%d pinned" % (python + stack.python))
    for package, here in versions.items():
        print(f"  {package:15} {here or 'missing':22} pinned: {stack.pins.get(_norm(package), '(free)')}")
    differs = compare(stack, versions, python)
    for line in adaptations(versions, python):
        print(f"  → {line}")
    if differs:
        print("differs from the stack: " + ", ".join(f"{p} {h} (pinned {w})" for p, w, h in differs))
        return 1
    return 0
