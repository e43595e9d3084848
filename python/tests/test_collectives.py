"""barrier / all_gather / broadcast / all_to_all / all_reduce, and mismatched collective calls."""

from __future__ import annotations

import importlib.util

import pytest
from conftest import RANK, TORCH, WORLD, gather_text, normalized
from hyper_multicore import shmem


def test_barrier_makes_puts_visible(runtime, xp):
    slots = shmem.empty(WORLD, dtype="int32")
    xp.fill(slots, -1)
    shmem.barrier()
    for pe in range(WORLD):
        shmem.put(slots[RANK : RANK + 1], xp.full(1, RANK * 10, "int32"), pe)
    shmem.barrier()
    assert xp.tolist(slots) == [pe * 10 for pe in range(WORLD)]
    shmem.host_barrier()
    shmem.free(slots)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int64", "uint8"])
def test_all_gather(runtime, xp, dtype):
    if dtype == "bfloat16" and xp.name == "numpy":
        pytest.skip("NumPy has no bfloat16")
    output = shmem.empty(WORLD, 3, dtype=dtype)
    shmem.all_gather(output, xp.arange(3, dtype, start=RANK * 3))
    assert xp.tolist(output) == [[pe * 3 + i for i in range(3)] for pe in range(WORLD)]
    # From a symmetric input (a view), and a zero-element no-op.
    source = shmem.empty(4, dtype=dtype)
    xp.fill(source, RANK + 1)
    shmem.barrier()
    shmem.all_gather(output, source[1:4])
    assert xp.tolist(output) == [[pe + 1] * 3 for pe in range(WORLD)]
    empty_out = shmem.empty(0, dtype=dtype)
    shmem.all_gather(empty_out, xp.zeros(0, dtype))
    with pytest.raises(ValueError, match="need"):
        shmem.all_gather(output, xp.zeros(2, dtype))
    with pytest.raises(TypeError, match="dtypes differ"):
        shmem.all_gather(output, xp.zeros(3, "int32" if dtype != "int32" else "int64"))
    for tensor in (empty_out, source, output):
        shmem.free(tensor)


def test_broadcast_from_every_root(runtime, xp):
    target = shmem.empty(5, dtype="int64")
    for root in range(WORLD):
        source = xp.arange(5, "int64", start=root * 100) if RANK == root else None
        shmem.broadcast(target, source, root)
        assert xp.tolist(target) == [root * 100 + i for i in range(5)]
        shmem.barrier()
    with pytest.raises(shmem.InvalidArgumentError, match="is not one of the"):
        shmem.broadcast(target, None, WORLD)
    shmem.free(target)


def test_all_to_all(runtime, xp):
    block = 2
    output = shmem.empty(WORLD * block, dtype="int32")
    source = xp.arange(WORLD * block, "int32", start=RANK * 1000)
    shmem.all_to_all(output, source)
    expected = []
    for pe in range(WORLD):
        expected += [pe * 1000 + RANK * block + i for i in range(block)]
    assert xp.tolist(output) == expected
    with pytest.raises(ValueError, match="multiple"):
        shmem.all_to_all(output, xp.zeros(WORLD * block + 1, "int32"))
    shmem.barrier()
    shmem.free(output)


@pytest.mark.parametrize("dtype", ["int32", "uint32", "int64", "uint64", "float32", "float64"])
def test_all_reduce(runtime, xp, dtype):
    values = shmem.empty(3, dtype=dtype)
    result = shmem.empty(3, dtype=dtype)
    values[:] = xp.arange(3, dtype, start=RANK + 1)
    shmem.barrier()
    shmem.all_reduce(result, values)
    total = sum(range(1, WORLD + 1))
    assert xp.tolist(result) == [total + i * WORLD for i in range(3)]
    shmem.all_reduce(result, values, op="min")
    assert xp.tolist(result) == [1, 2, 3]
    shmem.all_reduce(result, values, op="max")
    assert xp.tolist(result) == [WORLD, WORLD + 1, WORLD + 2]
    shmem.all_reduce(values, values, op="sum")  # in place
    assert xp.tolist(values) == [total + i * WORLD for i in range(3)]
    with pytest.raises(ValueError, match="op"):
        shmem.all_reduce(result, values, op="prod")
    with pytest.raises(ValueError, match="symmetric"):
        shmem.all_reduce(result, xp.zeros(3, dtype))
    shmem.barrier()
    shmem.free(result)
    shmem.free(values)


