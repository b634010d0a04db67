"""Used by notebook 05h's exercises: the fewest tokens that make a matrix product compute-bound (05h.1)
and a training step's model FLOPs utilisation (05h.2), both graded on cases drawn at grading time.

05h.1 is checked exactly, with fractions: the student's ``m`` must be compute-bound and ``m − 1`` not,
so no rounding of the grader's own makes a right answer fail. Work that runs this module's answer key
(under any name) is rejected by watching which functions run while it runs.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from fractions import Fraction
from typing import Any

from ..exercises import Wrong, exercise, run_refusing

#: Peak FLOP/s and memory bytes/s pairs of the GPUs notebook 05h tabulates, with their formats' sizes.
_GPUS = (
    (65e12, 320e9, 2),  # T4, fp16
    (121e12, 300e9, 2),  # L4, bf16
    (242e12, 300e9, 1),  # L4, fp8
    (312e12, 2039e9, 2),  # A100 SXM 80 GB, bf16
    (989.4e12, 3.35e12, 2),  # H100 SXM, bf16
    (1978.9e12, 3.35e12, 1),  # H100 SXM, fp8
    (989.4e12, 4.8e12, 2),  # H200, bf16
    (2250e12, 7.7e12, 2),  # B200, bf16
)
_WIDTHS = (64, 128, 512, 1024, 2048, 4096, 8192, 14336, 16384, 28672, 53248)


def _answer_keys() -> dict[Any, str]:
    keys = {
        "the grader's own answer": _fewest_tokens,
        "the grader's own cases": _token_cases,
        "the grader's own MFU": _mfu,
    }
    return {f.__code__: name for name, f in keys.items()}


def _run_watched(work: Callable[..., Any], *args: Any) -> Any:
    """``work(*args)``, refused if it ran one of :func:`_answer_keys` (under any name)."""
    return run_refusing(work, _answer_keys(), *args)


def _compute_bound(m: int, peak: float, bandwidth: float, k: int, n: int, nbytes: int) -> bool:
    """Exactly: FLOPs / bytes of an (m × k) @ (k × n) product >= peak / bandwidth."""
    flops = 2 * m * k * n
    moved = nbytes * (m * k + k * n + m * n)
    return Fraction(flops) * Fraction(bandwidth) >= Fraction(peak) * moved


def _fewest_tokens(peak: float, bandwidth: float, k: int, n: int, nbytes: int) -> float:
    """The smallest m that is compute-bound, or math.inf (the weights' bytes alone keep it memory-bound)."""
    ridge = Fraction(peak) / Fraction(bandwidth)
    slope = 2 * k * n - ridge * nbytes * (k + n)  # m · slope >= ridge · nbytes · k · n
    if slope <= 0:
        return math.inf
    return math.ceil(ridge * nbytes * k * n / slope)


def _token_cases(rng: random.Random) -> list[tuple[float, float, int, int, int]]:
    cases = [
        (peak, bw, k, n, b) for peak, bw, b in _GPUS for k, n in ((4096, 4096), (4096, 14336), (1024, 1024))
    ]
    cases += [
        (*rng.choice(_GPUS)[:2], rng.choice(_WIDTHS), rng.choice(_WIDTHS), rng.choice((1, 2, 4)))
        for _ in range(60)
    ]
    return cases


@exercise(
    "05h.1",
    "the fewest tokens that make a matrix product compute-bound",
    task="`fewest_tokens(peak, bandwidth, k, n, nbytes)` → the smallest whole m ≥ 1 for which the (m × k) @ "
    "(k × n) product is compute-bound, or `math.inf` if none is. Checked exactly, with fractions, on 84 "
    "products (the table's GPUs on three shapes, 60 drawn at grading): your m must be compute-bound and m − "
    "1 not. The grader's own answer is refused.",
    hint="write the product's FLOPs and the bytes it moves as functions of m; their ratio grows with m "
    "but towards a limit, and when that limit is below peak / bandwidth no m is enough.",
)
def grade_tokens(fewest_tokens: Callable[..., Any]) -> str:
    """Check ``fewest_tokens(peak, bandwidth, k, n, nbytes)`` on the table's GPUs and drawn shapes."""
    if not callable(fewest_tokens):
        raise Wrong(f"pass your function itself, not {type(fewest_tokens).__name__}.")
    rng = random.Random()
    never = 0
    for peak, bw, k, n, nbytes in _token_cases(rng):
        call = f"fewest_tokens({peak:.4g}, {bw:.4g}, k={k}, n={n}, nbytes={nbytes})"
        got = _run_watched(fewest_tokens, peak, bw, k, n, nbytes)
        want = _fewest_tokens(peak, bw, k, n, nbytes)
        if want == math.inf:
            never += 1
            if got != math.inf:
                raise Wrong(
                    f"{call} returned {got!r}, but no number of tokens makes that product compute-bound."
                )
            continue
        if isinstance(got, bool) or not isinstance(got, int | float) or got != int(got) or got < 1:
            raise Wrong(f"{call} returned {got!r}: a whole number of tokens >= 1 (or math.inf) was expected.")
        m = int(got)
        if not _compute_bound(m, peak, bw, k, n, nbytes):
            raise Wrong(f"{call} returned {m}, but at {m} tokens the product is still memory-bound.")
        if m > 1 and _compute_bound(m - 1, peak, bw, k, n, nbytes):
            raise Wrong(f"{call} returned {m}, but {m - 1} tokens are already compute-bound.")
    return f"exact on {len(_token_cases(rng))} products, {never} of them memory-bound at any length"


def _mfu(
    layers: int, hidden: int, params: float, seq: int, tokens: float, seconds: float, gpus: int, peak: float
) -> float:
    return tokens * (6 * params + 12 * layers * hidden * seq) / (seconds * gpus * peak)


@exercise(
    "05h.2",
    "a training step's model FLOPs utilisation",
    task="`mfu(shape, seq_len, tokens, seconds, gpus, peak)` → the step's model FLOPs utilisation as a "
    "fraction, with PaLM's model FLOPs of section 3. Compared (to 1e-9) with the definition on 69 steps: "
    "the three Llama 3 shapes and 20 drawn ones, sequences of 2k, 8k and 128k tokens, 8 to 16,384 GPUs. The "
    "grader's own formula is refused.",
    hint="MFU compares the FLOPs the model needs with what the GPUs could have done in that time: count "
    "both, per step and over all GPUs, and remember what attention adds per token.",
)
def grade_mfu(mfu: Callable[..., Any]) -> str:
    """Check ``mfu(shape, seq_len, tokens, seconds, gpus, peak)`` on the Llama presets and drawn shapes."""
    if not callable(mfu):
        raise Wrong(f"pass your function itself, not {type(mfu).__name__}.")
    from ..planner import LLAMA_8B, LLAMA_70B, LLAMA_405B, Transformer

    rng = random.Random()
    shapes = [LLAMA_8B, LLAMA_70B, LLAMA_405B]
    for _ in range(20):
        heads = rng.choice((8, 16, 32, 64))
        shapes.append(Transformer("drawn", rng.randint(2, 96), heads * rng.choice((64, 128)), heads, 32_000))
    n = 0
    for shape in shapes:
        for seq in (2048, 8192, 131_072):
            gpus = rng.choice((8, 64, 1024, 16_384))
            tokens = gpus * rng.choice((1, 2, 4)) * seq
            seconds, peak = rng.uniform(0.5, 30.0), rng.choice(_GPUS)[0]
            got = _run_watched(mfu, shape, seq, tokens, seconds, gpus, peak)
            want = _mfu(shape.layers, shape.hidden, shape.params, seq, tokens, seconds, gpus, peak)
            call = (
                f"mfu({shape.name}: {shape.layers} layers of width {shape.hidden}, seq_len={seq}, "
                f"tokens={tokens:,}, seconds={seconds:.3f}, gpus={gpus}, peak={peak:.4g})"
            )
            if isinstance(got, bool) or not isinstance(got, int | float) or not math.isfinite(got):
                raise Wrong(f"{call} returned {got!r}: a number (a fraction, e.g. 0.41) was expected.")
            if not math.isclose(got, want, rel_tol=1e-9):
                raise Wrong(f"{call} returned {got:.6g}, not the MFU of that step.")
            n += 1
    return f"equal on {n} steps of {len(shapes)} model shapes, sequences of 2k to 128k tokens"
