"""Number formats, bit strings, per-process state bytes (plain and FSDP2-sharded), timing, CPU flags."""

import math

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import pytest
import torch

from mgpu_helpers.launching import launch
from mgpu_helpers.memory import MemoryTracker
from mgpu_helpers.precision import (
    FORMATS,
    bit_string,
    compare_step_times,
    cpu_has_native_bf16,
    draw_number_formats,
    local_state_bytes,
)


def test_formats_agree_with_torch_finfo():
    assert {name: fmt.bits for name, fmt in FORMATS.items()} == {"fp32": 32, "fp16": 16, "bf16": 16}
    for fmt in FORMATS.values():
        assert fmt.bits == torch.finfo(fmt.dtype).bits
        assert fmt.eps == 2.0**-fmt.mantissa_bits
        # the smallest subnormal is representable; half of it rounds to zero
        assert torch.tensor(fmt.smallest_subnormal, dtype=fmt.dtype).item() == fmt.smallest_subnormal
        assert torch.tensor(fmt.smallest_subnormal / 2, dtype=torch.float64).to(fmt.dtype).item() == 0
    assert FORMATS["fp16"].max == 65504.0
    assert FORMATS["bf16"].smallest_normal == FORMATS["fp32"].smallest_normal  # same exponent range


def test_bit_string():
    assert bit_string(1.0, torch.float32) == "0 01111111 " + "0" * 23
    assert bit_string(-2.0, torch.float16) == "1 10000 0000000000"
    assert bit_string(1.0, torch.bfloat16) == "0 01111111 0000000"
    # bf16 is the top half of fp32 (for values bf16 holds exactly)
    assert (
        bit_string(3.0, torch.bfloat16).replace(" ", "")
        == bit_string(3.0, torch.float32).replace(" ", "")[:16]
    )
    assert bit_string(1e6, torch.float16) == "0 11111 0000000000"  # overflow: infinity


def test_draw_number_formats():
    fig = draw_number_formats(1.5, marks={"tiny": 1e-8})
    left, right = fig.axes
    texts = [t.get_text() for t in left.texts]
    assert "fp16 (16 bits)" in texts and "= 1.5" in texts
    assert any(t.get_text() == "tiny" for t in right.texts)
    plt.close("all")


def _train_one_step(model, opt):
    model(torch.randn(8, model[0].in_features)).sum().backward()
    opt.step()


def test_local_state_bytes_matches_the_tracker_on_plain_tensors():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(10, 30), torch.nn.ReLU(), torch.nn.Linear(30, 3))
    opt = torch.optim.Adam(model.parameters())
    assert local_state_bytes(model, opt) == {"parameters": 4 * 423, "gradients": 0, "optimizer": 0}
    tracker = MemoryTracker(model, opt)
    with tracker:
        _train_one_step(model, opt)
        tracked = tracker.mark("after step").bytes
    tracker.close()
    counted = local_state_bytes(model, opt)
    assert counted == {k: tracked[k] for k in counted}
    assert counted["optimizer"] == 8 * 423 + 4 * 4  # exp_avg + exp_avg_sq + a 4-byte step per tensor


def test_local_state_bytes_counts_shared_storage_once():
    a = torch.nn.Linear(4, 4, bias=False)
    b = torch.nn.Linear(4, 4, bias=False)
    b.weight = a.weight  # tied weights: one storage
    model = torch.nn.Sequential(a, b)
    assert local_state_bytes(model) == {"parameters": 64, "gradients": 0, "optimizer": 0}


def _fsdp_rank(rank, world_size):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 6), torch.nn.ReLU(), torch.nn.Linear(6, 5))
    mesh = init_device_mesh("cpu", (world_size,))
    fully_shard(model, mesh=mesh)
    opt = torch.optim.Adam(model.parameters())
    _train_one_step(model, opt)
    wrapper = next(model.parameters()).untyped_storage().nbytes()
    return local_state_bytes(model, opt), wrapper


def test_local_state_bytes_counts_fsdp_local_shards_with_padding():
    results = launch(_fsdp_rank, 2, backend="gloo")  # a CPU mesh: gloo on any machine
    # rows split over 2 ranks, padded to equal shards: weights (6,8)->3 rows, (5,6)->3 rows (1 padding
    # row on rank 1); biases (6,)->3, (5,)->3 (padded)
    padded = 3 * 8 + 3 + 3 * 6 + 3
    for rank, (counted, wrapper) in enumerate(results):
        assert counted["parameters"] == 4 * padded
        assert counted["gradients"] == 4 * padded
        unpadded = padded - (rank == 1) * (6 + 1)  # Adam's states follow the local shard, no padding
        assert counted["optimizer"] == 8 * unpadded + 4 * 4
        assert wrapper == 6 * 8 * 4  # the DTensor wrapper reports the global size: why this helper exists


