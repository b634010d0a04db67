"""Used by the environment doctor (notebook 00, ``python -m mgpu_helpers``; see :mod:`mgpu_helpers.doctor`):
GPU questions asked in a **child process**, so that the notebook's kernel never initialises CUDA (after
which the course's launcher could no longer fork workers).

* :func:`probe_gpus` — names, compute capability, memory and peer access of every GPU;
* :func:`nccl_smoke` — a real NCCL all-reduce with a deadline, retried with ``NCCL_P2P_DISABLE=1`` if it
  hangs (the usual cure where GPUs cannot reach each other directly, e.g. some 2 × T4 hosts);
* :func:`run_child` — runs a script in a fresh Python with a deadline and leaves no process behind.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass

__all__ = ["GPUFacts", "P2P_FIX", "nccl_smoke", "probe_gpus", "run_child"]

#: The environment fix printed when NCCL hangs (and tried by :func:`nccl_smoke` itself).
P2P_FIX = "NCCL_P2P_DISABLE=1"


@dataclass(frozen=True)
class GPUFacts:
    """One GPU as the probe child saw it."""

    index: int
    name: str
    capability: tuple[int, int]
    memory_bytes: int

    @property
    def native_bf16(self) -> bool:
        """bf16 in hardware: compute capability 8.0 (Ampere) and later — torch's own rule in
        ``torch.cuda.is_bf16_supported(including_emulation=False)``. A T4 (7.5) only emulates it."""
        return self.capability >= (8, 0)


PROBE_SCRIPT = r"""
import json, torch
out = {"gpus": [], "peer": []}
n = torch.cuda.device_count() if torch.cuda.is_available() else 0
for i in range(n):
    p = torch.cuda.get_device_properties(i)
    out["gpus"].append([i, p.name, [p.major, p.minor], int(p.total_memory)])
for i in range(n):
    for j in range(n):
        if i != j:
            out["peer"].append([i, j, bool(torch.cuda.can_device_access_peer(i, j))])
print("PROBE " + json.dumps(out))
"""

NCCL_SCRIPT = r"""
import sys, torch, torch.distributed as dist, torch.multiprocessing as mp
def work(rank, world, port, backend):
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    device = torch.device("cpu")
    if backend == "nccl":
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
    x = torch.ones(1 << 20, device=device) * (rank + 1)
    dist.all_reduce(x)
    assert x[0].item() == world * (world + 1) / 2, x[0].item()
    dist.destroy_process_group()
if __name__ == "__main__":
    port, backend, n = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    mp.spawn(work, args=(n, port, backend), nprocs=n)
    print("ALL-REDUCE OK")
"""


def run_child(code: str, args: list[str], timeout_s: float, env: dict[str, str] | None = None):
    """Run ``code`` as a script file in a fresh Python; ``(returncode or None on timeout, output)``.

    A file, not ``python -c``: ``mp.spawn``'s children must import the worker function from ``__main__``,
    which they can only do from a file. No process outlives this call; the file is removed.
    """
    import tempfile

    from ..processes import stop_processes, temp_prefix

    with tempfile.TemporaryDirectory(prefix=temp_prefix("doctor")) as folder:
        script = os.path.join(folder, "probe.py")
        with open(script, "w") as f:
            f.write(code)
        proc = subprocess.Popen(
            [sys.executable, script, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )
        try:
            out, _ = proc.communicate(timeout=timeout_s)
            return proc.returncode, out
        except subprocess.TimeoutExpired:
            return None, ""
        finally:
            if proc.poll() is None:
                stop_processes([proc], grace_s=2.0)
                proc.communicate()


def probe_gpus(timeout_s: float) -> tuple[tuple[GPUFacts, ...], dict[tuple[int, int], bool], str | None]:
    """The GPUs and which pairs can reach each other (peer access), asked in a child:
    ``(gpus, peer access by (i, j), None)``, or ``((), {}, why)`` when the child fails or times out."""
    code, out = run_child(PROBE_SCRIPT, [], timeout_s)
    line = next((ln for ln in out.splitlines() if ln.startswith("PROBE ")), None)
    if code != 0 or line is None:
        why = "timed out" if code is None else (out.strip().splitlines() or ["no output"])[-1]
        return (), {}, f"the GPU probe failed ({why})"
    data = json.loads(line[len("PROBE ") :])
    gpus = tuple(GPUFacts(i, name, (cc[0], cc[1]), mem) for i, name, cc, mem in data["gpus"])
    return gpus, {(i, j): ok for i, j, ok in data["peer"]}, None


def nccl_smoke(timeout_s: float, n_gpus: int) -> str:
    """An NCCL all-reduce over ``n_gpus`` GPUs in a child with a deadline, run again with P2P_FIX if it
    hangs: ``"ok"``, ``"ok with NCCL_P2P_DISABLE=1"``, ``"error: <last line>"`` or ``"hang"``."""
    from ..processes import free_port

    args = lambda: [str(free_port()), "nccl", str(n_gpus)]  # noqa: E731 - a fresh port per try
    code, out = run_child(NCCL_SCRIPT, args(), timeout_s)
    if code == 0 and "ALL-REDUCE OK" in out:
        return "ok"
    if code is not None:
        return "error: " + ((out.strip().splitlines() or ["no output"])[-1])[:200]
    code, out = run_child(NCCL_SCRIPT, args(), timeout_s, env={"NCCL_P2P_DISABLE": "1"})
    return f"ok with {P2P_FIX}" if code == 0 and "ALL-REDUCE OK" in out else "hang"
