"""The scale lab's plumbing (notebook 05g): one process as one rank of a large fake job, the Llama block it
shards, and the per-rank byte counts, checked against counts derived here from shapes and dtypes."""

import pytest
import torch
import torch.distributed as dist
from torch import nn

from mgpu_helpers.planner import LLAMA_8B, LLAMA_70B, LLAMA_405B, Transformer
from mgpu_helpers.scale.count import SavedActivations, local, rank_state, unique_bytes
from mgpu_helpers.scale.llama import Block, LlamaBlocks, tp_plan
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
