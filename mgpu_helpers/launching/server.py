"""Used by :func:`~mgpu_helpers.launching.launch` (notebooks 02a–08 and the graders) and by the 04d
graders' elastic jobs: the one way this package starts Python workers from a notebook kernel or a test.

**Why not fork.** A forked child is a copy of the kernel, so a function defined in a notebook cell simply
exists in it — which is why fork was the obvious choice, and why Hugging Face Accelerate's
``notebook_launcher`` forks. But PyTorch marks a process unsafe to fork as soon as autograd has started a
worker thread, and a forked child then fails at its first ``backward()`` ("Unable to handle autograd's
threading in combination with fork-based multiprocessing"). On a machine with a GPU, autograd starts its
per-device threads at the first backward of the process — *even a CPU-only one*, with
``torch.cuda.is_initialized()`` still False — so every notebook that checks a reference gradient in the
kernel before launching broke there. Forking after CUDA is initialised breaks CUDA in the child, too.

**What is done instead.** Children come from Python's *forkserver*: a clean process, started once per
kernel with ``fork + exec``, that imports torch and this launcher (:data:`PRELOAD`) and never runs autograd
or touches CUDA; each child is a fork of *that* process, so it starts in milliseconds with torch already
imported, and CUDA and autograd work in it. Where forkserver does not exist (Windows), ``spawn`` is used:
the same code, only slower. What a fork used to give for free is shipped with every launch:

* the function and its arguments, pickled **by value** with ``cloudpickle`` (:func:`pack`): a function,
  class or global defined in the notebook travels as its code and data. Tensors in the payload are
  *copied* (a rank changing one does not change the notebook's); CUDA tensors are refused (:func:`pack`
  says to create them inside the function);
* the environment variables, working directory and ``sys.path`` at launch time (:func:`snapshot`,
  :func:`adopt`): a variable set by ``%env`` after the server started reaches the ranks, and a module
  written with ``%%writefile`` imports;
* the kernel's pid: a forkserver child's parent is the server, not the kernel, so each child watches the
  kernel (:func:`die_with`) and kills itself within moments of the kernel's death.
"""

from __future__ import annotations

import contextlib
import io
import multiprocessing
import os
import pickle
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

from ..processes import die_with_parent, tune_malloc

__all__ = [
    "PRELOAD", "adopt", "context", "die_with", "keep_freed_memory", "no_main_import", "pack", "snapshot",
    "start_method", "unpack",
]  # fmt: skip

#: What the forkserver imports once, so that no child pays for it: torch, the launcher (and so this
#: package), and ``torch._dynamo``, which ``DistributedDataParallel`` and every optimizer import on first
#: use (1.5–2.5 s of CPU in each process that does not inherit it).
PRELOAD = ["cloudpickle", "torch", "torch.distributed", "torch._dynamo", "mgpu_helpers.launching.notebook"]


def start_method() -> str:
    """``"forkserver"`` where Python has it (Linux, macOS), else ``"spawn"``."""
    return "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"


def context() -> Any:
    """The multiprocessing context every worker is started from, its forkserver running and preloaded.

    The preload list (:data:`PRELOAD`) is set before the server's first start; the server then lives as
    long as this process (and is started again if it died). It is Python's one forkserver per
    interpreter: anything else here that asks for forkserver (a DataLoader with
    ``multiprocessing_context="forkserver"``) shares it.
    """
    method = start_method()
    ctx = multiprocessing.get_context(method)
    if method == "forkserver":
        from multiprocessing import forkserver

        if getattr(forkserver._forkserver, "_forkserver_pid", None) is None:  # not started yet
            ctx.set_forkserver_preload(PRELOAD)
        forkserver.ensure_running()
    return ctx


def _parent_of_children(method: str) -> int:
    """The pid children started with ``method`` have as parent: the forkserver's (after :func:`context`),
    else ours."""
    from multiprocessing import forkserver

    if method == "forkserver":
        pid = getattr(forkserver._forkserver, "_forkserver_pid", None)
        if pid is not None:
            return int(pid)
    return os.getpid()


