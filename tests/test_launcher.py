"""launch(): per-rank results, failures with tracebacks, timeouts, forkserver and spawn with functions
from __main__, what a fork used to inherit (environment, cwd, sys.path), loopback only, and no process or
temp folder left behind — also when the caller is interrupted or killed."""

import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time

import pytest
import torch
import torch.distributed as dist
from _scripts import (
    assert_loopback_only,
    count_mgpu_entries,
    job_listening_addresses,
    signal_parent_and_watch,
)

from mgpu_helpers.hardware import choose_backend
from mgpu_helpers.launching import LaunchError, launch
from mgpu_helpers.launching.loopback import loopback_tcp_store
from mgpu_helpers.processes import free_port, listening_addresses, remove_orphaned_temp_dirs


def _device() -> torch.device:
    """Where this rank's tensors must live for the backend launch chose (NCCL: its own GPU)."""
    if dist.get_backend() == "nccl":
        torch.cuda.set_device(dist.get_rank())
        return torch.device("cuda", dist.get_rank())
    return torch.device("cpu")


def all_reduce_rank(rank: int, world_size: int, scale: float = 1.0):
    t = torch.tensor([float(rank)], device=_device())
    dist.all_reduce(t)
    return rank, world_size, t.item() * scale, dist.get_backend()


def test_returns_each_ranks_result_in_order():
    assert launch(all_reduce_rank, 3, args=(2.0,)) == [(r, 3, 6.0, choose_backend(3)) for r in range(3)]
    assert launch(all_reduce_rank, 1) == [(0, 1, 0.0, choose_backend(1))]  # a real group of one, in a child


def test_launching_twice_in_a_row_uses_fresh_ports():
    first = launch(all_reduce_rank, 2)
    second = launch(all_reduce_rank, 2)
    assert first == second == [(r, 2, 1.0, choose_backend(2)) for r in range(2)]


def fail_on_rank_one(rank: int, world_size: int):
    if rank == 1:
        raise ValueError("rank one fails on purpose")
    t = torch.zeros(1, device=_device())
    dist.all_reduce(t)  # rank 0 waits here for a peer that is gone
    return rank


def test_failing_rank_is_reported_first_with_its_traceback():
    # Rank 0 would wait 60 s in its all_reduce: it is stopped as soon as rank 1 fails, well before.
    with pytest.raises(LaunchError) as err:
        launch(fail_on_rank_one, 2, collective_timeout_s=60, timeout_s=60)
    message = str(err.value)
    assert message.startswith("rank 1 raised first")
    assert "ValueError: rank one fails on purpose" in message and "fail_on_rank_one" in message


def hang_on_rank_one(rank: int, world_size: int):
    if rank == 1:
        time.sleep(60)
    t = torch.zeros(1, device=_device())
    dist.all_reduce(t)


def test_collective_timeout_turns_a_hang_into_an_error():
    with pytest.raises(LaunchError, match="rank 0 raised first"):
        launch(hang_on_rank_one, 2, collective_timeout_s=2, timeout_s=60)


def sleep_forever(rank: int, world_size: int):
    time.sleep(60)


def test_overall_timeout_stops_everything_and_leaves_no_temp_folder(monkeypatch, tmp_path):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # a folder no other test writes to
    with pytest.raises(LaunchError, match="timed out after 2 s"):
        launch(sleep_forever, 2, timeout_s=2)
    with pytest.raises(LaunchError, match="rank 1 raised first"):
        launch(fail_on_rank_one, 2, timeout_s=60)
    assert count_mgpu_entries(tmp_path) == 0
    assert not list(tmp_path.glob("pytorch-errorfile-*")), "torch's error file of the failed rank is left"


def killed_on_rank_one(rank: int, world_size: int):
    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(60)


def test_a_rank_killed_by_a_signal_is_named():
    with pytest.raises(LaunchError, match=r"rank 1 was killed by SIGKILL without a Python traceback"):
        launch(killed_on_rank_one, 2, timeout_s=60)


def test_spawn_of_a_module_function_works():
    expected = [(r, 2, 1.0, choose_backend(2)) for r in range(2)]
    assert launch(all_reduce_rank, 2, start_method="spawn") == expected


