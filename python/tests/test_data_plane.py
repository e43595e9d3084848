"""empty / free / put / get / signals / atomics, zero-copy views, and stale tensors."""

from __future__ import annotations

import gc

import numpy as np
import pytest
from conftest import RANK, TORCH, WORLD, gather_text, needs_torch, normalized
from hyper_multicore import _native, shmem

if TORCH:
    import torch

ALL_DTYPES = [
    "bool", "uint8", "int8", "int16", "float16", "int32", "float32", "int64", "float64",
    "uint16", "uint32", "uint64",
]  # fmt: skip


def nxt() -> int:
    return (RANK + 1) % WORLD


def prv() -> int:
    return (RANK - 1) % WORLD


# -- empty ---------------------------------------------------------------------------------------


def test_empty_follows_torch_size_conventions(runtime, xp):
    shapes = [
        ((2, 3), (2, 3)),
        (((2, 3),), (2, 3)),
        (([2, 3],), (2, 3)),
        ((np.int64(4),), (4,)),
        (((),), ()),
        ((0,), (0,)),
        ((3, 0, 2), (3, 0, 2)),
    ]
    if TORCH:
        shapes += [((torch.Size([5, 1]),), (5, 1)), ((torch.tensor(3),), (3,))]
    for args, shape in shapes:
        tensor = shmem.empty(*args)
        assert tuple(tensor.shape) == shape, args
        assert xp.dtype_name(tensor) == "float32"
        shmem.free(tensor)
    for bad in [(True,), ((2, False),), (2.0,), ("3",), ()]:
        with pytest.raises(TypeError):
            shmem.empty(*bad)
    with pytest.raises(ValueError, match="negative"):
        shmem.empty(2, -1)


@needs_torch
def test_empty_uses_torch_default_dtype(runtime):
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        tensor = shmem.empty(3)
    finally:
        torch.set_default_dtype(previous)
    assert tensor.dtype == torch.float64
    assert isinstance(tensor, torch.Tensor) and tensor.device.type == "cpu"
    shmem.free(tensor)


def test_every_dtype_and_alignment(runtime, xp):
    for name in ALL_DTYPES:
        tensor = shmem.empty(5, dtype=name)
        assert xp.dtype_name(tensor) == name
        other = shmem.empty(2, dtype=xp.dtype(name))
        assert xp.dtype_name(other) == name
        shmem.free(other)
        shmem.free(tensor)
    for alignment in [None, 0, 16, 256, 4096, 1 << 21]:
        tensor = shmem.empty(3, dtype="uint8", alignment=alignment)
        assert xp.data_ptr(tensor) % (alignment or 64) == 0
        shmem.free(tensor)
    with pytest.raises(TypeError):
        shmem.empty(3, alignment=True)
    with pytest.raises(TypeError):
        shmem.empty(3, dtype="complex64")
    with pytest.raises(shmem.InvalidArgumentError, match="power of two"):
        shmem.empty(3, alignment=48)
    assert shmem.debug_state()["heap"]["allocation_count"] == 0


def test_tensors_view_the_heap_without_copies(runtime, xp):
    tensor = shmem.empty(4, 8, dtype="int32")
    state = shmem.debug_state()
    (summary,) = state["allocations"]
    assert summary["base_address"] == xp.data_ptr(tensor)
    assert summary["bytes"] == 4 * 8 * 4
    # A local write is what a peer's get sees.
    xp.fill(tensor, RANK + 10)
    shmem.barrier()
    seen = xp.zeros((4, 8), "int32")
    shmem.get(seen, tensor, nxt())
    assert xp.tolist(seen) == [[nxt() + 10] * 8] * 4
    shmem.barrier()
    shmem.free(tensor)


# -- put / get -----------------------------------------------------------------------------------


