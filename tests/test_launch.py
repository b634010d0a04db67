"""run_torchrun: identities, failures that name the rank, timeouts, loopback only, and no leftover
processes — also when the caller is interrupted or killed, or an agent is killed."""

import os
import signal
import threading

import psutil
import pytest
from _scripts import (
    FAILING_NODE,
    KILLED_AFTER_JOIN,
    RAISE_AFTER_JOIN,
    READY_THEN_WAIT,
    SLEEP,
    assert_loopback_only,
    is_alive,
    job_listening_addresses,
    signal_parent_and_watch,
    wait_until,
    write_script,
)

from mgpu_helpers.hardware import choose_backend
from mgpu_helpers.launching import (
    TorchrunError,
    gpu_slices,
    parse_results,
    run_torchrun,
    torchrun_command,
)
from mgpu_helpers.launching import torchrun as torchrun_module
from mgpu_helpers.launching.failures import describe_failure, parse_failures, rank_output

# What a node prints when rank 3 raises a chained exception after joining its group (torch 2.13).
AGENT_OUTPUT = """\
[rank2]:[W1123 04:34:18.26 ProcessGroupGloo.cpp:1] Warning: something harmless
[rank3]: Traceback (most recent call last):
[rank3]:   File "train.py", line 4, in load
[rank3]: KeyError: 'weights'
[rank3]:
[rank3]: During handling of the above exception, another exception occurred:
[rank3]:
[rank3]: Traceback (most recent call last):
[rank3]:   File "train.py", line 9, in <module>
[rank3]: RuntimeError: checkpoint is incomplete
E1123 04:34:18.299000 14237 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: 1)
Traceback (most recent call last):
  File "torch/distributed/run.py", line 1032, in <module>
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train.py FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-11-23_04:34:18
  rank      : 2 (local_rank: 0)
  exitcode  : -15 (pid: 14239)  (SIGTERM)
  traceback : Signal 15 (SIGTERM) received by PID 14239
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-23_04:34:18
  rank      : 3 (local_rank: 1)
  exitcode  : 1 (pid: 14240)
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================
"""


def test_two_nodes_form_one_job_with_distinct_ranks():
    runs = run_torchrun("mgpu_helpers.launching.worker", nnodes=2, nproc_per_node=1, timeout=90)
    assert [r.returncode for r in runs] == [0, 0]
    (table,) = runs[0].results  # rank 0 lives on node 0 and prints everyone's identity
    assert runs[1].results == []
    assert [(r["rank"], r["node_rank"], r["local_rank"], r["world_size"]) for r in table] == [
        (0, 0, 0, 2),
        (1, 1, 0, 2),
    ]
    # Each simulated node sees its own slice of GPUs ("" = none): the worker asks choose_backend there.
    expected = choose_backend(1) if gpu_slices(2, 1)[0] else "gloo"
    assert all(r["all_reduce_sum"] == 1.0 and r["backend"] == expected for r in table)
    assert all(r["master"].startswith("127.0.0.1:") for r in table)
    assert len({r["pid"] for r in table}) == 2
    assert runs[1].shell_command().startswith("torchrun --nnodes=2 --nproc-per-node=1 --node-rank=1")


def test_a_rank_that_raises_after_joining_is_named_with_its_traceback(tmp_path):
    with pytest.raises(TorchrunError) as err:
        run_torchrun(write_script(tmp_path, RAISE_AFTER_JOIN), module=False, nproc_per_node=2, timeout=60)
    message = str(err.value)
    assert message.startswith("rank 1 (local rank 1 on node 0) exited with code 1")
    assert "ValueError: rank one is broken after joining" in message
    assert "in broken_step" in message and "[rank1]" not in message  # the whole traceback, unprefixed


def test_a_rank_that_raises_before_joining_is_quoted(tmp_path):
    script = write_script(
        tmp_path, 'import os\nif os.environ["RANK"] == "1":\n    raise ValueError("early")\n'
    )
    with pytest.raises(TorchrunError) as err:
        run_torchrun(script, module=False, nproc_per_node=2, timeout=60)
    assert str(err.value).startswith("rank 1 (local rank 1 on node 0) exited with code 1")
    assert "ValueError: early" in str(err.value)


def test_a_rank_killed_by_a_signal_is_named(tmp_path):
    with pytest.raises(TorchrunError) as err:
        run_torchrun(write_script(tmp_path, KILLED_AFTER_JOIN), module=False, nproc_per_node=2, timeout=60)
    assert str(err.value).startswith("rank 1 (local rank 1 on node 0) was killed by signal 9 (SIGKILL)")