def test_compare_step_times_interleaves_and_takes_medians():
    calls = []
    times = compare_step_times(
        {"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, repeats=3, warmup=1
    )
    assert calls == ["a", "b"] * 4
    assert set(times) == {"a", "b"} and all(t >= 0 for t in times.values())
    slow = compare_step_times({"sleep": lambda: __import__("time").sleep(0.01)}, repeats=1, warmup=0)
    assert slow["sleep"] >= 0.009


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ("fpu avx2 avx512f avx512bw", False),
        ("fpu avx512f avx512_bf16", True),
        ("fpu amx_tile amx_bf16", True),
    ],
)
def test_cpu_has_native_bf16(tmp_path, flags, expected):
    path = tmp_path / "cpuinfo"
    path.write_text(f"processor\t: 0\nflags\t\t: {flags}\n\nprocessor\t: 1\nflags\t\t: {flags}\n")
    assert cpu_has_native_bf16(str(path)) is expected


def test_cpu_has_native_bf16_unknown(tmp_path):
    assert cpu_has_native_bf16(str(tmp_path / "missing")) is None
    (tmp_path / "noflags").write_text("processor : 0\n")
    assert cpu_has_native_bf16(str(tmp_path / "noflags")) is None


def test_smallest_subnormal_is_below_smallest_normal():
    for fmt in FORMATS.values():
        assert fmt.smallest_subnormal < fmt.smallest_normal < 1 < fmt.max
        assert math.isclose(fmt.smallest_subnormal, fmt.smallest_normal * fmt.eps)


_MODEL = torch.nn.Linear(2, 2)


@pytest.mark.parametrize(
    ("call", "args", "kwargs", "exc", "match"),
    [
        (bit_string, (1.0, torch.float64), {}, ValueError, r"dtype must be one of \['torch.float32'"),
        (bit_string, (1.0, torch.int32), {}, ValueError, r"dtype must be one of"),
        (bit_string, (1.0, "bf16"), {}, TypeError, r"dtype must be a torch.dtype such as torch.bfloat16"),
        (bit_string, ("1.0", torch.float32), {}, TypeError, r"value must be a real number such as 3.14"),
        (
            draw_number_formats,
            (),
            {"marks": {"zero": 0.0}},
            ValueError,
            r"marks must be positive finite values",
        ),
        (
            draw_number_formats,
            (),
            {"marks": [1e-6]},
            TypeError,
            r"marks must map a label to a positive value",
        ),
        (draw_number_formats, (), {"axes": "ax"}, TypeError, r"axes must be two matplotlib axes"),
        (draw_number_formats, ("pi",), {}, TypeError, r"value must be a real number"),
        (local_state_bytes, ("model",), {}, TypeError, r"model must be a torch.nn.Module"),
        (local_state_bytes, (_MODEL, "adam"), {}, TypeError, r"optimizer must be a torch.optim.Optimizer"),
        (compare_step_times, ({"a": lambda: None},), {"repeats": 0}, ValueError, r"repeats must be >= 1"),
        (
            compare_step_times,
            ({"a": lambda: None},),
            {"repeats": 2.5},
            TypeError,
            r"repeats must be a whole number",
        ),
        (compare_step_times, ({"a": lambda: None},), {"warmup": -1}, ValueError, r"warmup must be >= 0"),
        (compare_step_times, ({},), {}, ValueError, r"steps is empty: pass a name -> function mapping"),
        (compare_step_times, ([lambda: None],), {}, TypeError, r"steps must map a name to a function"),
        (
            compare_step_times,
            ({"a": 1},),
            {},
            TypeError,
            r"steps\['a'\] must be a function taking no arguments",
        ),
        (
            cpu_has_native_bf16,
            (3,),
            {},
            TypeError,
            r"cpuinfo_path must be a file path such as '/proc/cpuinfo'",
        ),
    ],
)
def test_bad_arguments_are_refused_with_a_fix(call, args, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        call(*args, **kwargs)
    plt.close("all")
