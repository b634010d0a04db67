"""Used by notebook 07 (troubleshooting), §5: a real distributed hang, turned into an error by a timeout.

Run under torchrun with two processes (the notebook uses ``run_torchrun``)::

    torchrun --nproc-per-node=2 --master-addr=127.0.0.1 -m mgpu_helpers.troubleshoot hang --timeout 2

:func:`hang_worker` is each rank's code: rank 1 never joins rank 0's ``all_reduce``, and the process
group's timeout turns what would be a silent hang into an error that rank 0 diagnoses and reports.
Everything stays on loopback: gloo on the loopback interface, the store on 127.0.0.1.
"""

from __future__ import annotations

import math
import os
from typing import Any

from ..processes import is_loopback, loopback_interface

__all__ = ["hang_worker"]


def _check_hang_setup(timeout_s: Any) -> None:
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float):
        raise TypeError(f"timeout_s must be a number of seconds, not {timeout_s!r}")
    if not (timeout_s > 0 and math.isfinite(timeout_s)):
        raise ValueError(f"timeout_s must be a finite number of seconds > 0 (e.g. 2), not {timeout_s}")
    if int(os.environ.get("WORLD_SIZE", "0")) < 2 or "MASTER_ADDR" not in os.environ:
        raise RuntimeError(
            "the hang demo runs under torchrun with 2 processes: torchrun --nproc-per-node=2 "
            "--master-addr=127.0.0.1 -m mgpu_helpers.troubleshoot hang --timeout 2"
        )
    if not is_loopback(os.environ["MASTER_ADDR"]):
        raise RuntimeError(
            f"the hang demo stays on this machine; start torchrun with --master-addr=127.0.0.1, "
            f"not {os.environ['MASTER_ADDR']}"
        )
    iface = loopback_interface()
    if iface:
        os.environ["GLOO_SOCKET_IFNAME"] = iface  # gloo listens on 127.0.0.1 only


def hang_worker(timeout_s: float) -> None:
    """One rank of the hang demo (run under torchrun with 2 processes): rank 1 skips rank 0's all_reduce."""
    import datetime
    import json
    import time

    import torch
    import torch.distributed as dist

    _check_hang_setup(timeout_s)
    from ..launching import RESULT_PREFIX
    from .diagnose import diagnose

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=timeout_s))  # CPU tensors: gloo
    rank = dist.get_rank()
    # A side channel both ranks can reach: torchrun's own key-value store at MASTER_ADDR:MASTER_PORT.
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        is_master=False,
        timeout=datetime.timedelta(seconds=60),
    )
    if rank == 0:
        report: dict[str, Any] = {"rank": 0}
        start = time.monotonic()
        try:
            dist.all_reduce(torch.ones(4))  # rank 1 never calls this: without a timeout, a hang forever
            report["error_type"] = None
        except Exception as exc:
            report.update(error_type=type(exc).__name__, message=str(exc), kind=diagnose(exc).kind)
        report["waited_s"] = round(time.monotonic() - start, 3)
        print(RESULT_PREFIX + json.dumps(report), flush=True)
        store.set("mgpu_troubleshoot/rank0_done", "1")
    else:
        # The "bug": this rank is busy elsewhere and never joins the all_reduce. It stays alive until
        # rank 0 has seen its timeout (if it exited, rank 0 would see "connection closed" instead).
        store.wait(["mgpu_troubleshoot/rank0_done"])
        print(RESULT_PREFIX + json.dumps({"rank": rank, "skipped_all_reduce": True}), flush=True)
    dist.destroy_process_group()