def test_the_rank_that_failed_is_named_not_the_node_stopped_for_it(tmp_path):
    with pytest.raises(TorchrunError) as err:
        run_torchrun(
            write_script(tmp_path, FAILING_NODE), module=False, nnodes=2, nproc_per_node=1, timeout=60
        )
    assert str(err.value).startswith("rank 1 (local rank 0 on node 1) exited with code 1")
    assert "node one is broken on purpose" in str(err.value)
    # the conftest fixture fails this test if node 0's agent or worker is still alive


def test_a_missing_module_is_quoted():
    with pytest.raises(TorchrunError, match="No module named no_such_module_here"):
        run_torchrun("no_such_module_here", nproc_per_node=1, timeout=60)


def test_timeout_stops_everything(tmp_path):
    with pytest.raises(TorchrunError, match="timed out after 2 s"):
        run_torchrun(write_script(tmp_path, SLEEP), module=False, nproc_per_node=1, timeout=2)


def test_every_socket_of_the_job_listens_on_loopback_only(tmp_path):
    """The agent's store and the workers' gloo sockets: all on 127.0.0.1 (2-node c10d: test_ddp)."""
    folder = tmp_path / "job"
    folder.mkdir()
    script = write_script(tmp_path, READY_THEN_WAIT)
    runs = []
    job = threading.Thread(
        target=lambda: runs.extend(run_torchrun(script, [str(folder)], module=False, nproc_per_node=2))
    )
    job.start()
    try:
        found = job_listening_addresses(lambda: all((folder / f"ready{r}").exists() for r in range(2)))
    finally:
        (folder / "release").touch()
        job.join(timeout=90)
    assert [r.returncode for r in runs] == [0]
    assert_loopback_only(found, at_least=3)  # node 0's store + one gloo listener per rank


def test_a_killed_agent_takes_its_workers_along(tmp_path):
    """SIGKILL to an agent: it cannot stop its workers, Linux does (PDEATHSIG set when they start)."""
    script = write_script(tmp_path, SLEEP)
    errors = []

    def job():
        try:
            # the agent's scratch folder stays behind when it is killed: keep it in tmp_path
            run_torchrun(script, module=False, nproc_per_node=2, timeout=90, env={"TMPDIR": str(tmp_path)})
        except TorchrunError as exc:
            errors.append(str(exc))

    thread = threading.Thread(target=job)
    thread.start()
    try:

        def agent_and_workers():
            try:
                kids = [(p, p.cmdline()) for p in psutil.Process().children(recursive=True)]
            except psutil.NoSuchProcess:
                return None
            agents = [p for p, cmd in kids if "mgpu_helpers.launching.agent" in cmd]
            workers = [p for p, cmd in kids if cmd[-2:] == ["-u", script]]
            return len(agents) == 1 and len(workers) == 2 and (agents[0], workers)

        agent, workers = wait_until(agent_and_workers, "the agent and its 2 workers")
        agent.kill()
        wait_until(lambda: not any(is_alive(p) for p in workers), "the workers to exit")
    finally:
        thread.join(timeout=90)
    assert errors and "agent was killed by SIGKILL before any worker failed" in errors[0]


PARENT = """
import sys
from mgpu_helpers.launching import run_torchrun
try:
    run_torchrun(sys.argv[1], module=False, nproc_per_node=2, timeout=100)
except KeyboardInterrupt:
    print("interrupted", flush=True)
"""


def test_the_job_dies_with_a_killed_parent(tmp_path):
    """A kernel killed with SIGKILL runs no cleanup: agent (SIGTERM) and workers must go by themselves,
    and the agent still removes its folders."""
    script, scratch = write_script(tmp_path, SLEEP), tmp_path / "tmp"
    scratch.mkdir()
    signal_parent_and_watch(PARENT, script, min_descendants=3, sig=signal.SIGKILL, tmpdir=scratch)
    assert sorted(os.listdir(scratch)) == []


def test_an_interrupt_stops_the_agent_and_its_workers(tmp_path):
    script = write_script(tmp_path, SLEEP)
    output = signal_parent_and_watch(PARENT, script, min_descendants=3, sig=signal.SIGINT)
    assert "interrupted" in output, output


def test_command_line():
    cmd = torchrun_command("pkg.mod", ["--x", 1], nnodes=2, nproc_per_node=4, node_rank=1, master_port=1234)
    assert cmd[1:] == [
        "-m",
        "torch.distributed.run",
        "--nnodes=2",
        "--nproc-per-node=4",
        "--node-rank=1",
        "--master-addr=127.0.0.1",
        "--master-port=1234",
        "-m",
        "pkg.mod",
        "--x",
        "1",
    ]


