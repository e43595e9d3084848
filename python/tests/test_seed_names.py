"""The seed module's private names (issue 41, item 4), used the way the seed's callers use them.

The seed reference implementation's ``hyper_multicore/shmem/_lifecycle.py`` had private names
that its callers import: ``_restart``, ``_AllocationSpec``, ``_AllocationReplacement``,
``_RestartResult``, ``_reference_count()`` (which keeps its count once the lifecycle is
invalidated), ``_runtime_is_healthy()``, ``_host_barrier()`` and ``_lock`` (the lifecycle's
lock); its ``debug_state()`` has a ``device_index``; its restart failures begin "SHMEM restart
failed during <Stage>", a Preflight difference "values differ across Root ranks".

Runs in one process and on every rank of a launcher's job; the tests that invalidate a lifecycle
do it in a standalone child interpreter (an invalidated process stays so).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
from conftest import HEAP, RANK, TIMEOUT, WORLD, cleanup, gather_text, normalized
from hyper_multicore import _native, shmem
from hyper_multicore.shmem import _lifecycle, _registry
from hyper_multicore.shmem._lifecycle import (
    _AllocationReplacement,
    _AllocationSpec,
    _host_barrier,
    _lock,
    _reference_count,
    _restart,
    _RestartResult,
    _runtime_is_healthy,
)

needs_faults = pytest.mark.skipif(
    not _native.FAULT_INJECTION, reason="the extension was built without fault-injection"
)

#: "SHMEM restart failed during <Stage>[ on rank N]: " -- the seed's prefix, then the project's
#: detail (the rank that raised it, the error kind, the failing root ranks, the hint).
SEED_RESTART = r"SHMEM restart failed during {stage}(?: on rank \d+)?: "


def test_the_seed_names_are_the_public_ones():
    assert _restart is shmem.restart
    assert _AllocationSpec is shmem.AllocationSpec
    assert _AllocationReplacement is shmem.AllocationReplacement
    assert _RestartResult is shmem.RestartResult
    assert _host_barrier is shmem.host_barrier
    # ``_lock`` is the lifecycle's (re-entrant) lock, not the registry's.
    assert _lock is _lifecycle._lifecycle_lock
    assert _lock is not _registry._lock
    assert isinstance(_lock, type(threading.RLock()))


def test_a_seed_caller_restarts_through_the_seed_names(xp):
    assert _reference_count() == 0
    assert _runtime_is_healthy() is False  # no reference
    shmem.acquire(heap_size_bytes=HEAP)
    try:
        assert _reference_count() == 1 == shmem.reference_count()
        assert _runtime_is_healthy() is True
        data = shmem.empty(16, dtype="int64")
        flags = shmem.empty(4, dtype="int32")
        xp.fill(data, 7 + RANK)
        _host_barrier()
        with _lock:  # the seed's callers hold the lifecycle lock around a restart
            result = _restart(
                heap_size_bytes=2 * HEAP,
                replacements=[
                    _AllocationReplacement(data, _AllocationSpec((32,), "int64"), preserve=True),
                    _AllocationReplacement(flags, _AllocationSpec.like(flags)),
                ],
                preflight_hook=lambda: {"step": 3},
            )
        assert isinstance(result, _RestartResult)
        assert tuple(result.stages_ms) == shmem.STAGE_KEYS
        new_data, new_flags = result.tensors
        assert xp.tolist(new_data) == [7 + RANK] * 16 + [0] * 16  # first 16 kept, rest zero
        assert xp.tolist(new_flags) == [0] * 4
        assert shmem.debug_state()["config"]["heap_size"] == 2 * HEAP
        assert _reference_count() == 1 and _runtime_is_healthy() is True
        _host_barrier()
        shmem.free(new_flags)
        shmem.free(new_data)
    finally:
        cleanup()
    assert _reference_count() == 0
    assert _runtime_is_healthy() is False


def test_host_barrier_without_a_reference_is_an_error():
    with pytest.raises(shmem.ShmemError, match="acquire"):
        _host_barrier()


def test_the_seed_lock_is_the_lifecycle_lock():
    """Holding ``_lock`` keeps another thread's lifecycle calls out (and not the registry's
    callers); the holder itself may call them (re-entrant)."""
    shmem.acquire(heap_size_bytes=HEAP)
    try:
        done = threading.Event()

        def second_reference():
            shmem.acquire()  # a later reference: no collective work
            done.set()

        with _lock:
            other = threading.Thread(target=second_reference)
            other.start()
            assert not done.wait(0.5), "acquire ran while another thread held _lifecycle._lock"
            # The registry's lock is another lock: a second thread takes it at once.
            took_registry = threading.Event()

            def take_registry_lock():
                with _registry._lock:
                    took_registry.set()

            registry_user = threading.Thread(target=take_registry_lock)
            registry_user.start()
            assert took_registry.wait(TIMEOUT)
            registry_user.join(TIMEOUT)
            with _lock:  # re-entrant: the holder's own lifecycle calls go through
                shmem.acquire()
                assert _reference_count() == 2
                shmem.release()
        assert done.wait(TIMEOUT), "acquire never ran after _lifecycle._lock was let go"
        other.join(TIMEOUT)
        assert _reference_count() == 2
        shmem.release()
        assert _reference_count() == 1
    finally:
        cleanup()


def test_debug_state_has_the_seed_device_index():
    state = shmem.debug_state()
    assert state["device"] == "cpu" and state["device_index"] is None
    shmem.acquire(heap_size_bytes=HEAP)
    try:
        state = shmem.debug_state()
        assert state["device"] == "cpu" and state["device_index"] is None
        assert state["state"] == "Ready"
    finally:
        cleanup()
    root = shmem.SharedRoot(heap_size_bytes=HEAP)
    consumer = root.reserve(shmem.ConsumerSpec("seed", "workspace", 1 << 20))
    root.activate()
    try:
        assert root.debug_state()["device_index"] is None
        assert _reference_count() == 1 and _runtime_is_healthy() is True
    finally:
        consumer.close()
        root.close()
    assert _runtime_is_healthy() is False


def retryable_message(call) -> str:
    with pytest.raises(shmem.RetryableError) as caught:
        call()
    message = str(caught.value)
    assert message.endswith("the runtime remains usable"), message
    assert len(set(gather_text(normalized(message)))) == 1, message  # alike on every rank
    return message


def test_restart_failures_begin_with_the_seed_prefix():
    shmem.acquire(heap_size_bytes=HEAP)
    try:
        tensor = shmem.empty(4)
        message = retryable_message(lambda: _restart(heap_size_bytes=HEAP, replacements=[]))
        assert re.match(SEED_RESTART.format(stage="Preflight"), message), message
        assert "have no replacement" in message  # the project's detail follows
        # A problem found by the Python front itself reads the same way.
        message = retryable_message(
            lambda: _restart(heap_size_bytes=HEAP, replacements=[], preflight_hook=42)
        )
        assert re.match(SEED_RESTART.format(stage="Preflight"), message), message
        assert "preflight_hook must be callable" in message
        # Other lifecycle errors keep their own wording.
        shmem.acquire()
        try:
            message = retryable_message(lambda: _restart(heap_size_bytes=HEAP, replacements=[]))
            assert re.match(SEED_RESTART.format(stage="Preflight"), message), message
            assert "exactly one reference" in message
        finally:
            shmem.release()
        shmem.free(tensor)
    finally:
        cleanup()


@needs_faults
def test_a_later_stage_failure_names_its_stage_after_the_seed_prefix(monkeypatch):
    shmem.acquire(heap_size_bytes=HEAP)
    try:
        tensor = shmem.empty(4)
        monkeypatch.setenv("HYPER_MULTICORE_TEST_FAULT", "restart:Quiesce:0:retryable")
        message = retryable_message(
            lambda: _restart(
                heap_size_bytes=HEAP,
                replacements=[_AllocationReplacement(tensor, _AllocationSpec.like(tensor))],
            )
        )
        monkeypatch.delenv("HYPER_MULTICORE_TEST_FAULT")
        assert re.match(SEED_RESTART.format(stage="Quiesce"), message), message
        assert "root_ranks=[0]" in message
        assert _runtime_is_healthy() is True  # retryable: nothing changed
        shmem.free(tensor)
    finally:
        cleanup()


@pytest.mark.skipif(WORLD < 2, reason="needs 2 ranks")
def test_values_that_differ_read_as_the_seed_said():
    shmem.acquire(heap_size_bytes=HEAP)
    try:
        tensor = shmem.empty(4)
        keep = [_AllocationReplacement(tensor, _AllocationSpec.like(tensor))]
        message = retryable_message(
            lambda: _restart(
                heap_size_bytes=HEAP, replacements=keep, preflight_hook=lambda: {"rank": RANK}
            )
        )
        seed = SEED_RESTART.format(stage="Preflight") + "values differ across Root ranks "
        assert re.match(seed + re.escape("(the preflight hook's snapshots): "), message), message
        assert "root_ranks=[0]: {'rank': 0}" in message and "root_ranks=[1]: {'rank': 1}" in message
        # The restart's own arguments that differ: the same beginning.
        message = retryable_message(
            lambda: _restart(heap_size_bytes=HEAP + 4096 * (RANK % 2), replacements=keep)
        )
        assert re.match(seed + re.escape("(the restart's heap size"), message), message
        shmem.free(tensor)
    finally:
        cleanup()


#: A standalone child interpreter: a restart or a release that fails terminally (injected), then
#: what the seed's names say about the invalidated lifecycle.
_INVALIDATED_CHILD = """
import json, sys
from hyper_multicore import shmem
from hyper_multicore.shmem._lifecycle import (
    _AllocationReplacement, _AllocationSpec, _reference_count, _restart, _runtime_is_healthy,
)

