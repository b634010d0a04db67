"""Tests of mgpu_helpers.tuning.regimes: the equal-budget search loop of notebook 06b and the benchmark, with
Ray's ASHAScheduler driven by hand (no Ray runtime starts)."""

import dataclasses

import numpy as np
import pytest

from mgpu_helpers import tuning
from mgpu_helpers.tuning import REGIMES, asha_gain, search

#: A smaller toy regime: the bookkeeping does not depend on the sizes.
SMALL = dataclasses.replace(
    REGIMES["toy"], task=tuning.ToyTask(n_samples=400, val_fraction=0.5), max_t=4, budget_trainings=3
)


def test_search_spends_exactly_the_budget_and_counts_only_full_trainings():
    plain = search(SMALL, 0, early_stopping=False)
    assert len(plain.curve) == SMALL.budget == 12 and plain.tried == 3
    finished = [v for v in plain.curve if not np.isnan(v)]
    assert len(finished) == len(plain.curve) - 3  # the first full training ends after 4 epochs
    assert finished == sorted(finished)
    early = search(SMALL, 0, early_stopping=True)
    assert len(early.curve) == 12 and early.tried > plain.tried
    # same first configuration, never stopped (nothing to compare it with yet)
    np.testing.assert_array_equal(early.curve[:4], plain.curve[:4])
    np.testing.assert_array_equal(search(SMALL, 0, early_stopping=True).curve, early.curve)  # reproducible


def test_asha_gain_and_ratio():
    r = [tuning.SearchResult([0.5, 0.6], 2), tuning.SearchResult([0.8, 0.8], 2)]
    a = [tuning.SearchResult([0.5, 0.8], 5), tuning.SearchResult([0.8, 0.8], 5)]
    g = asha_gain(r, a)
    assert g["gain"] == pytest.approx(0.1) and g["ratio"] == pytest.approx(0.0) and g["tried_asha"] == 5
    assert asha_gain(r, r)["ratio"] == pytest.approx(1.0)


def test_sample_config_is_log_uniform():
    rng = np.random.default_rng(0)
    lrs = np.log10([tuning.sample_config(rng, REGIMES["favourable"])["lr"] for _ in range(800)])
    counts = np.histogram(lrs, bins=8, range=(-6, 2))[0]
    assert counts.min() > 60  # about 100 per decade


@pytest.mark.parametrize(
    ("args", "error", "message"),
    [
        (("toy", 0, True), TypeError, "regime must be a Regime"),
        ((SMALL, -1, True), ValueError, "seed must be >= 0"),
        ((SMALL, 0, "yes"), TypeError, "early_stopping must be True or False"),
    ],
)
def test_search_rejects_bad_inputs(args, error, message):
    with pytest.raises(error, match=message):
        search(*args)
    with pytest.raises(ValueError, match="one SearchResult per seed"):
        asha_gain([], [])
