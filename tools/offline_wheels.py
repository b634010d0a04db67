"""Wheels for a GPU machine without internet: fetch them on a connected machine, install them there.

    python tools/offline_wheels.py fetch [--python 3.12] [--dest .whl] [--exclude NAME] [--include NAME]
    python tools/offline_wheels.py fetch --print-requirements      # the top-level list only (no network)
    python tools/offline_wheels.py split --wheels .whl [--max-mib 40]   # for the device tool's 64 MiB
    python tools/offline_wheels.py install --wheels .whl [--target DIR] [--skip NAME]

(``tools/fetch_wheels.sh`` runs ``fetch``; ``tools/gpu_check.sh --wheels DIR`` runs ``install``.)

**fetch** (needs PyPI) resolves the course's dependencies plus its ``test`` extra (pyproject.toml) for
one CPython version on manylinux x86_64 and downloads them as wheels into DEST, with the course's own
wheel and ``requirements.txt`` (one ``name==version`` a line, the Python version in its header). Left
out: torch (the GPU machine has its own; so no nvidia-* or triton either) and, by default, what the
check can do without (DEFAULT_EXCLUDED; ``--include NAME`` brings one back): Ray (an ~80 MB wheel:
notebooks 06b and 08, the tuning benchmark and the tests that need Ray are skipped without it) and
what only Ray's notebooks use (pandas, scikit-learn); ruff (lint, not a GPU check); and dependencies
that are optional at run time: debugpy (ipykernel's debugger), jedi and parso (IPython's completion),
SQLAlchemy, Alembic and Mako (Optuna's database storage; the course keeps studies in memory) and
widgetsnbextension (the classic Notebook's front-end for ipywidgets). DEST keeps one version of each
package: wheels not in the new resolution are deleted. GPUtil exists only as a source archive: it is
built here into a pure-Python wheel.

**split** spreads DEST over folders of at most ``--max-mib`` MiB each, for a GPU machine reached by the
device tool (64 MiB a transfer, the working tree's ~14 MiB included): DEST, then ``DEST.2``, ``DEST.3``...,
a wheel bigger than that (Ray's, ~76 MiB) cut into byte ranges (``NAME.whl.partK``, its hash in
``NAME.whl.sha256``). Carry one folder a call while the machine is warm (ignored paths it already has
are kept). **install** first brings them together, joins the parts and checks the hashes; a folder that
did not arrive stops it, named.

**install** (no network) installs every wheel of the folder with ``pip install --no-index --no-deps``
(the folder *is* the resolved list), except distributions already installed — torch and whatever came
with it are never touched — and ``--skip`` names. ``--target DIR`` installs into DIR instead (for a
read-only system site-packages; put DIR on PYTHONPATH).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import hashlib
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROJECT = "mgpu-course"
#: Never fetched: the GPU machine's own torch stays (with its CUDA libraries).
ALWAYS_EXCLUDED = ("torch", "triton", "nvidia-*", "pytorch-triton*")
#: Matches ALWAYS_EXCLUDED's patterns but is no CUDA library: NVML's bindings, a course dependency.
NOT_EXCLUDED = ("nvidia-ml-py",)
#: Left out unless --include names them (see the module docstring): not requested, and dropped when
#: something else requires them (install uses --no-deps).
DEFAULT_EXCLUDED = (
    *("ray", "pandas", "scikit-learn", "ruff"),
    *("debugpy", "jedi", "parso", "sqlalchemy", "alembic", "mako", "widgetsnbextension"),
)
#: Published only as source archives: built here into pure-Python wheels.
SOURCE_ONLY = ("gputil",)
MANYLINUX = (
    "manylinux_2_28",
    "manylinux_2_27",
    "manylinux_2_26",
    "manylinux_2_24",
    "manylinux_2_17",
    "manylinux2014",
    "manylinux_2_12",
    "manylinux2010",
    "manylinux_2_5",
    "manylinux1",
)
WHEEL_NAME = re.compile(
    r"^(?P<name>[^-]+)-(?P<version>[^-]+)(-\d[^-]*)?-(?P<py>[^-]+)-(?P<abi>[^-]+)-(?P<plat>.+)\.whl$"
)


def normalize(name: str) -> str:
    """PEP 503's form of a name: ``GPUtil`` -> ``gputil``, ``nvidia_ml_py`` -> ``nvidia-ml-py``."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _excluded(name: str, patterns) -> bool:
    import fnmatch

    return normalize(name) not in NOT_EXCLUDED and any(
        fnmatch.fnmatch(normalize(name), normalize(p)) for p in patterns
    )


def _toml(path: Path) -> dict:
    try:
        import tomllib
    except ImportError:  # Python 3.10: pip carries a copy of tomli
        from pip._vendor import tomli as tomllib
    with open(path, "rb") as f:
        return tomllib.load(f)