NOTEBOOK = """
import os, sys
sys.path.insert(0, {tests!r})
import _gpu_conditions
import torch, torch.distributed as dist, torch.nn as nn
from torch.utils.data import DataLoader, Dataset
from mgpu_helpers.launching import launch

_gpu_conditions.start_autograd_thread()  # what a GPU machine's first backward does: fork is now unsafe
WEIGHT = torch.full((3, 3), 2.0)  # a notebook global: ranks get a copy

class Doubler(nn.Module):  # a class defined in the notebook
    def forward(self, x):
        return x @ WEIGHT

class Squares(Dataset):  # a Dataset defined in the notebook, read by DataLoader workers inside a rank
    def __len__(self):
        return 4
    def __getitem__(self, i):
        return torch.tensor([float(i * i)])

def notebook_fn(rank, world_size, offset):
    x = torch.ones(1, 3, requires_grad=True)
    Doubler()(x).sum().backward()  # autograd in the child
    WEIGHT.add_(100)  # changes the rank's copy only
    total = sum(b.sum().item() for b in DataLoader(Squares(), batch_size=2, num_workers=2))
    t = x.grad.sum().reshape(1) + offset
    dist.all_reduce(t)
    try:
        from late_module import VALUE  # written after the first launch, in the working directory
    except ImportError:
        VALUE = None
    return t.item(), total, os.environ.get("SET_LATER"), VALUE, os.getcwd()

print("first:", launch(notebook_fn, 2, args=(1.0,), timeout_s=90)[0][:2])
os.environ["SET_LATER"] = "yes"  # %env after the forkserver started
os.chdir({folder!r})
with open("late_module.py", "w") as fh:
    fh.write("VALUE = 7\\n")
sys.path.insert(0, "")  # as in a kernel: the working directory is on sys.path
for method in ("forkserver", "spawn"):
    print(method + ":", launch(notebook_fn, 2, args=(1.0,), start_method=method, timeout_s=90))
print("weight in the notebook:", WEIGHT[0, 0].item())
"""


def test_notebook_defined_code_runs_after_autograd_started_a_thread_with_the_notebooks_state(tmp_path):
    """The case that broke 10 notebooks on GPU machines: a function, class, Dataset and global defined
    in __main__ (as in a notebook), launched after autograd owns a thread (a fork would fail at the first
    backward), with the environment, cwd and sys.path as they are at the launch, not as they were when
    the forkserver started. Forkserver and spawn give the same answer; no `if __name__` guard needed."""
    folder = tmp_path / "cwd"
    folder.mkdir()
    code = NOTEBOOK.format(tests=os.path.dirname(__file__), folder=str(folder))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    # grad of sum(x @ W) w.r.t. x is W's row sums: 6 per element, 18 per rank; + offset 1, summed: 38
    assert "first: (38.0, 14.0)" in out.stdout, out.stdout + out.stderr[-2000:]
    expected = repr([(38.0, 14.0, "yes", 7, str(folder))] * 2)
    assert f"forkserver: {expected}" in out.stdout, out.stdout
    assert f"spawn: {expected}" in out.stdout, out.stdout
    assert "weight in the notebook: 2.0" in out.stdout


def test_launch_works_where_a_plain_fork_fails():
    """The conftest starts an autograd thread in this process (tests/test_gpu_conditions.py shows a fork
    then fails at its first backward); launch's ranks run backward all the same."""
    assert launch(backward_rank, 2) == [2.0, 2.0]


def backward_rank(rank: int, world_size: int) -> float:
    x = torch.ones(1, requires_grad=True)
    (2 * x).sum().backward()
    return x.grad.item()


def test_what_cannot_be_sent_is_named_with_the_fix():
    import threading as th

    lock = th.Lock()

    def uses_a_lock(rank, world_size):
        with lock:
            return rank

    with pytest.raises(ValueError, match=r"uses_a_lock.*'lock'.*build things like open files, locks"):
        launch(uses_a_lock, 1)
    with pytest.raises(ValueError, match=r"start_method must be one of.*never forked"):
        launch(all_reduce_rank, 2, start_method="fork")


