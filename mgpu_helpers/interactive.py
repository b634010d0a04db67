"""Used by notebook 01b: a live process group of N ranks that notebook cells talk to, one cell at a time.

    from mgpu_helpers.interactive import start_ranks

    ranks = start_ranks(2)      # 2 IPython engines, each rank of one torch.distributed group
    rc = ranks.client           # an ipyparallel Client: rc[:].pull("x") -> [x on rank 0, x on rank 1]

    %%px                         # this cell runs on every rank; output comes back rank by rank
    import torch, torch.distributed as dist
    t = torch.tensor([dist.get_rank() + 1.0]); dist.all_reduce(t); print(t)

    ranks.stop()                # process groups destroyed, engines and controller gone, temp dir removed

**Why ipyparallel.** Two existing engines run a notebook cell on several processes:

* `ipyparallel <https://ipyparallel.readthedocs.io>`_ (Jupyter project, since 2015, 9.x in 2026, BSD):
  a controller plus one IPython *engine* process per worker; ``%%px`` runs a cell on every engine and
  shows each engine's output prefixed ``[stdout:<id>]`` in engine order; ``rc[:].pull`` / ``push`` /
  ``%pxresult`` move values between the notebook and the engines; Ctrl-C forwards SIGINT to the
  engines; ``Cluster.stop_cluster`` stops everything (SIGTERM, then SIGKILL). It knows nothing about
  torch: joining the process group is one ``dist.init_process_group`` call on each engine
  (:func:`_join`, or typed by the student in a ``%%px`` cell after ``start_ranks(n, join=False)``).
* `nbdistributed <https://pypi.org/project/nbdistributed/>`_ (0.1.0, alpha, one author, written for
  his own GPU course; its README says it "is constantly changing" and takes no contributions): after
  ``%dist_init -n N`` it rewrites *every* cell to run on the workers (an input transformer), which blurs
  what runs where; it picks NCCL whenever CUDA exists and maps rank → GPU as ``rank % device_count``,
  so 2 ranks on Colab's single GPU both land on ``cuda:0`` under NCCL, which NCCL does not support; it
  binds its own ZeroMQ/pickle protocol and needs the ``jupyter`` meta-package.

ipyparallel is mature, documented, CPU-first and explicit (a cell runs on the ranks only when it says
``%%px``), so this module uses it and adds only the plumbing around it:

* **loopback only** — the controller listens on 127.0.0.1 (``--ip``); the engines only connect to it;
  rank 0's ``TCPStore`` listens on 127.0.0.1 only and gloo/NCCL use the loopback interface
  (:mod:`~mgpu_helpers.launching.loopback`), on a fresh port (:func:`~mgpu_helpers.processes.free_port`);
* **one process group** — rank = engine id (``join=False``: the engines are only prepared and a
  ``%%px`` cell joins them), backend from :func:`~mgpu_helpers.hardware.choose_backend`
  (NCCL with ``cuda:<rank>`` when every engine has its own GPU, else gloo), a collective timeout so a
  rank waiting for a peer that never comes raises instead of blocking for 30 minutes;
* **bounded start** — engines are polled for with a deadline; an engine that dies or a group that does
  not form raises an error that says what to do;
* **rank-ordered output** — the ``%%px`` magics are registered with streaming off (outputs are shown
  when every rank has finished, rank 0 first) and without a progress bar;
* **clean shutdown** — :meth:`LiveRanks.stop` (also ``with start_ranks(2) as ranks:``, on an error or
  Ctrl-C during start, and at kernel exit through ``atexit``) destroys the process groups, stops
  engines and controller, kills whatever is left of the processes it recorded, and removes the temp
  folder that holds ipyparallel's profile (connection files, logs). A kernel killed with SIGKILL runs no
  cleanup, and ipyparallel starts each process in a session of its own (no ``die_with_parent``), so a
  :class:`~mgpu_helpers.processes.Watchdog` told every pid stops them all within seconds; the next start
  removes the orphaned ``mgpu-ipp-<pid>-*`` folder (:func:`~mgpu_helpers.processes.temp_prefix`).
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import logging
import shutil
import tempfile
import time
from types import TracebackType
from typing import Any

from .hardware import BACKENDS, choose_backend
from .processes import LOOPBACK, Watchdog, descendants, free_port, stop_processes, temp_prefix

__all__ = ["LiveRanks", "start_ranks"]

_INSTALL = 'pip install ipyparallel  (or: pip install "mgpu-course[interactive]")'


def _require_ipyparallel() -> Any:
    """Import ipyparallel, or say which pip line installs it."""
    if importlib.util.find_spec("ipyparallel") is None:
        raise ModuleNotFoundError(
            f"interactive ranks need ipyparallel, which is not installed here: run `{_INSTALL}` "
            "(in a notebook: %pip install -q ipyparallel), then restart the kernel."
        )
    import ipyparallel

    return ipyparallel


def _prepare(rank: int, backend: str) -> dict[str, Any]:
    """Runs inside each engine before it joins a group: loopback sockets and stores, threads, device."""
    import os

    import torch

    from .launching.loopback import bind_stores_to_loopback, loopback_env

    os.environ.update(loopback_env())  # gloo / NCCL sockets on the loopback interface
    bind_stores_to_loopback()  # rank 0's TCPStore (init_method="tcp://127.0.0.1:PORT") on 127.0.0.1 only
    torch.set_num_threads(1)  # N engines share the machine's cores
    device = torch.device("cpu")
    if backend == "nccl":
        device = torch.device("cuda", rank)
        torch.cuda.set_device(device)  # NCCL then uses cuda:<rank> for this rank
    return {"rank": rank, "pid": os.getpid(), "device": str(device)}


def _join(rank: int, world_size: int, port: int, backend: str, timeout_s: float) -> dict[str, Any]:
    """Runs inside each engine: join the default process group as ``rank`` through 127.0.0.1:``port``
    (what notebook 01b's student types in a ``%%px`` cell after ``start_ranks(n, join=False)``)."""
    from datetime import timedelta

    import torch.distributed as dist

    info = _prepare(rank, backend)
    dist.init_process_group(
        backend,
        init_method=f"tcp://{LOOPBACK}:{port}",
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=timeout_s),
    )
    dist.barrier()  # every rank is connected to every other before the first cell runs
    return info


