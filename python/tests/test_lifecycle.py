"""acquire / release / reference counting / root_members / debug_state, and their errors."""

from __future__ import annotations

import pytest
from conftest import (
    DIST,
    HEAP,
    LAUNCHED,
    RANK,
    TORCH,
    WORLD,
    cleanup,
    gather_text,
    multi_rank,
    normalized,
    single_process,
)
from hyper_multicore import shmem


def test_operations_before_acquire_are_refused():
    assert shmem.reference_count() == 0
    for call in (lambda: shmem.empty(4), shmem.barrier, shmem.my_pe, shmem.quiet):
        with pytest.raises(shmem.ShmemError, match="call acquire first") as caught:
            call()
        assert caught.value.kind == "invalid state"
    with pytest.raises(shmem.ShmemError, match="no reference is active"):
        shmem.release()
    state = shmem.debug_state()
    assert state["state"] == "Uninitialized"
    assert state["reference_count"] == 0
    assert state["allocations"] == []


@pytest.mark.parametrize("bad", [True, False, 1.5, "64", [64], 0, -1])
def test_a_heap_size_must_be_a_positive_integer(bad):
    """As the original runtime: ValueError for every heap size that is not a positive integer
    (a bool is not one) -- issue 9, item 10."""
    with pytest.raises(ValueError, match="positive integer"):
        shmem.acquire(heap_size_bytes=bad)
    assert shmem.reference_count() == 0


def test_errors_the_original_runtime_raised_as_runtime_error_still_are(xp):
    """Issue 9, item 10: a larger heap than the active one, a membership that does not match
    it, freeing a view, a bad alignment -- catchable as RuntimeError (and ValueError)."""
    shmem.acquire(heap_size_bytes=HEAP)
    try:
        caught = []
        for call in (
            lambda: shmem.acquire(heap_size_bytes=HEAP * 2),
            lambda: shmem.empty(4, alignment=48),
            lambda: shmem.empty(4, alignment=-64),
        ):
            with pytest.raises(RuntimeError) as error:
                call()
            caught.append(error.value)
        if not DIST and WORLD > 1:
            with pytest.raises(RuntimeError) as error:
                shmem.acquire(list(reversed(range(WORLD))))  # another member order
            caught.append(error.value)
        tensor = shmem.empty(8)
        with pytest.raises(RuntimeError, match="a view cannot be freed") as error:
            shmem.free(tensor[2:4])
        caught.append(error.value)
        for error in caught:
            assert isinstance(error, shmem.InvalidArgumentError), error
            assert isinstance(error, ValueError) and isinstance(error, shmem.ShmemError)
        shmem.free(tensor)
    finally:
        cleanup()


@pytest.mark.skipif(not DIST or WORLD < 2, reason="needs torch.distributed with 2 ranks")
def test_a_process_group_this_rank_is_not_in_is_a_runtime_error():
    import torch.distributed as dist

    group = dist.new_group([0])  # collective: every rank makes it
    if RANK == 0:
        return
    with pytest.raises(RuntimeError, match="not a member") as caught:
        shmem.acquire(group)
    assert isinstance(caught.value, shmem.InvalidArgumentError)
    assert shmem.reference_count() == 0


def test_a_root_group_of_the_wrong_type_is_a_type_error():
    with pytest.raises(TypeError):
        shmem.acquire("world")
    with pytest.raises(TypeError):
        shmem.acquire(object())
    assert shmem.reference_count() == 0


