"""The parallelism planner (mgpu_helpers.planner) against the Ultra-Scale Playbook's published figures,
the ZeRO paper's per-stage formulas, Korthikanti et al.'s activation table, and real sharded runs."""

import math

import pytest

from mgpu_helpers.memory import TransformerShape, transformer_activation_bytes
from mgpu_helpers.planner import (
    GB,
    GIB,
    INTER_NODE_BW,
    INTRA_NODE_BW,
    LLAMA_8B,
    LLAMA_70B,
    LLAMA_405B,
    USABLE,
    Layout,
    Transformer,
    Workload,
    activation_bytes,
    communication_bytes,
    no_layout_reason,
    plan,
    plan_all,
    planner_form,
    plans_html,
    state_bytes,
)

ONE = Layout()


@pytest.mark.parametrize(
    ("billions", "plain_gb", "fp32_accum_gb"),
    [(1, 16, 20), (7, 112, 140), (70, 1120, 1400), (405, 6480, 8100)],  # the Playbook's memory table
)
def test_playbook_table_of_state_memory(billions, plain_gb, fp32_accum_gb):
    psi = billions * 10**9
    assert state_bytes(psi, ONE, Workload(precision="fp32")).total == plain_gb * GB
    assert state_bytes(psi, ONE, Workload()).total == plain_gb * GB  # bf16 mixed: 2 + 2 + 12
    assert state_bytes(psi, ONE, Workload(fp32_grad_accumulation=True)).total == fp32_accum_gb * GB


def test_zero_paper_figure_1():
    """Rajbhandari et al. (arXiv 1910.02054), figure 1: Ψ = 7.5B, N_d = 64, K = 12, in 10⁹ bytes."""
    psi = 7_500_000_000
    got = [state_bytes(psi, Layout(dp=64, zero=z)).total / GB for z in (0, 1, 2, 3)]
    assert [round(x, 1) for x in got] == [120.0, 31.4, 16.6, 1.9]  # baseline, P_os, P_os+g, P_os+g+p
    # TP and PP shards divide the state a GPU holds before ZeRO divides it again
    assert state_bytes(psi, Layout(dp=2, tp=4, pp=2, zero=3)).total == pytest.approx(16 * psi / 16, abs=2)


def test_playbook_tp_chart_weights_of_70b():
    """The Playbook's tensor-parallel chart (GiB): Llama 70B's bf16 weights 131.5, at TP8 16.44."""
    assert round(state_bytes(LLAMA_70B.params, Layout()).parameters / GIB, 1) == 131.5
    assert round(state_bytes(LLAMA_70B.params, Layout(tp=8)).parameters / GIB, 2) == 16.44


@pytest.mark.parametrize(
    ("seq_len", "materialised_gib", "selective_gib"),
    [(1024, 9.25, 4.25), (2048, 28.5, None), (4096, 97.0, 17.0), (8192, 354, None), (16384, 1348, 68.0)],
)
def test_playbook_activation_chart_llama_8b(seq_len, materialised_gib, selective_gib):
    """The Playbook's activation chart for Llama 8B, b = 1, all 32 layers (GiB); its selective
    recomputation figures are at s = 1k, 4k and 16k. 34 and 5·a·s/h are a GPT layer's (the Playbook's)."""
    full = LLAMA_8B.layers * activation_bytes(LLAMA_8B, Workload(seq_len, 1)) / GIB
    assert full == pytest.approx(materialised_gib, rel=0.005)
    if selective_gib is not None:
        sel = LLAMA_8B.layers * activation_bytes(LLAMA_8B, Workload(seq_len, 1, recompute="selective")) / GIB
        assert sel == pytest.approx(selective_gib, rel=0.005)


@pytest.mark.parametrize(
    ("name", "hidden", "heads", "saving"),
    [("GPT-3 175B", 12288, 96, 0.70), ("MT-NLG 530B", 20480, 128, 0.65)],
)
def test_korthikanti_selective_recomputation_saving(name, hidden, heads, saving):
    """Korthikanti et al. (arXiv 2205.05198), section 4.2: at s = 2048 (5as/h = 80 and 64) selective
    recomputation saves 70 % and 65 % of activation memory (with TP and sequence parallelism)."""
    model = Transformer(name, 1, hidden, heads, n_params=10**9)
    assert 5 * heads * 2048 / hidden in (80, 64)
    kept = [activation_bytes(model, Workload(2048, 1, recompute=r, sequence_parallel=True), tp=8) for r in
            ("materialised", "selective")]  # fmt: skip
    assert round(1 - kept[1] / kept[0], 2) == saving


def test_parameter_count_is_the_playbooks_when_not_given():
    gpt = Transformer("toy", layers=2, hidden=8, heads=2, vocab=10)
    assert gpt.params == 8 * 10 + 2 * (12 * 64 + 13 * 8) + 2 * 8
    assert LLAMA_8B.params == 8_030_000_000


