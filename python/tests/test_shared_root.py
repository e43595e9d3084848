"""SharedRoot: declarations compared across ranks, budgets, ownership, refused bare calls,
execution leases (two threads, stale generations), close order, preserving restarts, and heap
growth that keeps every consumer's data byte for byte on every PE (or changes nothing when it
cannot happen). Runs in one process and on every rank of hmrun jobs of 2 and 4 PEs."""

from __future__ import annotations

import gc
import sys
import threading

import pytest
from conftest import RANK, TORCH, WORLD, multi_rank
from hyper_multicore import _native, shmem
from hyper_multicore.shmem import AllocationReplacement, AllocationSpec, ConsumerSpec

MIB = 1 << 20


def pattern(which: int, n: int, xp):
    """This rank's bytes for tensor ``which``: differ per rank, per tensor and per byte."""
    values = xp.arange(n, "int64")
    return (values * 31 + RANK * 7 + which * 13) % 251


def as_ints(tensor, xp) -> list[int]:
    return [int(v) for v in xp.tolist(tensor)]


@pytest.fixture
def three():
    """An active root with two MoE consumers and a workspace; closed after the test (freeing
    what a failed test left)."""
    root = shmem.SharedRoot()
    consumers = [
        root.reserve(ConsumerSpec("moe0", "moe-dispatch", 4 * MIB, "dispatch")),
        root.reserve(ConsumerSpec("moe1", "moe-dispatch", 4 * MIB, "dispatch")),
        root.reserve(ConsumerSpec("attn", "workspace", 2 * MIB, "scratch", 2 * MIB)),
    ]
    root.activate()
    yield root, consumers
    from hyper_multicore.shmem._registry import _live  # the suite's backdoor for cleanup only

    for consumer in consumers:
        owned = sorted((a for a in _live.values() if a.owner is consumer), key=lambda a: a.index)
        with consumer.lease():
            for allocation in owned:
                consumer.free(allocation.tensor)
        consumer.close()
    root.close()
    assert shmem.reference_count() == 0


@multi_rank
def test_declarations_that_differ_fail_on_every_rank_naming_consumer_and_ranks():
    root = shmem.SharedRoot()
    root.reserve(ConsumerSpec("moe0", "moe-dispatch", 4 * MIB, "a"))
    budget = 6 * MIB if RANK == 1 else 4 * MIB
    root.reserve(ConsumerSpec("moe1", "moe-dispatch", budget, "a"))
    with pytest.raises(shmem.InvalidArgumentError) as raised:
        root.activate()
    message = str(raised.value)
    others = [r for r in range(WORLD) if r != 1]
    assert "consumer moe1" in message and "root_ranks=[1]" in message, message
    assert f"root_ranks={others}" in message, message
    assert shmem.reference_count() == 0


def test_a_heap_smaller_than_the_budgets_is_refused_before_any_native_work():
    root = shmem.SharedRoot(heap_size_bytes=2 * MIB)
    root.reserve(ConsumerSpec("moe0", "moe-dispatch", 3 * MIB, "a"))
    with pytest.raises(shmem.InvalidArgumentError, match="too small"):
        root.activate()
    assert shmem.reference_count() == 0
    assert shmem.debug_state()["state"] != "ready"


def test_budgets_owners_and_bare_calls_are_enforced(three, xp):
    root, (moe0, moe1, attn) = three
    assert shmem.reference_count() == 1
    for call in (
        lambda: shmem.acquire(),
        shmem.release,
        lambda: shmem.empty(4),
        lambda: shmem.restart(heap_size_bytes=32 * MIB, replacements=[]),
    ):
        with pytest.raises(shmem.HyperMulticoreError, match="shared root"):
            call()
    with moe0.lease():
        tensor = moe0.empty(2 * MIB, dtype="uint8")
        billed = shmem.allocation_budget((2 * MIB,), "uint8")
        assert billed >= 2 * MIB
        with pytest.raises(
            shmem.InvalidArgumentError,
            match=r"consumer moe0: 6291519 bytes \(6.0 MiB\) requested, 2097089 bytes \(2.0 MiB\) "
            r"of 4 MiB left",
        ):
            moe0.empty(6 * MIB, dtype="uint8")
        # Over budget on the last rank only: the same refusal on every rank.
        n = 3 * MIB if RANK == WORLD - 1 else 1024
        with pytest.raises(shmem.InvalidArgumentError, match=rf"root_ranks=\[{WORLD - 1}\]"):
            moe0.empty(n, dtype="uint8")
    with moe1.lease():
        with pytest.raises(shmem.InvalidArgumentError, match="owned by consumer moe0"):
            moe1.free(tensor)
        # Outside moe0's lease its tensors are refused by the data plane.
        with pytest.raises(shmem.ShmemError, match="lease"):
            shmem.put(tensor[:8], xp.zeros(8, "uint8"), 0)
    state = root.debug_state()
    assert state["consumers"][0]["used_bytes"] == billed  # the failed free kept the bill
    assert state["consumers"][0]["budget_bytes"] == 4 * MIB
    assert state["lease_holder"] is None
    for key in ("reference_count", "allocated_bytes", "remaining_bytes", "max_allocated_bytes"):
        assert key in state, key
    assert state["config"]["heap_size_bytes"] == 10 * MIB
    assert state["config"]["timeout_seconds"] > 0
    assert [a["allocation_bytes"] for a in state["active_allocations"]] == [2 * MIB]
    assert "latest_failure" in state