def _requirement_class():
    try:
        from packaging.requirements import Requirement
    except ImportError:
        from pip._vendor.packaging.requirements import Requirement
    return Requirement


def requirements(
    python: str, extras=("test",), exclude=(), pyproject: Path = ROOT / "pyproject.toml"
) -> list[str]:
    """The course's base dependencies plus ``extras`` (the course's own extras expanded), with markers
    evaluated for CPython ``python`` on Linux, less the excluded names; sorted, one string each."""
    Requirement = _requirement_class()
    project = _toml(pyproject)["project"]
    optional = project.get("optional-dependencies", {})
    env = {
        "python_version": python,
        "python_full_version": f"{python}.0",
        "sys_platform": "linux",
        "platform_system": "Linux",
        "platform_machine": "x86_64",
        "os_name": "posix",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
        "extra": "",
    }
    found: dict[str, tuple[set, set]] = {}  # name -> (extras, specifiers)
    todo, seen = [*project.get("dependencies", []), f"{PROJECT}[{','.join(extras)}]"], set()
    while todo:
        req = Requirement(todo.pop(0))
        if req.marker is not None and not req.marker.evaluate(env):
            continue
        if normalize(req.name) == PROJECT:  # the course's own extras: expand them here
            for extra in sorted(req.extras - seen):
                seen.add(extra)
                todo += optional.get(extra, [])
            continue
        if _excluded(req.name, (*ALWAYS_EXCLUDED, *exclude)):
            continue
        got_extras, specs = found.setdefault(normalize(req.name), (set(), set()))
        got_extras.update(req.extras)
        specs.update(str(s) for s in req.specifier)
    return [
        f"{name}{'[' + ','.join(sorted(ex)) + ']' if ex else ''}{','.join(sorted(specs))}"
        for name, (ex, specs) in sorted(found.items())
    ]


def _run(cmd: list[str]) -> None:
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def _wheels(folder: Path) -> dict[str, Path]:
    """``normalized name -> wheel file`` for every wheel in ``folder``."""
    out = {}
    for path in sorted(folder.glob("*.whl")):
        match = WHEEL_NAME.match(path.name)
        if match:
            out[normalize(match["name"])] = path
    return out