def test_put_and_get_around_a_ring_with_views(runtime, xp):
    data = shmem.empty(10, dtype="float64")
    xp.fill(data, -1)
    shmem.barrier()
    # A view of the allocation is an RMA target: its offset comes from its address.
    shmem.put(data[2:5], xp.arange(3, "float64", start=RANK * 100), nxt())
    shmem.barrier()
    expected = [-1.0] * 10
    expected[2:5] = [prv() * 100.0 + i for i in range(3)]
    assert xp.tolist(data) == expected
    # get from a view into a local view, and into a symmetric view of this PE.
    local = xp.zeros(4, "float64")
    shmem.get(local[1:4], data[2:5], nxt())
    assert xp.tolist(local) == [0.0] + [RANK * 100.0 + i for i in range(3)]
    shmem.get(data[7:10], data[2:5], nxt())
    assert xp.tolist(data[7:10]) == [RANK * 100.0 + i for i in range(3)]
    # put from a symmetric source.
    shmem.barrier()
    shmem.put(data[0:2], data[7:9], nxt())
    shmem.barrier()
    assert xp.tolist(data[0:2]) == [prv() * 100.0, prv() * 100.0 + 1]
    shmem.barrier()
    shmem.free(data)


def moved_and_bounced() -> tuple[int, int]:
    """The bytes this process's data plane has moved, and copied through private buffers."""
    count = _native.copy_count()
    assert count is not None, "the extension was built without fault-injection"
    return count


@pytest.mark.skipif(
    not _native.FAULT_INJECTION, reason="the extension was built without fault-injection"
)
def test_heap_to_heap_put_get_and_put_signal_move_the_bytes_once(runtime, xp):
    n = 8192
    source = shmem.empty(n, dtype="float64")
    target = shmem.empty(n, dtype="float64")
    scratch = shmem.empty(n + 16, dtype="float64")
    flag = shmem.empty(1, dtype="uint64")
    source[:] = xp.arange(n, "float64", start=RANK * 100_000)
    xp.fill(flag, 0)
    shmem.barrier()

    def once(call, *args, **kwargs):
        moved, bounced = moved_and_bounced()
        call(*args, **kwargs)
        after = moved_and_bounced()
        assert (after[0] - moved, after[1] - bounced) == (8 * n, 0), call.__name__

    def pattern(rank: int) -> list[float]:
        return [rank * 100_000.0 + i for i in range(n)]

    once(shmem.put, target, source, nxt())
    shmem.barrier()
    assert xp.tolist(target) == pattern(prv())
    shmem.barrier()
    once(shmem.get, target, source, nxt())
    assert xp.tolist(target) == pattern(nxt())
    shmem.barrier()
    once(shmem.put_signal, target, source, flag, 1, nxt())
    assert shmem.wait_signal(flag, 1) == 1
    assert xp.tolist(target) == pattern(prv())
    # Overlapping on this PE, both ways: as a copy through a temporary leaves them.
    for put, (to, frm) in [(True, (16, 0)), (True, (0, 16)), (False, (7, 0)), (False, (0, 7))]:
        scratch[:] = xp.arange(n + 16, "float64", start=RANK)
        expected = xp.tolist(scratch)
        expected[to : to + n] = expected[frm : frm + n]
        if put:
            once(shmem.put, scratch[to : to + n], scratch[frm : frm + n], RANK)
        else:
            once(shmem.get, scratch[to : to + n], scratch[frm : frm + n], RANK)
        assert xp.tolist(scratch) == expected, (put, to, frm)
    shmem.barrier()
    for tensor in (flag, scratch, target, source):
        shmem.free(tensor)


def test_put_and_get_check_their_arguments(runtime, xp):
    data = shmem.empty(8, dtype="float32")
    with pytest.raises(TypeError, match="dtypes differ"):
        shmem.put(data, xp.zeros(8, "float64"), 0)
    with pytest.raises(shmem.InvalidArgumentError, match="byte-count mismatch"):
        shmem.put(data, xp.zeros(7, "float32"), 0)
    with pytest.raises(shmem.InvalidArgumentError, match="out of range"):
        shmem.put(data, xp.zeros(8, "float32"), WORLD)
    with pytest.raises(ValueError, match="non-negative"):
        shmem.get(xp.zeros(8, "float32"), data, -1)
    with pytest.raises(TypeError):
        shmem.put(data, xp.zeros(8, "float32"), True)
    with pytest.raises(ValueError, match="symmetric tensor"):
        shmem.put(xp.zeros(8, "float32"), data, 0)
    with pytest.raises(ValueError, match="contiguous"):
        shmem.put(data[::2], xp.zeros(4, "float32"), 0)
    with pytest.raises(TypeError):
        shmem.put(data, [0.0] * 8, 0)
    if not TORCH:
        readonly = np.zeros(8, dtype="float32")
        readonly.flags.writeable = False
        with pytest.raises(ValueError, match="read-only"):
            shmem.get(readonly, data, 0)
    shmem.free(data)


