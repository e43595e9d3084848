"""CPU kernels for torch's own ``torch.ops.symm_mem`` operators, registered on import with
``torch.library`` under torch's schemas (torch defines the operators; this adds their CPU
implementations): ``one_shot_all_reduce`` (and ``_out``, ``_copy``, ``_copy_out``),
``two_shot_all_reduce_`` (and ``_out``), ``reduce_scatter_out``, ``all_to_all_vdev``,
``all_to_all_vdev_2d`` and ``all_to_all_vdev_2d_offset``.

Each kernel follows torch's CUDA kernel step for step: a barrier on the input's signal pad
(every member's input is ready), the work, a barrier again (no member changes its input
before every member has read it). Members on this host are read and written where their
memory lies (views of their heaps); members on another host through the runtime (gets into a
private copy, puts; UCX). Reductions add the members' values in rank order with torch's CPU
arithmetic, as the CUDA kernels do (``acc = v0; acc += v1; …``, rounding to the dtype after
each addition), so every member ends with the same bits.

Where torch's CUDA kernels need 4-byte aligned sizes (vector loads), these take any size; the
reductions take float32 and bfloat16 as torch does, and float16 and float64 besides.
"""

from __future__ import annotations

from typing import Any

import torch

from .. import _native, shmem
from ._memory import SymmetricMemory, _block_of, rendezvous

#: The dtypes the reductions take.
_REDUCIBLE = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


def _handle(op: str, tensor: torch.Tensor, group_name: str, what: str = "input") -> SymmetricMemory:
    """``tensor``'s handle over the group, or torch's error for a tensor not made by ``empty``."""
    if _block_of(tensor) is None:
        raise RuntimeError(
            f"{op}: {what} must be allocated with empty_strided_p2p() "
            "(hyper_multicore.symm_mem.empty)."
        )
    handle = rendezvous(tensor, group_name)
    assert handle is not None
    return handle


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise RuntimeError(message)


def _reducible(op: str, tensor: torch.Tensor) -> None:
    if tensor.dtype not in _REDUCIBLE:
        raise RuntimeError(f'"{op}" not implemented for {tensor.dtype}')


def _byte_offset(handle: SymmetricMemory, tensor: torch.Tensor) -> int:
    """Where ``tensor`` starts in its allocation (the same on every member)."""
    return tensor.data_ptr() - handle._block.allocation.address


def _member(handle: SymmetricMemory, rank: int, tensor: torch.Tensor) -> torch.Tensor:
    """Member ``rank``'s copy of ``tensor`` (contiguous, in ``handle``'s block): a view of its
    memory where the member shares this host's heap segment, else a private copy fetched
    through the runtime."""
    if handle._bases[rank]:
        key = (rank, _byte_offset(handle, tensor), tensor.shape, tensor.dtype)
        view = handle._views.get(key)
        if view is None:
            raw = handle._peer_tensor(rank, key[1], tensor.numel() * tensor.element_size())
            view = raw.view(tensor.dtype).view(tensor.shape)
            handle._views[key] = view
        return view
    copy = torch.empty_like(tensor)
    shmem.get(copy, tensor, handle.pes[rank])
    return copy


def _members(handle: SymmetricMemory, tensor: torch.Tensor) -> list[torch.Tensor]:
    """Every member's copy of ``tensor``, in rank order (see :func:`_member`)."""
    return [_member(handle, rank, tensor) for rank in range(handle.world_size)]


def _write_members(handle: SymmetricMemory, tensor: torch.Tensor, value: torch.Tensor) -> None:
    """Writes ``value`` into every member's copy of ``tensor`` (directly on this host, by a put
    through the runtime elsewhere)."""
    for rank, pe in enumerate(handle.pes):
        if handle._bases[rank]:
            _member(handle, rank, tensor).copy_(value)
        else:
            shmem.put(tensor, value, pe)


def _sum(parts: list[torch.Tensor], out: torch.Tensor) -> None:
    """``out = parts[0] + parts[1] + …`` in that order, rounded to the dtype after each
    addition (``out`` aliases none of the parts)."""
    if len(parts) == 1:
        out.copy_(parts[0])
        return
    torch.add(parts[0], parts[1], out=out)
    for part in parts[2:]:
        out.add_(part)