@contextlib.contextmanager
def no_main_import() -> Iterator[None]:
    """While processes start: tell them not to import the launching script's ``__main__``.

    multiprocessing's forkserver and spawn children normally run the parent's main script again (as
    ``__mp_main__``) so that functions defined there can be found by name; that is why scripts need an
    ``if __name__ == "__main__":`` guard. Here the function travels by value (:func:`pack`), so nothing
    is looked up in ``__main__``: a script that calls ``launch`` at its top level works, and no child
    pays for importing it. (A notebook kernel's ``__main__`` has no file: nothing changes there.)
    """
    from multiprocessing import spawn

    original = spawn.get_preparation_data

    def without_main(name: str) -> dict[str, Any]:
        data = original(name)
        data.pop("init_main_from_path", None)
        data.pop("init_main_from_name", None)
        return data

    spawn.get_preparation_data = without_main
    try:
        yield
    finally:
        spawn.get_preparation_data = original


# ----------------------------------------------------------------------------------------- the payload
class _Pickler:
    """cloudpickle's pickler that refuses CUDA tensors (made lazily: cloudpickle loads on first use)."""

    cls: Any = None

    @classmethod
    def make(cls, buffer: io.BytesIO) -> Any:
        if cls.cls is None:
            import cloudpickle
            import torch

            class Refusing(cloudpickle.CloudPickler):
                def reducer_override(self, obj: Any) -> Any:
                    if isinstance(obj, torch.Tensor) and obj.device.type not in ("cpu", "meta"):
                        raise _DeviceTensor(obj)
                    return super().reducer_override(obj)

            cls.cls = Refusing
        return cls.cls(buffer, protocol=pickle.HIGHEST_PROTOCOL)


class _DeviceTensor(pickle.PicklingError):
    def __init__(self, tensor: Any) -> None:
        super().__init__(f"a tensor on {tensor.device}")
        self.device = tensor.device


def _culprit(fn: Any, args: tuple[Any, ...]) -> str:
    """Name the notebook global or argument that cannot be pickled, for the error message."""
    code = getattr(fn, "__code__", None)
    names = list(code.co_names) if code is not None else []
    found = getattr(fn, "__globals__", {})
    candidates = [(f"the global {n!r}", found[n]) for n in names if n in found]
    cells = zip(getattr(code, "co_freevars", ()), getattr(fn, "__closure__", None) or (), strict=False)
    candidates += [(f"the variable {n!r} it uses", c.cell_contents) for n, c in cells]
    candidates += [(f"argument {i} of args", a) for i, a in enumerate(args)]
    for label, value in candidates:
        try:
            _dumps(value)
        except Exception as exc:
            return f"{label} ({type(value).__name__}: {exc})"
    return ""


def _dumps(obj: Any) -> bytes:
    buffer = io.BytesIO()
    _Pickler.make(buffer).dump(obj)
    return buffer.getvalue()


def pack(fn: Callable[..., Any], args: tuple[Any, ...]) -> bytes:
    """``(fn, args)`` as bytes, by value where they come from the notebook (``__main__``).

    Functions and classes from importable modules travel by name (the child imports them); those defined
    in the notebook travel with their code and the globals they use. Tensors are copied.

    Raises:
        ValueError: something in the payload cannot be sent to another process — the message names it and
            says what to do (a CUDA tensor: create it inside the function; an open file, lock, widget or
            figure: build it inside the function or pass what it holds instead).
    """
    try:
        return _dumps((fn, tuple(args)))
    except _DeviceTensor as exc:
        raise ValueError(
            f"the function or its args carry a tensor on {exc.device}; CUDA tensors cannot be copied into "
            "the worker processes. Create it inside the function (each rank on its own device), or pass "
            "it as .cpu() and move it there."
        ) from None
    except Exception as exc:
        name = getattr(fn, "__qualname__", repr(fn))
        where = _culprit(fn, tuple(args))
        raise ValueError(
            f"{name!r} cannot be sent to the worker processes: {where or f'{type(exc).__name__}: {exc}'}. "
            "The ranks get a copy of the function, of what it uses from the notebook and of args; build "
            "things like open files, locks, widgets or figures inside the function instead."
        ) from None


