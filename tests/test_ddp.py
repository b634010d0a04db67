"""mgpu_helpers.ddp: c10d torchrun jobs on 127.0.0.1, the notebook's plots, DDP throughput."""

import textwrap
import time

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import pytest

from mgpu_helpers.ddp import (
    measure_throughput,
    plot_bytes_per_rank,
    plot_loss_per_rank,
    run_c10d_job,
)
from mgpu_helpers.launch import TorchrunError, torchrun_command

WORKER = """
import json, os
import torch, torch.distributed as dist

dist.init_process_group("gloo")
total = torch.tensor([float(dist.get_rank())])
dist.all_reduce(total)
keys = ("RANK", "GROUP_RANK", "LOCAL_RANK", "WORLD_SIZE", "TORCHELASTIC_RUN_ID")
print("MGPU_RESULT " + json.dumps({**{k: os.environ[k] for k in keys}, "sum": total.item()}), flush=True)
dist.destroy_process_group()
"""


def _script(tmp_path, body: str) -> str:
    path = tmp_path / "worker.py"
    path.write_text(textwrap.dedent(body))
    return str(path)


def test_c10d_command_is_the_same_for_every_node():
    kwargs = dict(nnodes=2, nproc_per_node=4, master_port=29400, rdzv="c10d", rdzv_id="job", module=False)
    cmd = torchrun_command("train.py", ["--steps", 3], node_rank=0, **kwargs)
    assert cmd == torchrun_command("train.py", ["--steps", 3], node_rank=1, **kwargs)
    assert cmd[1:3] == ["-m", "torch.distributed.run"]
    assert cmd[3:] == [
        "--nnodes=2",
        "--nproc-per-node=4",
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=127.0.0.1:29400",
        "--rdzv-id=job",
        "--max-restarts=0",
        "train.py",
        "--steps",
        "3",
    ]
    assert not any(a.startswith("--node-rank") for a in cmd), "c10d assigns node ranks itself"
    module = torchrun_command("pkg.mod", nnodes=1, nproc_per_node=1, master_port=1, rdzv="c10d", module=True)
    assert module[-2:] == ["-m", "pkg.mod"]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"nnodes": 0, "nproc_per_node": 1},
        {"nnodes": 1, "nproc_per_node": 0},
        {"nnodes": 1, "nproc_per_node": 1, "rdzv": "etcd"},
        {"nnodes": 1, "nproc_per_node": 1, "max_restarts": -1},
    ],
)
def test_c10d_command_rejects_bad_arguments(kwargs):
    with pytest.raises(ValueError):
        torchrun_command("train.py", master_port=1, **{"rdzv": "c10d", **kwargs})


def test_two_nodes_meet_through_c10d_and_get_node_ranks(tmp_path):
    runs = run_c10d_job(_script(tmp_path, WORKER), nnodes=2, nproc_per_node=1, timeout=120)
    assert [r.returncode for r in runs] == [0, 0]
    assert runs[0].command == runs[1].command
    results = sorted((res for r in runs for res in r.results), key=lambda res: res["RANK"])
    assert [(res["RANK"], res["GROUP_RANK"], res["LOCAL_RANK"]) for res in results] == [
        ("0", "0", "0"),
        ("1", "1", "0"),
    ]
    assert all(res["WORLD_SIZE"] == "2" and res["sum"] == 1.0 for res in results)
    assert len({res["TORCHELASTIC_RUN_ID"] for res in results}) == 1
    assert runs[0].shell_command().startswith("torchrun --nnodes=2 --nproc-per-node=1 --rdzv-backend=c10d")


def test_a_failing_node_stops_the_job_with_its_traceback(tmp_path):
    script = _script(
        tmp_path,
        """
        import os, time
        if os.environ["GROUP_RANK"] == "1":
            raise ValueError("node one is broken on purpose")
        time.sleep(120)
        """,
    )
    start = time.monotonic()
    with pytest.raises(TorchrunError) as err:
        run_c10d_job(script, nnodes=2, nproc_per_node=1, timeout=90)
    assert time.monotonic() - start < 60
    assert "node one is broken on purpose" in str(err.value)
    # the conftest fixture fails this test if any agent or worker is still alive


def test_timeout_stops_everything(tmp_path):
    script = _script(tmp_path, "import time\ntime.sleep(120)\n")
    start = time.monotonic()
    runs = run_c10d_job(script, nnodes=2, nproc_per_node=1, timeout=8, check=False)
    assert time.monotonic() - start < 45
    assert [r.returncode for r in runs] == [None, None]
    assert all("timeout" in r.stderr for r in runs)


def test_plot_loss_per_rank_draws_ranks_and_reference():
    ax = plot_loss_per_rank([[1.0, 0.5, 0.25], [1.2, 0.7, 0.2]], reference=[1.1, 0.6, 0.225])
    lines = ax.get_lines()
    assert len(lines) == 3
    assert list(lines[2].get_ydata()) == [1.1, 0.6, 0.225]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [
        "rank 0 (its shard)",
        "rank 1 (its shard)",
        "one process, whole batch",
    ]
    plt.close(ax.figure)


def test_plot_loss_per_rank_rejects_ragged_input():
    with pytest.raises(ValueError):
        plot_loss_per_rank([[1.0, 0.5], [1.0]])
    with pytest.raises(ValueError):
        plot_loss_per_rank([[1.0, 0.5]], reference=[1.0])
    with pytest.raises(ValueError):
        plot_loss_per_rank([])


def test_plot_bytes_per_rank_one_bar_per_rank_and_series():
    ring = {2: [2048, 2048], 3: [3072, 3072, 3072]}
    naive = {2: [2048, 2048], 3: [4096, 2048, 2048]}
    ax = plot_bytes_per_rank(ring, naive, unit="KiB")
    heights = [p.get_height() for p in ax.patches]
    assert len(heights) == 10  # (2 + 3 ranks) x (ring, naive)
    assert heights[:4] == [2.0, 2.0, 2.0, 2.0] and heights[4:6] == [3.0, 4.0]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["ring", "gather to rank 0"]
    plt.close(ax.figure)
    with pytest.raises(ValueError):
        plot_bytes_per_rank(ring, unit="GB")
    with pytest.raises(ValueError):
        plot_bytes_per_rank({})


def test_measure_throughput_runs_real_ddp_for_one_and_two_processes():
    one = measure_throughput(1, global_batch=64, steps=2, warmup=1, hidden=32, threads_per_process=1)
    two = measure_throughput(2, global_batch=64, steps=2, warmup=1, hidden=32, threads_per_process=1)
    assert one > 0 and two > 0


def test_measure_throughput_rejects_bad_arguments():
    with pytest.raises(ValueError, match="divisible"):
        measure_throughput(3, global_batch=64)
    with pytest.raises(ValueError):
        measure_throughput(1, steps=0)
    with pytest.raises(ValueError):
        measure_throughput(1, threads_per_process=0)
