"""processes: free ports, loopback checks, stopping process trees, children that die with their parent."""

import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time

import psutil
import pytest
from _scripts import HANG_DEADLINE_S, is_alive, wait_until

from mgpu_helpers import processes
from mgpu_helpers.processes import (
    LOOPBACK,
    descendants,
    free_port,
    is_loopback,
    listening_addresses,
    remove_orphaned_temp_dirs,
    stop_processes,
    temp_prefix,
)


def test_free_port_can_be_bound_on_loopback_and_lies_below_the_ephemeral_range():
    port = free_port()
    with socket.socket() as s:
        s.bind((LOOPBACK, port))
        assert s.getsockname() == (LOOPBACK, port)
    assert processes.PORT_FLOOR <= port < min(processes._ephemeral_start(), processes.PORT_CEILING)
    assert port not in processes.TORCHRUN_PORTS


def test_free_port_skips_a_port_in_use_and_differs_across_seeds_and_forks(monkeypatch):
    with socket.socket() as taken:
        taken.bind((LOOPBACK, 0))
        busy = taken.getsockname()[1]
        real, drawn = processes._PORTS.randrange, []

        def first_the_busy_port(low, high):
            drawn.append(busy if not drawn else real(low, high))
            return drawn[-1]

        monkeypatch.setattr(processes._PORTS, "randrange", first_the_busy_port)
        monkeypatch.setattr(processes, "_ephemeral_start", lambda: 65535)
        assert free_port() != busy and drawn[0] == busy  # drawn first, in use, skipped
    monkeypatch.undo()
    picks = set()
    for _ in range(3):
        random.seed(0)  # what a notebook may do: two kernels must still not draw the same ports
        picks.add(free_port())
    assert len(picks) > 1
    children = []  # forked children (a grader's job, a launcher's worker) must not repeat each other
    for _ in range(3):
        read, write = os.pipe()
        if os.fork() == 0:
            os.write(write, str(free_port()).encode())
            os._exit(0)
        os.close(write)
        children.append(int(os.read(read, 16)))
        os.close(read)
        os.wait()
    assert len(set(children)) > 1, children


def test_free_port_falls_back_to_the_os_pick_when_nothing_lies_below_the_range(monkeypatch):
    ephemeral = processes._ephemeral_start()
    monkeypatch.setattr(processes, "_ephemeral_start", lambda: processes.PORT_FLOOR + 10)
    port = free_port()
    assert port >= ephemeral  # the OS's pick, from its ephemeral range
    with socket.socket() as s:
        s.bind((LOOPBACK, port))


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        ("127.0.0.1", True),
        ("127.8.9.10", True),
        ("::1", True),
        ("[::1]", True),
        ("::ffff:127.0.0.1", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("10.1.2.3", False),
        ("fe80::1%eth0", False),
    ],
)
def test_is_loopback(address, expected):
    assert is_loopback(address) is expected


@pytest.mark.parametrize(
    ("fn", "args", "exc", "message"),
    [
        (is_loopback, (127,), TypeError, "string such as '127.0.0.1'"),
        (is_loopback, ("my-laptop",), ValueError, "not an IP address"),
        (free_port, (None,), TypeError, "address string"),
        (stop_processes, ([], -1), ValueError, "grace_s must be >= 0"),
    ],
)
def test_bad_inputs_say_what_to_pass(fn, args, exc, message):
    with pytest.raises(exc, match=message):
        fn(*args)


def test_listening_addresses_sees_a_socket_of_this_process():
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        s.listen()
        port = s.getsockname()[1]
        found = listening_addresses()
    assert (LOOPBACK, port) in [(ip, p) for ip, p, _ in found]
    assert all(is_loopback(ip) for ip, p, _ in found if p == port)


_TREE = textwrap.dedent(
    """
    import signal, subprocess, sys, time
    # a grandchild that ignores SIGTERM: only SIGKILL stops it
    code = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "print('up', flush=True); time.sleep(600)")
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    child.stdout.readline()
    print("ready", flush=True)
    time.sleep(600)
    """
)


def test_stop_processes_stops_the_whole_tree_even_what_ignores_sigterm():
    parent = subprocess.Popen([sys.executable, "-c", _TREE], stdout=subprocess.PIPE)
    assert parent.stdout.readline().strip() == b"ready"
    tree = [parent.pid, *(p.pid for p in psutil.Process(parent.pid).children(recursive=True))]
    assert len(tree) == 2
    killed = stop_processes([parent], grace_s=0.5)
    assert len(killed) == 1  # the grandchild needed SIGKILL
    assert parent.poll() == -signal.SIGTERM  # the exit status survives psutil reaping the child

    def gone() -> bool:
        return not any(psutil.pid_exists(p) and psutil.Process(p).status() != "zombie" for p in tree)

    wait_until(gone, "the tree to be gone")
    assert not {p.pid for p in descendants()} & set(tree)  # (the worker may have other children)


def test_stop_processes_keeps_the_exit_status_of_multiprocessing_children():
    import multiprocessing

    child = multiprocessing.get_context("fork").Process(target=time.sleep, args=(600,))
    child.start()
    assert stop_processes([child], grace_s=5) == []
    assert child.exitcode == -signal.SIGTERM


