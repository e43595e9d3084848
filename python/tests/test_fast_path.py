"""The data plane's remembered tensors (``src/seen.rs``): a torch tensor seen before is not
inspected again, yet every check still fires on it -- stale tensors after free and restart,
foreign (process-private) tensors, dtypes, sizes, contiguity after in-place metadata changes,
and a consumer's lease. Each test warms the cache with successful calls on the very tensor
objects it then misuses. Runs in one process and on every rank of hmrun jobs."""

from __future__ import annotations

import gc

import pytest
from conftest import RANK, WORLD, needs_torch
from hyper_multicore import _native, shmem
from hyper_multicore.shmem import AllocationReplacement, AllocationSpec, ConsumerSpec

MIB = 1 << 20


def nxt() -> int:
    return (RANK + 1) % WORLD


def warm(dst, src, word) -> None:
    """Successful calls on ``dst``, ``src`` and ``word``, twice (the second from the cache)."""
    for _ in range(2):
        shmem.put(dst, src, nxt())
        shmem.get(src, dst, nxt())
        shmem.signal(word, 1, nxt())
        shmem.quiet()


@needs_torch
def test_a_tensor_seen_before_is_not_inspected_again(runtime, xp):
    dst, word = shmem.empty(4, dtype="float32"), shmem.empty(1, dtype="int64")
    src = xp.zeros(4, "float32")
    gc.collect()  # (no tensor remembered before dies while this test counts)
    before = _native.remembered()
    warm(dst, src, word)
    assert _native.remembered() == before + 3
    shmem.barrier()
    shmem.free(word)
    shmem.free(dst)


def test_stale_tensors_and_views_are_refused_after_free(runtime, xp):
    dst, word = shmem.empty(4, dtype="float32"), shmem.empty(1, dtype="int64")
    view, src = dst[1:3], xp.zeros(4, "float32")
    warm(dst, src, word)
    shmem.put(view, src[:2], nxt())
    shmem.barrier()
    shmem.free(word)
    shmem.free(dst)
    with pytest.raises(shmem.StaleTensorError):
        shmem.put(dst, src, nxt())
    with pytest.raises(shmem.StaleTensorError):
        shmem.put(view, src[:2], nxt())
    with pytest.raises(shmem.StaleTensorError):
        shmem.get(src, dst, nxt())
    with pytest.raises(shmem.StaleTensorError):
        shmem.signal(word, 1, nxt())
    with pytest.raises(shmem.StaleTensorError):
        shmem.wait_signal(word, 1)
    # A new allocation may reuse the freed address: the old tensor stays stale.
    again = shmem.empty(4, dtype="float32")
    with pytest.raises(shmem.StaleTensorError):
        shmem.put(dst, src, nxt())
    shmem.barrier()
    shmem.free(again)


def test_stale_tensors_are_refused_after_restart(runtime, xp):
    dst, word = shmem.empty(4, dtype="float32"), shmem.empty(1, dtype="int64")
    src = xp.zeros(4, "float32")
    warm(dst, src, word)
    shmem.barrier()
    result = shmem.restart(
        heap_size_bytes=4 * MIB,
        replacements=[
            AllocationReplacement(t, AllocationSpec.like(t), preserve=True) for t in (dst, word)
        ],
    )
    with pytest.raises(shmem.StaleTensorError):
        shmem.put(dst, src, nxt())
    with pytest.raises(shmem.StaleTensorError):
        shmem.signal(word, 1, nxt())
    new_dst, new_word = result.tensors
    warm(new_dst, src, new_word)
    shmem.barrier()
    shmem.free(new_word)
    shmem.free(new_dst)