def test_acquire_release_and_reference_counting():
    shmem.acquire(heap_size_bytes=HEAP)
    try:
        assert shmem.reference_count() == 1
        assert (shmem.my_pe(), shmem.n_pes()) == (RANK, WORLD)
        state = shmem.debug_state()
        assert state["state"] == "Ready"
        assert (state["root_rank"], state["root_size"]) == (RANK, WORLD)
        assert state["device"] == "cpu"
        assert state["config"]["heap_size"] == HEAP
        assert state["config"]["timeout_sec"] > 0
        assert state["heap"]["allocation_count"] == 0
        # A second consumer: no collective work, same root, a heap no larger.
        shmem.acquire(heap_size_bytes=HEAP // 2)
        shmem.acquire()
        assert shmem.reference_count() == 3
        assert shmem.debug_state()["reference_count"] == 3
        with pytest.raises(shmem.InvalidArgumentError, match="heap of"):
            shmem.acquire(heap_size_bytes=HEAP * 2)
        shmem.release()
        shmem.release()
        assert shmem.reference_count() == 1
        shmem.host_barrier()
        shmem.barrier()
    finally:
        cleanup()
    assert shmem.reference_count() == 0
    assert shmem.debug_state()["state"] == "Uninitialized"
    # A new lifetime with new settings.
    shmem.acquire(heap_size_bytes=HEAP * 2)
    try:
        assert shmem.debug_state()["config"]["heap_size"] == HEAP * 2
    finally:
        cleanup()


def test_the_heap_size_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("HYPER_MULTICORE_SHMEM_HEAP_SIZE", "12M")
    shmem.acquire()
    try:
        assert shmem.debug_state()["config"]["heap_size"] == 12 << 20
    finally:
        cleanup()


def test_a_bad_environment_variable_is_named(monkeypatch):
    shmem.root_members()  # the launcher's world exists before the bad variable is set
    monkeypatch.setenv("HYPER_MULTICORE_SHMEM_HEAP_SIZE", "lots")
    with pytest.raises(shmem.RetryableError, match="HYPER_MULTICORE_SHMEM_HEAP_SIZE") as caught:
        shmem.acquire()
    assert caught.value.recovery == "retryable"
    assert "the runtime remains usable" in str(caught.value)
    assert shmem.reference_count() == 0


def test_the_last_release_needs_every_tensor_freed():
    shmem.acquire(heap_size_bytes=HEAP)
    try:
        tensor = shmem.empty(16)
        with pytest.raises(shmem.RetryableError, match="still live") as caught:
            shmem.release()
        error = caught.value
        assert error.stage == "Preflight" and error.operation == "release"
        assert "the runtime remains usable" in str(error)
        assert isinstance(error.__cause__, shmem.HyperMulticoreError)
        # The reference is kept and the runtime usable: fix it and release again.
        assert shmem.reference_count() == 1
        tensor[:] = 1
        shmem.barrier()
        shmem.free(tensor)
        shmem.release()
        assert shmem.reference_count() == 0
    finally:
        cleanup()


def test_root_members_is_the_ordered_world():
    assert shmem.root_members() == tuple(range(WORLD))
    if not DIST:
        assert shmem.root_members([1, 0]) == (1, 0)
        with pytest.raises(TypeError):
            shmem.root_members([True])
        with pytest.raises(ValueError, match="twice"):
            shmem.root_members([0, 0])


@single_process
def test_a_standalone_process_is_a_root_of_one():
    assert shmem.root_members() == (0,)
    with pytest.raises(shmem.InvalidArgumentError, match="standalone"):
        shmem.acquire([0])
    shmem.acquire(heap_size_bytes=HEAP)
    try:
        assert (shmem.my_pe(), shmem.n_pes()) == (0, 1)
        state = shmem.debug_state()
        assert (state["root_rank"], state["root_size"]) == (0, 1)
    finally:
        cleanup()


@multi_rank
def test_heap_sizes_that_differ_across_ranks_fail_on_every_rank():
    with pytest.raises(shmem.RetryableError, match="heap sizes differ") as caught:
        shmem.acquire(heap_size_bytes=HEAP + (1 << 20) * (RANK % 2))
    assert shmem.reference_count() == 0
    message = normalized(str(caught.value))
    # Retryable: a correct acquire works, and every rank saw the same diagnosis.
    shmem.acquire(heap_size_bytes=HEAP)
    try:
        assert len(set(gather_text(message))) == 1, message
    finally:
        cleanup()


@pytest.mark.skipif(not (TORCH and not DIST and not LAUNCHED), reason="torch, no launcher")
def test_process_groups_need_torch_distributed():
    import torch.distributed as dist

    assert not dist.is_initialized()
    with pytest.raises(TypeError):
        shmem.acquire(object())