def test_activations_follow_korthikanti_table_2():
    s, b, h, a = 4096, 2, 4096, 32
    sbh = s * b * h
    shape = TransformerShape(layers=1, seq_len=s, batch=b, hidden=h, heads=a)
    work = Workload(seq_len=s, micro_batch=b)
    model = Transformer("m", 32, h, a)
    assert activation_bytes(model, work) == transformer_activation_bytes(shape)  # the course's one formula
    assert activation_bytes(model, work, tp=8) == round(sbh * (10 + 24 / 8 + 5 * a * s / (h * 8)))
    sp = Workload(seq_len=s, micro_batch=b, sequence_parallel=True)
    assert activation_bytes(model, sp, tp=8) == round(sbh * (34 + 5 * a * s / h) / 8)
    assert activation_bytes(model, Workload(s, b, recompute="selective"), tp=4) == round(sbh * (10 + 24 / 4))
    assert activation_bytes(model, Workload(s, b, recompute="full")) == 2 * sbh
    full_sp = Workload(s, b, recompute="full", sequence_parallel=True)
    assert activation_bytes(model, full_sp, tp=8) == 2 * sbh / 8  # the course's extension of table 2


def test_pipeline_first_stage_holds_p_micro_batches_under_1f1b():
    work = Workload(seq_len=1024, micro_batch=1, global_batch=16)
    per_layer = activation_bytes(LLAMA_8B, work)
    assert plan(LLAMA_8B, work, Layout(pp=4)).activations == 8 * 4 * per_layer  # L/p layers × p in flight
    assert plan(LLAMA_8B, Workload(1024, 1, 2), Layout(pp=4)).activations == 8 * 2 * per_layer  # m < p


def test_communication_formulas():
    model, psi = LLAMA_8B, LLAMA_8B.params
    work = Workload(seq_len=4096, micro_batch=1, global_batch=8)
    dp = communication_bytes(model, work, Layout(dp=8))
    assert dp == {"DP": round(2 * 7 / 8 * psi * 2), "TP": 0, "PP": 0}  # ring all-reduce of bf16 grads
    assert communication_bytes(model, work, Layout(dp=8, zero=1))["DP"] == dp["DP"]  # ZeRO-1: same bytes
    z3 = communication_bytes(model, work, Layout(dp=8, zero=3))["DP"]
    assert z3 == pytest.approx(1.5 * dp["DP"], rel=1e-9)  # 3Ψ instead of 2Ψ (m = 1)
    tp = communication_bytes(model, work, Layout(tp=8))  # m = 8 micro-batches, 32 layers
    assert tp["TP"] == round(4 * 2 * 7 / 8 * 4096 * 4096 * 2 * 32 * 8)
    pp = communication_bytes(model, work, Layout(pp=4))
    assert pp["PP"] == 2 * 4096 * 4096 * 2 * 8  # a middle stage: activation forward, gradient back


def test_bad_degrees_are_rejected_with_what_to_pass():
    with pytest.raises(ValueError, match="with dp=1 pass zero=0"):
        Layout(tp=2, zero=3)
    with pytest.raises(ValueError, match="does not divide the 32 layers"):
        plan(LLAMA_8B, Workload(), Layout(pp=3))
    with pytest.raises(ValueError, match="must divide the 32 heads"):
        plan(LLAMA_8B, Workload(), Layout(tp=3))
    with pytest.raises(ValueError, match="multiple of"):
        plan(LLAMA_8B, Workload(global_batch=6), Layout(dp=4))
    assert plan_all(LLAMA_8B, Workload(), 7) == []
    assert "heads" in no_layout_reason(LLAMA_8B, Workload(), 7) and "8" in no_layout_reason(
        LLAMA_8B, Workload(), 7
    )


def test_fits_leaves_headroom_and_traffic_splits_by_node():
    work = Workload(4096, 1, 64, recompute="selective")
    q = plan(LLAMA_70B, work, Layout(dp=2, tp=8, pp=2, zero=1), 80.0)
    assert q.fits == (q.memory <= USABLE * 80 * GIB) and q.gpu_memory == 80 * GIB
    comm = q.comm  # TP inside a node of 8; DP (stride 8) and PP cross nodes
    assert (q.intra, q.inter) == (comm["TP"], comm["DP"] + comm["PP"])
    one_node = plan(LLAMA_8B, work, Layout(dp=2, tp=2, pp=2), 80.0)
    assert one_node.inter == 0 and one_node.intra == one_node.comm_total
    expect = q.compute_s / (1 - q.bubble) + q.intra / INTRA_NODE_BW + q.inter / INTER_NODE_BW
    assert q.seconds == pytest.approx(expect)


def test_plan_all_lists_every_layout_of_the_gpus_fitting_first():
    plans = plan_all(LLAMA_70B, Workload(4096, 1, 64, recompute="selective"), 32, 80.0)
    assert all(q.layout.n_gpus == 32 and q.layout.tp <= 8 for q in plans)
    fits = [q.fits for q in plans]
    assert any(fits) and fits == sorted(fits, reverse=True)
    fitting = [q for q in plans if q.fits]
    assert fitting[0].seconds == min(q.seconds for q in fitting)
    # cheap cross-node traffic beats a zero bubble: ZeRO-3 over 8 nodes is slower than TP8 × PP4
    assert fitting[0].layout == Layout(tp=8, pp=4) and fitting[0].inter < fitting[-1].inter / 10
    assert "fit" in plans_html(plans)
    assert not any(q.fits for q in plan_all(LLAMA_70B, Workload(), 1))


