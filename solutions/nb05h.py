"""Reference solutions of notebook 05h's exercises, typical wrong attempts and known shortcuts
(tests/test_solutions.py, tests/test_shortcuts.py)."""

import math

from mgpu_helpers.graders import nb05h as _grader


def fewest_tokens(peak, bandwidth, k, n, nbytes):
    ridge = peak / bandwidth  # FLOPs per byte at which compute and memory take equally long
    # 2mkn / (nbytes (mk + kn + mn)) >= ridge  <=>  m (2kn - ridge nbytes (k + n)) >= ridge nbytes k n
    slope = 2 * k * n - ridge * nbytes * (k + n)
    if slope <= 0:
        return math.inf  # even at infinitely many tokens the ratio stays below the ridge
    m = math.ceil(ridge * nbytes * k * n / slope)
    while m > 1 and 2 * (m - 1) * k * n >= ridge * nbytes * ((m - 1) * (k + n) + k * n):
        m -= 1  # floating-point rounding put the ceiling one too high
    while 2 * m * k * n < ridge * nbytes * (m * (k + n) + k * n):
        m += 1  # ... or one too low
    return m


def fewest_tokens_ignoring_the_weights(peak, bandwidth, k, n, nbytes):
    """The large-matrix rule of thumb: intensity ≈ 2m / nbytes, so m ≈ ridge · nbytes / 2."""
    return math.ceil(peak / bandwidth * nbytes / 2)


def fewest_tokens_from_the_grader(peak, bandwidth, k, n, nbytes):
    """Shortcut: the grader's own answer key."""
    return _grader._fewest_tokens(peak, bandwidth, k, n, nbytes)


def mfu(shape, seq_len, tokens, seconds, gpus, peak):
    per_token = 6 * shape.params + 12 * shape.layers * shape.hidden * seq_len  # PaLM's model FLOPs
    return tokens * per_token / (seconds * gpus * peak)


def mfu_without_attention(shape, seq_len, tokens, seconds, gpus, peak):
    """Forgets attention's 12·L·h·s FLOPs per token (small at 2k tokens, not at 128k)."""
    return tokens * 6 * shape.params / (seconds * gpus * peak)


def mfu_from_the_grader(shape, seq_len, tokens, seconds, gpus, peak):
    """Shortcut: the grader's own formula."""
    return _grader._mfu(shape.layers, shape.hidden, shape.params, seq_len, tokens, seconds, gpus, peak)


SOLUTIONS = {"05h.1": (fewest_tokens,), "05h.2": (mfu,)}
WRONG = {"05h.1": (fewest_tokens_ignoring_the_weights,), "05h.2": (mfu_without_attention,)}
SHORTCUTS = {
    "05h.1": {"grader's answer key": (fewest_tokens_from_the_grader,)},
    "05h.2": {"grader's formula": (mfu_from_the_grader,)},
}