def _share(numel: int, world_size: int, rank: int) -> slice:
    """The elements member ``rank`` reduces in a two-shot all-reduce."""
    per = -(-numel // world_size)
    return slice(min(numel, rank * per), min(numel, (rank + 1) * per))


# ---------------------------------------------------------------------------------------------
# one_shot_all_reduce: every member reads every member's input and reduces all of it.


def _one_shot(
    input: torch.Tensor,
    local_input: torch.Tensor | None,
    reduce_op: str,
    group_name: str,
    out: torch.Tensor,
) -> torch.Tensor:
    op = "one_shot_all_reduce"
    _check(input.is_contiguous(), f"{op}: input must be contiguous.")
    _check(out.is_contiguous(), f"{op}: output must be contiguous.")
    _check(
        out.shape == input.shape,
        f"{op}: input/output size mismatch, input.sizes(): {list(input.shape)}, "
        f"output.sizes(): {list(out.shape)}",
    )
    _check(reduce_op == "sum", f"{op}: only sum is supported for now.")
    if local_input is not None:
        _check(local_input.is_contiguous(), f"{op}: local input must be contiguous.")
        _check(
            local_input.numel() <= input.numel(),
            f"{op}: local input size must be smaller than symm buffer size.",
        )
    if input.numel() == 0:
        _check(input.dtype == out.dtype, f"{op}: input and output dtypes differ")
        return out
    handle = _handle(op, input, group_name)
    _reducible(op, input)
    if local_input is not None:
        input.view(-1)[: local_input.numel()].copy_(local_input.view(-1))
    handle.barrier(0)
    _sum(_members(handle, input), out)
    handle.barrier(0)
    return out


def one_shot_all_reduce(input: torch.Tensor, reduce_op: str, group_name: str) -> torch.Tensor:
    return _one_shot(input, None, reduce_op, group_name, torch.empty_like(input))


def one_shot_all_reduce_out(
    input: torch.Tensor, reduce_op: str, group_name: str, out: torch.Tensor
) -> torch.Tensor:
    return _one_shot(input, None, reduce_op, group_name, out)


def one_shot_all_reduce_copy(
    symm_buffer: torch.Tensor, local_input: torch.Tensor, reduce_op: str, group_name: str
) -> torch.Tensor:
    out = torch.empty_like(local_input)
    return _one_shot(symm_buffer, local_input, reduce_op, group_name, out)


def one_shot_all_reduce_copy_out(
    symm_buffer: torch.Tensor,
    local_input: torch.Tensor,
    reduce_op: str,
    group_name: str,
    out: torch.Tensor,
) -> torch.Tensor:
    return _one_shot(symm_buffer, local_input, reduce_op, group_name, out)


# ---------------------------------------------------------------------------------------------
# two_shot_all_reduce: member r reduces share r of every input (reduce-scatter), then the shares
# travel to every member (all-gather).


def _two_shot(
    input: torch.Tensor, reduce_op: str, group_name: str, output: torch.Tensor | None
) -> torch.Tensor:
    op = "two_shot_all_reduce"
    _check(input.is_contiguous(), f"{op}: input must be contiguous.")
    _check(reduce_op == "sum", f"{op}: only sum is supported for now.")
    handle = _handle(op, input, group_name)
    if output is not None:
        _check(output.is_contiguous(), f"{op}: output must be contiguous.")
        _check(
            output.shape == input.shape,
            f"{op}: input/output size mismatch, input.sizes(): {list(input.shape)}, "
            f"output.sizes(): {list(output.shape)}",
        )
    if input.numel() == 0:
        if output is None:
            return input
        _check(output.dtype == input.dtype, f"{op}: input and output dtypes differ")
        return output
    _reducible(op, input)
    flat = input.view(-1)
    mine = flat[_share(flat.numel(), handle.world_size, handle.rank)]
    handle.barrier(0)
    reduced = torch.empty_like(mine)
    if mine.numel():
        _sum(_members(handle, mine), reduced)
    if output is None:
        # In place: this member's share into every member's input.
        if mine.numel():
            _write_members(handle, mine, reduced)
        handle.barrier(0)
        return input
    # Into output: this member's share into its own input (as torch's kernel leaves it), then
    # every member's share from its input into output.
    mine.copy_(reduced)
    handle.barrier(0)
    out = output.view(-1)
    for rank in range(handle.world_size):
        share = _share(flat.numel(), handle.world_size, rank)
        if share.stop > share.start:
            out[share].copy_(_member(handle, rank, flat[share]))
    handle.barrier(0)
    return output


def two_shot_all_reduce_(input: torch.Tensor, reduce_op: str, group_name: str) -> torch.Tensor:
    return _two_shot(input, reduce_op, group_name, None)


def two_shot_all_reduce_out(
    input: torch.Tensor, reduce_op: str, group_name: str, output: torch.Tensor
) -> torch.Tensor:
    return _two_shot(input, reduce_op, group_name, output)


def reduce_scatter_out(
    input: torch.Tensor, group_name: str, split_last_dim: bool, output: torch.Tensor
) -> torch.Tensor:
    """``output`` = member ``rank``'s share of the sum of every member's ``input``: a
    contiguous block of the 1-D input, or (``split_last_dim``) a block of the last dimension."""
    op = "reduce_scatter"
    _check(input.is_contiguous(), f"{op}: input must be contiguous.")
    _check(output.is_contiguous(), f"{op}: output must be contiguous.")
    handle = _handle(op, input, group_name)
    world_size = handle.world_size
    _check(
        input.numel() % world_size == 0,
        f"expected number of elements to be divisible by world_size, number of elements "
        f"{input.numel()} world size {world_size}",
    )
    if split_last_dim:
        _check(input.dim() == output.dim(), f"{op}: input and output dimensions differ")
        _check(
            input.shape[:-1] == output.shape[:-1],
            "reduce_scatter expected input and output to have same sizes except in the last "
            "dimension",
        )
        _check(
            output.shape[-1] == input.shape[-1] // world_size,
            "reduce_scatter expected output last dim size to be input last dim size / world_size",
        )
        _check(
            input.shape[-1] % world_size == 0,
            f"expected last dimension to be divisible by world_size, last dimension "
            f"{input.shape[-1]} world size {world_size}",
        )
    else:
        _check(input.dim() == 1, "reduce_scatter expected 1D input")
        _check(output.dim() == 1, "reduce_scatter expected 1D output")
        _check(
            output.numel() == input.numel() // world_size,
            f"{op}: output must have input.numel() / world_size elements",
        )
    if input.numel() == 0:
        _check(input.dtype == output.dtype, f"{op}: input and output dtypes differ")
        return output
    _reducible(op, input)
    handle.barrier(0)
    if split_last_dim:
        width = input.shape[-1] // world_size
        columns = slice(handle.rank * width, (handle.rank + 1) * width)
        parts = [m.view(-1, input.shape[-1])[:, columns] for m in _members(handle, input)]
        _sum(parts, output.view(-1, width))
    else:
        flat = input.view(-1)
        per = flat.numel() // world_size
        mine = flat[handle.rank * per : (handle.rank + 1) * per]
        _sum(_members(handle, mine), output)
    handle.barrier(0)
    return output


# ---------------------------------------------------------------------------------------------
# all_to_all_vdev and its 2-D forms (MoE dispatch and combine): every member reads the splits
# the others published, then gets the rows it receives from each of them.


def _rows(op: str, input: torch.Tensor, out: torch.Tensor) -> None:
    """Checks the data tensors of an all-to-all (rows of ``stride(0)`` elements)."""
    _check(
        input.is_contiguous() and out.is_contiguous(),
        f"{op}: input and out must be contiguous",
    )
    _check(
        input.dim() >= 1 and out.dim() >= 1,
        f"{op}: input and out must have at least 1 dimension",
    )
    _check(
        input.dtype == out.dtype and input.stride(0) == out.stride(0),
        f"{op}: input and out must have the same dtype and the same stride at dim 0",
    )


def _splits(op: str, *tensors: torch.Tensor) -> None:
    for tensor in tensors:
        _check(tensor.is_contiguous(), f"{op}: splits and offsets must be contiguous")
        _check(tensor.dtype == torch.int64, f"{op}: splits and offsets must be int64")


def _exchange(
    op: str,
    handle: SymmetricMemory,
    input: torch.Tensor,
    out: torch.Tensor,
    sources: list[tuple[int, int, int, int]],
) -> None:
    """Gets every ``(rank, source row, target row, rows)`` of ``sources``: ``rows`` rows of
    member ``rank``'s ``input`` into this member's ``out``, after checking both ranges."""
    out_handle = _handle(op, out, handle.group_name, "out")
    row = input.stride(0) * input.element_size()
    input_at = _byte_offset(handle, input)
    out_at = _byte_offset(out_handle, out)
    moves = []
    for rank, source, target, rows in sources:
        if rows == 0:
            continue
        _check(
            0 <= source and source + rows <= input.shape[0],
            f"{op}: rank {rank} sends rows {source}..{source + rows} of its input, which has "
            f"{input.shape[0]}",
        )
        _check(
            target + rows <= out.shape[0],
            f"{op}: out has {out.shape[0]} rows, too few for rows {target}..{target + rows} "
            f"from rank {rank}",
        )
        moves.append((handle.pes[rank], input_at + source * row, out_at + target * row, rows * row))
    _native.symm_get_many(out_handle._block.key, handle._block.key, moves)


def _published(handle: SymmetricMemory, splits: torch.Tensor) -> list[list[int]]:
    """Every member's ``splits`` (a symmetric int64 tensor), as lists, in rank order."""
    splits_handle = _handle("all_to_all_vdev", splits, handle.group_name, "splits")
    return [m.view(-1).tolist() for m in _members(splits_handle, splits)]


def _exclusive_scan(values: list[int]) -> list[int]:
    total, scan = 0, []
    for value in values:
        scan.append(total)
        total += value
    return scan


def all_to_all_vdev(
    input: torch.Tensor,
    out: torch.Tensor,
    in_splits: torch.Tensor,
    out_splits_offsets: torch.Tensor,
    group_name: str,
) -> None:
    """Member ``r`` sends ``in_splits[p]`` rows to member ``p``, taken in order from its
    ``input``; each member receives them in rank order into ``out`` and writes what it received
    from each member (row 0) and where it starts (row 1, an exclusive scan) into
    ``out_splits_offsets``."""
    op = "all_to_all_vdev"
    _rows(op, input, out)
    _splits(op, in_splits, out_splits_offsets)
    handle = _handle(op, input, group_name)
    world_size = handle.world_size
    _check(
        in_splits.numel() == world_size,
        f"in_splits must have world_size ({world_size}) elements, got {in_splits.numel()}",
    )
    _check(
        tuple(out_splits_offsets.shape) == (2, world_size),
        f"out_splits_offsets must have shape [2, world_size] = [2, {world_size}], got "
        f"{list(out_splits_offsets.shape)}",
    )
    handle.barrier(0)
    me = handle.rank
    published = _published(handle, in_splits)
    received = [splits[me] for splits in published]
    offsets = _exclusive_scan(received)
    sources = [
        (rank, _exclusive_scan(splits)[me], offsets[rank], received[rank])
        for rank, splits in enumerate(published)
    ]
    _exchange(op, handle, input, out, sources)
    out_splits_offsets.copy_(torch.tensor([received, offsets], dtype=torch.int64))
    handle.barrier(0)


def all_to_all_vdev_2d(
    input: torch.Tensor,
    out: torch.Tensor,
    in_splits: torch.Tensor,
    out_splits_offsets: torch.Tensor,
    group_name: str,
    major_align: int | None = None,
) -> None:
    """MoE dispatch: ``input`` holds, rank-major, ``in_splits[p * ne + e]`` rows for expert
    ``e`` of member ``p``; each member receives them expert-major (for each of its ``ne``
    experts, the rows from every member in rank order), each expert's rows padded to a multiple
    of ``major_align`` (and at least ``major_align``). Row 0 of ``out_splits_offsets``: the
    rows received, ``[e * world_size + p]``; row 1: where each chunk starts."""
    op = "all_to_all_vdev_2d"
    _rows(op, input, out)
    _splits(op, in_splits, out_splits_offsets)
    handle = _handle(op, input, group_name)
    world_size = handle.world_size
    nsplits = in_splits.numel()
    _check(
        out_splits_offsets.dim() == 2
        and tuple(out_splits_offsets.shape) == (2, nsplits)
        and nsplits % world_size == 0,
        "out_splits_offsets must be 2D with 2 rows, each row must be a multiple of world_size",
    )
    align = 1 if major_align is None else major_align
    _check(align > 0, "major_align must be positive")
    experts = nsplits // world_size
    handle.barrier(0)
    me = handle.rank
    published = _published(handle, in_splits)
    starts = [_exclusive_scan(splits) for splits in published]
    received = [
        published[rank][me * experts + e] for e in range(experts) for rank in range(world_size)
    ]
    offsets, sources, at = [], [], 0
    for e in range(experts):
        chunks = received[e * world_size : (e + 1) * world_size]
        for rank, rows in enumerate(chunks):
            offsets.append(at)
            sources.append((rank, starts[rank][me * experts + e], at, rows))
            at += rows
        total = sum(chunks)
        at += max(-(-total // align) * align, align) - total
    _exchange(op, handle, input, out, sources)
    out_splits_offsets.copy_(torch.tensor([received, offsets], dtype=torch.int64))
    handle.barrier(0)


def all_to_all_vdev_2d_offset(
    input: torch.Tensor,
    out: torch.Tensor,
    in_splits_offsets: torch.Tensor,
    out_splits_offsets: torch.Tensor,
    group_name: str,
) -> None:
    """MoE combine, the reverse of :func:`all_to_all_vdev_2d`: ``input`` holds, expert-major,
    ``in_splits_offsets[0][e * world_size + p]`` rows for member ``p`` starting at row
    ``in_splits_offsets[1][e * world_size + p]`` (padding between chunks stays home); each
    member receives them rank-major (for each member, its ``ne`` experts' rows in order),
    packed. Row 0 of ``out_splits_offsets``: the rows received, ``[p * ne + e]``; row 1: where
    each chunk starts."""
    op = "all_to_all_vdev_2d_offset"
    _rows(op, input, out)
    _splits(op, in_splits_offsets, out_splits_offsets)
    handle = _handle(op, input, group_name)
    world_size = handle.world_size
    _check(
        in_splits_offsets.dim() == 2
        and in_splits_offsets.shape[0] == 2
        and in_splits_offsets.shape[1] % world_size == 0,
        "in_splits_offsets must be 2D with 2 rows, each row must be a multiple of world_size",
    )
    nsplits = in_splits_offsets.shape[1]
    _check(
        tuple(out_splits_offsets.shape) == (2, nsplits),
        f"out_splits_offsets must have shape [2, {nsplits}], got {list(out_splits_offsets.shape)}",
    )
    experts = nsplits // world_size
    handle.barrier(0)
    me = handle.rank
    published = _published(handle, in_splits_offsets)
    received, sources, at = [], [], 0
    for rank, both in enumerate(published):
        splits, starts = both[:nsplits], both[nsplits:]
        for e in range(experts):
            rows = splits[e * world_size + me]
            received.append(rows)
            sources.append((rank, starts[e * world_size + me], at, rows))
            at += rows
    offsets = _exclusive_scan(received)
    _exchange(op, handle, input, out, sources)
    out_splits_offsets.copy_(torch.tensor([received, offsets], dtype=torch.int64))
    handle.barrier(0)


#: The kernels, by torch's operator name.
KERNELS: dict[str, Any] = {
    "one_shot_all_reduce": one_shot_all_reduce,
    "one_shot_all_reduce_out": one_shot_all_reduce_out,
    "one_shot_all_reduce_copy": one_shot_all_reduce_copy,
    "one_shot_all_reduce_copy_out": one_shot_all_reduce_copy_out,
    "two_shot_all_reduce_": two_shot_all_reduce_,
    "two_shot_all_reduce_out": two_shot_all_reduce_out,
    "reduce_scatter_out": reduce_scatter_out,
    "all_to_all_vdev": all_to_all_vdev,
    "all_to_all_vdev_2d": all_to_all_vdev_2d,
    "all_to_all_vdev_2d_offset": all_to_all_vdev_2d_offset,
}


def register() -> torch.library.Library:
    """Registers every kernel for CPU tensors under torch's ``symm_mem`` operators (defined by
    torch when ``torch.distributed._symmetric_memory`` is imported). Keep the returned library:
    the registrations last as long as it does."""
    import torch.distributed._symmetric_memory  # noqa: F401  (defines the Python-side ops)

    library = torch.library.Library("symm_mem", "IMPL")
    for name, kernel in KERNELS.items():
        library.impl(name, kernel, "CPU")
    return library
