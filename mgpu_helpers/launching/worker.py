"""Used by the launcher tests and from a terminal (notebook 01 writes its own version, ``whoami.py``, in
a cell): a torchrun worker that reports who it is.

    torchrun --nproc-per-node=2 -m mgpu_helpers.launching.worker

Every rank reads the identity torchrun gave it (environment variables ``RANK``, ``LOCAL_RANK``,
``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK`` = node rank), joins the process group, proves
that the group works with one ``all_reduce``, and gathers everyone's identity on rank 0, which prints
one ``MGPU_RESULT`` line holding the list. Backend: :func:`mgpu_helpers.hardware.choose_backend` for
this node's ranks (NCCL when it has a GPU per local rank, else gloo); override with ``--backend``.
"""

from __future__ import annotations

import argparse
import json
import os
import socket

import torch
import torch.distributed as dist

from ..hardware import choose_backend
from .torchrun import RESULT_PREFIX

__all__ = ["identity", "main"]


def identity() -> dict[str, object]:
    """This process's place in the job, as torchrun described it in the environment."""
    env = os.environ
    return {
        "rank": int(env["RANK"]),
        "local_rank": int(env["LOCAL_RANK"]),
        "node_rank": int(env.get("GROUP_RANK", "0")),
        "world_size": int(env["WORLD_SIZE"]),
        "local_world_size": int(env["LOCAL_WORLD_SIZE"]),
        "hostname": socket.gethostname(),
        "pid": os.getpid(),
        "master": f"{env.get('MASTER_ADDR')}:{env.get('MASTER_PORT')}",
        "CUDA_VISIBLE_DEVICES": env.get("CUDA_VISIBLE_DEVICES", "(unset)"),
    }


def main(argv: list[str] | None = None) -> None:
    """Join the group, check it with an all-reduce, gather identities, print them from rank 0."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--backend", choices=["auto", "gloo", "nccl"], default="auto")
    args = parser.parse_args(argv)
    if "RANK" not in os.environ:
        parser.error("run me under torchrun: torchrun --nproc-per-node=2 -m mgpu_helpers.launching.worker")
    me = identity()
    local_rank = int(me["local_rank"])
    backend = choose_backend(int(me["local_world_size"])) if args.backend == "auto" else args.backend
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    me.update(backend=backend, device=str(device))
    # env:// (torchrun set MASTER_ADDR/PORT, RANK, WORLD_SIZE); NCCL: this rank's GPU, named, not guessed
    dist.init_process_group(backend=backend, device_id=device if backend == "nccl" else None)
    try:
        total = torch.tensor([float(me["rank"])], device=device)
        dist.all_reduce(total)  # every rank ends with 0 + 1 + … + (world_size - 1)
        expected = sum(range(int(me["world_size"])))
        if total.item() != expected:
            raise RuntimeError(f"all_reduce gave {total.item()}, expected {expected}")
        me["all_reduce_sum"] = total.item()
        everyone: list[object] = [None] * int(me["world_size"])
        dist.all_gather_object(everyone, me)
        if me["rank"] == 0:
            print(RESULT_PREFIX + json.dumps(everyone), flush=True)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