def test_foreign_tensors_dtypes_and_sizes_are_checked_after_warming(runtime, xp):
    dst, word = shmem.empty(4, dtype="float32"), shmem.empty(1, dtype="int64")
    src = xp.zeros(4, "float32")
    warm(dst, src, word)
    with pytest.raises(ValueError, match="symmetric tensor"):
        shmem.put(src, dst, nxt())  # a process-private tensor is not a symmetric one
    with pytest.raises(ValueError, match="symmetric tensor"):
        shmem.signal(src, 1, nxt())
    with pytest.raises(TypeError, match="dtypes differ"):
        shmem.put(dst, xp.zeros(4, "float64"), nxt())
    with pytest.raises(shmem.InvalidArgumentError, match="byte-count mismatch"):
        shmem.put(dst, src[:3], nxt())
    with pytest.raises(ValueError, match="does not fit"):
        shmem.signal(word, 2**64, nxt())
    with pytest.raises(ValueError, match="target_pe must be non-negative"):
        shmem.put(dst, src, -1)
    shmem.barrier()
    shmem.free(word)
    shmem.free(dst)


@needs_torch
def test_in_place_metadata_changes_are_noticed(runtime, xp):
    import torch

    whole = shmem.empty(3, 2, dtype="float32")
    grid = whole[...]  # a view: the registered tensor itself stays as empty() made it
    src = torch.zeros(3, 2)
    shmem.put(grid, src, nxt())
    shmem.put(grid, src, nxt())
    grid.t_()  # same object, same data pointer, now not contiguous
    with pytest.raises(ValueError, match="contiguous"):
        shmem.put(grid, src.t(), nxt())
    grid.t_()
    shmem.put(grid, src, nxt())
    private = torch.zeros(3, 2)
    grid.set_(private.untyped_storage(), 0, (3, 2))  # now views process-private memory
    with pytest.raises(ValueError, match="symmetric tensor"):
        shmem.put(grid, src, nxt())
    src.resize_(5)  # a local source that shrinks is a new byte count
    data = shmem.empty(6, dtype="float32")
    shmem.put(data, torch.zeros(6), nxt())
    with pytest.raises(shmem.InvalidArgumentError, match="byte-count mismatch"):
        shmem.put(data, src, nxt())
    shmem.barrier()
    shmem.free(data)
    shmem.free(whole)


def test_a_consumers_tensor_needs_its_lease_on_the_fast_path(xp):
    root = shmem.SharedRoot()
    moe = root.reserve(ConsumerSpec("moe", "moe-dispatch", 2 * MIB, "dispatch"))
    root.activate()
    src = xp.zeros(4, "float32")
    with moe.lease():
        dst, word = moe.empty(4, dtype="float32"), moe.empty(1, dtype="int64")
        warm(dst, src, word)
        shmem.barrier()
    with pytest.raises(shmem.ShmemError, match="lease"):
        shmem.put(dst, src, nxt())
    with pytest.raises(shmem.ShmemError, match="lease"):
        shmem.signal(word, 1, nxt())
    with moe.lease():
        shmem.put(dst, src, nxt())
        shmem.barrier()
        moe.free(word)
        moe.free(dst)
    moe.close()
    root.close()
    assert shmem.reference_count() == 0


@needs_torch
def test_warmed_torch_tensors_are_checked_on_every_call_and_errors_move_nothing(runtime, xp):
    import torch

    dst, word = shmem.empty(4, dtype="float32"), shmem.empty(1, dtype="int64")
    src = torch.arange(4, dtype=torch.float32) + RANK
    warm(dst, src, word)
    shmem.barrier()
    shmem.signal(word, 7, nxt(), operation="add")
    shmem.put_signal(dst, src, word, 1, nxt(), operation="set")
    shmem.quiet()
    assert isinstance(shmem.atomic_fetch(word, RANK), int)
    shmem.barrier()
    assert shmem.wait_signal(word, 0, comparison="ge") >= 0
    assert shmem.wait_signal(word, 0, comparison="ge", timeout=1.5) >= 0
    # Each misuse of a warmed tensor raises the precise error, and nothing is sent.
    wide = torch.zeros(4, dtype=torch.float64)
    before = src.clone()
    misuses = [
        (lambda: shmem.put(src, dst, nxt()), ValueError, "must be a symmetric tensor"),
        (lambda: shmem.put(dst, src, True), TypeError, "target_pe must be an integer, not a bool"),
        (lambda: shmem.put(dst, src, -1), ValueError, "target_pe must be non-negative, not -1"),
        (lambda: shmem.put(dst, torch.zeros(4, dtype=torch.int32), nxt()), TypeError, "dtypes"),
        (lambda: shmem.get(wide, dst, nxt()), TypeError, r"get: dtypes differ \(float64 and"),
        (lambda: shmem.signal(dst, 1, nxt()), TypeError, "int32, uint32, int64 or uint64"),
        (lambda: shmem.signal(word, 2**64, nxt()), ValueError, "value 18446744073709551616 does"),
        (lambda: shmem.signal(word, 1, nxt(), operation="or"), ValueError, "one of \\('set'"),
        (lambda: shmem.signal(word, 1.0, nxt()), TypeError, "value must be an integer, not float"),
        (lambda: shmem.wait_signal(word, 0, timeout=-1.0), ValueError, "non-negative, not -1.0"),
        (lambda: shmem.wait_signal(word, 0, timeout=True), TypeError, "number of seconds"),
        (lambda: shmem.atomic_add(word, 1, "0"), TypeError, "pe must be an integer, not str"),
    ]
    for call, kind, message in misuses:
        with pytest.raises(kind, match=message):
            call()
    assert torch.equal(src, before)
    shmem.barrier()
    shmem.free(word)
    shmem.free(dst)


