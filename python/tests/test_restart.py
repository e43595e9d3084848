"""restart: new heap, replaced allocations of several dtypes, stage timings, and its failures."""

from __future__ import annotations

import dataclasses

import pytest
from conftest import HEAP, RANK, TORCH, WORLD, gather_text, normalized
from hyper_multicore import shmem
from hyper_multicore.shmem import AllocationReplacement, AllocationSpec


def replace(tensor, shape, dtype, alignment=None) -> AllocationReplacement:
    return AllocationReplacement(tensor, AllocationSpec(shape, dtype, alignment))


def test_restart_replaces_float32_bfloat16_and_int64_tensors(runtime, xp):
    floats = shmem.empty(4, 4, dtype="float32")
    ints = shmem.empty(10, dtype="int64")
    old_view = floats[1]
    xp.fill(floats, 1.5)
    hook_calls = []

    def hook():
        # The hook may look at the runtime; its value must be equal on every rank.
        hook_calls.append(shmem.debug_state()["heap"]["allocation_count"])
        return {"step": 12, "experts": [0, 1, 2]}

    bf16 = "bfloat16" if TORCH else "float16"  # NumPy has no bfloat16
    result = shmem.restart(
        heap_size_bytes=HEAP * 2,
        replacements=[
            replace(ints, (3, 5), "int64"),
            replace(floats, (32,), bf16, 4096),
        ],
        preflight_hook=hook,
    )
    assert hook_calls == [2]
    assert isinstance(result, shmem.RestartResult)
    assert tuple(result.stages_ms) == shmem.STAGE_KEYS
    assert all(value >= 0 for value in result.stages_ms.values())
    new_ints, new_halves = result.tensors
    assert tuple(new_ints.shape) == (3, 5) and xp.dtype_name(new_ints) == "int64"
    assert tuple(new_halves.shape) == (32,) and xp.dtype_name(new_halves) == bf16
    assert xp.data_ptr(new_halves) % 4096 == 0
    # Fresh heap: zero-filled, new size, the old tensors stale but readable.
    assert xp.tolist(new_ints) == [[0] * 5] * 3
    state = shmem.debug_state()
    assert state["config"]["heap_size"] == HEAP * 2
    assert [a["id"] for a in state["allocations"]] == [0, 1]
    assert xp.tolist(old_view) == [1.5] * 4
    with pytest.raises(shmem.StaleTensorError):
        shmem.put(floats, xp.zeros((4, 4)), 0)
    with pytest.raises(shmem.StaleTensorError):
        shmem.free(ints)
    # The new tensors work like any other.
    gathered = shmem.empty(WORLD, 2, dtype="int64")
    shmem.all_gather(gathered, xp.full(2, RANK, "int64"))
    assert xp.tolist(gathered) == [[pe, pe] for pe in range(WORLD)]
    shmem.put(new_halves[:4], xp.full(4, 2.0, bf16), (RANK + 1) % WORLD)
    shmem.barrier()
    assert xp.tolist(new_halves[:4]) == [2.0] * 4
    for tensor in (gathered, new_halves, new_ints):
        shmem.free(tensor)


