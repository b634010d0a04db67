"""Tests of mgpu_helpers.tuning that need a fresh Python: no Ray or Optuna on import, the install hint
when the ``tune`` extra is missing, and re-running notebook 06's Ray cells in any order.

The re-run runs in a child process: the bug it guards against aborted the process in Ray's native
code (``authentication_token_loader.cc``), which would take the test runner with it.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest

HANG_DEADLINE_S = 300  # only catches hangs


def _run(code: str) -> tuple[subprocess.CompletedProcess, dict]:
    """Run ``code`` in a fresh interpreter without Ray settings in its environment; parse its REPORT line."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=HANG_DEADLINE_S,
        env=env,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("REPORT ")]
    report = json.loads(lines[-1][len("REPORT ") :]) if lines else {}
    return proc, report


IMPORTS_AND_MISSING_EXTRA = """
import importlib, json, pkgutil, sys
import mgpu_helpers, mgpu_helpers.tuning

failed = {}
for package in (mgpu_helpers, mgpu_helpers.tuning):
    for m in pkgutil.iter_modules(package.__path__):
        if m.name == "__main__":
            continue
        try:
            importlib.import_module(f"{package.__name__}.{m.name}")
        except Exception as exc:  # another module's own problem, reported but not this test's subject
            failed[f"{package.__name__}.{m.name}"] = repr(exc)
loaded = sorted(k for k in sys.modules if k.split(".")[0] in ("ray", "optuna"))

# Now pretend the optional `tune` extra is not installed.
for name in [k for k in sys.modules if k.split(".")[0] in ("ray", "optuna", "pandas")]:
    del sys.modules[name]
sys.modules.update({"ray": None, "optuna": None, "pandas": None})
from mgpu_helpers import tuning

calls = {
    "notes_search_space": lambda: tuning.notes_search_space(),
    "optuna_search_space": lambda: tuning.optuna_search_space(),
    "train_mlp": lambda: tuning.train_mlp({"l1": 4, "l2": 4, "lr": 0.1, "batch_size": 8}),
    "epoch_progress": lambda: tuning.epoch_progress(),
    "bohb_unavailable_reason": lambda: tuning.bohb_unavailable_reason(),
    "results_table": lambda: tuning.results_table([]),
    "run_study": lambda: tuning.run_study("random", budget=2),
    "local_ray": lambda: tuning.local_ray(num_cpus=1).__enter__(),
    "LocalRayCluster.start": lambda: tuning.LocalRayCluster(num_cpus=1).start(),
}
errors = {}
for name, call in calls.items():
    try:
        call()
        errors[name] = None
    except Exception as exc:
        errors[name] = f"{type(exc).__name__}: {exc}"
works = tuning.train_locally({"l1": 4, "l2": 4, "lr": 0.1, "batch_size": 64}, 1)[0]["epoch"] == 1
print("REPORT " + json.dumps({"loaded": loaded, "failed": failed, "errors": errors, "works": works}))
"""


@pytest.fixture(scope="module")
def without_extra():
    proc, report = _run(IMPORTS_AND_MISSING_EXTRA)
    assert proc.returncode == 0 and report, proc.stdout[-3000:] + proc.stderr[-3000:]
    return report


def test_importing_the_package_and_every_module_imports_neither_ray_nor_optuna(without_extra):
    assert not [m for m in without_extra["failed"] if "tuning" in m], without_extra["failed"]
    assert without_extra["loaded"] == [], (
        f"importing mgpu_helpers modules imported {without_extra['loaded'][:5]}"
    )


def test_missing_tune_extra_names_the_install_command(without_extra):
    errors = without_extra["errors"]
    for name, error in errors.items():
        assert error is not None, f"{name} ran without Ray/Optuna/pandas"
        assert error.startswith("ModuleNotFoundError: "), (name, error)
        assert 'pip install "mgpu-course[tune]"' in error and 'pip install "ray[tune]" optuna' in error, error
    assert "'optuna'" in errors["run_study"] and "'pandas'" in errors["results_table"]
    assert without_extra["works"], "training without Ray must keep working"


