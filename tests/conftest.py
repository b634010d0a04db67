"""Shared fixtures: every test must leave no child process behind."""

import psutil
import pytest


@pytest.fixture(autouse=True)
def no_leftover_children():
    """Fail a test that leaves a process it started (torchrun agents, workers) running."""
    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    yield
    left = [p for p in me.children(recursive=True) if p.pid not in before and p.is_running()]
    for p in left:
        p.kill()
    assert not left, f"test left processes running: {[(p.pid, ' '.join(p.cmdline())[:80]) for p in left]}"