def unpack(blob: bytes) -> Any:
    """The object :func:`pack` (or ``cloudpickle.dumps``) turned into ``blob``."""
    return pickle.loads(blob)


# ------------------------------------------------------------------------------- the kernel's state
def snapshot(method: str | None = None) -> dict[str, Any]:
    """What a fork would have inherited and a forkserver child lacks: environment, cwd, ``sys.path`` and
    multiprocessing's default start method; and whose death the child must not outlive (call
    :func:`context` first, so that the forkserver's pid is known). ``method``: how the children will be
    started (default: :func:`start_method`)."""
    return {
        "env": dict(os.environ),
        "cwd": os.getcwd(),
        "path": list(sys.path),
        "start_method": multiprocessing.get_start_method(),
        "kernel": os.getpid(),
        "parent": _parent_of_children(method or start_method()),
    }


def adopt(state: dict[str, Any]) -> None:
    """In a child: take on the launching process's environment, working directory, ``sys.path`` and
    default start method (a forkserver child would otherwise default to forkserver, and a DataLoader's
    workers inside a rank could not load a Dataset class defined in the notebook)."""
    os.environ.clear()
    os.environ.update(state["env"])
    os.chdir(state["cwd"])
    sys.path[:] = state["path"]
    multiprocessing.set_start_method(state["start_method"], force=True)


def keep_freed_memory() -> None:
    """In a child: let glibc's malloc keep large freed blocks for reuse instead of returning them to the OS.

    A fork of the kernel inherited the kernel's warmed-up heap; a fresh forkserver child starts with
    glibc's defaults, under which a training step's large tensors are mapped, freed to the OS and
    faulted in again every step — on 2 CPU cores a one-process DDP step of notebook 04b's
    communication-bound model varied between 19 and 42 ms in a repeating pattern (about 21 ms in a forked
    child; 19–21 ms with this). Fixed thresholds (mmap above 256 MiB,
    trim above 512 MiB) make the child reuse its memory as a long-running training process does. A no-op
    where the C library has no ``mallopt`` (macOS, musl).
    """
    # fixing the mmap threshold also stops glibc's dynamic adjustment of it
    tune_malloc(mmap_threshold=256 * 2**20, trim_threshold=512 * 2**20)


def die_with(state: dict[str, Any]) -> None:
    """In a child: end this process (SIGKILL) when the kernel that launched it ends, or now if it already
    has. ``state`` is the launching process's :func:`snapshot`.

    A forkserver child's parent is the server, not the kernel. The server exits as soon as the last
    holder of its "alive" pipe is gone; the kernel holds it, and so would every child, which inherits a
    copy: the child closes its copy first, so that the kernel's death ends the server, and
    ``PR_SET_PDEATHSIG`` (the parent's death) then ends the child. No thread is left in the child (a
    stack dump of a rank shows only its own code). Where ``PR_SET_PDEATHSIG`` does not exist (macOS), a
    thread watches the kernel's pid instead.
    """
    from multiprocessing import forkserver

    server = forkserver._forkserver
    alive = getattr(server, "_forkserver_alive_fd", None)
    if alive is not None and state["parent"] != state["kernel"]:
        with contextlib.suppress(OSError):
            os.close(alive)
        server._forkserver_alive_fd = None  # this child starts its own server if it needs one
    die_with_parent(signal.SIGKILL)
    if os.getppid() != state["parent"]:  # the parent died before we asked
        os._exit(1)
    if not sys.platform.startswith("linux"):
        kernel = state["kernel"]
        threading.Thread(target=_watch, args=(kernel,), name="mgpu-watch-kernel", daemon=True).start()


def _watch(kernel: int) -> None:  # pragma: no cover - macOS: runs in a child, ends it
    import time

    while True:
        try:
            os.kill(kernel, 0)
        except ProcessLookupError:
            break
        except PermissionError:
            pass
        time.sleep(0.2)
    os.kill(os.getpid(), signal.SIGKILL)