@needs_torch
def test_numpy_arrays_are_local_buffers_in_torch_mode(runtime):
    data = shmem.empty(4, dtype=torch.int64)
    data.fill_(RANK)
    shmem.barrier()
    out = np.zeros(4, dtype=np.int64)
    shmem.get(out, data, nxt())
    assert out.tolist() == [nxt()] * 4
    shmem.barrier()
    shmem.free(data)


def _aliases_of(heap_tensor, nbytes: int) -> list:
    """Local-looking objects over a symmetric tensor's memory, which Python cannot tell from a
    private array: a NumPy view through torch, a foreign array over the same address."""
    import ctypes

    address = heap_tensor.data_ptr() if TORCH else heap_tensor.__array_interface__["data"][0]
    raw = (ctypes.c_ubyte * nbytes).from_address(address)
    aliases = [np.frombuffer(raw, dtype=np.int64)]
    if TORCH:
        aliases.append(heap_tensor.numpy())
    return aliases


def test_a_symmetric_tensor_seen_through_numpy_is_not_a_local_buffer(runtime, xp):
    """Issue 9, item 11: the runtime (in Rust) refuses a local buffer that lies in the heap, so
    no slice is ever formed over memory that other PEs write."""
    data = shmem.empty(4, dtype="int64")
    target = shmem.empty(4, dtype="int64")
    xp.fill(data, RANK)
    shmem.barrier()
    for alias in _aliases_of(data, 32):
        with pytest.raises(ValueError, match="use the symmetric tensor itself"):
            shmem.put(target, alias, nxt())
        with pytest.raises(ValueError, match="use the symmetric tensor itself"):
            shmem.get(alias, target, nxt())
    # The tensor itself is fine.
    shmem.put(target, data, nxt())
    shmem.barrier()
    assert xp.tolist(target) == [prv()] * 4
    shmem.barrier()
    shmem.free(target)
    shmem.free(data)


# -- signals -------------------------------------------------------------------------------------


def test_signals_put_signal_and_wait_comparisons(runtime, xp):
    data = shmem.empty(16, dtype="int64")
    flag = shmem.empty(1, dtype="uint64")
    counter = shmem.empty(1, dtype="int32")
    xp.fill(flag, 0)
    xp.fill(counter, 0)
    shmem.barrier()
    shmem.put_signal(data, xp.full(16, RANK, "int64"), flag, 7, nxt())
    assert shmem.wait_signal(flag, 7) == 7
    assert xp.tolist(data) == [prv()] * 16
    for pe in range(WORLD):
        shmem.signal(counter, 1, pe, operation="add")
    assert shmem.wait_signal(counter, WORLD, comparison="ge") >= WORLD
    assert shmem.wait_signal(counter, 0, comparison="gt") == WORLD
    assert shmem.wait_signal(counter, WORLD + 1, comparison="lt") == WORLD
    assert shmem.wait_signal(counter, WORLD, comparison="le") == WORLD
    assert shmem.wait_signal(counter, 0, comparison="ne") == WORLD
    shmem.barrier()
    shmem.signal(flag, 0, RANK)  # set on this PE
    assert shmem.wait_signal(flag, 0, comparison="eq", timeout=1) == 0
    shmem.barrier()
    shmem.free(counter)
    shmem.free(flag)
    shmem.free(data)