RERUN_CELLS = """
import gc, json, os, time, weakref
import psutil, ray
from mgpu_helpers import tuning
from mgpu_helpers.processes import is_loopback, listening_addresses


def where(i):
    return i, os.getpid()


report = {"driver": os.getpid()}
# Notebook 06's cells: start the cluster in the background, ask `ray status` before connecting, connect,
# run tasks.
cluster = tuning.LocalRayCluster(num_cpus=1).start(wait=False)
report["status_before_connect"] = "Active:" in cluster.status()
first = cluster.connect()
report["first"] = ray.get([ray.remote(where).remote(i) for i in range(2)])
token, first_head, old_ref = os.environ["RAY_AUTH_TOKEN"], cluster.process.pid, weakref.ref(cluster)

# Re-run the cluster cell while connected: a new object, same name and settings; the old one is dropped.
cluster = tuning.LocalRayCluster(num_cpus=1).start(wait=False)
gc.collect()
report["same_cell_reuses"] = [old_ref() is None, cluster.process.pid == first_head, ray.is_initialized()]
# ... then its connect cell (twice) and a @ray.remote cell: this aborted the process before the fix.
again = [cluster.connect().address, cluster.connect().address]
report["same_address"] = again == [first.address, first.address]
report["reused"] = ray.get([ray.remote(where).remote(i) for i in range(2)])

# Edit the cell (2 CPUs) and run it while connected: the old head is stopped, the new one joined.
old_ref = weakref.ref(cluster)
cluster = tuning.LocalRayCluster(num_cpus=2).start(wait=False)
gc.collect()
gone = not psutil.pid_exists(first_head)
report["edited_cell_replaces"] = [old_ref() is None, gone, not ray.is_initialized()]
report["token_kept"] = os.environ.get("RAY_AUTH_TOKEN") == token
second = cluster.connect()
report["new_address"] = second.address != first.address and cluster.connect().address == second.address


@ray.remote
def where_now(i):
    return i, os.getpid()


report["second"] = ray.get([where_now.remote(i) for i in range(2)])
report["loopback"] = all(is_loopback(ip) for ip, _, _ in listening_addresses())
report["status"] = "/2.0 CPU" in cluster.status()

# The stop cell twice, then the connect cell: a clear error, not an abort.
cluster.stop()
cluster.stop()
try:
    cluster.connect()
except RuntimeError as exc:
    report["connect_after_stop"] = str(exc)
deadline = time.monotonic() + 30
while tuning.ray_processes() and time.monotonic() < deadline:
    time.sleep(0.2)
report["left"] = [p.name() for p in tuning.ray_processes()]
report["temp_dir_removed"] = not os.path.exists(cluster.temp_dir)
print("REPORT " + json.dumps(report))
"""


@pytest.mark.slow  # three Ray clusters, ~24 s under CI's load: the slow set keeps it (CI's time budget)
def test_rerunning_the_cluster_cells_in_any_order_never_aborts():
    proc, report = _run(RERUN_CELLS)
    output = proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.returncode == 0, f"exit code {proc.returncode} (-6: Ray aborted the process):\n{output}"
    for key in ("first", "reused", "second"):  # every @ray.remote cell returned, from Ray's workers
        assert [i for i, _ in report[key]] == [0, 1], (key, output)
        assert all(pid != report["driver"] for _, pid in report[key]), key
    assert report["status_before_connect"] and report["status"]
    assert report["same_cell_reuses"] == [True, True, True] and report["same_address"]
    assert report["edited_cell_replaces"] == [True, True, True]
    assert report["token_kept"] and report["new_address"] and report["loopback"]
    assert "stopped: call start()" in report["connect_after_stop"]
    assert report["left"] == [] and report["temp_dir_removed"]
