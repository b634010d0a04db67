"""mgpu_helpers.ddp (`!torchrun` cells, native stderr capture) and the plumbing of notebook 04a/04b's
graders."""

import os
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

from mgpu_helpers.ddp import captured_native_stderr, torchrun_ready_shell
from mgpu_helpers.exercises import Wrong
from mgpu_helpers.graders._ranks import run_ranks


def test_torchrun_ready_shell_puts_this_python_first_and_stays_on_loopback(monkeypatch):
    monkeypatch.setenv("PATH", os.pathsep.join(["/usr/bin", os.path.dirname(sys.executable)]))
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    monkeypatch.delenv("TMPDIR", raising=False)  # restored afterwards
    port = torchrun_ready_shell()
    assert 0 < port < 65536
    assert os.environ["PATH"].split(os.pathsep)[0] == os.path.dirname(sys.executable)
    assert os.environ["PATH"].count(os.path.dirname(sys.executable)) == 1
    assert os.environ.get("GLOO_SOCKET_IFNAME") in ("lo", "lo0", None)
    which = subprocess.run(
        ["sh", "-c", "command -v torchrun"], capture_output=True, text=True, env=os.environ
    )
    if which.returncode == 0:  # the torchrun of this environment, not another one
        assert os.path.dirname(which.stdout.strip()) == os.path.dirname(sys.executable)


#: A kernel that prepares its shell twice, then runs what torchrun's agent does with its log folder.
SHELL_KERNEL = """
import subprocess, sys, tempfile
from mgpu_helpers.ddp import torchrun_ready_shell
torchrun_ready_shell()
import os
folder = os.environ["TMPDIR"]
torchrun_ready_shell()
assert os.environ["TMPDIR"] == folder, "one folder per kernel"
assert tempfile.gettempdir() != folder, "the kernel's own tempfile keeps its temp dir"
agent = "import tempfile; print(tempfile.mkdtemp(prefix='torchelastic_'))"  # what torchrun does
shell = subprocess.run(["sh", "-c", f'{sys.executable} -c "{agent}"'], capture_output=True, text=True)
made = shell.stdout.strip()
print(folder, made)
"""


def test_torchrun_ready_shell_keeps_torchruns_temp_folders_in_one_removed_at_exit(tmp_path):
    orphan = tmp_path / "mgpu-shell-4194305-left"  # above Linux's largest pid: a kernel that is gone
    (orphan / "torchelastic_old").mkdir(parents=True)
    proc = subprocess.run(
        [sys.executable, "-c", SHELL_KERNEL],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "TMPDIR": str(tmp_path)},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    folder, made = proc.stdout.split()
    assert os.path.dirname(folder) == str(tmp_path) and os.path.basename(folder).startswith("mgpu-shell-")
    assert os.path.dirname(made) == folder and os.path.basename(made).startswith("torchelastic_")
    assert not os.path.exists(folder), "the kernel's folder (and torchrun's inside it) went at exit"
    assert not orphan.exists(), "a folder of a kernel that is gone was removed"


def test_captured_native_stderr_sees_what_cpp_code_writes():
    with captured_native_stderr() as captured:
        os.write(2, b"from file descriptor 2\n")  # what C++ warnings do, past sys.stderr
    assert captured == ["from file descriptor 2\n"]
    os.write(2, b"")  # file descriptor 2 works again


def _raises(rank, world_size):
    if rank == 1:
        raise ValueError("rank one is broken on purpose")
    dist.barrier()


def _waits_forever(rank, world_size):
    dist.recv(torch.empty(1), src=1 - rank)  # both ranks wait for the other: a deadlock


def test_grader_runs_turn_failures_and_hangs_into_short_feedback():
    with pytest.raises(Wrong, match=r"^rank 1 raised ValueError: rank one is broken on purpose$"):
        run_ranks(_raises, 2)
    with pytest.raises(Wrong, match=r"the 2 ranks did not finish within 3 s: one is waiting for a message"):
        run_ranks(_waits_forever, 2, timeout_s=3)
