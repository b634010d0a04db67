"""Used by notebook 00 (its first cell after the install) and ``python -m mgpu_helpers``: the environment
doctor. It says where the course is running (Colab, Kaggle, Jupyter, plain Python), what this Python, torch
and the GPUs can do, and — for each fact — what the course will do about it.

Three steps, so that every GPU branch can be tested on a machine without one:

* :func:`gather_facts` reads the machine. GPU questions (names, compute capability, peer access) are
  asked in a **child process** (:mod:`mgpu_helpers.hardware.probes`): asking them here would initialise
  CUDA in the notebook's kernel, which then holds GPU memory and cannot fork CUDA workers. With two
  or more GPUs, a child also runs an NCCL all-reduce with a deadline and, if it hangs, runs it again
  with ``NCCL_P2P_DISABLE=1`` (the usual cure on machines whose GPUs cannot reach each other directly,
  such as some 2 × T4 hosts).
* :func:`findings` turns :class:`Facts` into :class:`Finding` rows — a pure function, unit-tested with
  faked facts for 0, 1, 2 and N GPUs, a GPU without bf16, a hanging NCCL, Python 3.14, torch releases
  inside and outside :data:`TORCH_SUPPORTED` and a kernel that has already initialised CUDA.
* :func:`doctor` does both and prints the rows; it never raises (a failed probe is itself a finding).
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, field
from importlib import metadata

from .hardware.probes import P2P_FIX, GPUFacts, nccl_smoke, probe_gpus
from .hardware.sources import _cuda_usable
from .stacks import describe as describe_stack
from .stacks import installed_versions

__all__ = ["Facts", "Finding", "GPUFacts", "doctor", "findings", "gather_facts", "platform_name"]

#: The torch releases the course supports, (major, minor) inclusive: Kaggle's (2.10) to the newest
#: release (2.15); CI tests :data:`TORCH_TESTED` (.ci/run) and Colab's 2.11 (``nox -s colab``); the
#: Kaggle and newest stacks (noxfile.py) test both ends. README's "Supported torch versions" says the
#: same (tests/test_doctor.py checks). Inside the range, differences between releases are
#: feature-detected where they are used (e.g. ``troubleshoot.unmatched_collective``), never read from a
#: version string.
TORCH_SUPPORTED = ((2, 10), (2, 15))
TORCH_TESTED = "2.13"

#: Packages the doctor reports, with the notebooks that need them (none = every notebook).
_PACKAGES = {
    "ipywidgets": "widgets (the course uses only those that ipywidgets 7 and 8 share)",
    "ipykernel": "the notebook kernel",
    "ray": "notebooks 06b and 08 (the `tune` extra, installed by their first cell)",
    "optuna": "notebooks 06a, 06b and 08 (the `tune` extra)",
    "ipyparallel": "notebook 01b (the `interactive` extra)",
    "scikit-learn": "notebook 08 (the `capstone` extra)",
}


@dataclass(frozen=True)
class Facts:
    """What :func:`gather_facts` read; build one by hand to ask :func:`findings` about another machine."""

    platform: str
    python: tuple[int, int]
    torch: str | None = None
    torch_cuda: str | None = None
    nccl_built: bool = False
    gpus: tuple[GPUFacts, ...] = ()
    #: ``(i, j) -> can GPU i read GPU j's memory directly`` (empty with fewer than 2 GPUs).
    peer_access: dict[tuple[int, int], bool] = field(default_factory=dict)
    #: "ok", "hang", "ok with NCCL_P2P_DISABLE=1", "error: …", or None when not run.
    nccl_smoke: str | None = None
    start_method: str = "fork"
    cuda_initialised: bool = False
    packages: dict[str, str | None] = field(default_factory=dict)
    probe_error: str | None = None
    #: versions of :data:`mgpu_helpers.stacks.KEY_PACKAGES`, compared with Colab's or Kaggle's stack
    versions: dict[str, str | None] = field(default_factory=dict)


@dataclass(frozen=True)
class Finding:
    """One row of the doctor's report: a fact and what the course does about it."""

    topic: str
    status: str  # "ok", "note" or "warn"
    fact: str
    action: str


def platform_name(environ: dict[str, str] | None = None, modules: dict | None = None) -> str:
    """``"Colab"``, ``"Kaggle"``, ``"Jupyter"`` (a notebook kernel elsewhere) or ``"plain Python"``."""
    env = os.environ if environ is None else environ
    mods = sys.modules if modules is None else modules
    if "google.colab" in mods or "COLAB_RELEASE_TAG" in env:
        return "Colab"
    if "KAGGLE_KERNEL_RUN_TYPE" in env or "KAGGLE_URL_BASE" in env:
        return "Kaggle"
    if "ipykernel" in mods:
        return "Jupyter"
    return "plain Python"


def _default_start_method() -> str:
    import multiprocessing

    try:
        return multiprocessing.get_start_method(allow_none=True) or multiprocessing.get_context()._name
    except Exception:  # pragma: no cover - exotic platforms
        return "unknown"


# --- reading the machine (children for everything that touches CUDA: hardware.probes) -------------


