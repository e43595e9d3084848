"""Lifecycle calls from several threads: no call into the runtime may wait for a lock while it
holds the GIL (issue 9, item 1).

Thread A holds the lifecycle lock and needs the GIL (a preflight hook of ``restart``, or the
torch all-gather of a first ``acquire`` over a ProcessGroup); thread B calls into the runtime
meanwhile. If B waited for the lock holding the GIL, the whole interpreter would freeze -- a
deadlock that no in-process timeout can report (a ``join(timeout)`` needs the GIL back to
return). So each scenario runs in a child interpreter with a deadline, and a child that does not
finish by then is a deadlock.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from conftest import LAUNCHED, TIMEOUT, TORCH

pytestmark = pytest.mark.skipif(LAUNCHED, reason="starts its own interpreters")

#: How long a child may take before it counts as deadlocked (it needs about a second).
DEADLINE = 4 * TIMEOUT

#: Runs ``thread_a`` until ``a_ready`` is set, then ``thread_b``, and waits for both (each
#: child below defines them).
_A_THEN_B = """
def run_a_then_b(a_ready, why):
    a = threading.Thread(target=thread_a)
    a.start()
    assert a_ready.wait(WAIT), why
    b = threading.Thread(target=thread_b)
    b.start()
    a.join(WAIT)
    b.join(WAIT)
    assert not a.is_alive() and not b.is_alive()
"""

_CHILD = """
import os, sys, threading
from hyper_multicore import shmem
from hyper_multicore.shmem import _lifecycle

WAIT = {wait}
SCENARIO, CALL = sys.argv[1], sys.argv[2]
entered, calling = threading.Event(), threading.Event()
seen = {{}}


def hold_then_need_the_gil():
    # Runs in thread A while it holds the lifecycle lock: it lets B start, waits (GIL
    # released) until B is about to call into the runtime, then needs the GIL again.
    entered.set()
    assert calling.wait(WAIT), "thread B never called"


if SCENARIO == "restart":
    shmem.acquire(heap_size_bytes=8 << 20)
    tensor = shmem.empty(4)

    def hook():
        hold_then_need_the_gil()
        return "ok"

    def thread_a():
        result = shmem.restart(
            heap_size_bytes=8 << 20,
            replacements=[
                shmem.AllocationReplacement(tensor, shmem.AllocationSpec.like(tensor))
            ],
            preflight_hook=hook,
        )
        seen["a"] = result.tensors
else:  # the first acquire over a torch ProcessGroup: its all-gather needs the GIL
    import torch.distributed as dist

    dist.init_process_group(
        "gloo", rank=0, world_size=1, init_method="file://" + sys.argv[3]
    )
    plain = _lifecycle._all_gather_object_over

    def slow(dist_module, group):
        allgather = plain(dist_module, group)

        def gathered(data):
            if not entered.is_set():
                hold_then_need_the_gil()
            return allgather(data)

        return gathered

    _lifecycle._all_gather_object_over = slow

    def thread_a():
        shmem.acquire(heap_size_bytes=8 << 20)
        seen["a"] = "acquired"

calls = {{
    "reference_count": shmem.reference_count,
    "debug_state": shmem.debug_state,
    "release": shmem.release,
    "acquire": shmem.acquire,
    "host_barrier": shmem.host_barrier,
}}


def thread_b():
    calling.set()
    try:
        seen["b"] = calls[CALL]()
    except shmem.HyperMulticoreError as error:
        seen["b"] = type(error).__name__


{a_then_b}
run_a_then_b(entered, "thread A never reached its hook")
print("done", CALL, "->", seen["b"])
if SCENARIO != "restart":
    dist.destroy_process_group()  # gloo's threads must not outlive the interpreter
"""

CALLS = ["reference_count", "debug_state", "release", "acquire", "host_barrier"]
SCENARIOS = ["restart"] + (["first_acquire_over_torch"] if TORCH else [])


@pytest.mark.parametrize("call", CALLS)
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_a_lifecycle_call_waits_without_holding_the_gil(tmp_path, scenario, call):
    child = textwrap.dedent(_CHILD.format(wait=TIMEOUT, a_then_b=_A_THEN_B))
    command = [sys.executable, "-c", child, scenario, call, str(tmp_path / "store")]
    try:
        run = subprocess.run(command, capture_output=True, text=True, timeout=DEADLINE)
    except subprocess.TimeoutExpired:
        pytest.fail(
            f"deadlock: thread B's {call}() waited for the lifecycle lock while holding the GIL "
            f"that thread A ({scenario}) needed"
        )
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"done {call} ->" in run.stdout


_REGISTRY_CHILD = """
import sys, threading
from hyper_multicore import shmem
from hyper_multicore.shmem import _registry

