"""Number labels and exercise checks."""

import pytest

from mgpu_helpers.exercises import check, check_function
from mgpu_helpers.labels import Labelled, estimated, measured, simulated


def test_labels_say_how_a_number_was_obtained():
    assert (
        str(estimated(16_016_008, "B", how="params + grads + Adam"))
        == "16,016,008 B (estimated: params + grads + Adam)"
    )
    assert (
        str(simulated(2.5, "GiB", what="4 GPUs accounted on CPU"))
        == "2.5 GiB (simulated: 4 GPUs accounted on CPU)"
    )
    assert str(measured(0.1234, "s", on="CPU: test, 2 cores")) == "0.123 s (measured on CPU: test, 2 cores)"
    assert "measured on" in str(measured(1.0, "s"))  # defaults to this machine's hardware label


def test_labels_refuse_missing_provenance():
    with pytest.raises(ValueError, match="needs a detail"):
        estimated(1, "B", how="")
    with pytest.raises(ValueError, match="kind must be"):
        Labelled(1, "B", "guessed", "x")  # type: ignore[arg-type]


def test_check_pass_fail_and_unanswered(capsys):
    assert check("1", 8_008_008, 8_008_008, hint="h")
    assert "✅ Exercise 1: correct." in capsys.readouterr().out
    assert not check("1", 4_004_000, 8_008_008, hint="two states")
    out = capsys.readouterr().out
    assert "❌" in out and "two states" in out and "4004000" in out
    assert not check("1", None, 3, hint="h")
    assert "not answered yet" in capsys.readouterr().out


def test_check_compares_by_type():
    assert check("f", 0.30000001, 0.3, hint="", rel_tol=1e-6)
    assert not check("f", 0.31, 0.3, hint="")
    assert check("s", "  NCCL ", "nccl", hint="")
    assert check("l", [1, 2.0], (1, 2), hint="")
    assert not check("l", [1, 2], [1, 2, 3], hint="")
    assert not check("b", 1, True, hint="")  # a bool answer must be a bool
    assert not check("x", object(), 3, hint="")


def test_check_function(capsys):
    assert check_function("f", lambda m, p: (p - 1) / (m + p - 1), [((4, 2), 0.2), ((1, 4), 0.75)], hint="")
    assert not check_function("f", lambda m, p: 0.0, [((4, 2), 0.2)], hint="bubble")
    assert "expected 0.2" in capsys.readouterr().out
    assert not check_function("f", lambda m, p: 1 / 0, [((4, 2), 0.2)], hint="")
    assert "ZeroDivisionError" in capsys.readouterr().out
    assert not check_function("f", None, [], hint="")
