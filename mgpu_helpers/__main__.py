"""``python -m mgpu_helpers``: this machine's hardware table and what each notebook does here."""

from __future__ import annotations

import argparse

from .course import modes_here
from .hardware import describe_node, format_node_table, recommended_backend


def main(argv: list[str] | None = None) -> int:
    """Print the node table, the distributed backend to use, and the per-notebook mode."""
    parser = argparse.ArgumentParser(prog="python -m mgpu_helpers", description=__doc__)
    parser.parse_args(argv)
    info = describe_node()
    print(format_node_table(info))
    print()
    print(f"Distributed backend to use here: {recommended_backend(info)}")
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