def test_restart_without_allocations_only_resizes(runtime):
    result = shmem.restart(heap_size_bytes=HEAP // 2, replacements=[])
    assert result.tensors == ()
    assert shmem.debug_state()["config"]["heap_size"] == HEAP // 2


def test_malformed_specs_and_replacements_are_refused_when_made(runtime):
    tensor = shmem.empty(4)
    with pytest.raises(TypeError):
        AllocationReplacement(tensor, (4,))
    with pytest.raises(TypeError):
        AllocationReplacement([1.0], AllocationSpec((4,), "float32"))
    with pytest.raises(TypeError):
        AllocationSpec((4, True), "float32")
    with pytest.raises(ValueError):
        AllocationSpec((4, -1), "float32")
    with pytest.raises(TypeError):
        AllocationSpec((4,), "complex64")
    with pytest.raises(TypeError):
        AllocationSpec(4, "float32")
    spec = AllocationSpec([2, 3], "int32", 0)
    assert spec == AllocationSpec((2, 3), "int32", None)
    assert AllocationSpec.like(tensor) == AllocationSpec((4,), "float32")
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.shape = (1,)
    shmem.free(tensor)


def test_restart_argument_problems_are_reported_on_every_rank(runtime, xp):
    """Issue 9, item 8: a rank whose own restart arguments are bad still takes part, so every
    rank reports its problem (retryable) instead of the others waiting until the deadline."""
    tensor = shmem.empty(4, 4)
    good = [replace(tensor, (4, 4), "float32")]
    last = WORLD - 1  # the rank with the bad argument

    def on_last(bad, fine):
        return bad if RANK == last else fine

    cases = [
        (dict(heap_size_bytes=on_last(True, HEAP), replacements=good), "not a bool"),
        (dict(heap_size_bytes=on_last(0, HEAP), replacements=good), "positive integer"),
        (dict(heap_size_bytes=on_last("1M", HEAP), replacements=good), "positive integer"),
        (dict(heap_size_bytes=HEAP, replacements=on_last(good[0], good)), "sequence of"),
        (dict(heap_size_bytes=HEAP, replacements=on_last([(tensor, (4,))], good)), r"\[0\]"),
        (
            dict(
                heap_size_bytes=HEAP,
                replacements=on_last([replace(tensor.T, (4, 4), "float32")], good),
            ),
            "contiguous",
        ),
        (
            dict(heap_size_bytes=HEAP, replacements=good, preflight_hook=on_last(42, None)),
            "callable",
        ),
    ]
    for kwargs, match in cases:
        message = retryable(lambda kwargs=kwargs: shmem.restart(**kwargs), match)
        assert f"root_ranks=[{last}]" in message, message
    # Nothing changed: the tensor is still live.
    shmem.barrier()
    shmem.free(tensor)


def retryable(call, match: str) -> str:
    """Runs a restart that must fail as retryable on every rank; returns the diagnosis."""
    with pytest.raises(shmem.RetryableError, match=match) as caught:
        call()
    error = caught.value
    assert error.recovery == "retryable" and error.operation == "restart"
    assert error.stage == "Preflight"
    assert str(error).endswith("the runtime remains usable")
    assert error.__cause__ is not None
    message = normalized(str(error))
    assert len(set(gather_text(message))) == 1, message
    return message


def test_bad_replacements_fail_alike_on_every_rank_and_change_nothing(runtime, xp):
    a = shmem.empty(8, dtype="int32")
    b = shmem.empty(8, dtype="int32")
    xp.fill(a, RANK)
    stale = shmem.empty(2)
    shmem.free(stale)
    heap = HEAP * 2
    retryable(
        lambda: shmem.restart(heap_size_bytes=heap, replacements=[replace(a, (8,), "int32")]),
        "no replacement",
    )
    retryable(
        lambda: shmem.restart(
            heap_size_bytes=heap,
            replacements=[
                replace(a, (8,), "int32"),
                replace(a, (8,), "int32"),
                replace(b, (8,), "int32"),
            ],
        ),
        "replaced twice",
    )
    retryable(
        lambda: shmem.restart(
            heap_size_bytes=heap,
            replacements=[replace(a[2:4], (8,), "int32"), replace(b, (8,), "int32")],
        ),
        "is a view",
    )
    retryable(
        lambda: shmem.restart(
            heap_size_bytes=heap,
            replacements=[
                replace(a, (8,), "int32"),
                replace(b, (8,), "int32"),
                replace(stale, (2,), "float32"),
            ],
        ),
        "not an active allocation",
    )
    retryable(
        lambda: shmem.restart(
            heap_size_bytes=1024,
            replacements=[replace(a, (8,), "int32"), replace(b, (1024,), "int32")],
        ),
        "raise heap_size_bytes",
    )
    retryable(
        lambda: shmem.restart(
            heap_size_bytes=heap,
            replacements=[replace(a, (8,), "int32"), replace(b, (8,), "int32", 48)],
        ),
        "power of two",
    )
    # Nothing changed: the old tensors still work.
    shmem.barrier()
    got = xp.zeros(8, "int32")
    shmem.get(got, a, (RANK + 1) % WORLD)
    assert xp.tolist(got) == [(RANK + 1) % WORLD] * 8
    shmem.barrier()
    shmem.free(b)
    shmem.free(a)


@pytest.mark.skipif(WORLD < 2, reason="needs 2 ranks")
def test_values_that_differ_across_ranks_fail_on_every_rank(runtime, xp):
    a = shmem.empty(8, dtype="int32")
    message = retryable(
        lambda: shmem.restart(
            heap_size_bytes=HEAP, replacements=[replace(a, (8 + RANK % 2,), "int32")]
        ),
        "differ across Root ranks",
    )
    assert "root_ranks" in message or "root ranks" in message
    retryable(
        lambda: shmem.restart(
            heap_size_bytes=HEAP + 4096 * (RANK % 2), replacements=[replace(a, (8,), "int32")]
        ),
        "differ across Root ranks",
    )
    retryable(
        lambda: shmem.restart(
            heap_size_bytes=HEAP,
            replacements=[replace(a, (8,), "int32")],
            preflight_hook=lambda: f"rank {RANK}",
        ),
        "differ across Root ranks",
    )
    shmem.free(a)


def test_a_raising_hook_fails_every_rank(runtime):
    a = shmem.empty(2)

    def hook():
        if RANK == WORLD - 1:
            raise KeyError("snapshot missing")
        return b"ok"

    message = retryable(
        lambda: shmem.restart(
            heap_size_bytes=HEAP, replacements=[replace(a, (2,), "float32")], preflight_hook=hook
        ),
        "preflight hook raised",
    )
    assert f"root_ranks=[{WORLD - 1}]" in message
    shmem.free(a)


def test_restart_needs_exactly_one_reference(runtime):
    shmem.acquire()
    try:
        retryable(
            lambda: shmem.restart(heap_size_bytes=HEAP, replacements=[]), "exactly one reference"
        )
    finally:
        shmem.release()


def test_hook_values_are_compared_as_values(runtime):
    """Issue 9, item 7: equal values whose pickles differ (dicts and sets built in another
    order on each rank) agree; values that differ are shown with repr, never as pickle bytes."""
    a = shmem.empty(2)
    keys = ["experts", "step", "layers"]
    order = keys if RANK % 2 == 0 else list(reversed(keys))

    def equal_values():
        return {
            "config": {key: len(key) for key in order},  # another insertion order per rank
            "names": {f"expert-{key}" for key in order},
            "step": 12,
        }

    result = shmem.restart(
        heap_size_bytes=HEAP,
        replacements=[replace(a, (2,), "float32")],
        preflight_hook=equal_values,
    )
    (a,) = result.tensors
    if WORLD > 1:
        message = retryable(
            lambda: shmem.restart(
                heap_size_bytes=HEAP,
                replacements=[replace(a, (2,), "float32")],
                preflight_hook=lambda: {"rank": RANK % 2, "padding": "x" * 500},
            ),
            "differ across Root ranks",
        )
        assert "{'rank': 0, 'padding': 'xxx" in message and "{'rank': 1, " in message, message
        assert "x" * 400 not in message  # cut short
        assert "\\x80" not in message and "0x80" not in message  # no pickle bytes
    shmem.free(a)
