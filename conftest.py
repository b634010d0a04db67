"""Repository-wide pytest hook: the whole run (unit tests and notebooks) must leave no process behind."""

import time

import psutil


def pytest_sessionfinish(session, exitstatus):
    me = psutil.Process()
    deadline = time.monotonic() + 10  # kernels and workers get a moment to exit after their shutdown
    left = me.children(recursive=True)
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = [
            p for p in me.children(recursive=True) if p.is_running() and p.status() != psutil.STATUS_ZOMBIE
        ]
    if left:
        names = [f"{p.pid} {' '.join(p.cmdline())[:80]}" for p in left]
        print(f"\nERROR: processes left running after the tests: {names}")
        for p in left:
            p.kill()
        session.exitstatus = 1