def test_form_replans_when_a_field_changes():
    pytest.importorskip("ipywidgets")
    form = planner_form(8, 80.0)
    out = form.children[-1]
    assert "<table>" in out.value
    before = out.value
    form.fields["GiB per GPU"].value = 24.0
    assert out.value != before and "24 GiB" in out.value
    form.fields["preset"].value = LLAMA_70B.name  # fills layers, hidden, heads
    assert form.fields["layers"].value == 80 and "70.60 B parameters" in out.value
    form.fields["layers"].value = 40  # a custom model: the Playbook's parameter count
    assert "custom" in out.value
    form.fields["GPUs"].value = 7
    assert "No layout uses exactly 7 GPUs" in out.value


def test_form_measures_the_chosen_layout_with_the_scale_labs_dry_run():
    pytest.importorskip("ipywidgets")
    form = planner_form(8, 80.0)
    out, which = form.children[-1], form.fields["measure"]
    listed = [layout for _, layout in which.options]
    assert listed and all(layout.n_gpus == 8 for layout in listed)  # the table's layouts, in its order,
    assert not any(layout.zero == 1 and layout.tp * layout.pp > 1 for layout in listed)  # measurable ones
    which.value = next(layout for layout in listed if layout.tp == 8)  # one eighth of a block: quick
    form.measure.click()
    assert "Measured on rank 0 of 8 (TP8" in out.value and "planner (estimate)" in out.value
    assert "<table>" in out.value.split("Measured on")[0]  # the planner's table stays above it
    form.fields["layers"].value = 40  # a custom shape has no Llama block to build
    form.measure.click()
    assert "Measuring needs a preset's Llama shape" in out.value


def test_form_rows_fit_800_px_and_numbers_update_while_typing():
    pytest.importorskip("ipywidgets")
    form = planner_form(8, 80.0)
    for row in form.children[:-1]:
        widths = [int(f.layout.width.removesuffix("px")) for f in row.children]
        assert sum(widths) + 10 * len(widths) <= 800, widths  # JupyterLab's output area, margins included
    numbers = [f for f in form.fields.values() if hasattr(f, "continuous_update")]
    assert len(numbers) >= 8 and all(f.continuous_update for f in numbers)


def test_table_caption_says_the_order_it_shows():
    work = Workload(4096, 1, 8)
    assert "none fits: smallest memory first" in plans_html(plan_all(LLAMA_405B, work, 8, 80.0))
    mixed = plans_html(plan_all(LLAMA_70B, Workload(4096, 1, 64, recompute="selective"), 32, 80.0))
    assert "fitting layouts first, fastest estimated step first; then the others, smallest memory" in mixed
    every = plans_html(plan_all(LLAMA_8B, Workload(1024, 1, 8, recompute="selective"), 8, 10**6))
    assert "; fastest estimated step first" in every and "none fits" not in every


def _real_state(rank, world_size):
    """fp32 Adam, one step, in four layouts on this rank: bytes from the course's tracker."""
    import copy

    import torch
    from torch import nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    from torch.nn.parallel import DistributedDataParallel as DDP

    from mgpu_helpers.memory import MemoryTracker

    torch.manual_seed(0)
    base = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64))
    mesh = init_device_mesh("cpu", (world_size,))
    out = {}
    for setup in ("DP", "ZeRO-1", "ZeRO-3", "TP"):
        model = copy.deepcopy(base)
        if setup == "TP":
            net = parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
        elif setup == "ZeRO-3":
            net = fully_shard(model, mesh=mesh)
        else:
            net = DDP(model)
        if setup == "ZeRO-1":
            opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam)
            holder = opt.optim
        else:
            opt = holder = torch.optim.Adam(model.parameters())
        tracker = MemoryTracker(model, holder)
        with tracker:
            net(torch.randn(8, 64)).square().mean().backward()
            opt.step()
            out[setup] = tracker.mark("after step").bytes
        tracker.close()
    return out


def test_memory_column_matches_real_sharded_runs():
    from mgpu_helpers.launching import launch

    psi = 64 * 128 + 128 + 128 * 64 + 64
    layouts = {
        "DP": Layout(dp=2),
        "ZeRO-1": Layout(dp=2, zero=1),
        "ZeRO-3": Layout(dp=2, zero=3),
        "TP": Layout(tp=2),
    }
    per_rank = launch(_real_state, 2, backend="gloo", timeout_s=120)
    for rank in per_rank:
        for setup, layout in layouts.items():
            predicted = state_bytes(psi, layout, Workload(precision="fp32")).as_dict()
            for cat, value in predicted.items():
                # off by Adam's 4-byte step counters and TP's replicated row-parallel bias only
                assert math.isclose(rank[setup][cat], value, rel_tol=0.005), (
                    setup,
                    cat,
                    rank[setup][cat],
                    value,
                )
