"""mgpu_helpers.interactive: a live 2-rank group on ipyparallel engines (joined at start) runs a real
all_reduce, listens on 127.0.0.1 only, and leaves no process and no temp folder behind — after an error
in a cell, after Ctrl-C during start, and after the kernel is killed (SIGKILL: the watchdog stops every
ipyparallel process, the next start removes the folder); stop() twice is harmless; errors name the fix.

The other way to join — ``start_ranks(n, join=False)``, then ``init_process_group`` typed in a
``%%px`` cell — is what notebook 01b does under nbval (its all_reduce asserted): not started again here."""

import importlib.util
import os
import subprocess
import sys
import tempfile
import time

import psutil
import pytest

pytest.importorskip("ipyparallel")

from mgpu_helpers import interactive  # noqa: E402
from mgpu_helpers.interactive import LiveRanks, start_ranks  # noqa: E402
from mgpu_helpers.processes import (  # noqa: E402
    descendants,
    is_loopback,
    listening_addresses,
    stop_processes,
    temp_prefix,
)


def _alive(pids):
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return out


@pytest.mark.slow  # ~13 s; notebook 01b runs live ranks and an all-reduce under nbval in CI
def test_all_reduce_on_live_ranks_then_nothing_left_also_after_an_error_in_a_cell():
    before = {p.pid for p in descendants()}
    with pytest.raises(Exception, match="boom"), start_ranks(2, backend="gloo") as ranks:
        assert ranks.running and ranks.backend == "gloo" and len(ranks.pids) >= 3  # controller + 2 engines
        assert all("ipyparallel" in " ".join(psutil.Process(p).cmdline()) for p in ranks.pids)
        assert [r["rank"] for r in ranks.ranks] == [0, 1]
        assert all(is_loopback(ip) for ip, _, _ in listening_addresses()), listening_addresses()
        ranks.view.execute(
            "import torch, torch.distributed as dist\n"
            "t = torch.tensor([dist.get_rank() + 1.0])\n"
            "dist.all_reduce(t)"
        )
        assert [t.item() for t in ranks.view.pull("t")] == [3.0, 3.0]  # 1 + 2 on both ranks
        pids, folder = list(ranks.pids), ranks.temp_dir
        assert os.path.isdir(folder)
        ranks.view.execute("raise ValueError('boom')")  # an error inside a cell: the with block cleans up
    assert not ranks.running
    assert _alive(pids) == [] and not os.path.exists(folder)
    assert {p.pid for p in descendants()} - before == set()
    ranks.stop()  # a second stop is harmless
    ranks.stop()


def test_ctrl_c_during_start_stops_what_was_started(monkeypatch):
    before = {p.pid for p in descendants()}
    ranks = LiveRanks(2, backend="gloo")

    def interrupted(self, deadline):
        self.launched = self._launched_pids()
        raise KeyboardInterrupt

    monkeypatch.setattr(LiveRanks, "_wait_for_engines", interrupted)
    with pytest.raises(KeyboardInterrupt):
        ranks.start()
    assert len(ranks.launched) == 3  # the controller and both engines had been started
    assert _alive(ranks.launched) == [] and not os.path.exists(ranks.temp_dir)
    assert {p.pid for p in descendants()} - before == set()
    ranks.stop()


def test_errors_name_the_fix(monkeypatch):
    with pytest.raises(ValueError, match="nprocs"):
        LiveRanks(0)
    with pytest.raises(ValueError, match="backend"):
        LiveRanks(2, backend="mpi")
    real = importlib.util.find_spec
    monkeypatch.setattr(
        interactive.importlib.util, "find_spec", lambda n, *a: None if n == "ipyparallel" else real(n, *a)
    )
    with pytest.raises(ModuleNotFoundError, match="pip install"):
        LiveRanks(2, backend="gloo").start()


_KERNEL = """
import sys, time
from mgpu_helpers.interactive import start_ranks
ranks = start_ranks(2, backend="gloo", join=False)
print("READY", ranks.temp_dir, *ranks.pids, flush=True)
time.sleep(600)
"""


def test_a_killed_kernel_takes_every_ipyparallel_process_along_and_its_folder_goes_at_the_next_start(
    tmp_path, monkeypatch
):
    """SIGKILL runs no cleanup, and ipyparallel starts each process in a session of its own: before the
    watchdog, controller, engines and nannies outlived the kernel for minutes."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    out = tmp_path / "kernel.out"
    with open(out, "wb") as log:  # a file, not a pipe: a pipe stays open while any child holds it
        kernel = subprocess.Popen(
            [sys.executable, "-c", _KERNEL],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "TMPDIR": str(tmp_path)},
        )
    tree: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 120
        while "READY" not in out.read_text() and kernel.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        ready = [line.split() for line in out.read_text().splitlines() if line.startswith("READY")]
        assert ready, f"the kernel did not start its ranks: {out.read_text()[-2000:]}"
        folder, *pids = ready[0][1:]
        # controller and its fork, 2 engines, 2 nannies
        assert kernel.poll() is None and len(pids) >= 6, out.read_text()
        tree = descendants(kernel.pid)  # the watchdog too
        assert {int(p) for p in pids} < {p.pid for p in tree}
        kernel.kill()
        kernel.wait()
        killed = time.monotonic()
        while any(_alive([p.pid]) for p in tree) and time.monotonic() < killed + 10:
            time.sleep(0.1)
        assert _alive([p.pid for p in tree]) == [], f"alive 10 s after the kernel was killed: {tree}"
        assert os.path.isdir(folder)  # nothing of the kernel ran: the folder is still there ...
        temp_prefix("ipp")  # ... until the next start_ranks (of any kernel) asks for its prefix
        assert not os.path.exists(folder)
    finally:
        if kernel.poll() is None:
            kernel.kill()
            kernel.wait()
        stop_processes(tree, grace_s=0)
