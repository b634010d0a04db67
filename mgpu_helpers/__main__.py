"""Used by notebook 00 and the README (``python -m mgpu_helpers``): the environment doctor, this machine's
hardware table, the distributed backend to use here, and what each notebook does on this machine."""

from __future__ import annotations

import argparse

from .course import modes_here
from .doctor import doctor
from .hardware import choose_backend, describe_node, format_node_table


def main(argv: list[str] | None = None) -> int:
    """Print the doctor's findings, the node table, the backend to use here, and each notebook's mode."""
    parser = argparse.ArgumentParser(prog="python -m mgpu_helpers", description=__doc__)
    parser.parse_args(argv)
    print("Environment doctor: what this machine has, and what the course does about it")
    doctor()
    print()
    info = describe_node()
    print(format_node_table(info))
    print()
    print(f"Distributed backend to use here: {choose_backend(info=info)}")
    if info.gpu_count > 1:
        n = info.gpu_count
        print(f"  with {n} processes (one per GPU): {choose_backend(n, info)}; with more: gloo")
    print()
    print(
        f"What each notebook does on this machine ({info.gpu_count} GPU{'s' if info.gpu_count != 1 else ''}):"
    )
    rows = modes_here(info.gpu_count)
    width = max(len(f"{n} {t}") for n, t, _ in rows)
    for number, title, mode in rows:
        print(f"  {f'{number} {title}'.ljust(width)}  {mode}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
