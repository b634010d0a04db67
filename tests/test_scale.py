"""The scale lab's plumbing (notebook 05g): one process as one rank of a large fake job, the Llama block it
shards, and the per-rank byte counts, checked against counts derived here from shapes and dtypes."""

import copy

import pytest
import torch
import torch.distributed as dist
from torch import nn

from mgpu_helpers.launching import launch
from mgpu_helpers.planner import LLAMA_8B, LLAMA_70B, LLAMA_405B, Layout, Transformer
from mgpu_helpers.scale.count import SavedActivations, local, rank_state, unique_bytes
from mgpu_helpers.scale.dryrun import dry_run
from mgpu_helpers.scale.llama import Block, LlamaBlocks, context_parallel, tp_plan
from mgpu_helpers.scale.world import fake_world


def test_fake_world_is_one_rank_of_the_job_and_moves_no_data():
    with fake_world(1024, rank=3):
        assert (dist.get_world_size(), dist.get_rank(), dist.get_backend()) == (1024, 3, "fake")
        t = torch.ones(4)
        dist.all_reduce(t)  # a real job would sum 1,024 ones
        assert t.tolist() == [1.0] * 4
    assert not dist.is_initialized()


def test_fake_world_is_left_on_an_error_and_refuses_what_cannot_be():
    with pytest.raises(ZeroDivisionError), fake_world(8):
        raise ZeroDivisionError
    assert not dist.is_initialized()
    with pytest.raises(ValueError, match=r"rank must be below world_size=8 \(ranks are 0 … 7\)"):
        fake_world(8, rank=8).__enter__()
    with fake_world(2), pytest.raises(RuntimeError, match="already belongs to a process group"):
        fake_world(4).__enter__()
    assert not dist.is_initialized()


@pytest.mark.parametrize(
    ("shape", "exact"),
    [(LLAMA_8B, 8_030_261_248), (LLAMA_70B, 70_553_706_496), (LLAMA_405B, 405_853_388_800)],
)
def test_the_block_has_llamas_parameters(shape, exact):
    with torch.device("meta"):
        block = Block(shape)
    counted = sum(p.numel() for p in block.parameters())
    assert counted == shape.layer_params
    embeddings = 2 * shape.hidden * shape.vocab  # untied input embedding and output layer
    assert shape.layers * counted + embeddings + shape.hidden == exact  # + the final norm
    assert abs(exact - shape.params) / exact < 0.0025  # the model card's rounded count the planner uses


def test_a_block_needs_a_llama_shape():
    with pytest.raises(TypeError, match="kv_heads and ffn"):
        Block(Transformer("gpt", 2, 64, 4, 100))