def test_the_lease_has_one_holder_and_stale_generations_are_refused(three):
    root, (moe0, moe1, attn) = three
    held = moe0.claim()
    with pytest.raises(shmem.ShmemError, match="consumer moe0 holds the lease"):
        moe1.claim(wait=False)
    got = {}
    waiting = threading.Event()

    def claim_moe1():
        waiting.set()
        lease = moe1.claim()  # waits for moe0's release
        got["generation"] = lease.generation
        lease.release()

    thread = threading.Thread(target=claim_moe1)
    thread.start()
    assert waiting.wait(timeout=30)
    assert root.debug_state()["lease_holder"] == "moe0"
    held.release()
    thread.join(timeout=60)
    assert not thread.is_alive()
    assert got["generation"] > held.generation
    with pytest.raises(shmem.ShmemError, match="stale"):
        held.release()
    with pytest.raises(shmem.ShmemError, match="stale"):
        moe0.empty(8)  # its latest lease is released: refused on every rank


def test_close_order_is_enforced_and_close_is_idempotent():
    root = shmem.SharedRoot()
    moe = root.reserve(ConsumerSpec("moe0", "moe-dispatch", 2 * MIB, "a"))
    root.activate()
    with pytest.raises(shmem.ShmemError, match="still open"):
        root.close()
    lease = moe.claim()
    tensor = moe.empty(16)
    with pytest.raises(shmem.ShmemError, match="still owns"):
        moe.close()
    moe.free(tensor)
    with pytest.raises(shmem.ShmemError, match="holds the lease"):
        moe.close()
    lease.release()
    moe.close()
    moe.close()
    root.close()
    root.close()
    assert shmem.reference_count() == 0
    # Nothing manages the heap any more.
    shmem.acquire(heap_size_bytes=4 * MIB)
    shmem.release()


def test_a_preserving_restart_keeps_the_first_bytes(runtime, xp):
    kept = shmem.empty(1000, dtype="int64")
    dropped = shmem.empty(64, dtype="int64")
    kept[:] = pattern(0, 1000, xp)
    xp.fill(dropped, 5)
    result = shmem.restart(
        heap_size_bytes=32 * MIB,
        replacements=[
            AllocationReplacement(kept, AllocationSpec((600,), "int64"), preserve=True),
            AllocationReplacement(dropped, AllocationSpec((128,), "int64")),
        ],
    )
    new_kept, new_dropped = result.tensors
    assert as_ints(new_kept, xp) == as_ints(pattern(0, 1000, xp), xp)[:600]
    assert as_ints(new_dropped, xp) == [0] * 128
    assert result.stages_ms["preserve_ms"] >= 0
    for tensor in result.tensors:
        shmem.free(tensor)


