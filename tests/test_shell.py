"""mgpu_helpers.shell.shell: IPython's ``x = !cmd`` as a call (notebooks 01 and 04d)."""

import contextlib

import psutil
import pytest
from _scripts import is_alive

from mgpu_helpers.shell import shell


def test_returns_stdout_and_stderr_lines_in_order_and_prints_the_command(capsys):
    lines = shell('echo one; echo two >&2; echo "exit code: $?"')
    assert lines == ["one", "two", "exit code: 0"]
    assert capsys.readouterr().out == '$ echo one; echo two >&2; echo "exit code: $?"\n'


def test_a_failing_command_returns_its_output_as_bang_does():
    assert shell("echo broken; exit 3; echo never") == ["broken"]


def test_a_command_past_its_timeout_is_stopped_with_its_children(tmp_path):
    pid_file = tmp_path / "pid"
    with pytest.raises(TimeoutError, match="pass a larger timeout="):
        shell(f"sleep 60 & echo $! > {pid_file}; wait", timeout=1.0)
    with contextlib.suppress(psutil.NoSuchProcess):  # NoSuchProcess: gone and reaped
        assert not is_alive(psutil.Process(int(pid_file.read_text()))), "the command's child outlived it"


@pytest.mark.parametrize("bad", ["", "   ", ["echo", "hi"]])
def test_the_command_is_one_string(bad):
    with pytest.raises(ValueError, match="one non-empty string"):
        shell(bad)
