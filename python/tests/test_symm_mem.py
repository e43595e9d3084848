"""hyper_multicore.symm_mem: torch's symmetric-memory API and torch.ops.symm_mem on CPU.

In the spirit of torch's own test/distributed/test_symmetric_memory.py: buffers, signal pads,
barriers and every operator, checked against reference computations made locally (every rank
can make every rank's input: they come from seeded generators). Reductions are compared bit
for bit: the operators add the members' values in rank order, rounding after each addition, and
so does the reference. Runs on one PE, on every rank of an hmrun job (torch.distributed/gloo
groups), and with every pair of PEs on the UCX route, where peers' memory is reached through the
runtime only.
"""

from __future__ import annotations

import os
import socket

import pytest
from conftest import DIST, RANK, TIMEOUT, WORLD, cleanup, gather_text

torch = pytest.importorskip("torch")
symm_mem = pytest.importorskip("hyper_multicore.symm_mem")

from hyper_multicore import shmem  # noqa: E402

#: Peers on this host are mapped here, except on the UCX route (every peer through the network).
UCX = os.environ.get("HYPER_MULTICORE_SHMEM_TRANSPORT", "auto") == "ucx"
GROUP = "0"
#: Odd sizes on purpose: torch's CUDA kernels need 4-byte multiples, these do not.
SIZES = [1, 7, 1023, 4099]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


@pytest.fixture
def symm():
    """symm_mem on a fresh runtime; every block freed and the runtime released afterwards."""
    yield symm_mem
    cleanup()


def mapped() -> list[bool]:
    """Whether each rank's heap is mapped in this process (a collective call)."""
    hosts = gather_text(socket.gethostname())
    return [r == RANK or (not UCX and hosts[r] == hosts[RANK]) for r in range(WORLD)]


def data(rank: int, shape, dtype, salt: int = 0) -> torch.Tensor:
    """Rank ``rank``'s input: any rank can make anyone's."""
    generator = torch.Generator().manual_seed(1000 * rank + salt)
    return torch.randn(shape, generator=generator).to(dtype)


def rank_order_sum(parts: list[torch.Tensor]) -> torch.Tensor:
    """The reference reduction: v0 + v1 + … in rank order, rounded after each addition."""
    total = parts[0].clone()
    for part in parts[1:]:
        total = total + part
    return total


def test_empty_rendezvous_and_handle(symm):
    t = symm.empty(3, 5, dtype=torch.bfloat16)
    assert t.shape == (3, 5) and t.dtype == torch.bfloat16 and t.is_contiguous()
    assert symm.empty((2, 2)).dtype == torch.get_default_dtype()
    assert symm.is_symm_mem_tensor(t) and symm.is_symm_mem_tensor(t[1:])
    assert not symm.is_symm_mem_tensor(torch.empty(3))
    hdl = symm.rendezvous(t, GROUP)
    assert symm.rendezvous(t, GROUP) is hdl
    if DIST:
        assert symm.rendezvous(t, torch.distributed.group.WORLD) is hdl
    assert (hdl.rank, hdl.world_size) == (RANK, WORLD)
    assert hdl.buffer_size == 3 * 5 * 2
    assert hdl.signal_pad_size == symm.get_signal_pad_size() == 9216
    assert hdl.offset == 0 and hdl.multicast_ptr == 0 and hdl.device == torch.device("cpu")
    assert hdl.buffer_ptrs[RANK] == t.data_ptr()
    assert len(hdl.buffer_ptrs) == len(hdl.signal_pad_ptrs) == WORLD
    assert [ptr != 0 for ptr in hdl.buffer_ptrs] == mapped()
    assert symm.get_backend("cpu") == "HYPER_MULTICORE"
    assert not symm.is_nvshmem_available()
    with pytest.warns(UserWarning, match="not within any SymmetricMemory allocation"):
        assert symm.rendezvous(torch.empty(3), GROUP) is None
    with pytest.raises(TypeError, match="unsupported group type"):
        symm.rendezvous(t, 0)
    with pytest.raises(ValueError, match="CPU tensors"):
        symm.empty(3, device="meta")


