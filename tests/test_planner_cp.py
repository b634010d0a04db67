"""The planner's context parallelism (Layout.cp, notebook 05e) against the Ultra-Scale Playbook's published
context-parallelism chart and the ring's formulas."""

import pytest

from mgpu_helpers.planner import (
    GIB,
    LLAMA_8B,
    Layout,
    Transformer,
    Workload,
    activation_bytes,
    plan,
    plan_all,
)
from mgpu_helpers.planner import communication_bytes as comm

#: The Playbook's chart "cp_8Bmemoryusage" (Llama 8B, b = 1, all 32 layers, GiB), its first panel
#: (weights 14.96 GiB: no TP), selective recomputation. Data read from the chart's HTML fragment:
#: https://huggingface.co/spaces/nanotron/ultrascale-playbook/blob/9f7c465fdb144ed72ddc0706c06dd88cde086862/src/fragments/cp_8Bmemoryusage.html
#: (only this panel's numbers were readable; the CP panels are checked through the formula below).
PLAYBOOK_CP_CHART = {1024: 4.25, 4096: 17.0, 16384: 68.0, 65536: 272.0, 131072: 544.0}


@pytest.mark.parametrize(("seq_len", "gib"), sorted(PLAYBOOK_CP_CHART.items()))
def test_playbook_cp_chart_llama_8b_activations(seq_len, gib):
    """Tolerance 0.5 % (the chart's figures have 3 significant digits); here they agree exactly."""
    work = Workload(seq_len, 1, recompute="selective")
    assert LLAMA_8B.layers * activation_bytes(LLAMA_8B, work) / GIB == pytest.approx(gib, rel=0.005)


def test_playbook_cp_chart_llama_8b_weights():
    """The same chart's bf16 weights: 14.96 GiB on one GPU, 7.48 GiB in its TP = 2 panels."""
    from mgpu_helpers.planner import state_bytes

    assert state_bytes(LLAMA_8B.params, Layout()).parameters / GIB == pytest.approx(14.957, abs=0.001)
    assert state_bytes(LLAMA_8B.params, Layout(tp=2)).parameters / GIB == pytest.approx(7.4785, abs=0.001)


@pytest.mark.parametrize("recompute", ["materialised", "selective", "full"])
@pytest.mark.parametrize("sp", [False, True])
def test_context_parallel_divides_every_activation_term(recompute, sp):
    work = Workload(8192, 2, recompute=recompute, sequence_parallel=sp)
    for cp in (2, 4, 8):
        assert activation_bytes(LLAMA_8B, work, 4, cp) == pytest.approx(
            activation_bytes(LLAMA_8B, work, 4) / cp, abs=1
        )


def test_materialised_scores_are_the_local_queries_against_all_keys():
    """5·a·(s/cp)·s·b bytes of scores (and their dropout mask) per layer: a rank's queries, every key."""
    s, b, h, a, cp = 4096, 1, 1024, 16, 4
    model = Transformer("m", 1, h, a, n_params=10**9)
    scores = activation_bytes(model, Workload(s, b), 1, cp) - activation_bytes(
        model, Workload(s, b, recompute="selective"), 1, cp
    )
    assert scores == 5 * a * (s // cp) * s * b


def test_cp_ring_sends_the_kv_blocks():
    """Per layer and micro-batch: (cp−1) K and V blocks of s/cp tokens × h/t features forward, twice that
    backward; the TP and PP activations hold s/cp tokens; gradients sync over dp·cp ranks."""
    model = Transformer("m", 4, 1024, 16, n_params=10**9)
    work = Workload(8192, 1, 8)
    one = comm(model, work, Layout(dp=2, tp=2))
    got = comm(model, work, Layout(dp=2, tp=2, cp=4))
    m, e, block = work.n_micro(2), 2, 8192 // 4 * 1024 // 2  # block: s/cp tokens × h/t features
    assert got["CP"] == 3 * (4 - 1) * 2 * block * e * model.layers * m
    assert got["TP"] == pytest.approx(one["TP"] / 4, abs=1) and "CP" not in one
    assert got["DP"] == pytest.approx(one["DP"] * (7 / 8) / (1 / 2), abs=1)  # a ring of 8 ranks, not 2
    full = comm(model, Workload(8192, 1, 8, recompute="full"), Layout(dp=2, tp=2, cp=4))
    assert full["CP"] == 4 * (4 - 1) * 2 * block * e * model.layers * m


def test_layout_counts_cp_gpus_and_names_it():
    assert Layout(dp=2, tp=8, pp=2, cp=4).n_gpus == 128
    assert Layout(dp=1, tp=8, cp=2, zero=1).name == "TP8 × CP2 ZeRO-1"
    assert Layout(dp=2, tp=8, cp=2, zero=3).name == "TP8 × CP2 × DP2 ZeRO-3"
    with pytest.raises(ValueError, match="cp=3 must divide"):
        plan(LLAMA_8B, Workload(4096), Layout(cp=3))


def test_plan_all_needs_cp_for_llama_8b_at_128k_tokens_on_16_gpus():
    """At s = 131,072 with TP8 + SP and selective recomputation one GPU holds 68 GiB of activations:
    no layout of 16 GPUs fits in 90 % of 80 GiB without CP; with CP the best ones do, at CP2."""
    base = dict(
        seq_len=131_072, micro_batch=1, global_batch=16, recompute="selective", sequence_parallel=True
    )
    without = plan_all(LLAMA_8B, Workload(**base), 16)
    assert not any(p.fits for p in without) and all(p.layout.cp == 1 for p in without)
    with_cp = plan_all(LLAMA_8B, Workload(**base, context_parallel=True), 16)
    assert with_cp[0].fits and with_cp[0].layout.cp == 2 and with_cp[0].activations == 34 * GIB
    assert {p.layout.n_gpus for p in with_cp} == {16}