def gather_facts(nccl_timeout_s: float = 60.0) -> Facts:
    """Read this machine without initialising CUDA in this process (see the module docstring)."""
    try:
        import torch
    except ImportError:
        torch = None
    packages = {}
    for name in _PACKAGES:
        try:
            packages[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            packages[name] = None
    gpus: tuple[GPUFacts, ...] = ()
    peer: dict[tuple[int, int], bool] = {}
    error = smoke = None
    cuda_build = getattr(getattr(torch, "version", None), "cuda", None)
    dist_ok = torch is not None and torch.distributed.is_available()
    if torch is not None and _cuda_usable(allow_cuda_init=False):  # fork-safe: CUDA stays untouched here
        gpus, peer, error = probe_gpus(timeout_s=60.0)
        if len(gpus) >= 2 and dist_ok and torch.distributed.is_nccl_available():
            smoke = nccl_smoke(nccl_timeout_s, len(gpus))
    return Facts(
        platform=platform_name(),
        python=sys.version_info[:2],
        torch=getattr(torch, "__version__", None),
        torch_cuda=cuda_build,
        nccl_built=bool(torch is not None and dist_ok and torch.distributed.is_nccl_available()),
        gpus=gpus,
        peer_access=peer,
        nccl_smoke=smoke,
        start_method=_default_start_method(),
        cuda_initialised=bool(torch is not None and torch.cuda.is_initialized()),
        packages=packages,
        probe_error=error,
        versions=installed_versions(),
    )


# --- what the course does about it (pure: unit-tested with faked facts) --------------------------------

_PLATFORM_ACTION = {
    "Colab": "one GPU on every tier; each notebook's first cell installs the course (and its extra) here",
    "Kaggle": "turn on the 'GPU T4 x2' accelerator: a real 2-GPU machine, so the multi-GPU paths run on NCCL",
    "Jupyter": "run the notebooks in order; each first cell installs a missing extra",
    "plain Python": "open the notebooks with `jupyter lab notebooks/` (README: the one install command)",
}


def _gpu_findings(f: Facts) -> list[Finding]:
    rows: list[Finding] = []
    if not f.gpus:
        built = f"CUDA {f.torch_cuda} build" if f.torch_cuda else "CPU build"
        rows.append(
            Finding(
                "GPUs",
                "note",
                f"none visible (torch {f.torch}, {built})",
                "every notebook takes its CPU path: gloo processes, bf16 compute on the CPU",
            )
        )
        return rows
    for g in f.gpus:
        bf16 = "bf16 in hardware" if g.native_bf16 else "no bf16 in hardware (emulated only)"
        rows.append(
            Finding(
                f"GPU {g.index}",
                "ok" if g.native_bf16 else "note",
                f"{g.name}, compute capability {g.capability[0]}.{g.capability[1]}, "
                f"{g.memory_bytes / 2**30:.1f} GiB, {bf16}",
                "mixed precision uses bf16 autocast"
                if g.native_bf16
                else "mixed precision uses fp16 autocast + GradScaler (05a, 08)",
            )
        )
    n = len(f.gpus)
    if n == 1:
        rows.append(
            Finding(
                "GPU count",
                "note",
                "1 GPU",
                "NCCL needs a GPU per rank, so multi-process lessons run 2 gloo processes on the CPU",
            )
        )
        return rows
    missing = sorted(pair for pair, ok in f.peer_access.items() if not ok)
    rows.append(
        Finding(
            "peer access",
            "ok" if not missing else "note",
            "every GPU pair can access each other directly"
            if not missing
            else f"no direct access between {', '.join(f'{i}→{j}' for i, j in missing)}",
            "NCCL copies GPU to GPU"
            if not missing
            else "NCCL goes through host memory (slower; results are the same)",
        )
    )
    smoke = f.nccl_smoke
    if not f.nccl_built:
        rows.append(
            Finding(
                "NCCL",
                "warn",
                "this torch build has no NCCL",
                "multi-process lessons use gloo; install a CUDA build of torch with NCCL",
            )
        )
    elif smoke == "ok":
        rows.append(
            Finding("NCCL", "ok", f"all-reduce on {n} GPUs passed", f"{n} ranks, one per GPU, on NCCL")
        )
    elif smoke == f"ok with {P2P_FIX}":
        rows.append(
            Finding(
                "NCCL",
                "warn",
                f"all-reduce hung, and passed with {P2P_FIX}",
                f"before any launch, run `%env {P2P_FIX}` in the notebook "
                f"(or `export {P2P_FIX}` in the shell that starts Jupyter)",
            )
        )
    elif smoke == "hang":
        rows.append(
            Finding(
                "NCCL",
                "warn",
                f"all-reduce hung, also with {P2P_FIX}",
                "launch with backend='gloo' on this machine, and report the GPU model to the course",
            )
        )
    elif smoke:
        rows.append(
            Finding(
                "NCCL",
                "warn",
                f"all-reduce failed: {smoke[len('error: ') :]}",
                "launch with backend='gloo' until the error above is fixed",
            )
        )
    return rows


def _torch_release(version: str) -> tuple[int, int] | None:
    """(major, minor) of a torch version such as ``"2.11.0+cu126"`` or ``"2.16.0.dev20260301"``; None when
    it does not start with two numbers."""
    m = re.match(r"(\d+)\.(\d+)", version)
    return (int(m[1]), int(m[2])) if m else None


def _torch_finding(version: str) -> Finding:
    """Is this torch inside :data:`TORCH_SUPPORTED`?"""
    (lo_major, lo_minor), (hi_major, hi_minor) = TORCH_SUPPORTED
    span = f"{lo_major}.{lo_minor} – {hi_major}.{hi_minor}"
    release = _torch_release(version)
    if release is None:
        return Finding(
            "torch", "warn", f"torch {version}: not a version number", f"the course supports torch {span}"
        )
    if release < TORCH_SUPPORTED[0]:
        return Finding(
            "torch",
            "warn",
            f"torch {version}, older than the course supports ({span})",
            f'upgrade: pip install -U "torch>={lo_major}.{lo_minor}" (no GPU: add the CPU index URL, README)',
        )
    if release > TORCH_SUPPORTED[1]:
        return Finding(
            "torch",
            "warn",
            f"torch {version}, newer than the course supports ({span})",
            "the notebooks will probably run; if one fails, report it with this torch version, or install "
            f'"torch=={hi_major}.{hi_minor}.*"',
        )
    return Finding("torch", "ok", f"torch {version}", f"supported ({span}; CI tests {TORCH_TESTED})")


def findings(f: Facts) -> list[Finding]:
    """What the course will do on the machine ``f`` describes, one :class:`Finding` per fact."""
    rows = [Finding("platform", "ok", f.platform, _PLATFORM_ACTION.get(f.platform, ""))]
    stack = describe_stack(f.platform, f.versions, f.python) if f.versions else None
    if stack:
        rows.append(Finding("stack", *stack))
    py = f"Python {f.python[0]}.{f.python[1]}"
    if f.python < (3, 10):
        rows.append(Finding("Python", "warn", py, "the course needs Python 3.10 or newer"))
    else:
        rows.append(Finding("Python", "ok", py, "supported"))
    rows.append(
        Finding(
            "start method",
            "ok" if f.start_method == "fork" else "note",
            f"multiprocessing's default here is {f.start_method!r}",
            "the course's launcher starts its ranks from its own forkserver and never forks the kernel, so "
            "functions defined in a notebook work, also after the kernel ran backward() or used CUDA"
            + (
                ""
                if f.start_method == "fork"
                else "; DataLoader workers use this default: give them datasets defined in a module "
                "(as the course does), or pass multiprocessing_context='fork' for a Dataset class "
                "defined in a notebook cell"
            ),
        )
    )
    if f.torch is None:
        rows.append(Finding("torch", "warn", "not installed", "run the README's install command"))
        return rows
    rows.append(_torch_finding(f.torch))
    if f.probe_error:
        rows.append(
            Finding(
                "GPUs",
                "warn",
                f.probe_error,
                "notebooks fall back to their CPU path; check `nvidia-smi` and the torch build",
            )
        )
    else:
        rows += _gpu_findings(f)
    if f.cuda_initialised:
        rows.append(
            Finding(
                "this kernel",
                "note",
                "CUDA is already initialised in this kernel",
                "fine for the course's launcher (it never forks the kernel); a DataLoader with workers "
                "forked from this kernel must not use CUDA in them",
            )
        )
    for name, version in f.packages.items():
        need = _PACKAGES.get(name, "")
        if name == "ipywidgets" and version and version.startswith("7."):
            rows.append(Finding(name, "ok", version, "widgets work (7.x, as on Colab)"))
        elif version:
            rows.append(Finding(name, "ok", version, need))
        else:
            status = (
                "warn" if name in ("ipywidgets", "ipykernel") and f.platform != "plain Python" else "note"
            )
            rows.append(
                Finding(
                    name,
                    status,
                    "not installed",
                    f"needed by {need}" if "notebook" in need else f"{need}: static pictures only",
                )
            )
    return rows


def format_findings(rows: list[Finding]) -> str:
    """The rows as a plain-text table (✔ ok, • note, ⚠ warn)."""
    mark = {"ok": "✔", "note": "•", "warn": "⚠"}
    width = max(len(r.topic) for r in rows)
    return "\n".join(
        f"{mark.get(r.status, '?')} {r.topic.ljust(width)}  {r.fact}"
        + (f"\n  {' ' * width}  → {r.action}" if r.action else "")
        for r in rows
    )


def doctor(nccl_timeout_s: float = 60.0, file=None) -> list[Finding]:
    """Read this machine, print what the course will do here, and return the rows. Never raises."""
    try:
        rows = findings(gather_facts(nccl_timeout_s=nccl_timeout_s))
    except Exception as exc:  # the doctor must never be the thing that breaks
        rows = [
            Finding(
                "doctor",
                "warn",
                f"could not read this machine: {type(exc).__name__}: {exc}",
                "the notebooks still run; please report this message",
            )
        ]
    print(format_findings(rows), file=file or sys.stdout)
    return rows
