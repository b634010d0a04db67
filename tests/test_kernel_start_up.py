"""The root conftest's kernel start-up retry: a notebook kernel that dies before answering kernel_info
(on CI: a port taken between jupyter_client choosing it and the kernel binding it) is started again; if
every attempt dies, the error quotes what the kernel wrote to stderr."""

import importlib.util
import os
import pathlib

import pytest

nbval_kernel = pytest.importorskip("nbval.kernel")

ROOT = pathlib.Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("root_conftest", ROOT / "conftest.py")
root_conftest = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(root_conftest)

#: nbval's own start_new_kernel (the root conftest has wrapped it in this process already).
NBVAL_START = getattr(nbval_kernel.start_new_kernel, "__wrapped__", nbval_kernel.start_new_kernel)
#: Shadows ``python -m ipykernel_launcher`` (what the kernel spec runs): dies the way a port clash does.
DYING_LAUNCHER = (
    "import sys\nsys.stderr.write('zmq.error.ZMQError: Address already in use\\n')\nsys.exit(1)\n"
)


def _start_real(dying_first: int, tmp_path):
    """nbval's real start_new_kernel, whose first ``dying_first`` kernels die at start-up."""
    (tmp_path / "ipykernel_launcher.py").write_text(DYING_LAUNCHER)
    calls = []

    def start(*args, **kwargs):
        calls.append(kwargs["stderr"])
        if len(calls) <= dying_first:
            kwargs["env"] = {**os.environ, "PYTHONPATH": str(tmp_path)}
        return NBVAL_START(*args, **kwargs)

    return root_conftest.retrying_start_up(start), calls


def test_a_kernel_that_dies_at_start_up_is_started_again(tmp_path):
    start, calls = _start_real(1, tmp_path)
    km, kc = start(kernel_name=nbval_kernel.CURRENT_ENV_KERNEL_NAME, startup_timeout=60)
    try:
        reply = kc.execute_interactive("x = 6 * 7", timeout=60)
        assert reply["content"]["status"] == "ok"
        assert len(calls) == 2 and km.is_alive()
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def test_a_kernel_that_always_dies_is_reported_with_its_stderr():
    calls = []

    def dies(*args, stderr, **kwargs):  # what nbval's start does when the kernel exits (seen above)
        calls.append(kwargs)
        stderr.write(f"zmq.error.ZMQError: Address already in use (attempt {len(calls)})\n")
        stderr.flush()
        raise RuntimeError("Kernel died before replying to kernel_info")

    with pytest.raises(RuntimeError, match="died at start-up 3 times") as err:
        root_conftest.retrying_start_up(dies)(kernel_name="python3", stderr=None)
    assert len(calls) == root_conftest.KERNEL_START_ATTEMPTS == 3
    assert all(f"Address already in use (attempt {i})" in str(err.value) for i in (1, 2, 3))


def test_nbvals_kernels_start_through_the_retry():
    assert getattr(nbval_kernel.start_new_kernel, "retries_start_up", False)
    assert NBVAL_START.__module__ == "nbval.kernel"