def test_get_buffer_sees_each_peer(symm):
    t = symm.empty(16, dtype=torch.int32)
    t.fill_(RANK)
    hdl = symm.rendezvous(t, GROUP)
    here = mapped()
    hdl.barrier()
    for peer in range(WORLD):
        if here[peer]:
            buffer = hdl.get_buffer(peer, (4, 2), torch.int32, storage_offset=8)
            assert buffer.tolist() == [[peer] * 2] * 4
            assert hdl.get_remote_tensor(peer, (16,), torch.int32).tolist() == [peer] * 16
        else:
            with pytest.raises(RuntimeError, match="Cannot get buffer across nodes"):
                hdl.get_buffer(peer, (16,), torch.int32)
        fetched = torch.empty(5, dtype=torch.int32)
        symm.get(fetched, hdl, peer, offset=3)
        assert fetched.tolist() == [peer] * 5
    with pytest.raises(RuntimeError, match="exceeds the allocated size"):
        hdl.get_buffer(RANK, (17,), torch.int32)
    with pytest.raises(ValueError, match="exceeds symmetric allocation"):
        symm.get(torch.empty(16, dtype=torch.int32), hdl, 0, offset=1)
    hdl.barrier()


def test_signal_pads_put_and_wait(symm):
    t = symm.empty(8, dtype=torch.float32)
    hdl = symm.rendezvous(t, GROUP)
    pad = hdl.get_signal_pad(RANK)
    assert pad.dtype == torch.uint32 and pad.shape == (9216 // 4,)
    # Zeroed by empty(); rows 1.. stay untouched until the barrier (on row 0) below.
    assert int(pad[WORLD:].sum()) == 0
    assert hdl.get_signal_pad(RANK, (2, 3), torch.int64, 1).shape == (2, 3)
    with pytest.raises(RuntimeError, match="exceeds the allocated size"):
        hdl.get_signal_pad(RANK, (9216 // 4 + 1,))
    hdl.barrier()
    # A ring on channel 1: data put into the next rank, then a signal it waits for.
    right, left = (RANK + 1) % WORLD, (RANK - 1) % WORLD
    shmem.put(t, torch.full((8,), float(RANK)), hdl.pes[right])
    hdl.put_signal(right, channel=1)
    hdl.wait_signal(left, channel=1)
    assert t.tolist() == [float(left)] * 8
    # Signals count: two sent before either is consumed are both received.
    hdl.put_signal(right, channel=2)
    hdl.put_signal(right, channel=2)
    hdl.wait_signal(left, channel=2)
    hdl.wait_signal(left, channel=2)
    # Every consumed signal leaves its word at zero (rows 1 to 3: no later call uses them).
    hdl.barrier(channel=3)
    assert int(pad[WORLD : 4 * WORLD].sum()) == 0
    with pytest.raises(shmem.WaitTimeoutError):
        hdl.wait_signal(left, channel=4, timeout_ms=50)
    last = 9216 // (4 * WORLD) - 1
    hdl.barrier(channel=last)
    with pytest.raises(RuntimeError, match="maximum supported channel"):
        hdl.barrier(channel=last + 1)
    with pytest.raises(RuntimeError, match="out of range"):
        hdl.put_signal(WORLD)
    hdl.barrier()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("numel", SIZES)
def test_one_shot_all_reduce(symm, dtype, numel):
    t = symm.empty(numel, dtype=dtype)
    t.copy_(data(RANK, numel, dtype))
    expected = rank_order_sum([data(r, numel, dtype) for r in range(WORLD)])
    out = torch.ops.symm_mem.one_shot_all_reduce(t, "sum", GROUP)
    assert torch.equal(out, expected)
    out = torch.full_like(t, -1)
    assert torch.ops.symm_mem.one_shot_all_reduce_out(t, "sum", GROUP, out) is out
    assert torch.equal(out, expected)
    assert torch.equal(t, data(RANK, numel, dtype))  # the input is not changed
    # _copy: a private input copied into the symmetric buffer first.
    other = [data(r, numel, dtype, salt=1) for r in range(WORLD)]
    out = torch.ops.symm_mem.one_shot_all_reduce_copy(t, other[RANK], "sum", GROUP)
    assert torch.equal(out, rank_order_sum(other))
    out = torch.empty_like(t)
    torch.ops.symm_mem.one_shot_all_reduce_copy_out(t, data(RANK, numel, dtype), "sum", GROUP, out)
    assert torch.equal(out, expected)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("numel", SIZES)
def test_two_shot_all_reduce(symm, dtype, numel):
    parts = [data(r, (numel,), dtype) for r in range(WORLD)]
    expected = rank_order_sum(parts)
    t = symm.empty(numel, dtype=dtype)
    t.copy_(parts[RANK])
    assert torch.ops.symm_mem.two_shot_all_reduce_(t, "sum", GROUP) is t
    assert torch.equal(t, expected)
    # _out: the result in output; torch's kernel leaves this rank's share reduced in its input.
    t.copy_(parts[RANK])
    output = torch.empty_like(t)
    assert torch.ops.symm_mem.two_shot_all_reduce_out(t, "sum", GROUP, output) is output
    assert torch.equal(output, expected)
    per = -(-numel // WORLD)
    share = slice(min(numel, RANK * per), min(numel, (RANK + 1) * per))
    assert torch.equal(t[share], expected[share])


@pytest.mark.parametrize("dtype", DTYPES)
def test_reduce_scatter_out(symm, dtype):
    numel = 12 * WORLD + 0
    parts = [data(r, numel, dtype) for r in range(WORLD)]
    expected = rank_order_sum(parts)
    t = symm.empty(numel, dtype=dtype)
    t.copy_(parts[RANK])
    output = torch.empty(numel // WORLD, dtype=dtype)
    torch.ops.symm_mem.reduce_scatter_out(t, GROUP, False, output)
    per = numel // WORLD
    assert torch.equal(output, expected[RANK * per : (RANK + 1) * per])
    assert torch.equal(t, parts[RANK])
    # split_last_dim: a block of the last dimension of every row.
    rows, width = 3, 5 * WORLD
    parts = [data(r, (rows, width), dtype, salt=2) for r in range(WORLD)]
    expected = rank_order_sum(parts)
    m = symm.empty(rows, width, dtype=dtype)
    m.copy_(parts[RANK])
    output = torch.empty(rows, 5, dtype=dtype)
    torch.ops.symm_mem.reduce_scatter_out(m, GROUP, True, output)
    assert torch.equal(output, expected[:, RANK * 5 : (RANK + 1) * 5])
    if WORLD > 1:
        with pytest.raises(RuntimeError, match="divisible by world_size"):
            torch.ops.symm_mem.reduce_scatter_out(t[1:], GROUP, False, output)


def test_reduction_errors(symm):
    t = symm.empty(8, dtype=torch.float32)
    with pytest.raises(RuntimeError, match="only sum is supported"):
        torch.ops.symm_mem.one_shot_all_reduce(t, "avg", GROUP)
    with pytest.raises(RuntimeError, match="must be allocated with empty_strided_p2p"):
        torch.ops.symm_mem.one_shot_all_reduce(torch.ones(8), "sum", GROUP)
    with pytest.raises(RuntimeError, match="size mismatch"):
        torch.ops.symm_mem.one_shot_all_reduce_out(t, "sum", GROUP, torch.empty(7))
    ints = symm.empty(8, dtype=torch.int32)
    with pytest.raises(RuntimeError, match="not implemented for torch.int32"):
        torch.ops.symm_mem.two_shot_all_reduce_(ints, "sum", GROUP)
    # Zero elements: nothing to do, and no barrier to wait for.
    empty = symm.empty(0, dtype=torch.float32)
    assert torch.ops.symm_mem.one_shot_all_reduce(empty, "sum", GROUP).numel() == 0


def splits_of(rank: int, count: int, high: int) -> list[int]:
    generator = torch.Generator().manual_seed(77 + rank)
    return torch.randint(high, (count,), generator=generator).tolist()


def exclusive_scan(values: list[int]) -> list[int]:
    return [sum(values[:i]) for i in range(len(values))]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
def test_all_to_all_vdev(symm, dtype):
    k, width = 10, 3  # rows per peer below k; rows of 3 elements
    max_in = k * WORLD
    inputs = [data(r, (max_in, width), dtype) for r in range(WORLD)]
    splits = [splits_of(r, WORLD, k) for r in range(WORLD)]
    inp = symm.empty(max_in, width, dtype=dtype)
    inp.copy_(inputs[RANK])
    out = symm.empty(max_in * WORLD, width, dtype=dtype).fill_(-1)
    in_splits = symm.empty(WORLD, dtype=torch.int64).copy_(torch.tensor(splits[RANK]))
    out_splits_offsets = symm.empty(2, WORLD, dtype=torch.int64).fill_(-1)
    torch.ops.symm_mem.all_to_all_vdev(inp, out, in_splits, out_splits_offsets, GROUP)
    received = [splits[r][RANK] for r in range(WORLD)]
    assert out_splits_offsets.tolist() == [received, exclusive_scan(received)]
    assert in_splits.tolist() == splits[RANK]
    chunks = [inputs[r][exclusive_scan(splits[r])[RANK] :][: received[r]] for r in range(WORLD)]
    total = sum(received)
    assert torch.equal(out[:total], torch.cat(chunks))
    assert (out[total:] == -1).all()


@pytest.mark.parametrize("align", [None, 1, 8, 16])
def test_all_to_all_vdev_2d(symm, align):
    experts, k = 3, 5
    nsplits = experts * WORLD
    max_in = k * nsplits
    inputs = [data(r, (max_in, 2), torch.float32) for r in range(WORLD)]
    splits = [splits_of(r, nsplits, k) for r in range(WORLD)]
    inp = symm.empty(max_in, 2).copy_(inputs[RANK])
    out = symm.empty(max_in * WORLD + 16 * experts, 2).fill_(-1)
    in_splits = symm.empty(nsplits, dtype=torch.int64).copy_(torch.tensor(splits[RANK]))
    out_splits_offsets = symm.empty(2, nsplits, dtype=torch.int64).fill_(-1)
    kwargs = {} if align is None else {"major_align": align}
    torch.ops.symm_mem.all_to_all_vdev_2d(inp, out, in_splits, out_splits_offsets, GROUP, **kwargs)
    # Expert-major: for each of my experts e, every rank's chunk for it, in rank order.
    a = align or 1
    received, offsets, at = [], [], 0
    for e in range(experts):
        for r in range(WORLD):
            received.append(splits[r][RANK * experts + e])
            offsets.append(at)
            at += received[-1]
        expert_rows = sum(received[-WORLD:])
        at += max(-(-expert_rows // a) * a, a) - expert_rows
    assert out_splits_offsets.tolist() == [received, offsets]
    for e in range(experts):
        for r in range(WORLD):
            c = e * WORLD + r
            start = exclusive_scan(splits[r])[RANK * experts + e]
            expected = inputs[r][start : start + received[c]]
            assert torch.equal(out[offsets[c] : offsets[c] + received[c]], expected)


def test_all_to_all_vdev_2d_offset(symm):
    experts, k = 3, 6
    nsplits = experts * WORLD
    max_in = k * nsplits
    inputs = [data(r, (max_in, 4), torch.bfloat16) for r in range(WORLD)]
    splits = [splits_of(r, nsplits, k) for r in range(WORLD)]
    starts = list(range(0, k * nsplits, k))  # every chunk k rows apart: padding stays home
    inp = symm.empty(max_in, 4, dtype=torch.bfloat16).copy_(inputs[RANK])
    out = symm.empty(max_in * WORLD, 4, dtype=torch.bfloat16).fill_(-1)
    in_splits_offsets = symm.empty(2, nsplits, dtype=torch.int64)
    in_splits_offsets.copy_(torch.tensor([splits[RANK], starts]))
    out_splits_offsets = symm.empty(2, nsplits, dtype=torch.int64).fill_(-1)
    torch.ops.symm_mem.all_to_all_vdev_2d_offset(
        inp, out, in_splits_offsets, out_splits_offsets, GROUP
    )
    # Rank-major: for each rank r, its chunks for me, expert by expert (its input is
    # expert-major: chunk e * WORLD + me).
    received = [splits[r][e * WORLD + RANK] for r in range(WORLD) for e in range(experts)]
    offsets = exclusive_scan(received)
    assert out_splits_offsets.tolist() == [received, offsets]
    for r in range(WORLD):
        for e in range(experts):
            c = r * experts + e
            start = starts[e * WORLD + RANK]
            expected = inputs[r][start : start + received[c]]
            assert torch.equal(out[offsets[c] : offsets[c] + received[c]], expected)
    assert (out[sum(received) :] == -1).all()


def test_all_to_all_vdev_checks(symm):
    inp = symm.empty(4, 2)
    out = symm.empty(4, 2)
    in_splits = symm.empty(WORLD, dtype=torch.int64).fill_(0)
    bad = symm.empty(2, WORLD + 1, dtype=torch.int64)
    with pytest.raises(RuntimeError, match="must have shape"):
        torch.ops.symm_mem.all_to_all_vdev(inp, out, in_splits, bad, GROUP)
    in_splits.fill_(5)  # 5 rows to everyone: more than the input holds
    oso = symm.empty(2, WORLD, dtype=torch.int64)
    with pytest.raises(RuntimeError, match="sends rows|too few"):
        torch.ops.symm_mem.all_to_all_vdev(inp, out, in_splits, oso, GROUP)


@pytest.mark.skipif(not DIST or WORLD < 4, reason="needs torch.distributed and 4 ranks")
def test_subgroup(symm):
    """A handle and the operators over a subgroup: the even ranks."""
    import torch.distributed as dist

    members = list(range(0, WORLD, 2))
    group = dist.new_group(members)
    t = symm.empty(9, dtype=torch.float32)  # every rank allocates
    if RANK in members:
        me = members.index(RANK)
        t.copy_(data(RANK, 9, torch.float32))
        hdl = symm.rendezvous(t, group)
        assert (hdl.rank, hdl.world_size, hdl.pes) == (me, len(members), tuple(members))
        out = torch.ops.symm_mem.one_shot_all_reduce(t, "sum", group.group_name)
        assert torch.equal(out, rank_order_sum([data(r, 9, torch.float32) for r in members]))
        hdl.barrier(channel=5, timeout_ms=int(TIMEOUT * 1000))
    shmem.barrier()


def whole(rank: int, shape, dtype, salt: int) -> torch.Tensor:
    """Rank ``rank``'s matrix of small integers: every product and sum of them is exact."""
    generator = torch.Generator().manual_seed(1000 * rank + salt)
    return torch.randint(-4, 5, shape, generator=generator).to(dtype)


@pytest.mark.parametrize("gather_dim", [0, 1, 2])
def test_fused_all_gather_matmul(symm, gather_dim):
    """As the unfused reference: every rank's shard gathered along gather_dim, then @ B. Small
    integers, whose products and sums are exact in any order: with the last dimension gathered
    the product sums over every rank's shard."""
    fused = torch.ops.symm_mem.fused_all_gather_matmul
    shape = (3, 5, 4)
    shards = [whole(r, shape, torch.float32, salt=3) for r in range(WORLD)]
    inner = shape[-1] * (WORLD if gather_dim == 2 else 1)
    B = whole(0, (inner, 6), torch.float32, salt=4)
    A, outs = fused(shards[RANK], [B, B[:, :2]], gather_dim, GROUP)
    gathered = torch.cat(shards, dim=gather_dim)
    assert torch.equal(A, gathered)
    assert torch.equal(outs[0], gathered @ B)
    assert torch.equal(outs[1], gathered @ B[:, :2])
    none, outs = fused(shards[RANK], [B], gather_dim, GROUP, return_A=False)
    assert none is None and torch.equal(outs[0], gathered @ B)
    with pytest.raises(ValueError, match="Invalid gather_dim"):
        fused(shards[RANK], [B], 3, GROUP)


@pytest.mark.parametrize("scatter_dim", [0, 1])
@pytest.mark.parametrize("reduce_op", ["sum", "avg"])
def test_fused_matmul_reduce_scatter(symm, scatter_dim, reduce_op):
    """As the unfused reference: every rank's A @ B summed in rank order, this rank's block of
    the scatter dimension (avg: divided by the group's size)."""
    shape = (2 * WORLD, 3)
    As = [data(r, shape, torch.float32, salt=6) for r in range(WORLD)]
    B = data(0, (3, 4 * WORLD), torch.float32, salt=7)
    out = torch.ops.symm_mem.fused_matmul_reduce_scatter(As[RANK], B, reduce_op, scatter_dim, GROUP)
    total = rank_order_sum([A @ B for A in As])
    if reduce_op == "avg":
        total = total / WORLD
    assert torch.equal(out, total.chunk(WORLD, dim=scatter_dim)[RANK])
    with pytest.raises(ValueError, match="reduce_op must be sum or avg"):
        torch.ops.symm_mem.fused_matmul_reduce_scatter(As[RANK], B, "max", 0, GROUP)
