"""Reference solutions of notebook 05g's exercises, typical wrong attempts and known shortcuts (run by
tests/test_solutions.py and tests/test_shortcuts.py).

05g.1 asks for ``plan()``: Megatron's split of a Llama block whose attention and MLP each take ONE
replicated input, so that the backward all-reduces once per sub-layer. 05g.2 asks for
``block_activation_bytes(shape, seq, batch, tp)``, counted from the shape. 05g.3 asks for
``rank_state_bytes(shape, layout, blocks)``: what one rank holds, as ``dry_run`` measures it.
"""

from __future__ import annotations

from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import ColwiseParallel, PrepareModuleInput, RowwiseParallel

from mgpu_helpers.planner import LLAMA_8B


def per_projection_plan():
    return {
        "attention.wq": ColwiseParallel(),
        "attention.wk": ColwiseParallel(),
        "attention.wv": ColwiseParallel(),
        "attention.wo": RowwiseParallel(),
        "feed_forward.w1": ColwiseParallel(),
        "feed_forward.w3": ColwiseParallel(),
        "feed_forward.w2": RowwiseParallel(),
    }


def plan():
    one = {"input_layouts": (Replicate(),), "desired_input_layouts": (Replicate(),)}
    return per_projection_plan() | {
        "attention": PrepareModuleInput(**one),
        "feed_forward": PrepareModuleInput(**one),
    }


def plan_from_the_package():
    from mgpu_helpers.scale import tp_plan as ready  # the answer key, renamed

    return ready()


def plan_with_gathered_outputs():
    """Every projection's output gathered: right shapes, but all-gathers instead of Megatron's all-reduces."""
    return {name: ColwiseParallel(output_layouts=Replicate()) for name in per_projection_plan()}


def plan_only_the_mlp():
    return {k: v for k, v in plan().items() if k.startswith("feed_forward")}


def block_activation_bytes(shape, seq, batch, tp):
    h, head_dim = shape.hidden, shape.hidden // shape.heads
    kv = (shape.kv_heads or shape.heads) * head_dim
    whole = 6 * h + 2  # block input, residual, x·rstd ×2, norm outputs ×2; one rstd per norm
    split = 2 * h + 2 * kv + 4 * shape.ffn + shape.heads  # Q, attention output, K, V, SwiGLU ×4, log-sum-exp
    return 4 * seq * batch * (whole + split // tp) + 4 * seq * 2 * head_dim  # + RoPE's cos and sin


def gpt_formula(shape, seq, batch, tp):
    """The planner's 16-bit GPT block (34·s·b·h, TP: 10 + 24/t), doubled for fp32."""
    return 2 * seq * batch * shape.hidden * (34 if tp == 1 else 10 + 24 / tp)


def llama_8b_constants(shape, seq, batch, tp):
    """Section 5's numbers for Llama 3 8B whatever the shape passed."""
    return block_activation_bytes(LLAMA_8B, seq, batch, tp)


def rope_per_sequence(shape, seq, batch, tp):
    """RoPE's tables counted once per sequence of the batch."""
    return block_activation_bytes(shape, seq, batch, tp) + 4 * seq * (batch - 1) * 2 * (
        shape.hidden // shape.heads
    )


def measured_instead(shape, seq, batch, tp):
    import torch

    from mgpu_helpers.scale import LlamaBlocks, SavedActivations

    model = LlamaBlocks(shape, 1)
    with SavedActivations(model) as saved:
        model(torch.randn(batch, seq, shape.hidden, requires_grad=True))
    return saved.bytes


def rank_state_bytes(shape, layout, blocks):
    norms = blocks * 2 * shape.hidden  # two RMSNorm weights per block: TP leaves them whole
    numbers = (blocks * shape.layer_params - norms) / layout.tp + norms  # this rank's after TP
    if layout.zero >= 2:
        numbers /= layout.dp  # FSDP2 shards what TP left, also at rest under ZeRO-2
    counters = 4 * 9 * blocks  # Adam's 4-byte step per tensor, 9 tensors a block
    return {
        "parameters": round(4 * numbers),
        "gradients": round(4 * numbers),
        "optimizer": round(8 * numbers) + counters,
    }


def planner_state(shape, layout, blocks):
    from mgpu_helpers.planner import Transformer, Workload, state_bytes

    model = Transformer(
        "stage", blocks * layout.pp, shape.hidden, shape.heads, 0, blocks * layout.pp * shape.layer_params
    )
    state = state_bytes(model.params, layout, Workload(precision="fp32"))
    return {"parameters": state.parameters, "gradients": state.gradients, "optimizer": state.optimizer}


def without_step_counters(shape, layout, blocks):
    out = rank_state_bytes(shape, layout, blocks)
    return out | {"optimizer": out["optimizer"] - 4 * 9 * blocks}


def dry_run_instead(shape, layout, blocks):
    from mgpu_helpers.scale import dry_run

    measured = dry_run(shape, layout, blocks=blocks, seq=4).measured
    return {k: measured[k] for k in ("parameters", "gradients", "optimizer")}


SOLUTIONS = {"05g.1": (plan,), "05g.2": (block_activation_bytes,), "05g.3": (rank_state_bytes,)}
WRONG = {"05g.1": (per_projection_plan,), "05g.2": (gpt_formula,), "05g.3": (planner_state,)}
SHORTCUTS = {
    "05g.1": {
        "the_packages_plan": (plan_from_the_package,),
        "outputs_gathered": (plan_with_gathered_outputs,),
        "only_the_mlp": (plan_only_the_mlp,),
    },
    "05g.2": {
        "llama_8b_constants": (llama_8b_constants,),
        "rope_per_sequence": (rope_per_sequence,),
        "measured_instead": (measured_instead,),
    },
    "05g.3": {
        "without_step_counters": (without_step_counters,),
        "dry_run_instead": (dry_run_instead,),
    },
}