def test_growth_keeps_every_consumers_data_byte_for_byte(three, xp):
    root, (moe0, moe1, attn) = three
    with moe0.lease():
        dispatch = moe0.growable(3072, 1024, dtype="uint8")
        dispatch.tensor.reshape(-1)[:] = pattern(0, 3 * MIB, xp)
    with moe1.lease():
        combine = moe1.empty(3 * MIB, dtype="uint8")
        combine[:] = pattern(1, 3 * MIB, xp)
    with attn.lease():
        workspace = attn.empty(MIB, dtype="uint8")
        workspace[:] = pattern(2, MIB, xp)
        assert not attn.grow(2 * MIB)  # covered already: nothing happens
    with moe0.lease():
        # Every rank needs a different number of rows: the largest wins, times 2.
        assert dispatch.ensure_capacity(3500 + RANK)
        assert dispatch.capacity == 6144
        grown = dispatch.tensor.reshape(-1)
        assert as_ints(grown[: 3 * MIB], xp) == as_ints(pattern(0, 3 * MIB, xp), xp)
        assert not dispatch.ensure_capacity(6000)
        # The new heap works remotely.
        peer = (RANK + 1) % WORLD
        shmem.put(grown[:64], xp.full(64, RANK + 1, "uint8"), peer)
        shmem.barrier()
        assert as_ints(grown[:64], xp) == [(RANK - 1) % WORLD + 1] * 64
    with pytest.raises(shmem.StaleTensorError):
        with moe1.lease():
            shmem.put(combine[:8], xp.zeros(8, "uint8"), 0)
    with moe1.lease():
        combine = moe1.refresh(combine)
        assert as_ints(combine, xp) == as_ints(pattern(1, 3 * MIB, xp), xp)
    with attn.lease():
        workspace = attn.refresh(workspace)
        assert as_ints(workspace, xp) == as_ints(pattern(2, MIB, xp), xp)
    state = root.debug_state()
    assert state["epoch"] == 1
    growth = state["growths"][0]
    assert growth["consumer"] == "moe0" and growth["from_bytes"] == 10 * MIB
    assert growth["to_bytes"] == state["config"]["heap_size_bytes"] > 10 * MIB
    assert set(growth["timings"]) == set(shmem.STAGE_KEYS)
    assert state["consumers"][0]["budget_bytes"] > 4 * MIB


def test_growth_that_cannot_fit_is_retryable_and_changes_nothing(three, xp):
    root, (moe0, moe1, attn) = three
    with attn.lease():
        workspace = attn.empty(MIB, dtype="uint8")
        workspace[:] = pattern(2, MIB, xp)
        # Over attn's declared maximum (2 MiB): refused at Agree on every rank.
        with pytest.raises(shmem.RetryableError, match="declared maximum is 2 MiB") as raised:
            attn.grow(3 * MIB)
        assert raised.value.stage == "Agree"
    with moe0.lease():
        # A heap larger than this host: refused at Preflight, before teardown.
        with pytest.raises(shmem.RetryableError) as raised:
            moe0.grow(1 << 50)
        assert raised.value.stage == "Preflight"
    with attn.lease():
        assert xp.data_ptr(attn.refresh(workspace)) == xp.data_ptr(workspace)  # not replaced
        assert as_ints(workspace, xp) == as_ints(pattern(2, MIB, xp), xp)
        shmem.barrier()
    state = root.debug_state()
    assert state["epoch"] == 0 and state["config"]["heap_size_bytes"] == 10 * MIB


def test_a_consumers_empty_refuses_a_shape_no_tensor_can_have_and_bills_nothing(three):
    """A zero-element shape whose strides pass 2**63 - 1 bytes costs no budget, but no tensor
    can describe it: refused before the call (it used to allocate, fail, and stay live)."""
    root, (moe0, _, _) = three
    with moe0.lease():
        with pytest.raises(ValueError, match="strides beyond"):
            moe0.empty(0, 2**62, 4)
    assert root.debug_state()["consumers"][0]["used_bytes"] == 0
    assert root.debug_state()["active_allocations"] == []


@pytest.mark.skipif(not TORCH, reason="the dtype check needs torch's bfloat16")
def test_allocation_budget_includes_alignment_padding():
    plain = shmem.allocation_budget((1024,), "bfloat16")
    aligned = shmem.allocation_budget((1024,), "bfloat16", 4096)
    assert plain >= 2048 and aligned > plain


def test_a_refreshed_tensor_dropped_while_live_warns_where_it_was_allocated(three, xp, monkeypatch):
    warned: list[str] = []
    monkeypatch.setattr(_native, "warn", warned.append)
    root, (moe0, moe1, attn) = three
    with attn.lease():
        workspace = attn.empty(MIB, dtype="uint8")
        site = f"test_shared_root.py:{sys._getframe().f_lineno - 1}"
    with moe0.lease():
        assert moe0.grow(5 * MIB)
    with attn.lease():
        fresh = attn.refresh(workspace)
        assert attn.refresh(workspace) is fresh  # one tensor per replacement while held
        gc.collect()
        assert warned == []  # the original's allocation was replaced: it does not warn
        del fresh
        gc.collect()
        assert len(warned) == 1, warned
        assert "consumer attn" in warned[0] and site in warned[0], warned
        attn.free(attn.refresh(workspace))
        gc.collect()
    assert len(warned) == 1, warned  # a freed replacement does not warn
