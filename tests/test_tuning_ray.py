"""Tests of Ray on loopback: one LocalRayCluster shared by this module (one start-up), Ray Tune's
fault tolerance and restore on it, local_ray next to it, and nothing left behind.

Every wait on Ray polls with a deadline (the cluster's own start-up waits until ``ray status`` lists
its node; ``status()`` asks again until it has a report).
"""

import socket
import time
from pathlib import Path

import psutil
import pytest
from _scripts import graded, reference_solutions

pytest.importorskip("ray", reason="Ray Tune is the `tune` extra (offline GPU checks leave its wheel out)")

from mgpu_helpers import tuning
from mgpu_helpers.processes import LOOPBACK, descendants, is_loopback, listening_addresses, stop_processes
from mgpu_helpers.tuning import cluster as cluster_module

CONFIG = {"l1": 32, "l2": 16, "lr": 0.03, "batch_size": 32}
METRICS = {"epoch", "loss", "accuracy", "train_loss"}
_SHARED: dict[str, int] = {}  # "head": pid of the shared cluster's `ray start --block`
_INTERPRETER_HELPERS = ("multiprocessing.resource_tracker", "multiprocessing.forkserver")


def _wait_until(condition, deadline_s=60.0, what="condition"):
    deadline = time.monotonic() + deadline_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not hold within {deadline_s:.0f} s")
        time.sleep(0.2)


def _new_children(before):
    head = _SHARED.get("head")
    shared = {head, *(p.pid for p in descendants(head))} if head else set()
    left = []
    for p in descendants():
        try:
            if (
                p.pid in before
                or p.pid in shared
                or any(h in " ".join(p.cmdline()) for h in _INTERPRETER_HELPERS)
            ):
                continue
        except psutil.NoSuchProcess:
            continue
        left.append(p)
    return left


@pytest.fixture(autouse=True)
def no_leftover_children():
    """The root conftest's check (a test leaves no process), except for the shared cluster's processes.

    Ray's worker pool keeps idle workers below the head between tests; the ``cluster`` fixture's
    finalizer requires that nothing of the head is left once it is stopped.
    """
    before = {p.pid for p in descendants()}
    yield
    deadline = time.monotonic() + 10
    left = _new_children(before)
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = _new_children(before)
    names = [f"{p.pid} {p.name()}" for p in left if p.is_running()]
    stop_processes(left, grace_s=1.0)
    assert not left, f"test left processes running: {names}"


@pytest.fixture(scope="module")
def cluster():
    """A 2-CPU LocalRayCluster, started and connected once for the module; stopped also on failure."""
    import ray

    shared = tuning.LocalRayCluster(num_cpus=2, name="tests")
    try:
        shared.start()
        _SHARED["head"] = shared.process.pid
        shared.connect()
        yield shared
    finally:
        _SHARED.pop("head", None)
        shared.stop()
        assert not ray.is_initialized()
        # stop() itself waits for every process of the head's session (08 asserts this right after it)
        assert not tuning.ray_processes(), [p.name() for p in tuning.ray_processes()]
        assert not Path(shared.temp_dir).exists()


def test_cluster_is_up_on_loopback_runs_tasks_and_reports_status(cluster):
    import ray

    command = cluster.start_command()
    assert f"--node-ip-address={LOOPBACK}" in command and "--include-dashboard=false" in command
    runtime = cluster.connect()  # connected already (the fixture did): the same runtime again
    assert runtime.node_ip == LOOPBACK and runtime.address == cluster.address
    assert ray.get_runtime_context().gcs_address == cluster.address
    assert runtime.resources["CPU"] == 2 and len(runtime.pids) >= 3
    listening = listening_addresses()
    assert listening and all(is_loopback(ip) for ip, _, _ in listening), listening
    assert ray.get(ray.remote(lambda: 6 * 7).remote()) == 42
    status = cluster.status()
    assert "Active:" in status and "/2.0 CPU" in status
    assert len([n for n in ray.nodes() if n["Alive"]]) == 1
    assert "ray start --address=10.0.0.1:" in "\n".join(cluster.second_machine_commands("10.0.0.1"))
    assert "running" in repr(cluster) and cluster.start() is cluster  # starting it again changes nothing


