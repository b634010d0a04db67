"""CPU CI runs in the state a GPU machine creates (tests/_gpu_conditions.py): autograd owns a thread in
the test process and in every notebook kernel, so a plain fork followed by backward fails — here, as on
Colab. If this condition ever lapsed, code that forks the kernel could pass CI and fail on every GPU."""

import importlib.util
import os
import pathlib

import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("root_conftest", ROOT / "conftest.py")
root_conftest = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(root_conftest)

#: In a child forked from here: exit 3 if autograd refuses because of the fork, 0 if backward works.
FORK_THEN_BACKWARD = """
import os, torch
pid = os.fork()
if pid == 0:
    try:
        torch.ones(1, requires_grad=True).sum().backward()
        os._exit(0)
    except RuntimeError as exc:
        os._exit(3 if "fork-based multiprocessing" in str(exc) else 4)
print("child exit", os.waitpid(pid, 0)[1] >> 8)
"""


def _fork_then_backward() -> int:
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            torch.ones(1, requires_grad=True).sum().backward()
            os._exit(0)
        except RuntimeError as exc:
            os._exit(3 if "fork-based multiprocessing" in str(exc) else 4)
    return os.waitpid(pid, 0)[1] >> 8


def test_the_test_process_is_in_gpu_machine_conditions():
    assert _fork_then_backward() == 3, "the conftest did not start autograd's thread in this process"


def test_notebook_kernels_start_in_gpu_machine_conditions():
    nbval_kernel = pytest.importorskip("nbval.kernel")
    km, kc = nbval_kernel.start_new_kernel(kernel_name=nbval_kernel.CURRENT_ENV_KERNEL_NAME)  # as nbval does
    try:
        out = []
        reply = kc.execute_interactive(
            FORK_THEN_BACKWARD + "\nprint('names left:', [n for n in dir() if 'Nest' in n or 'runpy' in n])",
            output_hook=lambda m: out.append(m["content"].get("text", "")),
            timeout=120,
        )
        assert reply["content"]["status"] == "ok", reply["content"]
        text = "".join(out)
        assert "child exit 3" in text, text  # a fork of the kernel cannot run autograd
        assert "names left: []" in text, text  # and the notebook's namespace is untouched
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