def test_all_reduce_rejects_unsupported_dtypes(runtime):
    halves = shmem.empty(2, dtype="float16")
    with pytest.raises(TypeError, match="all_reduce supports"):
        shmem.all_reduce(halves, halves)
    shmem.free(halves)


@pytest.mark.skipif(WORLD < 2, reason="needs 2 ranks")
@pytest.mark.parametrize(
    "mismatch",
    [
        lambda: shmem.empty(4 + RANK % 2),
        lambda: shmem.empty(4, dtype="int32" if RANK % 2 else "float32"),
        lambda: shmem.empty(4, alignment=64 << (RANK % 2)),
    ],
    ids=["shape", "dtype", "alignment"],
)
def test_mismatched_allocations_fail_alike_on_every_rank(runtime, mismatch):
    with pytest.raises(shmem.InvalidArgumentError, match="arguments differ across ranks") as caught:
        mismatch()
    message = normalized(str(caught.value))
    assert "nothing was allocated" in message
    # Every rank raised the same error, and the runtime is still in step.
    assert len(set(gather_text(message))) == 1, message
    assert shmem.debug_state()["heap"]["allocation_count"] == 0
    tensor = shmem.empty(4)
    shmem.free(tensor)


@pytest.mark.parametrize(
    "invalid",
    [
        pytest.param(lambda: shmem.empty(-1), id="negative"),
        pytest.param(lambda: shmem.empty(2**63, 0), id="too_large"),
        pytest.param(lambda: shmem.empty(0, 2**62, 4), id="strides_too_large"),
        pytest.param(lambda: shmem.empty(4, dtype="complex64"), id="dtype"),
        pytest.param(
            lambda: shmem.empty(4, dtype="bfloat16"),
            id="bfloat16_without_ml_dtypes",
            marks=pytest.mark.skipif(
                TORCH or importlib.util.find_spec("ml_dtypes") is not None,
                reason="bfloat16 is a dtype here",
            ),
        ),
        pytest.param(lambda: shmem.empty(4, alignment=-64), id="alignment"),
    ],
)
@pytest.mark.parametrize("ranks", ["one", "every"])
def test_invalid_empty_arguments_fail_at_once_on_every_rank(runtime, invalid, ranks):
    """A rank whose own ``empty`` arguments are invalid raises its own error and still takes
    part in the cross-rank check: the others fail at once (not at the deadline), and no rank
    allocates anything."""
    if ranks == "one" and RANK != 0:
        with pytest.raises(shmem.InvalidArgumentError, match="arguments differ across ranks"):
            shmem.empty(4)
    else:
        with pytest.raises((TypeError, ValueError, shmem.InvalidArgumentError)) as caught:
            invalid()
        if ranks == "one" and WORLD > 1:
            assert isinstance(caught.value.__cause__, shmem.InvalidArgumentError)
            assert "differ across ranks" in str(caught.value.__cause__)
    assert shmem.debug_state()["heap"]["allocation_count"] == 0
    # The runtime is still in step.
    tensor = shmem.empty(4)
    shmem.free(tensor)


def test_a_number_is_not_taken_for_a_dtype_named_before(runtime):
    """NumPy takes some numbers for dtypes (``np.dtype(np.float16(1.0))`` is float16), and
    numbers equal each other (``np.float16(1.0) == 1 == True``): naming float16 that way must
    not make ``True`` a dtype."""
    np = pytest.importorskip("numpy")
    halves = shmem.empty(4, dtype=np.float16(1.0))
    assert "float16" in str(halves.dtype)
    with pytest.raises(TypeError, match="is not a dtype"):
        shmem.empty(4, dtype=True)
    shmem.free(halves)


def test_a_dtype_in_the_other_byte_order_is_refused(runtime):
    """The heap holds native values: a NumPy dtype of the other byte order is refused, not
    taken for its native twin."""
    np = pytest.importorskip("numpy")
    foreign = np.dtype("float32").newbyteorder("S")
    with pytest.raises(TypeError, match="byte order"):
        shmem.empty(4, dtype=foreign)
    assert shmem.debug_state()["heap"]["allocation_count"] == 0
