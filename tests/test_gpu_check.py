"""tools/gpu_check.sh, narrowed to a few tests, three tiny notebooks and one quick benchmark, run the way an
offline GPU machine runs it: it installs a folder of wheels (here one tiny wheel built by the test) into a
--target folder without the network, runs the steps two at a time, skips what needs a module that is
missing (Ray, hidden with --without), writes each notebook's run as HTML, records pass/fail and seconds per
step and exits with the number of failed steps. Also: tools/fetch_wheels.sh's list (no network) and the
GPU names in the report folder's name."""

import base64
import csv
import hashlib
import importlib.util
import os
import pathlib
import subprocess
import sys
import zipfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
TESTS = """
def test_the_wheel_was_installed_into_the_target():
    import gpucheck_probe
    assert gpucheck_probe.VALUE == 42 and gpucheck_probe.__file__.startswith({site!r})

def test_needing_ray():
    import ray  # hidden by --without ray: reported as skipped, not failed

def test_that_fails():
    assert False
"""


def _module(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _tiny_wheel(folder: pathlib.Path) -> pathlib.Path:
    """A pure-Python wheel with one module, written by hand (no build backend: fast, offline)."""
    info = "gpucheck_probe-0.1.dist-info"
    files = {
        "gpucheck_probe.py": "VALUE = 42\n",
        f"{info}/METADATA": "Metadata-Version: 2.1\nName: gpucheck-probe\nVersion: 0.1\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for name, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(text.encode())}")
    files[f"{info}/RECORD"] = "\n".join([*record, f"{info}/RECORD,,"]) + "\n"
    folder.mkdir()
    wheel = folder / "gpucheck_probe-0.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for name, text in files.items():
            zf.writestr(name, text)
    return wheel


def _max_concurrency(timeline: pathlib.Path) -> int:
    events = []
    with open(timeline) as f:
        for _name, start, end, _status in csv.reader(f, delimiter="\t"):
            events += [(float(start), 1), (float(end), -1)]
    running = most = 0
    for _, change in sorted(events):  # an end before a start at the same instant
        running += change
        most = max(most, running)
    return most


@pytest.mark.slow  # ~17 s under CI's load (runs gpu_check.sh end to end): the slow set keeps it
def test_an_offline_narrowed_gpu_check_installs_runs_in_parallel_skips_and_counts_failures(tmp_path):
    import nbformat

    new = nbformat.v4
    notebooks = tmp_path / "notebooks"
    notebooks.mkdir()
    for name, sources in {
        "tiny": ["assert 1 + 1 == 2"],
        "broken": ["print('before the error')", "raise ValueError('on purpose')"],
        "06b_needs_ray": ["import ray"],  # skipped: the check's --without ray hides Ray
    }.items():
        cells = [new.new_code_cell(source) for source in sources]
        nbformat.write(new.new_notebook(cells=cells), notebooks / f"{name}.ipynb")
    out, site = tmp_path / "out", tmp_path / "site"
    (tmp_path / "test_selection.py").write_text(TESTS.format(site=str(site)))
    _tiny_wheel(tmp_path / "wheels")
    # not what a check that runs this test has set
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPU_CHECK_", "PIP_"))}
    env.update(
        GPU_CHECK_TESTS=str(tmp_path / "test_selection.py"),
        GPU_CHECK_NOTEBOOKS=str(notebooks / "*.ipynb"),
        GPU_CHECK_BENCHMARKS="benchmarks/memory_tracker.py",
    )
    options = ["--quick", "--jobs", "2", "--wheels", str(tmp_path / "wheels"), "--target", str(site)]
    proc = subprocess.run(
        ["bash", "tools/gpu_check.sh", str(out), *options, "--without", "ray"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    report = (out / "report.md").read_text()
    assert proc.returncode == 2, proc.stdout + proc.stderr  # the unit tests and one notebook
    for row in (
        "| install the wheels | pass",
        "| doctor and hardware table | pass",
        "| unit tests (gpu tests included) | FAIL",
        "| notebook 06b_needs_ray | skipped: needs ray | - | - |",
        "| notebook broken | FAIL",
        "| notebook tiny | pass",
        "| benchmark memory_tracker --quick | pass",
    ):
        assert row in report, report
    assert "- memory_tracker: `RESULT " in report and "Failed steps: 2" in report
    assert "`1 failed, 1 passed, 1 skipped" in report, report  # ray's test skipped, the wheel imported
    assert "Not installed here: ray — skipped: 06b_needs_ray (needs ray);" in proc.stdout
    assert (site / "gpucheck_probe.py").exists() and "gpucheck" in (out / "logs" / "install.log").read_text()

    assert "[html](notebooks/tiny.html)" in report
    assert sorted(p.name for p in (out / "notebooks").iterdir()) == ["broken.html", "lab.css", "tiny.html"]
    html = (out / "notebooks" / "broken.html").read_text()
    for shown in ("before the error", "ValueError", "on purpose", "nbval FAILED", 'href="lab.css"'):
        assert shown in html
    head = html[: html.index("</head>")]
    assert "<style" not in head and ".jp-Notebook" in (out / "notebooks" / "lab.css").read_text()

    assert "2 steps at a time" in report
    assert _max_concurrency(out / "logs" / "timeline.tsv") == 2  # two at a time, never more
    assert (out / "logs" / "nb-tiny.log").exists() and (out / "logs" / "nb-broken.log").exists()


@pytest.mark.parametrize(
    ("names", "slug"),
    [
        (["NVIDIA H100 80GB HBM3"], "1xH100"),
        (["Tesla T4", "Tesla T4"], "2xT4"),
        (["NVIDIA A100-SXM4-40GB", "Tesla T4"], "1xA100+1xT4"),
        (["NVIDIA GeForce RTX 4090"], "1xRTX4090"),
        ([], "cpu"),
    ],
)
def test_the_report_folder_is_named_after_the_visible_gpus(names, slug):
    assert _module("gpu_check_info").gpu_slug(names) == slug


def test_what_needs_an_optional_package_and_the_long_notebooks_first():
    info = _module("gpu_check_info")
    assert info.needs("notebooks/06b_ray_tune.ipynb") == ("ray", "optuna", "pandas")
    assert "ray" in info.needs("notebooks/08_capstone.ipynb") and info.needs("notebooks/00_setup.ipynb") == ()
    assert info.needs("benchmarks/tuning.py") == ("ray",) and info.needs("tests/test_tuning_ray.py")
    first = info.long_first(["notebooks/00_setup.ipynb", "notebooks/04b_ddp_in_practice.ipynb"])
    assert first == ["notebooks/04b_ddp_in_practice.ipynb", "notebooks/00_setup.ipynb"]


def test_the_fetch_lists_the_test_extra_without_torch_ray_or_trimmed_packages():
    proc = subprocess.run(
        ["bash", "tools/fetch_wheels.sh", "--print-requirements", "--python", "3.12"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    names = proc.stdout.split()
    assert proc.returncode == 0, proc.stderr
    for wanted in ("nbval>=0.11", "pytest-xdist>=3", "ipykernel", "optuna", "ipyparallel", "nvidia-ml-py"):
        assert wanted in names, names
    assert "setuptools" in names  # GPUtil's distutils on Python 3.12
    for left_out in ("torch", "ray[tune]", "ray", "pandas", "scikit-learn", "ruff", "mgpu-course"):
        assert left_out not in names, names
    wheels = _module("offline_wheels")
    assert "setuptools" not in wheels.requirements("3.11", exclude=wheels.DEFAULT_EXCLUDED)
    assert "ray[tune]" in wheels.requirements("3.12", exclude=())


def test_offline_install_checks_wheel_tags():
    wheels = _module("offline_wheels")
    here = f"cp3{sys.version_info.minor}"
    assert wheels._python_tag_ok("py3", "none") and wheels._python_tag_ok("py2.py3", "none")
    assert wheels._python_tag_ok(here, here) and wheels._python_tag_ok("cp36", "abi3")
    assert not wheels._python_tag_ok(f"cp3{sys.version_info.minor + 1}", f"cp3{sys.version_info.minor + 1}")


def test_wheels_too_big_for_one_transfer_are_spread_over_folders_and_brought_back(tmp_path):
    wheels_mod = _module("offline_wheels")
    wheels = tmp_path / ".whl"
    wheels.mkdir()
    payload = os.urandom(5 * 2**20 // 2)  # 2.5 MiB: three parts of at most 1 MiB
    big = wheels / "ray-2.60.0-cp312-cp312-manylinux2014_x86_64.whl"
    small = {wheels / f"pkg{i}-1.0-py3-none-any.whl": os.urandom(600 * 1024) for i in range(3)}
    big.write_bytes(payload)
    for path, data in small.items():
        path.write_bytes(data)
    folders = wheels_mod.split(wheels, max_mib=1)
    assert folders[0] == wheels and len(folders) == 6 and not big.exists()  # 3 parts + 3 wheels of 0.6 MiB
    for folder in folders:
        assert sum(p.stat().st_size for p in folder.iterdir()) <= 2**20, folder
    (tmp_path / ".whl.4").rename(tmp_path / "elsewhere")  # that transfer has not come yet
    (problem,) = wheels_mod.join(wheels)
    assert problem.endswith(".whl.4 as well") and not big.exists(), problem
    (tmp_path / "elsewhere").rename(tmp_path / ".whl.4")
    assert wheels_mod.join(wheels) == [] and big.read_bytes() == payload
    assert all(path.read_bytes() == data for path, data in small.items())
    assert sorted(p.name for p in tmp_path.iterdir()) == [".whl"] and len(list(wheels.iterdir())) == 4
