"""torchrun launching: identities, failures, timeouts, and no leftover processes."""

import textwrap
import time

import pytest

from mgpu_helpers import launch
from mgpu_helpers.launch import TorchrunError, free_port, parse_results, run_torchrun, torchrun_command


def test_two_nodes_form_one_job_with_distinct_ranks():
    runs = run_torchrun("mgpu_helpers.whoami", nnodes=2, nproc_per_node=1, timeout=90)
    assert [r.returncode for r in runs] == [0, 0]
    (table,) = runs[0].results  # rank 0 lives on node 0 and prints everyone's identity
    assert runs[1].results == []
    assert [(r["rank"], r["node_rank"], r["local_rank"], r["world_size"]) for r in table] == [
        (0, 0, 0, 2),
        (1, 1, 0, 2),
    ]
    assert all(r["all_reduce_sum"] == 1.0 and r["backend"] == "gloo" for r in table)
    assert len({r["pid"] for r in table}) == 2
    assert runs[1].shell_command().startswith("torchrun --nnodes=2 --nproc-per-node=1 --node-rank=1")


def _script(tmp_path, body: str) -> str:
    path = tmp_path / "worker.py"
    path.write_text(textwrap.dedent(body))
    return str(path)


def test_failing_rank_raises_with_its_traceback(tmp_path):
    script = _script(
        tmp_path,
        """
        import os
        if os.environ["RANK"] == "1":
            raise ValueError("rank one is broken on purpose")
        """,
    )
    with pytest.raises(TorchrunError) as err:
        run_torchrun(script, module=False, nproc_per_node=2, timeout=60)
    assert "rank one is broken on purpose" in str(err.value)
    assert "exited with code" in str(err.value)


def test_other_node_is_stopped_when_one_fails(tmp_path):
    script = _script(
        tmp_path,
        """
        import os, time
        if os.environ["GROUP_RANK"] == "1":
            raise SystemExit(3)
        time.sleep(120)
        """,
    )
    start = time.monotonic()
    runs = run_torchrun(script, module=False, nnodes=2, nproc_per_node=1, timeout=60, check=False)
    assert time.monotonic() - start < 40
    assert runs[1].returncode != 0
    assert "stopped by run_torchrun" in runs[0].stderr or runs[0].returncode != 0


def test_the_node_that_failed_is_named_not_the_one_stopped_for_it(tmp_path):
    script = _script(
        tmp_path,
        """
        import os, time
        if os.environ["GROUP_RANK"] == "1":
            raise ValueError("node one is broken on purpose")
        time.sleep(120)
        """,
    )
    with pytest.raises(TorchrunError) as err:
        run_torchrun(script, module=False, nnodes=2, nproc_per_node=1, timeout=60)
    assert str(err.value).startswith("node 1 exited with code")
    assert "node one is broken on purpose" in str(err.value)


def test_timeout_stops_everything(tmp_path):
    script = _script(tmp_path, "import time\ntime.sleep(120)\n")
    start = time.monotonic()
    with pytest.raises(TorchrunError, match="timed out"):
        run_torchrun(script, module=False, nproc_per_node=1, timeout=4)
    assert time.monotonic() - start < 20


def test_command_line_and_validation():
    cmd = torchrun_command("pkg.mod", ["--x", "1"], nnodes=2, nproc_per_node=4, node_rank=1, master_port=1234)
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
    with pytest.raises(ValueError, match="node_rank"):
        torchrun_command("m", nnodes=2, node_rank=2, master_port=1)
    with pytest.raises(ValueError, match=">= 1"):
        torchrun_command("m", nproc_per_node=0, master_port=1)


def test_gpu_slices_give_each_simulated_node_its_own_gpus(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr("torch.cuda.device_count", lambda: 4)
    assert launch.gpu_slices(2, 2) == ["0,1", "2,3"]
    monkeypatch.setattr("torch.cuda.device_count", lambda: 2)
    assert launch.gpu_slices(2, 2) == ["", ""]  # not enough: hide GPUs, use gloo
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    assert launch.gpu_slices(2, 2) == ["4,5", "6,7"]


def test_parse_results_and_free_port():
    assert parse_results('noise\nMGPU_RESULT {"a": 1}\nMGPU_RESULT [2]\n') == [{"a": 1}, [2]]
    assert 1024 <= free_port() <= 65535