def test_signal_arguments_are_checked(runtime, xp):
    flag = shmem.empty(1, dtype="int32")
    words = shmem.empty(2, dtype="int64")
    floats = shmem.empty(1, dtype="float32")
    xp.fill(flag, 0)
    with pytest.raises(shmem.WaitTimeoutError, match="timed out") as caught:
        shmem.wait_signal(flag, 1, timeout=0.2)
    assert caught.value.kind == "timeout"
    with pytest.raises(ValueError, match="one element"):
        shmem.signal(words, 1, 0)
    with pytest.raises(TypeError, match="int32, uint32, int64 or uint64"):
        shmem.signal(floats, 1, 0)
    with pytest.raises(ValueError, match="operation"):
        shmem.signal(flag, 1, 0, operation="xor")
    with pytest.raises(ValueError, match="comparison"):
        shmem.wait_signal(flag, 1, comparison="==")
    with pytest.raises(ValueError, match="does not fit"):
        shmem.signal(flag, 2**31, 0)
    with pytest.raises(TypeError):
        shmem.signal(flag, True, 0)
    with pytest.raises(ValueError, match="non-negative"):
        shmem.wait_signal(flag, 0, timeout=-1)
    # A view of one word of a larger allocation is a signal word too.
    xp.fill(words, 0)
    shmem.signal(words[1:2], 5, RANK)
    assert xp.tolist(words) == [0, 5]
    shmem.barrier()
    for tensor in (floats, words, flag):
        shmem.free(tensor)


# -- atomics -------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["int32", "uint32", "int64", "uint64"])
def test_atomics(runtime, xp, dtype):
    word = shmem.empty(1, dtype=dtype)
    xp.fill(word, 0)
    shmem.barrier()
    # Every PE adds to PE 0's word, once with fetch_add and once with add.
    previous = shmem.atomic_fetch_add(word, 2, 0)
    assert 0 <= previous <= 3 * (WORLD - 1)
    shmem.atomic_add(word, 1, 0)
    shmem.barrier()
    assert shmem.atomic_fetch(word, 0) == 3 * WORLD
    shmem.barrier()
    # Exactly one PE wins the compare-and-swap.
    won = shmem.atomic_compare_swap(word, 3 * WORLD, 1000 + RANK, 0) == 3 * WORLD
    winners = gather_text("won" if won else "lost")
    assert winners.count("won") == 1
    shmem.barrier()
    if RANK == 0:
        assert shmem.atomic_fetch(word, 0) == 1000 + winners.index("won")
        assert shmem.atomic_swap(word, 9, 0) == 1000 + winners.index("won")
        shmem.atomic_set(word, 42, 0)
        assert shmem.atomic_fetch(word, 0) == 42
        assert xp.tolist(word) == [42]
    shmem.barrier()
    with pytest.raises(ValueError, match="does not fit"):
        shmem.atomic_set(word, -1 if dtype.startswith("u") else 2**64, 0)
    shmem.free(word)


# -- free and stale tensors ----------------------------------------------------------------------


def test_free_rejects_views_foreign_and_freed_tensors(runtime, xp):
    data = shmem.empty(8)
    with pytest.raises(ValueError, match="view cannot be freed"):
        shmem.free(data[2:4])
    with pytest.raises(ValueError, match="made by empty"):
        shmem.free(xp.zeros(8))
    with pytest.raises(TypeError):
        shmem.free("data")
    shmem.free(data)
    with pytest.raises(shmem.StaleTensorError, match="double free"):
        shmem.free(data)
    assert shmem.debug_state()["heap"]["allocation_count"] == 0