def fetch(python: str, dest: Path, exclude=(), include=(), keep_temp: bool = False) -> Path:
    """Download the wheels (see the module docstring) into ``dest``; return ``dest/requirements.txt``."""
    excluded = tuple(sorted({*DEFAULT_EXCLUDED, *exclude} - {normalize(n) for n in include}))
    reqs = requirements(python, exclude=excluded)
    binary = [r for r in reqs if not _excluded(_requirement_class()(r).name, SOURCE_ONLY)]
    source = [r for r in reqs if r not in binary]
    dest.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".fetch-", dir=dest))
    try:
        req_file = staging / "top-level.txt"
        req_file.write_text("\n".join(binary) + "\n")
        platforms = [arg for tag in MANYLINUX for arg in ("--platform", f"{tag}_x86_64")]
        pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
        _run(
            [
                *pip,
                "download",
                "-q",
                "-d",
                str(staging),
                "--only-binary=:all:",
                "--python-version",
                python,
                "--implementation",
                "cp",
                *platforms,
                "-r",
                str(req_file),
            ]
        )
        if source:  # pure Python, no dependencies of their own
            _run([*pip, "wheel", "-q", "--no-deps", "-w", str(staging), *source])
        _run([*pip, "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(staging), str(ROOT)])
        fetched = _wheels(staging)
        dropped = sorted(n for n in fetched if _excluded(n, (*ALWAYS_EXCLUDED, *excluded)))
        for name in dropped:  # pulled in by something else: still left out
            fetched.pop(name).unlink()
        for name, old in _wheels(dest).items():  # one version of each package, nothing stale
            if name not in fetched or old.name != fetched[name].name:
                old.unlink()
        for path in fetched.values():
            shutil.move(str(path), dest / path.name)
    finally:
        if not keep_temp:
            shutil.rmtree(staging, ignore_errors=True)
    wheels = _wheels(dest)
    listing = dest / "requirements.txt"
    lines = [
        f"# Wheels for CPython {python} on manylinux x86_64, fetched {datetime.date.today()}"
        " by tools/fetch_wheels.sh.",
        f"# python={python}",
        f"# Left out: {', '.join((*ALWAYS_EXCLUDED, *excluded))}"
        + (f"; dropped: {', '.join(dropped)}" if dropped else ""),
        "# Install offline: bash tools/gpu_check.sh --wheels DIR"
        "  (or: pip install --no-index --no-deps DIR/*.whl)",
    ]
    for name, path in sorted(wheels.items()):
        lines.append(f"{name}=={WHEEL_NAME.match(path.name)['version']}")
    listing.write_text("\n".join(lines) + "\n")
    sizes = sorted(((p.stat().st_size, p.name) for p in wheels.values()), reverse=True)
    total = sum(s for s, _ in sizes)
    print(f"{len(sizes)} wheels in {dest}: {total / 2**20:.1f} MiB; biggest:")
    for size, name in sizes[:8]:
        print(f"  {size / 2**20:6.1f} MiB  {name}")
    print(f"list: {listing}")
    return listing


def _installed(target: Path | None) -> dict[str, str]:
    """``normalized name -> version`` of what this Python already has (and ``target``, if given)."""
    paths = [None] + ([[str(target)]] if target else [])
    found = {}
    for path in paths:
        dists = (
            importlib.metadata.distributions()
            if path is None
            else importlib.metadata.distributions(path=path)
        )
        for dist in dists:
            name = dist.metadata["Name"]
            if name:
                found.setdefault(normalize(name), dist.version)
    return found


def _python_tag_ok(py: str, abi: str) -> bool:
    """Whether a wheel's python and abi tags install on this interpreter (platform: the fetch's job)."""
    minor = sys.version_info.minor
    for tag in py.split("."):
        if tag.startswith("py3"):
            return True
        match = re.fullmatch(r"cp3(\d+)", tag)
        if match and (int(match[1]) == minor or (abi == "abi3" and int(match[1]) <= minor)):
            return True
    return False


#: The most :func:`split` puts in one folder (the device tool carries 64 MiB a call, the tree included).
PART_MIB = 40
#: Written by :func:`split` into the first folder: ``<folder> <file>`` for each file it moved out.
SPREAD = "SPREAD.txt"


def _sha256(paths: list[Path]) -> str:
    digest = hashlib.sha256()
    for path in paths:
        with path.open("rb") as f:
            for block in iter(lambda f=f: f.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def split(wheels: Path, max_mib: int = PART_MIB) -> list[Path]:
    """Spread the folder over folders of at most ``max_mib`` MiB (see the module docstring), cutting each
    wheel bigger than that into parts; return the folders, ``wheels`` first."""
    limit = max_mib * 2**20
    for path in sorted(wheels.glob("*.whl")):
        size = path.stat().st_size
        if size > limit:
            count = -(-size // limit)
            (wheels / f"{path.name}.sha256").write_text(f"{_sha256([path])} {count}\n")
            with path.open("rb") as f:
                for k in range(1, count + 1):
                    (wheels / f"{path.name}.part{k}").write_bytes(f.read(limit))
            path.unlink()
            print(f"{path.name}: {size / 2**20:.1f} MiB cut into {count} parts")
    files = sorted((p for p in wheels.iterdir() if p.is_file()), key=lambda p: -p.stat().st_size)
    folders, room, moved = [wheels], [limit - 2**16], []  # 64 KiB kept for SPREAD in the first
    for path in files:  # first fit, biggest first
        size = path.stat().st_size
        k = next((i for i, free in enumerate(room) if size <= free), None)
        if k is None:
            folders.append(wheels.with_name(f"{wheels.name}.{len(folders) + 1}"))
            room.append(limit)
            k = len(folders) - 1
        room[k] -= size
        if k:
            folders[k].mkdir(exist_ok=True)
            path.rename(folders[k] / path.name)
            moved.append(f"{folders[k].name} {path.name}")
    if moved:
        (wheels / SPREAD).write_text("\n".join(moved) + "\n")
    for folder in folders:
        size = sum(p.stat().st_size for p in folder.iterdir())
        print(f"{folder.name}: {size / 2**20:.1f} MiB: carry it in a transfer of its own")
    return folders


def join(wheels: Path) -> list[str]:
    """Undo :func:`split`: bring the files back from the ``wheels.k`` folders and join the parts of each
    cut wheel, checking its hash; return what is missing or wrong (nothing is changed then)."""
    spread = wheels / SPREAD
    lines = spread.read_text().split("\n") if spread.exists() else []
    moves = [(wheels.with_name(folder) / name, wheels / name) for folder, _, name in
             (line.partition(" ") for line in lines if line)]
    absent = sorted({str(src.parent) for src, dst in moves if not src.exists() and not dst.exists()})
    if absent:
        return [f"{len(absent)} folder(s) that split wrote did not arrive: carry {', '.join(absent)} as well"]
    for src, dst in moves:
        if src.exists():
            src.rename(dst)
    for folder in {src.parent for src, _ in moves}:
        with contextlib.suppress(OSError):  # not empty: something else was put there
            folder.rmdir()
    spread.unlink(missing_ok=True)
    problems = []
    for record in sorted(wheels.glob("*.whl.sha256")):
        name = record.name[: -len(".sha256")]
        expected, count = record.read_text().split()
        parts = [wheels / f"{name}.part{k}" for k in range(1, int(count) + 1)]
        if not all(p.exists() for p in parts) or _sha256(parts) != expected:
            problems.append(f"{name}: its parts do not add up to the fetched wheel (sha256): split it again")
            continue
        with (wheels / name).open("wb") as out:
            for part in parts:
                out.write(part.read_bytes())
        for part in [*parts, record]:
            part.unlink()
        print(f"{name}: joined from {count} parts")
    return problems


def install(wheels: Path, target: Path | None = None, skip=()) -> int:
    """Install the folder's wheels offline (see the module docstring); return pip's exit status."""
    problems = join(wheels)
    if problems:
        print("\n".join(problems), file=sys.stderr)
        return 1
    found = _wheels(wheels)
    if not found:
        print(f"no wheels in {wheels}", file=sys.stderr)
        return 1
    have = _installed(target)
    todo, kept, wrong = [], [], []
    for name, path in sorted(found.items()):
        match = WHEEL_NAME.match(path.name)
        if name in have or _excluded(name, skip):
            kept.append(f"{name} {have.get(name, '(skipped)')}")
        elif not _python_tag_ok(match["py"], match["abi"]):
            wrong.append(path.name)
        else:
            todo.append(path)
    if wrong:
        here = f"{sys.version_info.major}.{sys.version_info.minor}"
        print(
            f"these wheels are not for Python {here}: {', '.join(wrong)}\n"
            f"fetch them for this Python: bash tools/fetch_wheels.sh --python {here}",
            file=sys.stderr,
        )
        return 1
    print(f"already here, kept as they are ({len(kept)}): {', '.join(kept) or '-'}")
    if not todo:
        print("nothing to install")
        return 0
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--no-index",
        "--no-deps",
        "--no-compile",
        "--disable-pip-version-check",
        "--no-warn-script-location",
    ]
    if target is not None:
        target.mkdir(parents=True, exist_ok=True)
        cmd += ["--target", str(target)]
    print(
        f"installing {len(todo)} wheels{f' into {target}' if target else ''}: "
        + ", ".join(WHEEL_NAME.match(p.name)["name"] for p in todo),
        flush=True,
    )
    return subprocess.run([*cmd, *map(str, todo)]).returncode


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    f = sub.add_parser("fetch", help="download the wheels (needs PyPI)")
    f.add_argument("--python", default="3.12", help="the GPU machine's Python, e.g. 3.12 (default)")
    f.add_argument("--dest", default=str(ROOT / ".whl"), help="the folder (default: .whl, git-ignored)")
    f.add_argument("--exclude", action="append", default=[], metavar="NAME", help="leave NAME out too")
    f.add_argument(
        "--include",
        action="append",
        default=[],
        metavar="NAME",
        help=f"fetch NAME although left out by default ({', '.join(DEFAULT_EXCLUDED)})",
    )
    f.add_argument("--print-requirements", action="store_true", help="print the top-level list and stop")
    c = sub.add_parser("split", help="cut the wheels bigger than --max-mib into parts, one folder each")
    c.add_argument("--wheels", default=str(ROOT / ".whl"), help="the folder fetch filled (default: .whl)")
    c.add_argument("--max-mib", type=int, default=PART_MIB, help=f"the biggest part (default: {PART_MIB})")
    i = sub.add_parser("install", help="install a fetched folder (no network)")
    i.add_argument("--wheels", required=True, help="the folder fetch filled")
    i.add_argument("--target", default=None, help="install into this folder (then put it on PYTHONPATH)")
    i.add_argument("--skip", action="append", default=[], metavar="NAME", help="do not install NAME")
    args = parser.parse_args(argv)
    if args.command == "fetch":
        if not re.fullmatch(r"3\.\d+", args.python):
            parser.error(f"--python wants a version such as 3.12, not {args.python!r}")
        excluded = sorted({*DEFAULT_EXCLUDED, *args.exclude} - {normalize(n) for n in args.include})
        if args.print_requirements:
            print("\n".join(requirements(args.python, exclude=excluded)))
            return 0
        fetch(args.python, Path(os.path.abspath(args.dest)), exclude=args.exclude, include=args.include)
        return 0
    if args.command == "split":
        if args.max_mib < 1:
            parser.error(f"--max-mib wants a whole number of MiB >= 1, not {args.max_mib}")
        split(Path(os.path.abspath(args.wheels)), args.max_mib)
        return 0
    target = Path(os.path.abspath(args.target)) if args.target else None
    return install(Path(os.path.abspath(args.wheels)), target, skip=args.skip)


if __name__ == "__main__":
    sys.exit(main())
