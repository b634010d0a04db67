"""Used by notebooks 05d (and its graders), 05e, 05g (and its graders), 05h and 08b: a
parallelism planner.
Given a transformer, a workload and a cluster, it lists which layouts — data parallel (DP), ZeRO-1/2/3,
tensor parallel (TP), context parallel (CP), pipeline parallel (PP) and their combinations — fit in one
GPU's memory, what each sends per optimizer step, and a rough step time to rank them.

Every number is *estimated*:

* **state** (weights, gradients, optimizer) — the course's one estimator,
  :func:`mgpu_helpers.memory.predict_memory` (mixed precision: 2Ψ + 2Ψ + 12Ψ, ZeRO-k dividing by the DP
  size), applied to the Ψ/(t·p) parameters one TP×PP shard holds (Hugging Face's *Ultra-Scale
  Playbook*, after Rajbhandari et al., ZeRO, arXiv 1910.02054);
* **activations** per layer and micro-batch, 16-bit (Korthikanti et al., arXiv 2205.05198, table 2):
  ``s·b·h·(34 + 5·a·s/h)`` with the attention scores materialised (no FlashAttention); with TP
  ``s·b·h·(10 + 24/t + 5·a·s/(h·t))``, with sequence parallelism everything ``/t``; selective
  recomputation (what FlashAttention gives for free) drops the ``5·a·s/h`` term; full recomputation
  keeps each layer's input, ``2·s·b·h`` — divided by t under sequence parallelism, the course's extension
  of the table. The 34 is a GPT layer's (not Llama's SwiGLU/GQA). A pipeline stage holds ``L/p`` layers,
  and under 1F1B the first stage keeps ``min(p, m)`` micro-batches in flight. Context parallelism (ring
  attention, notebook 05e) divides every term by ``cp``: a rank holds ``s/cp`` tokens and scores of its
  ``s/cp`` queries against the ``s`` keys;
* **communication**, bytes one GPU *sends* per optimizer step of ``m`` micro-batches (ring collectives:
  an all-reduce sends ``2(n−1)/n`` of the buffer, a reduce-scatter or all-gather ``(n−1)/n``):
  DP and ZeRO-1 one gradient all-reduce (≈ 2Ψ); ZeRO-2 a reduce-scatter per micro-batch plus one
  all-gather of weights, ZeRO-3 two weight all-gathers and a reduce-scatter per micro-batch (≈ 3Ψ) —
  the course's model of gradient accumulation; TP four all-reduces of ``b·s·h`` per layer and
  micro-batch (Megatron-LM, Shoeybi et al., arXiv 1909.08053; full recomputation repeats the forward
  two); PP one ``b·s·h`` activation forward and one gradient backward per micro-batch and stage boundary
  (Narayanan et al., arXiv 2104.04473); CP the ring's K/V blocks, ``(cp−1)`` per layer and micro-batch
  forward and twice that backward. GPUs are numbered TP innermost, then CP, DP, PP: a group stays
  inside a node (``intra``) when it spans at most ``gpus_per_node`` GPUs, else it crosses nodes (``inter``);
* **step time** = compute / (1 − bubble) + intra / :data:`INTRA_NODE_BW` + inter / :data:`INTER_NODE_BW`,
  compute = 6Ψ (8Ψ with full recomputation) FLOPs per token at :data:`GPU_FLOPS`, no overlap.

Memory in GiB (2³⁰ B, as GPU capacities and the Playbook's charts), traffic in GB (10⁹ B, as link
speeds). A layout *fits* in :data:`USABLE` of the GPU. Embeddings are spread evenly like other weights.

The package: :mod:`.formulas` (models, workloads, layouts and the per-GPU formulas), :mod:`.plans`
(one layout's plan, every layout of a GPU count, the HTML table) and :mod:`.widget` (the form).
"""

from .formulas import (
    GB,
    GIB,
    GPU_FLOPS,
    INTER_NODE_BW,
    INTRA_NODE_BW,
    LLAMA_8B,
    LLAMA_70B,
    LLAMA_405B,
    PRESETS,
    USABLE,
    Layout,
    Transformer,
    Workload,
    activation_bytes,
    communication_bytes,
    state_bytes,
)
from .plans import Plan, no_layout_reason, plan, plan_all, plans_html
from .widget import gpu_memory_gib, planner_form

# fmt: off
__all__ = [
    "GB", "GIB", "GPU_FLOPS", "INTER_NODE_BW", "INTRA_NODE_BW", "LLAMA_8B", "LLAMA_70B", "LLAMA_405B",
    "PRESETS", "USABLE", "Layout", "Plan", "Transformer", "Workload", "activation_bytes",
    "communication_bytes", "gpu_memory_gib", "no_layout_reason", "plan", "plan_all", "plans_html",
    "planner_form", "state_bytes",
]
# fmt: on