def test_connect_closes_a_connection_to_another_cluster_first(cluster, monkeypatch):
    import ray

    closed = []
    real_disconnect = cluster_module._disconnect
    # Pretend the driver is connected elsewhere: connect() must close that connection, then join this one.
    monkeypatch.setattr(cluster_module, "_connected_address", lambda: "127.0.0.1:1")
    monkeypatch.setattr(cluster_module, "_disconnect", lambda: (closed.append(1), real_disconnect()))
    runtime = cluster.connect()
    assert closed == [1] and ray.is_initialized() and runtime.address == cluster.address
    assert ray.get(ray.remote(lambda: "again").remote()) == "again"


@pytest.mark.slow  # ~20 s; no notebook teaches Tune's fault tolerance since the 06 split (see the docstring)
def test_tune_fault_tolerance_and_restore_on_the_cluster(cluster, tmp_path):
    """train_mlp's checkpoint and crash switches under FailureConfig and Tuner.restore.

    Notebook 06b only names these APIs in its table of old and new calls, so this test runs with
    ``-m slow`` instead of in every CI run: ``python -m pytest -m slow tests/test_tuning_ray.py``.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from ray import tune

    # Two trials that report every epoch and checkpoint. One crashes once before epoch 2 and is retried
    # from its checkpoint (max_failures=1); the other crashes twice before epoch 3 and errors, which does
    # not stop the experiment. Tuner.restore then resumes it from its checkpoint.
    crash_dir = tmp_path / "crashes"
    crash_dir.mkdir()
    flaky = {**CONFIG, "max_epochs": 3, "checkpoint": True, "crash_dir": str(crash_dir)}
    trainable = tune.with_resources(tuning.train_mlp, {"cpu": 1})
    progress = tuning.epoch_progress(total=6)
    with tuning.quiet_logs():
        crashed = tune.Tuner(
            trainable,
            param_space={**flaky, "crash_at": tune.grid_search([[2], [3, 3]])},
            run_config=tune.RunConfig(
                name="faults",
                storage_path=str(tmp_path),
                verbose=0,
                callbacks=[progress],
                failure_config=tune.FailureConfig(max_failures=1),
            ),
        ).fit()
    expected = tuning.train_locally(flaky, 3)
    by_crash = {tuple(r.config["crash_at"]): r for r in crashed}
    assert crashed.num_errors == 1 and len(crashed) == 2
    recovered, errored = by_crash[(2,)], by_crash[(3, 3)]
    df = recovered.metrics_dataframe
    assert recovered.error is None and set(df.columns) >= METRICS
    # A report made just before a crash can be missing from the trial's history (a race inside Ray,
    # seen on a loaded machine: epochs [2, 3]); every recorded one must match, and the last is there.
    epochs = list(df["epoch"])
    assert epochs[-1] == 3 and epochs == sorted(set(epochs)) and epochs == list(df["training_iteration"])
    assert list(df["accuracy"]) == [expected[e - 1]["accuracy"] for e in epochs]
    assert list(df["loss"]) == [expected[e - 1]["loss"] for e in epochs]
    assert isinstance(errored.error, Exception) and "SimulatedCrash" in repr(errored.error)
    # The errored trial reported epochs 1 and 2 before crashing; whether its last report reached the
    # driver before Ray recorded the error is a race inside Ray (no wait can settle it), so a prefix.
    errored_epochs = list(errored.metrics_dataframe.get("epoch", []))
    assert errored_epochs == [1, 2][: len(errored_epochs)]
    assert sorted(p.name.split("-", 1)[1] for p in crash_dir.iterdir()) == [
        "epoch2-0",
        "epoch3-0",
        "epoch3-1",
    ]
    table = tuning.results_table(crashed)
    assert sorted(table["status"]) == ["ERROR", "OK"] and max(table["epochs"]) == 3
    assert list(table.columns) == ["l1", "l2", "lr", "batch_size", "loss", "accuracy", "epochs", "status"]
    assert len(epochs) <= progress.epochs <= 5  # the history + up to 2 reports of the errored trial
    ax = tuning.plot_learning_curves(crashed, milestones=[1, 3], title="faults")
    curves = 1 + bool(errored_epochs)  # a curve per trial that has reports (see the race above)
    assert ax.get_title() == "faults" and len(ax.lines) == curves + 2  # ... and a line per milestone
    plt.close("all")

    with tuning.quiet_logs():
        restored = tune.Tuner.restore(crashed.experiment_path, trainable=trainable, resume_errored=True).fit()
    assert restored.num_errors == 0
    for r in restored:
        epochs = list(r.metrics_dataframe["epoch"])  # (as above: a report before a crash may be missing)
        assert epochs[-1] == 3 and epochs == sorted(set(epochs))
        assert list(r.metrics_dataframe["accuracy"]) == [expected[e - 1]["accuracy"] for e in epochs]


def test_local_ray_replaces_the_connection_and_cleans_up_on_error(cluster):
    import ray

    class Boom(Exception):
        pass

    with pytest.raises(Boom), tuning.local_ray(num_cpus=1) as runtime:
        assert ray.get_runtime_context().gcs_address == runtime.address != cluster.address
        assert runtime.node_ip == LOOPBACK and runtime.resources["CPU"] == 1 and len(runtime.pids) >= 3
        listening = listening_addresses()
        assert all(is_loopback(ip) for ip, _, _ in listening), listening
        assert ray.get(ray.remote(lambda: 6 * 7).remote()) == 42
        with pytest.raises(RuntimeError, match="cannot be nested"), tuning.local_ray(num_cpus=1):
            pass
        with pytest.raises(RuntimeError, match="local_ray block; leave it"):
            cluster.connect()
        raise Boom("an error inside the block must still shut Ray down")
    assert not ray.is_initialized()
    assert not Path(runtime.temp_dir).exists()
    _wait_until(lambda: not any(psutil.pid_exists(p) for p in runtime.pids), 30, "local_ray's processes gone")
    assert cluster.process.poll() is None, "the cluster keeps running while local_ray runs"
    assert cluster.connect().address == cluster.address
    assert ray.get(ray.remote(lambda: "back").remote()) == "back"


def test_tune_refuses_to_start_a_second_ray_when_the_connect_cell_was_not_run(cluster, tmp_path):
    """Notebook 06b after its cluster cell was edited and re-run but not its connect cell: Tune's own
    ``ray.init()`` used to start a second Ray (a raylet beside the head's, a session left in /tmp/ray)."""
    import ray
    from ray import tune

    ray.shutdown()  # what re-running an edited cluster cell does to the connection
    raylets = {p.pid for p in tuning.ray_processes() if "raylet" in p.name()}
    tuner = tune.Tuner(
        tune.with_resources(tuning.train_mlp, {"cpu": 1}),
        param_space={**CONFIG, "max_epochs": 1},
        run_config=tune.RunConfig(name="refused", storage_path=str(tmp_path), verbose=0),
    )
    try:
        refused = r"not connected to its Ray cluster \('tests' at 127\.0\.0\.1:\d+\).*second Ray of its own"
        with pytest.raises(
            RuntimeError, match=refused + r".*Run the cell with `runtime = cluster\.connect\(\)`"
        ):
            tuner.fit()
        with pytest.raises(RuntimeError, match=r"cluster\.connect\(\)"):
            ray.get(ray.remote(lambda: 1).remote())  # any call that would start Ray is refused alike
        assert not ray.is_initialized()
        assert {p.pid for p in tuning.ray_processes() if "raylet" in p.name()} == raylets  # no second raylet
    finally:
        cluster.connect()  # the connect cell, run: the next tests use the cluster again
    assert ray.get(ray.remote(lambda: "connected").remote()) == "connected"


def test_cluster_start_failure_is_reported_and_cleaned_up(cluster, monkeypatch):
    from mgpu_helpers.tuning import _head

    def core() -> set[int]:  # ray start, gcs_server and the raylet of the shared head (not below ray start)
        found = cluster._head.marked()
        return {p.pid for p in found if p.pid == cluster.process.pid or p.name() in ("gcs_server", "raylet")}

    shared = core()
    assert len(shared) == 3 and cluster._head.process.pid in shared
    monkeypatch.setattr(
        _head, "ray_cli", lambda: ["python", "-c", "print('no Ray here'); raise SystemExit(3)"]
    )
    failing = tuning.LocalRayCluster(num_cpus=1, name="failing")
    with pytest.raises(RuntimeError, match=r"exited with code 3 \(attempt 1 of 3\).*\n.*no Ray here"):
        failing.start()
    assert failing.process is not None and failing.process.poll() == 3
    assert not Path(failing.temp_dir).exists()
    with pytest.raises(RuntimeError, match="was stopped: call start"):
        failing.connect()
    assert core() == shared, "stopping one head stopped another's processes"


def test_a_fixed_port_in_use_is_reported():
    with socket.socket() as busy:
        busy.bind((LOOPBACK, 0))
        busy.listen()
        port = busy.getsockname()[1]
        if port < 1024:
            pytest.skip("the OS gave a privileged port")
        with pytest.raises(RuntimeError, match=f"port {port} is in use on 127.0.0.1; pass port=None"):
            tuning.LocalRayCluster(num_cpus=1, port=port, name="busy").start()


# ------------------------------------------------------------------------------------------------
# Bad inputs (no Ray start-up: the checks come first)
# ------------------------------------------------------------------------------------------------


def _enter(**kwargs):
    with tuning.local_ray(**kwargs):
        pass


def _quiet(level):
    with tuning.quiet_logs(level):
        pass


RAY_LOCAL_BAD_INPUTS = [
    (_enter, (), {"num_cpus": -1}, ValueError, r"num_cpus must be >= 1 such as 2, not -1"),
    (_enter, (), {"num_cpus": 0}, ValueError, r"num_cpus must be >= 1"),
    (_enter, (), {"num_cpus": "2"}, TypeError, r"num_cpus must be a whole number"),
    (_enter, (), {"num_gpus": -1}, ValueError, r"num_gpus must be >= 0"),
    (_enter, (), {"attempts": 0}, ValueError, r"attempts must be >= 1"),
    (_enter, (), {"quiet": "yes"}, TypeError, r"quiet must be True or False"),
    (_enter, (), {"address": "auto"}, TypeError, r"local_ray sets \['address'\] itself"),
    (_enter, (), {"include_dashboard": True}, TypeError, r"sets \['include_dashboard'\] itself"),
    (_quiet, (-1,), {}, ValueError, r"level .* must be >= 0"),
    (tuning.ray_processes, (0,), {}, ValueError, r"root \(a process id\) must be >= 1"),
]

_UNSTARTED = tuning.LocalRayCluster(num_cpus=1, name="unstarted")

CLUSTER_BAD_INPUTS = [
    (tuning.LocalRayCluster, (0,), {}, ValueError, r"num_cpus must be >= 1"),
    (tuning.LocalRayCluster, (1.5,), {}, TypeError, r"num_cpus must be a whole number"),
    (tuning.LocalRayCluster, (), {"num_gpus": -1}, ValueError, r"num_gpus must be >= 0"),
    (tuning.LocalRayCluster, (), {"port": 80}, ValueError, r"port must be >= 1024 such as 6379, or None"),
    (tuning.LocalRayCluster, (), {"port": 70000}, ValueError, r"port must be <= 65535"),
    (tuning.LocalRayCluster, (), {"port": "6379"}, TypeError, r"port must be a whole number"),
    (tuning.LocalRayCluster, (), {"name": ""}, TypeError, r"name must be a non-empty string"),
    (tuning.LocalRayCluster, (), {"startup_timeout": 0}, ValueError, r"startup_timeout \(s\) must be .*> 0"),
    (tuning.LocalRayCluster, (), {"attempts": 0}, ValueError, r"attempts must be >= 1"),
    (_UNSTARTED.start, ("no",), {}, TypeError, r"wait must be True or False"),
    (_UNSTARTED.connect, (), {}, RuntimeError, r"not started: call start\(\) first"),
    (_UNSTARTED.connect, ("no",), {}, TypeError, r"quiet must be True or False"),
    (_UNSTARTED.status, (), {}, RuntimeError, r"not started: call start\(\) first"),
    (_UNSTARTED.status, (-1,), {}, ValueError, r"timeout \(seconds\) must be a finite number > 0"),
    (_UNSTARTED.stop, (-1,), {}, ValueError, r"grace \(seconds\) must be a finite number >= 0"),
    (_UNSTARTED.second_machine_commands, (5,), {}, TypeError, r"head_ip must be a non-empty string"),
    (getattr, (_UNSTARTED, "address"), {}, RuntimeError, r"not started: call start\(\) first"),
]


@pytest.mark.parametrize(
    ("func", "args", "kwargs", "error", "message"),
    RAY_LOCAL_BAD_INPUTS,
    ids=[f"{f.__name__}-{i}" for i, (f, *_) in enumerate(RAY_LOCAL_BAD_INPUTS)],
)
def test_ray_local_rejects_bad_inputs(func, args, kwargs, error, message):
    with pytest.raises(error, match=message):
        func(*args, **kwargs)


@pytest.mark.parametrize(
    ("func", "args", "kwargs", "error", "message"),
    CLUSTER_BAD_INPUTS,
    ids=[f"{f.__name__}-{i}" for i, (f, *_) in enumerate(CLUSTER_BAD_INPUTS)],
)
def test_cluster_rejects_bad_inputs(func, args, kwargs, error, message):
    with pytest.raises(error, match=message):
        func(*args, **kwargs)


@pytest.mark.parametrize(
    ("exercise_id", "attempt"),
    [  # 08.2's wrong attempt and shortcut (a Tune run each) are in the slow set (-m slow)
        ("06b.1", "SOLUTIONS"),
        ("06b.1", "WRONG"),
        ("08.2", "SOLUTIONS"),
        pytest.param("08.2", "WRONG", marks=pytest.mark.slow),
    ],
)
def test_trainable_exercise_graded_on_the_shared_cluster(cluster, attempt, exercise_id):
    """Exercises 06b.1 and 08.2 (tests/test_solutions.py leaves them here): the reference trainable passes
    its grader on the connected cluster (06b.1: a crash, a restart from its checkpoint; 08.2: ASHA stops a
    poor trial), and the known-wrong trainable (never resumes; reports only at the end) fails."""
    notebook = exercise_id.split(".")[0]
    ok, printed = graded(exercise_id, *getattr(reference_solutions(notebook), attempt)[exercise_id])
    assert ok == (attempt == "SOLUTIONS"), printed
    assert printed.startswith("✅" if ok else "❌"), printed


@pytest.mark.parametrize(
    "name",
    [  # each a Tune run with a restart (9-13 s under CI's load): the slow set (-m slow), CI's time budget
        pytest.param(n, marks=[pytest.mark.slow], id=n)
        for n in sorted(reference_solutions("06b").SHORTCUTS["06b.1"])
    ],
)
def test_trainable_shortcut_rejected_on_the_shared_cluster(cluster, name):
    """06b.1's known shortcuts (tests/test_solutions.py leaves them here too): a trainable that
    checkpoints only the epoch count and replays the earlier epochs after the restart, or keeps its state
    in a file under /tmp instead of (or besides) the checkpoint Tune hands back, may report the right
    numbers, yet the grader rejects it: every reported checkpoint must hold the model's weights, and the
    restart finds none of the files saved outside the checkpoints (as after a lost machine)."""
    ok, printed = graded("06b.1", *reference_solutions("06b").SHORTCUTS["06b.1"][name])
    assert not ok and printed.startswith("❌ Exercise 06b.1") and "restor" in printed, printed


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(reference_solutions("08").SHORTCUTS.get("08.2", {})))
def test_capstone_trainable_shortcut_rejected_on_the_shared_cluster(cluster, name):
    """08.2's known shortcuts (tests/test_solutions.py leaves them here too): e.g. training every epoch
    first and reporting afterwards — each reported checkpoint must match its report."""
    ok, printed = graded("08.2", *reference_solutions("08").SHORTCUTS["08.2"][name])
    assert not ok and printed.startswith("❌ Exercise 08.2"), printed