def test_a_cuda_tensor_in_the_payload_is_refused_with_the_fix(monkeypatch):
    from mgpu_helpers.launching import server

    class FakeCuda(torch.Tensor):  # a CPU tensor that says it lives on a GPU
        @property
        def device(self):
            return torch.device("cuda", 0)

    fake = torch.ones(2).as_subclass(FakeCuda)
    with pytest.raises(ValueError, match=r"tensor on cuda:0.*Create it inside the function"):
        server.pack(all_reduce_rank, (fake,))


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "message"),
    [
        ((all_reduce_rank, 0), {}, ValueError, r"nprocs must be >= 1"),
        ((all_reduce_rank, "2"), {}, TypeError, r"nprocs must be a whole number .* such as 2"),
        ((all_reduce_rank, True), {}, TypeError, r"nprocs must be a whole number"),
        (("not a function", 2), {}, TypeError, r"fn must be a function taking \(rank, world_size"),
        ((all_reduce_rank, 2), {"timeout_s": -1}, ValueError, r"timeout_s must be a positive number"),
        ((all_reduce_rank, 2), {"timeout_s": float("nan")}, ValueError, r"timeout_s must be a positive"),
        (
            (all_reduce_rank, 2),
            {"collective_timeout_s": -5},
            ValueError,
            r"collective_timeout_s must be a pos",
        ),
        ((all_reduce_rank, 2), {"collective_timeout_s": "60"}, TypeError, r"such as 60"),
        ((all_reduce_rank, 2), {"start_method": "thread"}, ValueError, r"start_method must be one of"),
        ((all_reduce_rank, 2), {"backend": "mpi"}, ValueError, r"backend must be one of .*gloo"),
        ((all_reduce_rank, 2), {"args": "abc"}, TypeError, r"args must be a tuple .* such as \(3,\)"),
        ((all_reduce_rank, 2), {"args": 5}, TypeError, r"args must be a tuple"),
        ((all_reduce_rank, 2), {"init_process_group": "yes"}, TypeError, r"True or False"),
        ((all_reduce_rank, 2), {"threads_per_process": 0}, ValueError, r"integer >= 1"),
        ((all_reduce_rank, 2), {"env": {"OMP_NUM_THREADS": 1}}, TypeError, r"dict of str to str"),
    ],
)
def test_bad_arguments_say_what_to_pass(args, kwargs, error, message):
    with pytest.raises(error, match=message):
        launch(*args, **kwargs)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"port": -1}, ValueError, r"port must be an integer in 0\.\.65535 \(0: any free port\)"),
        ({"port": "29500"}, TypeError, r"port must be an integer"),
        ({"timeout": 30}, ValueError, r"timeout must be a positive datetime\.timedelta"),
        ({"world_size": 0}, ValueError, r"world_size must be None \(not checked\) or an integer >= 1"),
    ],
)
def test_loopback_store_bad_arguments_say_what_to_pass(kwargs, error, message):
    with pytest.raises(error, match=message):
        loopback_tcp_store(**kwargs)


def test_loopback_store_listens_on_loopback_only_and_serves_clients():
    store = loopback_tcp_store()
    client = dist.TCPStore("127.0.0.1", store.port, is_master=False)
    client.set("key", "value")
    assert store.get("key") == b"value"
    mine = [a for a in listening_addresses() if a[1] == store.port]
    assert [a[0] for a in mine] == ["127.0.0.1"]
    del client, store


def test_nccl_without_enough_gpus_says_what_to_use(monkeypatch):
    monkeypatch.setattr(dist, "is_nccl_available", lambda: False)
    with pytest.raises(ValueError, match="no NCCL; use backend='gloo'"):
        launch(all_reduce_rank, 2, backend="nccl")
    monkeypatch.setattr(dist, "is_nccl_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    with pytest.raises(ValueError, match="use backend='gloo'"):
        launch(all_reduce_rank, 2, backend="nccl")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ValueError, match="one GPU per process"):
        launch(all_reduce_rank, 2, backend="nccl")


def test_cuda_initialised_here_changes_nothing(monkeypatch):
    """The kernel is never forked, so CUDA initialised in it does not matter (it did with fork)."""
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    assert launch(backward_rank, 1) == [2.0]


def init_yourself(rank: int, world_size: int):
    dist.init_process_group("gloo", init_method="env://")  # MASTER_ADDR/PORT, RANK, WORLD_SIZE are set
    return dist.get_rank(), dist.get_world_size()


def test_env_is_set_for_init_method_env():
    assert launch(init_yourself, 2, init_process_group=False) == [(0, 2), (1, 2)]


def threaded_matmul(rank: int, world_size: int):
    return torch.get_num_threads(), float(torch.nn.Linear(256, 512)(torch.randn(1024, 256)).sum() != 0)


def test_children_get_threads_after_the_parent_used_openmp():
    """The parent runs multi-threaded ops first (as a notebook does); the children, forked from the clean
    forkserver, run multi-threaded ops too (a fork of this process could hang in its first one)."""
    (torch.randn(1_000_000) * 2).sum()
    torch.nn.Linear(256, 512)(torch.randn(1024, 256))
    result = launch(threaded_matmul, 1, init_process_group=False, timeout_s=60, threads_per_process=2)
    assert result == [(2, 1.0)]


def ready_then_wait(rank: int, world_size: int, folder: str, init_method: str | None):
    """Join (unless launch did), say so in ``folder``, and stay up until the test has looked."""
    if init_method is not None:
        dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world_size)
    dist.barrier()
    open(os.path.join(folder, f"ready{rank}"), "w").close()
    deadline = time.monotonic() + 60
    while not os.path.exists(os.path.join(folder, "release")) and time.monotonic() < deadline:
        time.sleep(0.05)
    return dist.get_backend()


