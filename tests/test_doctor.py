"""The environment doctor: every GPU branch with the hardware faked at the boundary (:class:`Facts`, the
probe children's output), and a real run on this machine that is quick and never raises."""

import io
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mgpu_helpers import doctor as doc
from mgpu_helpers.doctor import Facts, GPUFacts, findings, platform_name
from mgpu_helpers.hardware import probes

T4 = ("Tesla T4", (7, 5), 15 * 2**30)
A100 = ("NVIDIA A100-SXM4-80GB", (8, 0), 80 * 2**30)


def machine(n_gpus=0, gpu=T4, *, peer=True, smoke=None, **kw):
    gpus = tuple(GPUFacts(i, *gpu) for i in range(n_gpus))
    pairs = {(i, j): peer for i in range(n_gpus) for j in range(n_gpus) if i != j}
    defaults = dict(
        platform="Jupyter",
        python=(3, 11),
        torch="2.13.0",
        torch_cuda="12.8" if n_gpus else None,
        nccl_built=bool(n_gpus),
        packages={"ipywidgets": "8.1.5", "ipykernel": "6.29.0"},
    )
    return Facts(gpus=gpus, peer_access=pairs, nccl_smoke=smoke, **{**defaults, **kw})


def row(rows, topic):
    return next(r for r in rows if r.topic == topic)


@pytest.mark.parametrize(
    ("environ", "modules", "expected"),
    [
        ({"COLAB_RELEASE_TAG": "release-colab_20261101"}, {}, "Colab"),
        ({}, {"google.colab": object()}, "Colab"),
        ({"KAGGLE_KERNEL_RUN_TYPE": "Interactive"}, {"ipykernel": object()}, "Kaggle"),
        ({}, {"ipykernel": object()}, "Jupyter"),
        ({}, {}, "plain Python"),
    ],
)
def test_platform_is_told_apart_by_its_environment(environ, modules, expected):
    assert platform_name(environ, modules) == expected


def test_cpu_only_machine_takes_the_cpu_paths():
    rows = findings(machine(0))
    assert "none visible" in row(rows, "GPUs").fact and "CPU build" in row(rows, "GPUs").fact
    assert "gloo" in row(rows, "GPUs").action
    assert not [r for r in rows if r.status == "warn"]


def test_one_t4_uses_fp16_with_a_scaler_and_gloo_for_several_processes():
    rows = findings(machine(1, T4, platform="Colab"))
    assert "compute capability 7.5" in row(rows, "GPU 0").fact and "no bf16" in row(rows, "GPU 0").fact
    assert "fp16 autocast + GradScaler" in row(rows, "GPU 0").action
    assert "gloo" in row(rows, "GPU count").action
    assert not any(r.topic == "NCCL" for r in rows), "one GPU: no NCCL smoke test to report"


def test_two_t4s_without_peer_access_that_need_the_p2p_fix():
    rows = findings(machine(2, T4, peer=False, smoke="ok with NCCL_P2P_DISABLE=1", platform="Kaggle"))
    assert "0→1" in row(rows, "peer access").fact and "1→0" in row(rows, "peer access").fact
    nccl = row(rows, "NCCL")
    assert nccl.status == "warn" and "%env NCCL_P2P_DISABLE=1" in nccl.action
    assert "T4 x2" in row(rows, "platform").action


def test_n_ampere_gpus_with_a_passing_nccl_all_reduce():
    rows = findings(machine(8, A100, smoke="ok"))
    assert all("bf16 in hardware" in row(rows, f"GPU {i}").fact for i in range(8))
    assert row(rows, "NCCL").status == "ok" and "8 ranks" in row(rows, "NCCL").action
    assert row(rows, "peer access").status == "ok"


@pytest.mark.parametrize(
    ("smoke", "nccl_built", "expected"),
    [
        ("hang", True, "backend='gloo'"),
        ("error: NCCL error: unhandled system error", True, "backend='gloo'"),
        (None, False, "install a CUDA build"),
    ],
)
def test_nccl_that_hangs_fails_or_is_missing_falls_back_to_gloo(smoke, nccl_built, expected):
    nccl = row(findings(machine(2, A100, smoke=smoke, nccl_built=nccl_built)), "NCCL")
    assert nccl.status == "warn" and expected in nccl.action


def test_python_314_forkserver_and_a_kernel_with_cuda_initialised():
    rows = findings(machine(1, A100, python=(3, 14), start_method="forkserver", cuda_initialised=True))
    start = row(rows, "start method")
    assert (
        start.status == "note"
        and "forkserver" in start.fact
        and "multiprocessing_context='fork'" in start.action
    )
    assert "never forks the kernel" in start.action
    kernel = row(rows, "this kernel")
    assert kernel.status == "note" and "never forks the kernel" in kernel.action