def _leave() -> bool:
    """Runs inside each engine at stop: destroy the process group(s) if there are any."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
        return True
    return False


def _is_ipyparallel(proc: Any) -> bool:
    """True for a process whose command line runs ipyparallel (controller, engine, nanny)."""
    try:
        return "ipyparallel" in " ".join(proc.cmdline())
    except Exception:  # gone, or not ours to read
        return False


def _check_seconds(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{name} must be a positive number of seconds, not {value!r}")
    return float(value)


class LiveRanks:
    """A live group of ``nprocs`` ranks: one ipyparallel engine per rank, all in one process group.

    Use :func:`start_ranks` (or ``LiveRanks(n).start()``); then ``%%px`` cells run on every rank,
    :attr:`client` / :attr:`view` move values, and :meth:`stop` ends everything (safe to call twice).

    Attributes:
        nprocs: number of ranks (engines).
        backend: ``"gloo"`` or ``"nccl"``.
        client: the ``ipyparallel.Client`` (``client[:]`` is a view on all ranks, ``client[1]`` on rank 1).
        view: a blocking ``DirectView`` on all ranks, in rank order (what ``%%px`` uses).
        pids: the ipyparallel processes started (controller, its forked copy, engines, their nannies).
        port: the 127.0.0.1 port of rank 0's store, for ``init_method=f"tcp://127.0.0.1:{port}"``.
        temp_dir: the folder holding ipyparallel's profile, connection files and logs.
    """

    def __init__(
        self,
        nprocs: int = 2,
        *,
        backend: str | None = None,
        start_timeout_s: float = 120.0,
        collective_timeout_s: float = 30.0,
        magics: bool = True,
        join: bool = True,
    ) -> None:
        """Configure (nothing starts until :meth:`start`).

        Args:
            nprocs: ranks to start, at least 1 (with NCCL at most one per GPU).
            backend: ``"gloo"``, ``"nccl"`` or None for :func:`~mgpu_helpers.hardware.choose_backend`.
            start_timeout_s: the whole start (engines registered and group formed) must fit in this.
            collective_timeout_s: a collective waiting longer than this for a peer raises on that rank
                (and the group is then unusable: stop and start again).
            magics: register ``%%px``, ``%px``, ``%pxresult``, ``%pxconfig`` in this IPython session.
            join: form the process group at start (rank = engine id). With False the engines are only
                prepared (loopback sockets and stores, one thread, ``cuda:<id>`` under NCCL) and each one
                joins when a cell calls ``dist.init_process_group(backend,
                init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=n)`` with :attr:`port`.
        """
        if isinstance(nprocs, bool) or not isinstance(nprocs, int) or nprocs < 1:
            raise ValueError(f"nprocs must be a whole number of ranks >= 1, such as 2, not {nprocs!r}")
        if backend is not None and backend not in BACKENDS:
            raise ValueError(
                f"backend must be one of {', '.join(BACKENDS)} or None (choose), not {backend!r}"
            )
        self.nprocs = nprocs
        self.backend = backend or choose_backend(nprocs)
        self.start_timeout_s = _check_seconds("start_timeout_s", start_timeout_s)
        self.collective_timeout_s = _check_seconds("collective_timeout_s", collective_timeout_s)
        self.magics = magics
        self.join = join
        self.port: int | None = None
        self.client: Any = None
        self.view: Any = None
        self.pids: list[int] = []
        self.temp_dir: str | None = None
        self.ranks: list[dict[str, Any]] = []
        self._cluster: Any = None
        self._watchdog: Watchdog | None = None  # stops the processes if this kernel is killed
        self._state = "new"

    def __repr__(self) -> str:
        return f"LiveRanks(nprocs={self.nprocs}, backend={self.backend!r}, {self._state})"

    @property
    def running(self) -> bool:
        """True between a successful :meth:`start` and :meth:`stop`."""
        return self._state == "running"

    # --- start ----------------------------------------------------------------------------------

    def start(self) -> LiveRanks:
        """Start the controller and ``nprocs`` engines on 127.0.0.1, wait for them (bounded), form the
        process group, and register the ``%px`` magics. On any failure (or Ctrl-C) everything started
        so far is stopped before the exception propagates."""
        if self._state != "new":
            raise RuntimeError(f"this LiveRanks is {self._state}; make a new one with start_ranks(...)")
        ipp = _require_ipyparallel()
        self._state = "starting"
        deadline = time.monotonic() + self.start_timeout_s
        before = {p.pid for p in descendants()}
        atexit.register(self.stop)
        try:
            self._watchdog = Watchdog(grace_s=0.5)  # SIGKILL after 0.5 s: nothing of value is left
            self.temp_dir = tempfile.mkdtemp(prefix=temp_prefix("ipp"))
            self._cluster = ipp.Cluster(
                n=self.nprocs,
                profile_dir=self.temp_dir,
                controller_ip=LOOPBACK,
                controller_args=["--usethreads"],  # schedulers as threads: fewer processes
                delay=0,
                shutdown_atexit=False,  # stop() is registered instead
                load_profile=False,
                log_level=logging.ERROR,  # engines stopped by SIGTERM exit with 1: not news
            )
            self._cluster.start_controller_sync()
            self._watchdog.watch(self._launched_pids())  # each pid as soon as it is known
            self._cluster.start_engines_sync(self.nprocs)
            self._watchdog.watch(self._launched_pids())
            self.client = self._cluster.connect_client_sync()
            self._wait_for_engines(deadline)
            self.pids = sorted(  # only ipyparallel's: stop() must not kill anything else started meanwhile
                p.pid for p in descendants() if p.pid not in before and _is_ipyparallel(p)
            )
            self._watchdog.watch(self.pids)  # + the controller's fork and the nannies
            self.port = free_port()
            if self.join:
                self._form_group(deadline)
            else:
                self.ranks = [
                    self.client[i].apply_sync(_prepare, i, self.backend) for i in range(self.nprocs)
                ]
            self.view = self.client[sorted(self.client.ids)]
            self.view.block = True
            if self.magics:
                self._register_magics()
        except BaseException:
            self.stop()
            raise
        self._state = "running"
        return self

    def _engine_output(self) -> str:
        with contextlib.suppress(Exception):
            text = "".join(s.get_output() for s in self._cluster.engines.values()).strip()
            return f" Engine output: {text[-800:]}" if text else ""
        return ""

    def _wait_for_engines(self, deadline: float) -> None:
        """Poll until all engines have registered, an engine set has exited, or the deadline passes."""
        while len(self.client.ids) < self.nprocs:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(
                    f"only {len(self.client.ids)} of {self.nprocs} engines registered within "
                    f"{self.start_timeout_s:g} s; on a busy machine pass a larger start_timeout_s, or "
                    f"fewer ranks.{self._engine_output()}"
                )
            if any(s.state != "running" for s in self._cluster.engines.values()):
                raise RuntimeError(
                    "an ipyparallel engine exited during start; check that `python -m ipyparallel.engine` "
                    f"runs in this environment ({_INSTALL}).{self._engine_output()}"
                )
            with contextlib.suppress(TimeoutError):
                self.client.wait_for_engines(self.nprocs, timeout=min(0.5, left), interactive=False)

    def _form_group(self, deadline: float) -> None:
        """Each engine joins the default group as rank = its engine id."""
        ids = sorted(self.client.ids)
        if ids != list(range(self.nprocs)):
            raise RuntimeError(f"expected engine ids 0..{self.nprocs - 1}, got {ids}; stop and start again")
        port = self.port
        timeout = min(self.collective_timeout_s, max(deadline - time.monotonic(), 1.0))
        pending = [
            self.client[i].apply_async(_join, i, self.nprocs, port, self.backend, timeout) for i in ids
        ]
        for i, result in enumerate(pending):
            try:
                self.ranks.append(result.get(timeout=max(deadline - time.monotonic(), 0.1) + timeout))
            except Exception as exc:
                cause = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
                fix = (
                    "NCCL needs one GPU per rank: pass backend='gloo' or fewer ranks"
                    if self.backend == "nccl"
                    else "another program may have taken the port: start again"
                )
                raise RuntimeError(
                    f"rank {i} could not join the {self.backend} group ({cause}); {fix}."
                ) from None

    def _register_magics(self) -> None:
        """``%%px`` and friends on all ranks: outputs shown rank by rank at the end, no progress bar."""
        from IPython import get_ipython

        shell = get_ipython()
        if shell is None:
            return  # plain Python (tests, scripts): use self.view.execute / apply instead
        from ipyparallel.client.magics import ParallelMagics

        magics = ParallelMagics(shell, self.view)
        magics.stream_output = False  # show outputs once every rank has finished, in rank order
        magics.progress_after_seconds = -1  # no progress bar in saved notebooks
        shell.magics_manager.register(magics)

    # --- stop -----------------------------------------------------------------------------------

    def _launched_pids(self) -> list[int]:
        """The controller's and engines' pids as ipyparallel knows them (also before :attr:`pids` is set)."""
        pids = []
        if self._cluster is not None:
            launchers = [self._cluster.controller]
            for engine_set in self._cluster.engines.values():
                launchers += list(getattr(engine_set, "launchers", {}).values())
            for launcher in launchers:
                with contextlib.suppress(Exception):
                    pids.append(int(launcher.process.pid))
        return pids

    def stop(self) -> None:
        """Destroy the process groups, stop engines and controller, kill leftovers, remove the temp
        folder. Idempotent; never raises for a cluster that is already (partly) gone."""
        if self._state in ("new", "stopped"):
            self._state = "stopped"
            return
        self._state = "stopping"
        atexit.unregister(self.stop)
        if self.client is not None:
            with contextlib.suppress(Exception):
                # A rank stuck in a collective cannot answer: wait a little, then stop it regardless.
                self.client[:].apply_async(_leave).wait(timeout=3.0)
            with contextlib.suppress(Exception):
                self.client.close()
        # The groups are gone, so nothing of value is left in the processes: stop them all at once
        # (SIGTERM, then SIGKILL after a short grace; an engine's own SIGTERM shutdown takes seconds).
        stop_processes([*self.pids, *self._launched_pids()], grace_s=1.5)
        if self._cluster is not None:
            with contextlib.suppress(Exception):
                self._cluster.stop_cluster_sync()  # ipyparallel's bookkeeping; its processes are gone
        if self._watchdog is not None:
            self._watchdog.close()  # everything is stopped: it exits without doing anything
        if self.temp_dir is not None:
            shutil.rmtree(self.temp_dir, ignore_errors=True)
        self._state = "stopped"

    def __enter__(self) -> LiveRanks:
        return self if self.running else self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def start_ranks(
    nprocs: int = 2,
    *,
    backend: str | None = None,
    start_timeout_s: float = 120.0,
    collective_timeout_s: float = 30.0,
    join: bool = True,
) -> LiveRanks:
    """Start ``nprocs`` ranks of one live process group (see :class:`LiveRanks`) and return them.

    Example: ``ranks = start_ranks(2)``, then ``%%px`` cells, ``ranks.client[:].pull("x")``, and
    ``ranks.stop()`` at the end (or ``with start_ranks(2) as ranks: ...``).
    """
    return LiveRanks(
        nprocs,
        backend=backend,
        start_timeout_s=start_timeout_s,
        collective_timeout_s=collective_timeout_s,
        join=join,
    ).start()