@pytest.mark.parametrize("init_method", [None, "env://", "tcp://127.0.0.1:{port}"])
def test_every_socket_of_the_job_listens_on_loopback_only(tmp_path, init_method):
    """The store rank 0 hosts (launch's own, or one fn creates itself) and gloo's sockets: 127.0.0.1."""
    if init_method and "{port}" in init_method:
        init_method = init_method.format(port=free_port())
    folder = str(tmp_path)
    results = []
    job = threading.Thread(
        target=lambda: results.append(
            launch(ready_then_wait, 2, args=(folder, init_method), init_process_group=init_method is None)
        )
    )
    job.start()
    try:
        found = job_listening_addresses(lambda: all(os.path.exists(f"{folder}/ready{r}") for r in range(2)))
    finally:
        open(os.path.join(folder, "release"), "w").close()
        job.join(timeout=90)
    assert results == [["gloo" if init_method else choose_backend(2)] * 2]
    assert_loopback_only(found, at_least=3)  # rank 0's store + one gloo listener per rank


PARENT = """
import signal, time
import psutil
from mgpu_helpers.launching import launch

def nap(rank, world_size):
    # torch's own children ask for SIGINT when the parent dies, which code that catches Ctrl-C (a
    # training loop that saves on KeyboardInterrupt) or is stuck in native code survives; here: ignores.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    time.sleep(100)

try:
    launch(nap, 2, timeout_s=100)
except KeyboardInterrupt:
    helpers = ("multiprocessing.forkserver", "multiprocessing.resource_tracker")  # live as long as we do
    live = [p for p in psutil.Process().children(recursive=True)
            if p.status() != psutil.STATUS_ZOMBIE and not any(h in " ".join(p.cmdline()) for h in helpers)]
    print("interrupted; children left:", len(live), flush=True)
"""


def test_children_die_with_a_killed_parent(tmp_path):
    """A kernel killed with SIGKILL runs no cleanup: the ranks (children of the forkserver, not of the
    kernel) must go by themselves, and so must the forkserver and the resource tracker.
    Its result folder stays until the next launch on the machine removes it (its pid is gone)."""
    signal_parent_and_watch(PARENT, min_descendants=4, sig=signal.SIGKILL, tmpdir=tmp_path)
    assert count_mgpu_entries(tmp_path) == 1
    remove_orphaned_temp_dirs("launch", str(tmp_path))  # what the next launch() does first
    assert count_mgpu_entries(tmp_path) == 0


def test_an_interrupt_stops_every_child_and_leaves_no_folder(tmp_path):
    output = signal_parent_and_watch(PARENT, min_descendants=4, sig=signal.SIGINT, tmpdir=tmp_path)
    assert "interrupted" in output, output
    assert count_mgpu_entries(tmp_path) == 0


INTERRUPTED_WHILE_STARTING = (
    """
import torch.multiprocessing as mp

real_start = mp.start_processes

def start_then_interrupted(*args, **kwargs):
    real_start(*args, **kwargs)  # the children exist ...
    raise KeyboardInterrupt  # ... but Ctrl-C lands before their context is returned

mp.start_processes = start_then_interrupted
"""
    + PARENT
)


CTRL_C_WHILE_STARTING = (
    """
import os, signal
import torch.multiprocessing as mp

real_start = mp.start_processes

def start_with_ctrl_c(*args, **kwargs):
    context = real_start(*args, **kwargs)
    os.kill(os.getpid(), signal.SIGINT)  # a real Ctrl-C while start_processes is still running
    return context

mp.start_processes = start_with_ctrl_c
"""
    + PARENT
)


@pytest.mark.parametrize(
    "parent",
    [
        # the same path as a real Ctrl-C, provoked by raising: the slow set keeps it (CI's time budget)
        pytest.param(INTERRUPTED_WHILE_STARTING, id="interrupt-raised", marks=pytest.mark.slow),
        pytest.param(CTRL_C_WHILE_STARTING, id="real-ctrl-c"),
    ],
)
def test_an_interrupt_during_start_up_still_stops_every_child(parent):
    # Without cleanup the children would live on, and Python would not even exit: it joins
    # non-daemon multiprocessing children at exit (here: for 100 s).
    proc = subprocess.run([sys.executable, "-c", parent], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "interrupted; children left: 0" in proc.stdout, proc.stdout + proc.stderr[-3000:]


def test_multiprocessings_default_start_method_does_not_change_the_launchers_choice(tmp_path):
    """Python 3.14 makes forkserver the default start method on Linux, and a notebook may set spawn: the
    launcher uses its own forkserver context either way, and a closure from __main__ still runs."""
    script = tmp_path / "nb314.py"
    script.write_text(
        textwrap.dedent(
            """
            import multiprocessing
            import torch, torch.distributed as dist
            from mgpu_helpers.launching import launch

            multiprocessing.set_start_method("spawn")

            def make_worker(offset):
                def worker(rank, world_size):  # a closure: travels by value
                    t = torch.ones(1) + offset
                    dist.all_reduce(t)
                    return t.item()
                return worker

            print("result:", launch(make_worker(1.0), 2))
            """
        )
    )
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "result: [4.0, 4.0]" in proc.stdout