@pytest.mark.parametrize(
    ("version", "status", "expected"),
    [
        ("2.10.0+cu128", "ok", "supported (2.10 – 2.15; CI tests 2.13)"),  # Kaggle's
        ("2.11.0+cu128", "ok", "supported"),  # Colab's
        ("2.13.0+cpu", "ok", "supported"),  # CI's
        ("2.15.0", "ok", "supported"),  # the newest release
        ("2.9.1", "warn", 'pip install -U "torch>=2.10"'),
        ("1.13.1", "warn", "upgrade"),
        ("2.16.0.dev20260301+cpu", "warn", "report it with this torch version"),
        ("3.0.0", "warn", 'or install "torch==2.15.*"'),
        ("unknown", "warn", "the course supports torch 2.10 – 2.15"),
    ],
)
def test_torch_outside_the_supported_releases_is_a_warning(version, status, expected):
    torch_row = row(findings(machine(1, A100, torch=version)), "torch")
    assert torch_row.status == status and expected in torch_row.action and version in torch_row.fact
    if status == "warn":
        assert "older" in torch_row.fact or "newer" in torch_row.fact or "not a version" in torch_row.fact


def test_readme_declares_the_supported_torch_releases():
    (lo_major, lo_minor), (hi_major, hi_minor) = doc.TORCH_SUPPORTED
    readme = " ".join((Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8").split())
    declared = f"**Supported torch versions: {lo_major}.{lo_minor} – {hi_major}.{hi_minor}.**"
    assert declared in readme and f"CI tests {doc.TORCH_TESTED}." in readme
    ci = (Path(__file__).resolve().parents[1] / ".ci" / "run").read_text(encoding="utf-8")
    assert f"torch=={doc.TORCH_TESTED}." in ci, "CI's torch is not the one the doctor and README name"


def test_a_failed_probe_old_python_and_missing_packages_are_findings():
    rows = findings(
        machine(
            0,
            python=(3, 9),
            probe_error="the GPU probe failed (timed out)",
            packages={"ipywidgets": "7.7.1", "ipykernel": None, "ray": None},
        )
    )
    assert row(rows, "Python").status == "warn"
    assert row(rows, "GPUs").status == "warn" and "timed out" in row(rows, "GPUs").fact
    assert row(rows, "ipywidgets").status == "ok" and "7.x" in row(rows, "ipywidgets").action
    assert row(rows, "ipykernel").status == "warn"
    assert row(rows, "ray").status == "note" and "06b" in row(rows, "ray").action


def test_probe_output_is_parsed_into_gpu_facts(monkeypatch):
    printed = (
        'noise\nPROBE {"gpus": [[0, "Tesla T4", [7, 5], 16], [1, "Tesla T4", [7, 5], 16]], '
        '"peer": [[0, 1, false], [1, 0, false]]}\n'
    )
    monkeypatch.setattr(probes, "run_child", lambda code, args, timeout_s, env=None: (0, printed))
    gpus, peer, error = probes.probe_gpus(5)
    assert (
        error is None
        and [g.capability for g in gpus] == [(7, 5), (7, 5)]
        and peer == {(0, 1): False, (1, 0): False}
    )
    monkeypatch.setattr(probes, "run_child", lambda code, args, timeout_s, env=None: (None, ""))
    assert probes.probe_gpus(5) == ((), {}, "the GPU probe failed (timed out)")


@pytest.mark.parametrize(
    ("answers", "expected"),
    [
        ([(0, "ALL-REDUCE OK\n")], "ok"),
        ([(None, ""), (0, "ALL-REDUCE OK\n")], "ok with NCCL_P2P_DISABLE=1"),
        ([(None, ""), (None, "")], "hang"),
        ([(1, "RuntimeError: NCCL error\n")], "error: RuntimeError: NCCL error"),
    ],
)
def test_a_hanging_nccl_all_reduce_is_retried_with_p2p_disabled(monkeypatch, answers, expected):
    calls = []

    def fake(code, args, timeout_s, env=None):
        calls.append(env)
        return answers[len(calls) - 1]

    monkeypatch.setattr(probes, "run_child", fake)
    assert probes.nccl_smoke(1.0, 2) == expected
    assert calls[1:] in ([], [{"NCCL_P2P_DISABLE": "1"}])


def test_a_child_that_hangs_is_stopped_at_its_deadline():
    start = time.monotonic()
    hangs = "import time; print('started', flush=True); time.sleep(60)"
    code, out = probes.run_child(hangs, [], timeout_s=2.0)
    assert code is None and time.monotonic() - start < 30


def test_the_doctor_runs_here_without_touching_cuda_and_never_raises(monkeypatch):
    import torch

    out = io.StringIO()
    rows = doc.doctor(file=out)
    assert rows and "Python" in out.getvalue() and not torch.cuda.is_initialized()

    def broken(**_):
        raise OSError("no /proc here")

    monkeypatch.setattr(doc, "gather_facts", broken)
    rows = doc.doctor(file=io.StringIO())
    assert [r.topic for r in rows] == ["doctor"] and "OSError" in rows[0].fact


def test_python_m_mgpu_helpers_prints_the_doctor():
    proc = subprocess.run([sys.executable, "-m", "mgpu_helpers"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "start method" in proc.stdout and "platform" in proc.stdout and "00 Setup" in proc.stdout


def test_the_all_reduce_smoke_script_really_runs_its_ranks():
    """The script the NCCL check runs, here on gloo: spawned ranks must import its worker from the file
    (``python -c`` could not: "Can't get attribute 'work' on <module '__main__'>")."""
    from mgpu_helpers.processes import free_port

    code, out = probes.run_child(probes.NCCL_SCRIPT, [str(free_port()), "gloo", "2"], timeout_s=120)
    assert code == 0 and "ALL-REDUCE OK" in out, out[-2000:]