_ORPHANING_PARENT = textwrap.dedent(
    """
    import subprocess, sys, time
    from mgpu_helpers.processes import die_with_parent
    sleeper = [sys.executable, "-c", "import time; time.sleep(600)"]
    child = subprocess.Popen(sleeper, preexec_fn=die_with_parent)
    print(child.pid, flush=True)
    time.sleep(600)
    """
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")
def test_a_child_started_with_die_with_parent_dies_when_the_parent_is_killed():
    parent = subprocess.Popen([sys.executable, "-c", _ORPHANING_PARENT], stdout=subprocess.PIPE)
    child_pid = int(parent.stdout.readline())
    child = psutil.Process(child_pid)
    parent.send_signal(signal.SIGKILL)  # a kernel killed hard: no finally block runs
    parent.wait()
    try:
        child.wait(timeout=HANG_DEADLINE_S)
    except psutil.TimeoutExpired:
        child.kill()
        raise AssertionError("the child outlived its killed parent") from None


def test_temp_prefix_names_by_pid_and_removes_folders_of_dead_processes(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    orphan = tmp_path / f"mgpu-launch-{dead.pid}-abc"  # left by a kernel that was killed
    orphan.mkdir()
    (orphan / "rank0.pkl").write_bytes(b"x")
    live = tmp_path / f"mgpu-launch-{os.getpid()}-def"
    live.mkdir()
    other_kind = tmp_path / f"mgpu-oom-{dead.pid}-ghi"
    other_kind.mkdir()
    assert temp_prefix("launch") == f"mgpu-launch-{os.getpid()}-"
    assert not orphan.exists() and live.exists() and other_kind.exists()
    assert remove_orphaned_temp_dirs("oom") == [str(other_kind)]
    with pytest.raises(ValueError, match="short lowercase word"):
        temp_prefix("../etc")


_WATCHED_PARENT = textwrap.dedent(
    """
    import subprocess, sys, time
    from mgpu_helpers.processes import Watchdog
    # Like ipyparallel's processes: a session of their own, no die_with_parent, and a grandchild.
    code = ("import subprocess, sys, time; "
            "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); time.sleep(600)")
    if sys.argv[1] == "no grandchild":
        code = "import time; time.sleep(600)"
    dog = Watchdog(grace_s=0.5)
    child = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    dog.watch([child.pid])
    if sys.argv[1] == "close":
        dog.close()  # returns once the watchdog has exited
    print(child.pid, dog.process.pid, dog.process.returncode, flush=True)
    time.sleep(600)
    """
)


def _start_watched_parent(how: str) -> tuple[subprocess.Popen, list[psutil.Process], int, str]:
    """The parent, its watched child and grandchild, the watchdog's pid and exit code (or "None")."""
    parent = subprocess.Popen(
        [sys.executable, "-c", _WATCHED_PARENT, how], stdout=subprocess.PIPE, start_new_session=True
    )
    child_pid, dog_pid, dog_code = parent.stdout.readline().split()
    child = psutil.Process(int(child_pid))
    tree = wait_until(lambda: len(c := child.children()) == 1 and [child, *c], "the grandchild to start")
    return parent, tree, int(dog_pid), dog_code.decode()


@pytest.mark.parametrize("kill", ["the kernel", "its process group (a Jupyter restart)"])
def test_a_watchdog_stops_what_it_watches_when_its_parent_is_killed(kill):
    parent, tree, dog_pid, _ = _start_watched_parent("watch")
    dog = psutil.Process(dog_pid)
    try:
        if kill == "the kernel":
            parent.kill()
        else:
            os.killpg(parent.pid, signal.SIGKILL)  # the watchdog has a session of its own: not reached
        parent.wait()
        wait_until(
            lambda: not any(is_alive(p) for p in [*tree, dog]),
            "the watched processes and the watchdog to exit",
            timeout_s=10,
        )
    finally:
        stop_processes([parent, *tree, dog], grace_s=0)


def test_a_watchdog_that_is_still_starting_when_its_parent_dies_reads_the_pids_left_for_it():
    parent = subprocess.Popen(
        [sys.executable, "-c", _WATCHED_PARENT, "no grandchild"],
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    pids = parent.stdout.readline().split()[:2]  # the child's and the watchdog's
    parent.kill()  # at once: the watchdog (a fresh Python) has most likely not read its pipe yet
    parent.wait()
    procs = []
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):  # (already stopped)
            procs.append(psutil.Process(int(pid)))
    try:
        wait_until(lambda: not any(is_alive(p) for p in procs), "the child and the watchdog to exit", 10)
    finally:
        stop_processes(procs, grace_s=0)


def test_a_closed_watchdog_exits_and_stops_nothing():
    parent, tree, _, dog_code = _start_watched_parent("close")
    try:
        assert dog_code == "0"  # close() returned after the watchdog exited: nothing is left to act
        parent.kill()
        parent.wait()
        assert all(is_alive(p) for p in tree)
    finally:
        stop_processes([parent, *tree], grace_s=0)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt (Linux)")
def test_tune_malloc_keeps_freed_blocks_as_the_launchers_children_do():
    code = textwrap.dedent(
        """
        import os, sys
        from mgpu_helpers.processes import tune_malloc

        def address_space():
            with open("/proc/self/statm") as fh:
                return int(fh.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")

        def kept_after_free():
            before = address_space()
            block = bytearray(32 * 2**20)  # malloc: mmap-ed by default, from the heap once tuned
            del block
            return address_space() - before

        untuned = kept_after_free()
        assert tune_malloc(mmap_threshold=256 * 2**20, trim_threshold=512 * 2**20)
        print(untuned, kept_after_free())
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    untuned, tuned = map(int, out.stdout.split())
    assert untuned < 2**20, "by default a freed 32 MiB block goes back to the system at once"
    assert tuned > 24 * 2**20, "tuned, the freed block stays in the heap for the next step to reuse"
    with pytest.raises(TypeError, match="known: .*mmap_threshold"):
        processes.tune_malloc(mmap_treshold=1)