def test_a_freed_tensor_is_rejected_by_every_operation(runtime, xp):
    stale = shmem.empty(WORLD * 2, dtype="int64")
    view = stale[0:1]
    live = shmem.empty(WORLD * 2, dtype="int64")
    xp.fill(live, 0)
    shmem.free(stale)
    # The memory stays mapped: reading or writing a stale tensor never crashes the interpreter.
    xp.fill(stale, 3)
    assert xp.tolist(view) == [3]
    local = xp.zeros(WORLD * 2, "int64")
    calls = {
        "put": lambda: shmem.put(stale, local, 0),
        "put src": lambda: shmem.put(live, stale, 0),
        "get": lambda: shmem.get(local, stale, 0),
        "get dst": lambda: shmem.get(stale, live, 0),
        "put_signal": lambda: shmem.put_signal(live, local, view, 1, 0),
        "signal": lambda: shmem.signal(view, 1, 0),
        "wait_signal": lambda: shmem.wait_signal(view, 1),
        "atomic_fetch": lambda: shmem.atomic_fetch(view, 0),
        "atomic_set": lambda: shmem.atomic_set(view, 1, 0),
        "atomic_swap": lambda: shmem.atomic_swap(view, 1, 0),
        "atomic_compare_swap": lambda: shmem.atomic_compare_swap(view, 0, 1, 0),
        "atomic_fetch_add": lambda: shmem.atomic_fetch_add(view, 1, 0),
        "atomic_add": lambda: shmem.atomic_add(view, 1, 0),
        "all_gather": lambda: shmem.all_gather(stale, local[:2]),
        "all_gather input": lambda: shmem.all_gather(live, stale[:2]),
        "broadcast": lambda: shmem.broadcast(stale, local, 0),
        "all_to_all": lambda: shmem.all_to_all(stale, local),
        "all_reduce": lambda: shmem.all_reduce(stale, live),
        "all_reduce input": lambda: shmem.all_reduce(live, stale),
        "free": lambda: shmem.free(stale),
        "free view": lambda: shmem.free(view),
    }
    for name, call in calls.items():
        try:
            call()
        except shmem.StaleTensorError:
            continue
        pytest.fail(f"{name} accepted a freed tensor")
    # Nothing moved, every rank is still in step.
    shmem.barrier()
    assert xp.tolist(live) == [0] * (WORLD * 2)
    shmem.free(live)
    gc.collect()


@needs_torch
def test_a_freed_tensor_is_known_as_stale_until_its_last_view_dies(runtime):
    from hyper_multicore.shmem import _registry

    tensor = shmem.empty(4, dtype="int64")
    key = tensor.untyped_storage()._cdata
    view = tensor[1:2]
    shmem.free(tensor)
    del tensor
    gc.collect()
    # The view keeps the storage alive: it is still a stale tensor of the heap, not a foreign one.
    assert key in _registry._by_storage
    with pytest.raises(shmem.StaleTensorError):
        shmem.signal(view, 1, 0)
    del view
    gc.collect()
    # The storage died: its entry went with it (its key may now be reused by any tensor).
    assert key not in _registry._by_storage


@needs_torch
def test_a_heap_storage_released_inside_autograd_drops_its_entry(runtime):
    from hyper_multicore.shmem import _registry

    tensor = shmem.empty(4, dtype=torch.float32)
    tensor.fill_(2.0)
    key = tensor.untyped_storage()._cdata
    weights = torch.ones(4, requires_grad=True)
    total = (weights * tensor).sum()  # the graph saves the heap tensor for backward
    shmem.free(tensor)
    del tensor
    gc.collect()
    assert key in _registry._by_storage
    # The engine releases saved tensors as it goes, in torch's C++ code: the storage dies there,
    # and its entry must go with it.
    total.backward()
    assert weights.grad.tolist() == [2.0] * 4
    assert key not in _registry._by_storage


@needs_torch
def test_a_registered_shape_must_fit_its_allocation(runtime):
    from hyper_multicore import _native
    from hyper_multicore.shmem import _registry

    exported = _native.allocate([4], "uint8")
    neighbour = shmem.empty(1024, dtype=torch.uint8)
    neighbour.zero_()
    # A tensor wider than its allocation would let torch write over the neighbour.
    with pytest.raises(ValueError, match="does not fit in the 4 bytes of its allocation"):
        _registry._register(exported, (4096,), "uint8")
    assert int(neighbour.sum()) == 0
    _native.free_allocation(exported[0], exported[1])
    shmem.free(neighbour)


def test_shmem_empty_and_free_pickle_by_reference():
    # (spawn-mode multiprocessing sends functions, and partials of them, by reference)
    import functools
    import pickle

    for function in (shmem.empty, shmem.free):
        assert pickle.loads(pickle.dumps(function)) is function
    assert pickle.loads(pickle.dumps(functools.partial(shmem.empty, 4))).func is shmem.empty