def test_the_agents_report_is_parsed_and_the_whole_chained_traceback_quoted():
    root, other = parse_failures(AGENT_OUTPUT)
    assert (root.rank, root.local_rank, root.exitcode, root.pid, root.root_cause) == (3, 1, 1, 14240, True)
    assert (other.rank, other.signal_name, other.root_cause) == (2, "SIGTERM", False)
    assert other.how() == "was killed by signal 15 (SIGTERM) (pid 14239)"
    text = describe_failure(root, AGENT_OUTPUT)
    assert text.startswith("--- rank 3's traceback ---\nTraceback (most recent call last):")
    assert "KeyError: 'weights'" in text and text.endswith("RuntimeError: checkpoint is incomplete")
    assert rank_output(AGENT_OUTPUT, 2) == [
        "[W1123 04:34:18.26 ProcessGroupGloo.cpp:1] Warning: something harmless"
    ]
    assert rank_output(AGENT_OUTPUT, None) == []  # torchrun's log line and its own report are left out


def test_a_missing_script_is_refused_before_anything_starts(tmp_path, monkeypatch):
    def no_popen(*args, **kwargs):
        raise AssertionError("a process was started")

    monkeypatch.setattr(torchrun_module.subprocess, "Popen", no_popen)
    missing = str(tmp_path / "nope.py")
    with pytest.raises(FileNotFoundError, match=r"No such file: .*nope\.py"):
        run_torchrun(missing, module=False)


@pytest.mark.parametrize(
    ("fn", "args", "kwargs", "error", "message"),
    [
        (run_torchrun, ("m",), {"nproc_per_node": "2"}, TypeError, r"nproc_per_node must be a whole number"),
        (run_torchrun, ("m",), {"nnodes": 0}, ValueError, r"nnodes must be >= 1"),
        (run_torchrun, ("m",), {"timeout": 0}, ValueError, r"timeout must be a positive number .* 120"),
        (run_torchrun, ("m",), {"timeout": "60"}, TypeError, r"timeout must be a number of seconds"),
        (run_torchrun, ("m",), {"rdzv": "etcd"}, ValueError, r"rdzv must be 'static' or 'c10d'"),
        (run_torchrun, ("m", "--x 1"), {}, TypeError, r"args must be a list .* \['--steps', '3'\]"),
        (run_torchrun, ("m",), {"env": {"A": 1}}, TypeError, r"env must be a dict of str to str"),
        (run_torchrun, ("m",), {"module": "yes"}, TypeError, r"module must be True or False"),
        (run_torchrun, ("",), {}, TypeError, r"target must be a module name or a script path"),
        (torchrun_command, ("m",), {"nnodes": 2, "node_rank": 2, "master_port": 1}, ValueError, r"0\.\.1"),
        (torchrun_command, ("m",), {"nproc_per_node": 0, "master_port": 1}, ValueError, r">= 1"),
        (torchrun_command, ("m",), {"master_port": 70000}, ValueError, r"1\.\.65535"),
        (torchrun_command, ("m",), {"master_port": 1, "max_restarts": -1}, ValueError, r"max_restarts"),
        (gpu_slices, (0, 1), {}, ValueError, r"nnodes must be >= 1"),
        (parse_results, (None,), {}, TypeError, r"NodeRun\.stdout"),
        (parse_failures, (b"bytes",), {}, TypeError, r"NodeRun\.stdout \+ NodeRun\.stderr"),
        (rank_output, ("",), {"rank": -1}, ValueError, r"rank must be a global rank >= 0"),
        (describe_failure, ("rank 1", ""), {}, TypeError, r"WorkerFailure from parse_failures\(\)"),
        (describe_failure, (None, ""), {"max_lines": 0}, ValueError, r"max_lines must be an integer >= 3"),
    ],
)
def test_bad_arguments_say_what_to_pass(fn, args, kwargs, error, message):
    with pytest.raises(error, match=message):
        fn(*args, **kwargs)


def test_gpu_slices_give_each_simulated_node_its_own_gpus(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr("torch.cuda.device_count", lambda: 4)
    assert gpu_slices(2, 2) == ["0,1", "2,3"]
    monkeypatch.setattr("torch.cuda.device_count", lambda: 2)
    assert gpu_slices(2, 2) == ["", ""]  # not enough: hide GPUs, use gloo
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    assert gpu_slices(2, 2) == ["4,5", "6,7"]


def test_parse_results():
    assert parse_results('noise\nMGPU_RESULT {"a": 1}\nMGPU_RESULT [2]\n') == [{"a": 1}, [2]]
