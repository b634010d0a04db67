"""run_torchrun's c10d rendezvous: several "nodes" on this machine run the same command and meet on
127.0.0.1 (the elastic form of torchrun); failures and timeouts stop every node."""

import threading

import pytest
from _scripts import FAILING_NODE, SLEEP, assert_loopback_only, job_listening_addresses, write_script

from mgpu_helpers.launching import run_torchrun, torchrun_command


def _c10d(script, args=(), **kwargs):
    return run_torchrun(script, args, rdzv="c10d", module=False, **kwargs)


#: Joins the group, reports its identity, then stays up (ready file in argv[1]) until the test has looked.
WORKER = """
import json, os, sys, time
import torch, torch.distributed as dist

dist.init_process_group("gloo")
total = torch.tensor([float(dist.get_rank())])
dist.all_reduce(total)
keys = ("RANK", "GROUP_RANK", "LOCAL_RANK", "WORLD_SIZE", "TORCHELASTIC_RUN_ID", "MASTER_ADDR")
print("MGPU_RESULT " + json.dumps({**{k: os.environ[k] for k in keys}, "sum": total.item()}), flush=True)
open(os.path.join(sys.argv[1], f"ready{dist.get_rank()}"), "w").close()
deadline = time.monotonic() + 60
while not os.path.exists(os.path.join(sys.argv[1], "release")) and time.monotonic() < deadline:
    time.sleep(0.05)
dist.destroy_process_group()
"""


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
        "--local-addr=127.0.0.1",  # every node is this machine: workers meet on loopback
        "train.py",
        "--steps",
        "3",
    ]
    assert not any(a.startswith("--node-rank") for a in cmd), "c10d assigns node ranks itself"
    module = torchrun_command("pkg.mod", nnodes=1, nproc_per_node=1, master_port=1, rdzv="c10d", module=True)
    assert module[-2:] == ["-m", "pkg.mod"]
    remote = torchrun_command("t.py", master_addr="10.0.0.1", master_port=1, rdzv="c10d", module=False)
    assert not any(a.startswith("--local-addr") for a in remote)  # a real cluster: each node's own address


def test_two_nodes_meet_through_c10d_on_loopback_only_and_get_node_ranks(tmp_path):
    folder = tmp_path / "job"
    folder.mkdir()
    script, runs = write_script(tmp_path, WORKER), []
    job = threading.Thread(
        target=lambda: runs.extend(_c10d(script, [str(folder)], nnodes=2, nproc_per_node=1, timeout=120))
    )
    job.start()
    try:
        # the c10d store, the workers' store (rank 0's agent) and one gloo listener per rank
        found = job_listening_addresses(lambda: all((folder / f"ready{r}").exists() for r in range(2)))
    finally:
        (folder / "release").touch()
        job.join(timeout=120)
    assert_loopback_only(found, at_least=4)
    assert [r.returncode for r in runs] == [0, 0]
    assert runs[0].command == runs[1].command
    results = sorted((res for r in runs for res in r.results), key=lambda res: res["RANK"])
    assert [(res["RANK"], res["GROUP_RANK"], res["LOCAL_RANK"]) for res in results] == [
        ("0", "0", "0"),
        ("1", "1", "0"),
    ]
    assert all(res["WORLD_SIZE"] == "2" and res["sum"] == 1.0 for res in results)
    assert all(res["MASTER_ADDR"] == "127.0.0.1" for res in results)
    assert len({res["TORCHELASTIC_RUN_ID"] for res in results}) == 1
    assert runs[0].shell_command().startswith("torchrun --nnodes=2 --nproc-per-node=1 --rdzv-backend=c10d")


def test_a_failing_node_stops_the_other_one(tmp_path):
    runs = _c10d(write_script(tmp_path, FAILING_NODE), nnodes=2, nproc_per_node=1, check=False)
    failed = [r for r in runs if "node one is broken on purpose" in r.stderr]
    stopped = [r for r in runs if "stopped by run_torchrun: another node failed" in r.stderr]
    assert len(failed) == len(stopped) == 1 and failed[0].returncode == 1
    # the conftest fixture fails this test if any agent or worker is still alive


def test_timeout_stops_everything(tmp_path):
    runs = _c10d(write_script(tmp_path, SLEEP), nnodes=2, nproc_per_node=1, timeout=2, check=False)
    assert [r.returncode for r in runs] == [None, None]
    assert all("timeout" in r.stderr for r in runs)


def test_c10d_refuses_a_missing_script_and_zero_nodes():
    with pytest.raises(ValueError, match=r"nnodes must be >= 1"):
        _c10d("t.py", nnodes=0)
    with pytest.raises(FileNotFoundError, match=r"No such file: 'missing_script\.py'"):
        _c10d("missing_script.py")
