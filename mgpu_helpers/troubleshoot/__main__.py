"""Used by notebook 07 (troubleshooting), §5: the command line of the troubleshooting demos.

``python -m mgpu_helpers.troubleshoot hang --timeout 2``, under torchrun with two processes, runs
:func:`~mgpu_helpers.troubleshoot.hang_worker`: a rank that never joins an ``all_reduce``.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds such as 2, not {text!r}") from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"the timeout must be a number of seconds > 0, not {text}")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` (default: the command line) and run the chosen demo; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m mgpu_helpers.troubleshoot", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    hang = sub.add_parser("hang", help="two ranks, one skips an all_reduce: a hang turned into an error")
    hang.add_argument("--timeout", type=_seconds, default=2.0, help="process-group timeout in seconds")
    args = parser.parse_args(argv)
    if args.command == "hang":
        from .hang import hang_worker

        hang_worker(args.timeout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
