"""The notebook launcher: per-rank results, fast failures with tracebacks, timeouts, fork vs spawn."""

import subprocess
import sys
import textwrap
import time

import pytest
import torch
import torch.distributed as dist

from mgpu_helpers.launcher import LaunchError, launch


def all_reduce_rank(rank: int, world_size: int, scale: float = 1.0):
    t = torch.tensor([float(rank)])
    dist.all_reduce(t)
    return rank, world_size, t.item() * scale, dist.get_backend()


def test_returns_each_ranks_result_in_order():
    assert launch(all_reduce_rank, 3, args=(2.0,)) == [(r, 3, 6.0, "gloo") for r in range(3)]
    assert launch(all_reduce_rank, 1) == [(0, 1, 0.0, "gloo")]  # a real group of one, in a child


def test_launching_twice_in_a_row_uses_fresh_ports():
    first = launch(all_reduce_rank, 2)
    second = launch(all_reduce_rank, 2)
    assert first == second == [(0, 2, 1.0, "gloo"), (1, 2, 1.0, "gloo")]


def fail_on_rank_one(rank: int, world_size: int):
    if rank == 1:
        raise ValueError("rank one fails on purpose")
    t = torch.zeros(1)
    dist.all_reduce(t)  # rank 0 waits here for a peer that is gone
    return rank


def test_failing_rank_is_reported_first_with_traceback_and_quickly():
    start = time.monotonic()
    with pytest.raises(LaunchError) as err:
        launch(fail_on_rank_one, 2, collective_timeout_s=30)
    assert time.monotonic() - start < 10
    message = str(err.value)
    assert message.startswith("rank 1 raised first")
    assert "ValueError: rank one fails on purpose" in message and "fail_on_rank_one" in message


def hang_on_rank_one(rank: int, world_size: int):
    if rank == 1:
        time.sleep(60)
    t = torch.zeros(1)
    dist.all_reduce(t)


def test_collective_timeout_turns_a_hang_into_an_error():
    start = time.monotonic()
    with pytest.raises(LaunchError) as err:
        launch(hang_on_rank_one, 2, collective_timeout_s=2)
    assert time.monotonic() - start < 15
    assert "rank 0 raised first" in str(err.value)


def sleep_forever(rank: int, world_size: int):
    time.sleep(60)


def test_overall_timeout_stops_everything():
    start = time.monotonic()
    with pytest.raises(LaunchError, match="timed out after 2 s"):
        launch(sleep_forever, 2, timeout_s=2)
    assert time.monotonic() - start < 10


def test_spawn_of_a_module_function_works():
    assert launch(all_reduce_rank, 2, start_method="spawn") == [(0, 2, 1.0, "gloo"), (1, 2, 1.0, "gloo")]


def test_notebook_defined_function_forks_and_spawn_request_explains(tmp_path):
    """A function defined in __main__ (as in a notebook) runs with fork; spawn gets a helpful error."""
    script = tmp_path / "nb.py"
    script.write_text(
        textwrap.dedent(
            """
            import torch, torch.distributed as dist
            from mgpu_helpers.launcher import LaunchError, launch

            def notebook_fn(rank, world_size):
                t = torch.ones(1)
                dist.all_reduce(t)
                return t.item()

            print("fork:", launch(notebook_fn, 2))
            try:
                launch(notebook_fn, 2, start_method="spawn")
            except LaunchError as exc:
                print("spawn:", exc)
            """
        )
    )
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "fork: [2.0, 2.0]" in out.stdout
    assert "spawn:" in out.stdout and "%%writefile" in out.stdout and "notebook_fn" in out.stdout


def test_bad_arguments_say_what_to_do(monkeypatch):
    with pytest.raises(ValueError, match=">= 1"):
        launch(all_reduce_rank, 0)
    with pytest.raises(TypeError):
        launch("not a function", 2)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="backend must be one of"):
        launch(all_reduce_rank, 2, backend="mpi")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    with pytest.raises(ValueError, match="use backend='gloo'"):
        launch(all_reduce_rank, 2, backend="nccl")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ValueError, match="one GPU per process"):
        launch(all_reduce_rank, 2, backend="nccl")


def test_fork_refused_once_cuda_is_initialised(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    with pytest.raises(LaunchError, match="CUDA is already initialised"):
        launch(all_reduce_rank, 2, start_method="fork")


def init_yourself(rank: int, world_size: int):
    dist.init_process_group("gloo", init_method="env://")  # MASTER_ADDR/PORT, RANK, WORLD_SIZE are set
    return dist.get_rank(), dist.get_world_size()


def test_env_is_set_for_init_method_env():
    assert launch(init_yourself, 2, init_process_group=False) == [(0, 2), (1, 2)]


def threaded_matmul(rank: int, world_size: int):
    return torch.get_num_threads(), float(torch.nn.Linear(256, 512)(torch.randn(1024, 256)).sum() != 0)


def test_fork_after_openmp_use_does_not_hang():
    """The parent runs multi-threaded ops first (as a notebook does); forked children must not hang."""
    (torch.randn(1_000_000) * 2).sum()
    torch.nn.Linear(256, 512)(torch.randn(1024, 256))
    assert launch(threaded_matmul, 1, init_process_group=False, timeout_s=60) == [(1, 1.0)]
    with pytest.warns(RuntimeWarning, match="OpenMP is not fork-safe"):
        launch(all_reduce_rank, 1, threads_per_process=2)  # no multi-threaded op in the child