@needs_torch
def test_a_data_assignment_that_keeps_the_pointer_is_noticed(runtime, xp):
    import torch

    whole = shmem.empty(3, 2, dtype="float32")
    grid = whole[...]
    src, word = torch.zeros(3, 2), shmem.empty(1, dtype="int64")
    warm(grid, src, word)
    # Same object, data pointer, dtype and size, but transposed: no version bump, no new id.
    grid.data = whole.t()
    with pytest.raises(ValueError, match="contiguous"):
        shmem.put(grid, src.t(), nxt())
    shmem.barrier()
    shmem.free(word)
    shmem.free(whole)


@needs_torch
def test_handles_of_dead_views_are_forgotten(runtime, xp):
    import torch

    dst = shmem.empty(64, dtype="float32")
    src = torch.zeros(1)
    shmem.put(dst[0:1], src, nxt())
    baseline = _native.remembered()
    for i in range(500):
        shmem.put(dst[i % 64 : i % 64 + 1], src, nxt())  # a new view object per call
    assert _native.remembered() <= baseline + 2
    shmem.barrier()
    shmem.free(dst)


@needs_torch
def test_free_of_a_tensor_changed_in_place_is_refused_and_frees_nothing(runtime, xp):
    # free's native path takes a plain tensor only: one whose data pointer and size are still
    # its allocation's. A tensor shrunk or moved in place since is refused with the full path's
    # error (a view), and the allocation stays live until the tensor is whole again.
    data = shmem.empty(8, dtype="float32")
    data.resize_(4)
    with pytest.raises(ValueError, match="view cannot be freed"):
        shmem.free(data)
    data.set_(data.untyped_storage(), 1, (7,))
    with pytest.raises(ValueError, match="view cannot be freed"):
        shmem.free(data)
    assert shmem.debug_state()["heap"]["allocation_count"] == 1
    data.set_(data.untyped_storage(), 0, (8,))
    shmem.free(data)
    assert shmem.debug_state()["heap"]["allocation_count"] == 0
    with pytest.raises(shmem.StaleTensorError, match="double free"):
        shmem.free(data)


@needs_torch
def test_a_tensor_that_share_memory_moved_out_of_the_heap_is_refused_yet_freed(runtime, xp):
    import torch

    data = shmem.empty(16, dtype="float32")
    data.share_memory_()  # torch copies the storage's bytes into new shared memory
    # No longer a view of the heap: refused as a target, as any private tensor is ...
    with pytest.raises(ValueError, match="must be a symmetric tensor"):
        shmem.put(data, torch.zeros(16), nxt())
    # ... yet still the tensor empty() returned, so free frees its allocation (and a release
    # is not refused for an allocation nobody can name any more).
    shmem.free(data)
    assert shmem.debug_state()["heap"]["allocation_count"] == 0