seen = {}
shmem.acquire(heap_size_bytes=8 << 20)
tensor = shmem.empty(4)
seen["before"] = [_reference_count(), _runtime_is_healthy()]
try:
    if sys.argv[1] == "restart":
        _restart(
            heap_size_bytes=8 << 20,
            replacements=[_AllocationReplacement(tensor, _AllocationSpec.like(tensor))],
        )
    else:
        shmem.free(tensor)
        shmem.release()
except shmem.HyperMulticoreError as error:
    seen["error"] = [type(error).__name__, str(error)]
seen["after"] = [_reference_count(), shmem.reference_count(), _runtime_is_healthy()]
state = shmem.debug_state()
seen["state"] = [state["state"], state["device_index"]]
try:
    shmem.acquire(heap_size_bytes=8 << 20)
except shmem.HyperMulticoreError as error:
    seen["acquire"] = type(error).__name__
seen["after_acquire"] = [_reference_count(), _runtime_is_healthy()]
print(json.dumps(seen))
"""

NUMPY_ONLY = Path(__file__).with_name("numpy_only")

#: The launcher's variables, which would make the child a rank of this job.
_LAUNCHER = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR"}
_LAUNCHER |= {"MASTER_PORT", "ROLE_RANK", "ROLE_WORLD_SIZE", "GROUP_WORLD_SIZE", "ROLE_NAME"}


def standalone_child(operation: str, fault: str) -> dict:
    env = {
        name: value
        for name, value in os.environ.items()
        if name not in _LAUNCHER
        and not name.startswith("TORCHELASTIC_")
        and not (name.startswith("HYPER_MULTICORE_") and "TIMEOUT" not in name)
    }
    env["HYPER_MULTICORE_TEST_FAULT"] = fault
    # With torch hidden (the lifecycle's bookkeeping does not depend on it): the child starts in
    # a fraction of the time.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(NUMPY_ONLY), env.get("PYTHONPATH")]))
    child = textwrap.dedent(_INVALIDATED_CHILD)
    run = subprocess.run(
        [sys.executable, "-c", child, operation],
        env=env,
        capture_output=True,
        text=True,
        timeout=4 * TIMEOUT,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    return json.loads(run.stdout.strip().splitlines()[-1])


@needs_faults
def test_an_invalidated_lifecycle_keeps_the_seed_count_and_is_not_healthy():
    seen = standalone_child("restart", "restart:ReleaseAllocations:0:retryable")
    assert seen["before"] == [1, True]
    kind, message = seen["error"]
    assert kind == "TerminalError"
    assert re.match(SEED_RESTART.format(stage="ReleaseAllocations"), message), message
    assert message.endswith("restart the process")
    # The seed's count is the one held when it was invalidated; the runtime's own is 0.
    assert seen["after"] == [1, 0, False]
    assert seen["state"] == ["Invalidated", None]
    assert seen["acquire"] == "TerminalError"
    assert seen["after_acquire"] == [1, False]


@needs_faults
def test_a_failed_shutdown_keeps_the_seed_count_too():
    seen = standalone_child("release", "release:Shutdown:0:retryable")
    assert seen["before"] == [1, True]
    kind, message = seen["error"]
    assert kind == "TerminalError"
    assert message.startswith("release failed during Shutdown"), message  # no seed prefix
    assert seen["after"] == [1, 0, False]
    assert seen["acquire"] == "TerminalError"
    assert seen["after_acquire"] == [1, False]
