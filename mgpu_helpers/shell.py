"""Used by notebooks 01 and 04d: run a shell command from a cell and get its output lines back.

``output = shell("torchrun …")`` does what IPython's ``output = !torchrun …`` does, without that syntax:
IPython 7.34 (Colab's and Kaggle's) cannot parse ``x = !cmd`` on Python 3.12 and newer. It prints the
command first, so the cell still shows what ran, and stops the command's whole process tree when the
cell is interrupted or the command outlives ``timeout``.
"""

from __future__ import annotations

import subprocess

from .processes import stop_processes

__all__ = ["shell"]


def shell(command: str, timeout: float | None = 600.0) -> list[str]:
    """Run ``command`` in bash, print it as ``$ command``, and return its output lines.

    stdout and stderr come back together, in the order they were written, as ``!cmd`` gives them; the
    command's exit status is not checked (end the command with ``; echo "exit code: $?"`` to see it).
    """
    if not isinstance(command, str) or not command.strip():
        raise ValueError(f"shell() takes the command as one non-empty string, not {command!r}")
    print(f"$ {command}")
    proc = subprocess.Popen(
        ["bash", "-c", command],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group: an interrupt here stops it, not the kernel
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stop_processes([proc])
        raise TimeoutError(
            f"the command ran longer than timeout={timeout} s and was stopped; pass a larger timeout= "
            "if it needs longer"
        ) from None
    except BaseException:
        stop_processes([proc])
        raise
    return out.splitlines()