def test_stale_tensors_survive_release(xp):
    shmem.acquire(heap_size_bytes=1 << 20)
    tensor = shmem.empty(1024, dtype="uint8")
    xp.fill(tensor, 7)
    view = tensor[10:20]
    shmem.free(tensor)
    shmem.release()
    # The runtime is gone, the mapping stays as long as the views do.
    assert xp.tolist(view) == [7] * 10
    xp.fill(view, 1)
    with pytest.raises(shmem.StaleTensorError):
        shmem.put(view, xp.zeros(10, "uint8"), 0)
    del tensor, view
    gc.collect()


def test_the_heap_stays_mapped_under_a_view_whatever_becomes_of_its_record(xp):
    from hyper_multicore.shmem import _registry

    shmem.acquire(heap_size_bytes=1 << 20)
    tensor = shmem.empty(1024, dtype="uint8")
    xp.fill(tensor, 7)
    view = tensor[10:20]
    allocation = _registry._lookup(tensor)
    shmem.free(tensor)
    shmem.release()
    del tensor
    # Only the view's own weak reference may keep the mapping: losing the registry's record of
    # the allocation (here by hand) must not unmap memory the view still reads (a fault, once).
    for key in [k for k, a in _registry._by_storage.items() if a is allocation]:
        del _registry._by_storage[key]
    del allocation
    gc.collect()
    assert xp.tolist(view) == [7] * 10
    del view
    gc.collect()


@pytest.mark.skipif(TORCH, reason="NumPy arrays only")
def test_an_array_made_from_a_heap_arrays_base_keeps_the_heap_mapped():
    shmem.acquire(heap_size_bytes=1 << 20)
    array = shmem.empty(16, dtype="float32")
    array[:] = 7
    # The root of a heap array's base chain, and what NumPy makes of it, must keep the memory
    # mapped like the array itself: a memoryview there would share a buffer that outlived it.
    derived = np.asarray(array.base)
    shmem.free(array)
    shmem.release()
    del array
    gc.collect()
    assert derived.view(np.float32)[:2].tolist() == [7.0, 7.0]
    with pytest.raises(TypeError):
        memoryview(derived.base)
    del derived
    gc.collect()


@pytest.mark.skipif(WORLD < 2, reason="needs 2 ranks")
def test_freeing_different_tensors_fails_on_every_rank(runtime):
    a = shmem.empty(4)
    b = shmem.empty(4)
    with pytest.raises(shmem.InvalidArgumentError, match="differ across ranks") as caught:
        shmem.free(a if RANK == 0 else b)
    assert len(set(gather_text(normalized(str(caught.value))))) == 1
    # Nothing was freed; the same call on every rank works.
    assert shmem.debug_state()["heap"]["allocation_count"] == 2
    shmem.free(a)
    shmem.free(b)


@pytest.mark.skipif(WORLD < 2, reason="needs 2 ranks")
def test_one_rank_freeing_a_stale_tensor_fails_every_rank_at_once(runtime):
    a = shmem.empty(4)
    stale = shmem.empty(4)
    shmem.free(stale)
    if RANK == 0:
        with pytest.raises(shmem.StaleTensorError) as caught:
            shmem.free(stale)
        assert isinstance(caught.value.__cause__, shmem.InvalidArgumentError)
    else:
        with pytest.raises(shmem.InvalidArgumentError, match="differ across ranks"):
            shmem.free(a)
    shmem.free(a)


# -- quiet / fence -------------------------------------------------------------------------------


def test_quiet_and_fence(runtime, xp):
    data = shmem.empty(2, dtype="int64")
    xp.fill(data, 0)
    shmem.barrier()
    shmem.put(data[0:1], xp.full(1, 1, "int64"), nxt())
    shmem.fence()
    shmem.put(data[1:2], xp.full(1, 2, "int64"), nxt())
    shmem.quiet()
    shmem.barrier()
    assert xp.tolist(data) == [1, 2]
    shmem.free(data)