def test_the_block_runs_and_tensor_parallel_shards_it_by_heads_and_by_ffn():
    shape = Transformer("tiny", 1, 64, 8, 0, kv_heads=4, ffn=96)
    model = LlamaBlocks(shape, 2)
    assert model(torch.randn(2, 5, 64)).shape == (2, 5, 64)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module

    with fake_world(4, rank=1):
        mesh = init_device_mesh("cpu", (4,))
        with torch.device("meta"):
            model = LlamaBlocks(shape, 1)
        parallelize_module(model.layers[0], mesh, tp_plan())
        model.to_empty(device="cpu")
        model.init_weights()
        shapes = {n.removeprefix("layers.0."): tuple(local(p).shape) for n, p in model.named_parameters()}
        assert model(torch.randn(1, 3, 64)).shape == (1, 3, 64)
    head = 64 // 8
    assert shapes["attention.wq.weight"] == (8 * head // 4, 64)  # 2 of the 8 query heads
    assert shapes["attention.wk.weight"] == (4 * head // 4, 64)  # 1 of the 4 key/value heads
    assert shapes["attention.wo.weight"] == (64, 8 * head // 4)  # by rows: its heads' inputs
    assert shapes["feed_forward.w1.weight"] == (96 // 4, 64) and shapes["feed_forward.w2.weight"] == (64, 24)
    assert shapes["attention_norm.weight"] == (64,)  # replicated


def test_rank_state_counts_each_storage_once_from_shapes_and_dtypes():
    model = nn.Sequential(nn.Linear(6, 4), nn.Linear(4, 2, bias=False)).double()
    n = sum(p.numel() for p in model.parameters())
    optimizer = torch.optim.Adam(model.parameters())
    assert rank_state(model, optimizer) == {"parameters": 8 * n, "gradients": 0, "optimizer": 0}
    model(torch.randn(3, 6, dtype=torch.float64)).sum().backward()
    optimizer.step()
    steps = sum(s["step"].numel() * s["step"].element_size() for s in optimizer.state.values())
    assert rank_state(model, optimizer) == {
        "parameters": 8 * n,
        "gradients": 8 * n,
        "optimizer": 16 * n + steps,
    }
    w = torch.zeros(10)
    assert unique_bytes([w, w[2:5], w.view(2, 5), None, torch.zeros(3)]) == 40 + 12


def test_saved_activations_are_what_backward_keeps_without_the_weights():
    x = torch.randn(2, 4)
    model = nn.Sequential(nn.Linear(4, 3, bias=False), nn.Tanh(), nn.Linear(3, 5, bias=False))
    with SavedActivations(model) as saved:
        model(x).sum()
    # the first layer keeps x (2·4 floats), tanh its output (2·3), which the second layer keeps too
    assert saved.bytes == 4 * (2 * 4 + 2 * 3)
    with SavedActivations(model) as saved, torch.no_grad():
        model(x)
    assert saved.bytes == 0


#: A small Llama-shaped block (GQA, SwiGLU) whose every matrix splits evenly over 8 ranks: fast, and the
#: planner's division has no remainder, so measured and planned bytes must agree to the byte.
TINY = Transformer("tiny Llama", 4, 256, 8, 0, kv_heads=4, ffn=512)


@pytest.mark.parametrize(
    ("layout", "rank"),
    [
        pytest.param(Layout(dp=8), 3, id="DP8"),
        pytest.param(Layout(dp=8, zero=3), 3, id="ZeRO-3 over 8"),
        pytest.param(Layout(dp=16, tp=4, zero=3), 6, id="TP4 x FSDP16"),
        pytest.param(Layout(dp=2, pp=4, zero=2), 3, id="PP4 x DP2, a middle stage"),
    ],
)
def test_dry_run_measures_what_the_planner_predicts_where_it_models_it(layout, rank):
    run = dry_run(TINY, layout, blocks=2, rank=rank)
    m, p, dp, tp = run.measured, run.planned, layout.dp, layout.tp
    norms = 2 * 2 * TINY.hidden * 4  # two RMSNorm weights per block, fp32: whole on every TP rank,
    extra = norms // dp - norms // (dp * tp) if layout.zero == 3 else 0  # the planner: dp·tp ways
    # FSDP2's ZeRO-2 keeps the parameters sharded at rest (it gathers them for each forward); the
    # planner's ZeRO-2 keeps them whole
    assert m["parameters"] == (p["parameters"] // dp if layout.zero == 2 else p["parameters"] + extra)
    assert m["gradients"] == p["gradients"] + extra
    counters = 4 * len(list(LlamaBlocks(TINY, 2).parameters()))  # Adam's 4-byte step, one per tensor
    assert m["optimizer"] == p["optimizer"] + 2 * extra + counters
    # FSDP's two all-gathers and its reduce-scatter carry the norms whole over dp, not 1/tp of them
    fsdp_norms = 3 * (dp - 1) / dp * (norms - norms / tp) if tp > 1 else 0
    assert run.sent == {k: round(run.planned_sent[k] + fsdp_norms * (k == "DP")) for k in ("DP", "TP", "PP")}
    assert m["activations"] > 0 and "planner (estimate)" in run.html() and not dist.is_initialized()


def test_dry_run_measures_context_parallelism_with_llama_3s_all_gathered_keys_and_values():
    cp, dp, seq = 4, 4, 32
    run = dry_run(TINY, Layout(dp=dp, zero=3, cp=cp), blocks=2, seq=seq, rank=5)
    alone = dry_run(TINY, Layout(dp=dp * cp, zero=3), blocks=2, seq=seq // cp, rank=5)  # same tokens, no CP
    for kind in ("parameters", "gradients", "optimizer"):  # ZeRO-3 over the dp·cp ranks: CP changes nothing
        assert run.measured[kind] == alone.measured[kind]
    assert run.sent["DP"] == alone.sent["DP"] and run.planned_sent["DP"] == alone.planned_sent["DP"]
    s, kv = seq // cp, TINY.kv_heads * TINY.hidden // TINY.heads  # this rank's tokens; K's and V's width
    # per block: K and V all-gathered in the forward, their gradients reduce-scattered in the backward
    assert run.sent["CP"] == 2 * 2 * 2 * (cp - 1) * s * kv * 4
    # the planner's ring sends K and V of the hidden size three times: (2/3)·(kv/hidden) of it
    assert run.sent["CP"] * 6 * TINY.hidden == run.planned_sent["CP"] * 4 * kv
    # kept for the backward beyond the same tokens without CP: the other chunks' K and V, and the
    # attention mask, which SDPA keeps as a float (s × seq) per block
    assert run.measured["activations"] == alone.measured["activations"] + 2 * (
        2 * (cp - 1) * s * kv * 4 + s * seq * 4
    )
    assert "(this rank 8 of them)" in run.html() and not dist.is_initialized()


def _context_parallel_against_the_whole_sequence(rank, world_size):
    torch.manual_seed(0)  # the same weights and the same sequence on every rank
    whole = LlamaBlocks(TINY, 2).double()
    parted = copy.deepcopy(whole)
    x = torch.randn(2, 4 * world_size, TINY.hidden, dtype=torch.float64, requires_grad=True)
    whole(x).square().sum().backward()
    context_parallel(parted, dist.group.WORLD)
    chunk = x.detach().chunk(world_size, dim=1)[rank].clone().requires_grad_()
    out = parted(chunk)
    out.square().sum().backward()  # this rank's part of the loss
    for p in parted.parameters():
        dist.all_reduce(p.grad)  # the whole loss's gradient: every rank's part
    mine = slice(4 * rank, 4 * (rank + 1))
    with torch.no_grad():
        expected = whole(x)[:, mine]
    return {
        "output": (out - expected).abs().max().item(),
        "input grad": (chunk.grad - x.grad[:, mine]).abs().max().item(),
        "weight grads": max(
            (a.grad - b.grad).abs().max().item()
            for a, b in zip(parted.parameters(), whole.parameters(), strict=True)
        ),
    }


def test_context_parallel_attention_computes_the_whole_sequences_attention_on_three_ranks():
    """Each of 3 gloo ranks holds a third of the sequence: its output, its input's gradient and the
    summed weight gradients equal the unsharded block's (float64) — positions, causal mask across
    chunks and the all-gather's backward included."""
    for errors in launch(_context_parallel_against_the_whole_sequence, 3, backend="gloo"):
        assert max(errors.values()) < 1e-12, errors


def test_dry_run_says_what_it_cannot_measure(monkeypatch):
    with pytest.raises(ValueError, match="cp=3 must divide seq=16"):
        dry_run(TINY, Layout(dp=2, cp=3))
    with pytest.raises(TypeError, match="has no mgpu_helpers.scale.llama.Attention"):
        context_parallel(nn.Linear(2, 2), None)
    with pytest.raises(ValueError, match="ZeRO-1 here is torch's ZeroRedundancyOptimizer"):
        dry_run(TINY, Layout(dp=2, tp=2, zero=1))
    with pytest.raises(ValueError, match="tp=3 must divide heads=8"):
        dry_run(TINY, Layout(tp=3))
    monkeypatch.setattr("mgpu_helpers.scale.dryrun._available_bytes", lambda: 2**20)
    with pytest.raises(MemoryError, match="pass fewer blocks, a larger tp, zero=2 or 3"):
        dry_run(TINY, Layout(dp=8))
    assert not dist.is_initialized()


def test_jobs_of_the_same_mesh_one_after_another_each_use_their_own_groups():
    """DTensor caches sharding decisions by mesh shape: without fake_world clearing them on the way out,
    the second TP job below reused the first one's destroyed process groups and failed."""
    for rank in (0, 1, 2, 3, 0, 3):
        run = dry_run(TINY, Layout(dp=2, tp=2), seq=4, rank=rank)
        assert run.sent["TP"] == run.planned_sent["TP"]