WAIT = {wait}
CALL = sys.argv[1]
shmem.acquire(heap_size_bytes=8 << 20)
tensor = shmem.empty(4)  # names the default dtype: the calls below take the native path
held, calling = threading.Event(), threading.Event()
seen = {{}}


def thread_a():
    with _registry._lock:
        held.set()
        # Waits (GIL released) until B is about to take the lock, then needs the GIL again.
        assert calling.wait(WAIT), "thread B never called"
        seen["a"] = sum(range(1000))


def thread_b():
    calling.set()
    seen["b"] = shmem.empty(4) if CALL == "empty" else shmem.free(tensor)


{a_then_b}
run_a_then_b(held, "thread A never took the lock")
if CALL == "empty":
    assert tuple(seen["b"].shape) == (4,)
    shmem.free(seen["b"])
# The calls above took the native path: with the full paths refused, the same calls still work.
def refused(*args):
    raise AssertionError("not native")


_registry._native_registry.install(refused, refused)
shmem.free(shmem.empty(4))
print("done", CALL, "registry lock free:", _registry._lock.acquire() is None)
_registry._lock.release()
try:
    _registry._lock.release()
except RuntimeError as error:
    print("second release:", error)
"""


@pytest.mark.skipif(not TORCH, reason="the native empty() and free() are torch's")
@pytest.mark.parametrize("call", ["empty", "free"])
def test_empty_and_free_wait_for_the_registry_lock_without_holding_the_gil(call):
    """``empty``/``free`` take the registry's lock natively; while another thread holds it (and
    needs the GIL to finish), they must wait for it with the GIL released."""
    child = textwrap.dedent(_REGISTRY_CHILD.format(wait=TIMEOUT, a_then_b=_A_THEN_B))
    command = [sys.executable, "-c", child, call]
    try:
        run = subprocess.run(command, capture_output=True, text=True, timeout=DEADLINE)
    except subprocess.TimeoutExpired:
        pytest.fail(
            f"deadlock: thread B's {call}() waited for the registry lock while holding the GIL "
            "that the lock's holder needed"
        )
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"done {call} registry lock free: True" in run.stdout
    assert "second release: cannot release the registry lock" in run.stdout


_INTERRUPT_CHILD = """
import os, signal, sys, threading
from hyper_multicore import shmem
from hyper_multicore.shmem import _registry

WAIT = {wait}
shmem.acquire(heap_size_bytes=8 << 20)
shmem.free(shmem.empty(4))  # names the default dtype: empty(4) below takes the native path
calling, interrupted = threading.Event(), threading.Event()
seen = {{}}


def holder():
    with _registry._lock:
        assert calling.wait(WAIT), "the main thread never called"
        os.kill(os.getpid(), signal.SIGINT)
        # Holds the lock until the main thread was interrupted while waiting for it.
        seen["interrupted while held"] = interrupted.wait(WAIT)


thread = threading.Thread(target=holder)
thread.start()
calling.set()
try:
    seen["tensor"] = shmem.empty(4)
except KeyboardInterrupt:
    interrupted.set()
thread.join(WAIT)
assert seen["interrupted while held"], "the wait for the lock ignored Ctrl-C"
assert "tensor" not in seen and shmem.debug_state()["heap"]["allocation_count"] == 0
shmem.release()
print("interrupted, nothing allocated")
"""


@pytest.mark.skipif(not TORCH, reason="the native empty() is torch's")
def test_ctrl_c_interrupts_a_wait_for_the_registry_lock_before_anything_is_allocated():
    child = textwrap.dedent(_INTERRUPT_CHILD.format(wait=TIMEOUT))
    run = subprocess.run(
        [sys.executable, "-c", child], capture_output=True, text=True, timeout=DEADLINE
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "interrupted, nothing allocated" in run.stdout


_FORK_CHILD = """
import os, signal, threading
from hyper_multicore.shmem import _registry

WAIT = {wait}
held, done = threading.Event(), threading.Event()


def holder():
    with _registry._lock:
        held.set()
        assert done.wait(WAIT)


thread = threading.Thread(target=holder)
thread.start()
assert held.wait(WAIT)
pid = os.fork()
if pid == 0:  # the child: the holder thread is not here to let the lock go
    signal.alarm(int(WAIT))  # a lock that stayed held would block for good: die of SIGALRM instead
    with _registry._lock:
        pass
    os._exit(0)
_, status = os.waitpid(pid, 0)
done.set()
thread.join(WAIT)
print("child exit status", os.waitstatus_to_exitcode(status))
"""


def test_a_forked_child_finds_the_registry_lock_free():
    """A child forked while another thread holds the registry's lock has no thread that would
    let it go: it starts free there (``os.register_at_fork``)."""
    child = textwrap.dedent(_FORK_CHILD.format(wait=TIMEOUT))
    run = subprocess.run(
        [sys.executable, "-c", child], capture_output=True, text=True, timeout=DEADLINE
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "child exit status 0" in run.stdout
