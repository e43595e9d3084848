"""Root groups other than the whole world: ordered subgroups and disjoint roots."""

from __future__ import annotations

import pytest
from conftest import DIST, HEAP, RANK, WORLD, B, cleanup, gather_text
from hyper_multicore import shmem

if DIST:
    import torch.distributed as dist

_groups: dict[tuple[int, ...], object] = {}


def group_of(members: list[int]):
    """The root group ``members``: a ProcessGroup with torch.distributed (created once, by
    every rank, as torch requires), else the list of world ranks itself."""
    if not DIST:
        return members
    key = tuple(members)
    if key not in _groups:
        _groups[key] = dist.new_group(members)
    return _groups[key]


def exercise(members: list[int]) -> None:
    """Everything a root does, inside one root whose members are ``members``."""
    me, n = shmem.my_pe(), shmem.n_pes()
    assert n == len(members) and members[me] == RANK
    assert shmem.debug_state()["root_size"] == n
    data = shmem.empty(4, dtype="int64")
    flag = shmem.empty(1, dtype="int64")
    flag[:] = 0
    shmem.barrier()
    shmem.put_signal(data, B.full(4, RANK, "int64"), flag, 1, (me + 1) % n)
    shmem.wait_signal(flag, 1)
    assert B.tolist(data) == [members[(me - 1) % n]] * 4
    total = shmem.empty(1, dtype="int64")
    total[:] = RANK
    shmem.barrier()
    shmem.all_reduce(total, total)
    assert B.tolist(total) == [sum(members)]
    # Every member's view of the root, gathered.
    assert gather_text(f"{RANK}") == [str(m) for m in members]
    result = shmem.restart(
        heap_size_bytes=HEAP,
        replacements=[
            shmem.AllocationReplacement(t, shmem.AllocationSpec.like(t))
            for t in (data, flag, total)
        ],
    )
    for tensor in result.tensors:
        shmem.free(tensor)


@pytest.mark.skipif(WORLD != 4, reason="needs exactly 4 ranks")
def test_two_disjoint_subgroup_roots_in_a_world_of_four():
    low, high = group_of([0, 1]), group_of([2, 3])
    members = [0, 1] if RANK < 2 else [2, 3]
    mine = low if RANK < 2 else high
    assert shmem.root_members(mine) == tuple(members)
    shmem.acquire(mine, heap_size_bytes=HEAP)
    try:
        exercise(members)
        # The other root's group is not this process's root.
        other = high if RANK < 2 else low
        with pytest.raises((shmem.InvalidArgumentError, ValueError)):
            shmem.acquire(other)
        assert shmem.reference_count() == 1
    finally:
        cleanup()


@pytest.mark.skipif(WORLD != 4, reason="needs exactly 4 ranks")
def test_an_ordered_subgroup_numbers_its_ranks_in_group_order():
    # torch needs every rank to create every group, in the same order.
    odd, even = group_of([3, 1]), group_of([2, 0])
    mine = odd if RANK % 2 else even
    # torch orders a group's ranks itself (ascending); a list of world ranks keeps its order.
    members = list(dist.get_process_group_ranks(mine)) if DIST else ([3, 1] if RANK % 2 else [2, 0])
    assert shmem.root_members(mine) == tuple(members)
    shmem.acquire(mine, heap_size_bytes=HEAP)
    try:
        assert shmem.my_pe() == members.index(RANK)
        exercise(members)
    finally:
        cleanup()


@pytest.mark.skipif(WORLD < 2, reason="needs 2 ranks")
def test_a_second_acquire_must_name_the_same_membership():
    world = group_of(list(range(WORLD)))
    if DIST:  # torch sorts a group's ranks: a different membership, not a different order
        other_members = [0, 1] if WORLD > 2 else [0]
    else:
        other_members = list(reversed(range(WORLD)))
    other = group_of(other_members)
    shmem.acquire(world, heap_size_bytes=HEAP)
    try:
        shmem.acquire(heap_size_bytes=HEAP)  # the world again, by default
        assert shmem.reference_count() == 2
        if RANK in other_members:
            with pytest.raises(shmem.InvalidArgumentError, match="same ordered group"):
                shmem.acquire(other)
        else:
            with pytest.raises(ValueError, match="not a member"):
                shmem.acquire(other)
        assert shmem.reference_count() == 2
    finally:
        cleanup()
