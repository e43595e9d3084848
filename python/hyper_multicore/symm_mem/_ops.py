"""CPU kernels for torch's own ``torch.ops.symm_mem`` operators, registered on import with
``torch.library`` under torch's schemas (torch defines the operators; this adds their CPU
implementations): ``one_shot_all_reduce`` (and ``_out``, ``_copy``, ``_copy_out``),
``two_shot_all_reduce_`` (and ``_out``), ``reduce_scatter_out``, ``all_to_all_vdev``,
``all_to_all_vdev_2d`` and ``all_to_all_vdev_2d_offset``.

Each kernel here checks its arguments as torch does and makes one native call, which does the
work (``crates/hyper-multicore-py/src/symm_mem/ops.rs``) as torch's CUDA kernel does: a
barrier on the input's signal pad (every member's input is ready), the work, a barrier again
(no member changes its input before every member has read it). Members on this host are read
and written where their memory lies; members on another host through the runtime (UCX).
Reductions add the members' values in rank order with the runtime's reduction kernels, as the
CUDA kernels do (``acc = v0; acc += v1; …``, rounding to the dtype after each addition, as
torch's CPU arithmetic does), so every member ends with the same bits.

Where torch's CUDA kernels need 4-byte aligned sizes (vector loads), these take any size; the
reductions take float32 and bfloat16 as torch does, and float16 and float64 besides.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .. import _native
from ..shmem._registry import _lookup
from ._memory import SymmetricMemory, _block_of, rendezvous

#: The dtypes the reductions take.
_REDUCIBLE = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


def _handle(op: str, tensor: torch.Tensor, group_name: str, what: str = "input") -> SymmetricMemory:
    """``tensor``'s handle over the group, or torch's error for a tensor not made by ``empty``."""
    block = _block_of(tensor)
    if block is None:
        raise RuntimeError(
            f"{op}: {what} must be allocated with empty_strided_p2p() "
            "(hyper_multicore.symm_mem.empty)."
        )
    handle = block.handles.get(group_name)
    if handle is None:
        handle = rendezvous(tensor, group_name)
        assert handle is not None
    return handle


def _check(condition: bool, message: str | Callable[[], str]) -> None:
    """Raises torch's ``RuntimeError`` with ``message`` (or the one it makes: formatted only
    when raised, off the fast path) unless ``condition``."""
    if not condition:
        raise RuntimeError(message if isinstance(message, str) else message())


def _reducible(op: str, tensor: torch.Tensor) -> None:
    if tensor.dtype not in _REDUCIBLE:
        raise RuntimeError(f'"{op}" not implemented for {tensor.dtype}')


#: The reducible dtypes' names in the native kernels.
_NAMES = {
    torch.float32: "float32",
    torch.bfloat16: "bfloat16",
    torch.float16: "float16",
    torch.float64: "float64",
}


def _place(handle: SymmetricMemory, tensor: torch.Tensor) -> tuple[Any, int, int]:
    """``tensor`` (contiguous, in ``handle``'s block) as the kernels take it: its allocation,
    where it starts in it (the same on every member) and its length in bytes."""
    block = handle._block
    offset = tensor.data_ptr() - block.allocation.address
    return (block.key, offset, tensor.numel() * tensor.element_size())


def _private(tensor: torch.Tensor) -> tuple[int, int]:
    """A private output as the kernels take it: ``(address, bytes)`` (the caller keeps the
    tensor referenced during the call)."""
    return (tensor.data_ptr(), tensor.numel() * tensor.element_size())


def _into_private(out: torch.Tensor, compute: Any) -> None:
    """Runs ``compute(private)`` with a private tensor like ``out`` (``out`` itself unless it
    lies in the symmetric heap, where the kernels do not write private outputs), then makes
    sure ``out`` holds the result."""
    if _lookup(out) is None:
        compute(out)
        return
    private = torch.empty_like(out)
    compute(private)
    out.copy_(private)


def _members(handle: SymmetricMemory) -> tuple[Any, list[int], int, int]:
    """Who meets in a kernel, and where: the handle's block (whose pad the barriers use), its
    members' PEs, this PE's rank among them and the pad row of channel 0 (made once per
    handle)."""
    members = handle._members
    if members is None:
        members = (handle._block.key, handle._pe_list, handle.rank, handle._row(0))
        handle._members = members
    return members


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
    _check(input.is_contiguous(), lambda: f"{op}: input must be contiguous.")
    _check(out.is_contiguous(), lambda: f"{op}: output must be contiguous.")
    _check(
        out.shape == input.shape,
        lambda: (
            f"{op}: input/output size mismatch, input.sizes(): {list(input.shape)}, "
            f"output.sizes(): {list(out.shape)}"
        ),
    )
    _check(reduce_op == "sum", lambda: f"{op}: only sum is supported for now.")
    if local_input is not None:
        _check(local_input.is_contiguous(), lambda: f"{op}: local input must be contiguous.")
        _check(
            local_input.numel() <= input.numel(),
            lambda: f"{op}: local input size must be smaller than symm buffer size.",
        )
    _check(input.dtype == out.dtype, lambda: f"{op}: input and output dtypes differ")
    if input.numel() == 0:
        return out
    handle = _handle(op, input, group_name)
    _reducible(op, input)
    if local_input is not None:
        input.view(-1)[: local_input.numel()].copy_(local_input.view(-1))
    members = _members(handle)
    place, dtype = _place(handle, input), _NAMES[input.dtype]
    _into_private(out, lambda into: _native.symm_one_shot(place, dtype, members, _private(into)))
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
    _check(input.is_contiguous(), lambda: f"{op}: input must be contiguous.")
    _check(reduce_op == "sum", lambda: f"{op}: only sum is supported for now.")
    handle = _handle(op, input, group_name)
    if output is not None:
        _check(output.is_contiguous(), lambda: f"{op}: output must be contiguous.")
        _check(
            output.shape == input.shape,
            lambda: (
                f"{op}: input/output size mismatch, input.sizes(): {list(input.shape)}, "
                f"output.sizes(): {list(output.shape)}"
            ),
        )
        _check(output.dtype == input.dtype, lambda: f"{op}: input and output dtypes differ")
    if input.numel() == 0:
        return input if output is None else output
    _reducible(op, input)
    members = _members(handle)
    place, dtype = _place(handle, input), _NAMES[input.dtype]
    if output is None:
        _native.symm_two_shot(place, dtype, members)
        return input
    _into_private(
        output,
        lambda into: _native.symm_two_shot(place, dtype, members, _private(into)),
    )
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
    _check(input.is_contiguous(), lambda: f"{op}: input must be contiguous.")
    _check(output.is_contiguous(), lambda: f"{op}: output must be contiguous.")
    handle = _handle(op, input, group_name)
    world_size = handle.world_size
    _check(
        input.numel() % world_size == 0,
        lambda: (
            f"expected number of elements to be divisible by world_size, number of elements "
            f"{input.numel()} world size {world_size}"
        ),
    )
    if split_last_dim:
        _check(input.dim() == output.dim(), lambda: f"{op}: input and output dimensions differ")
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
            lambda: (
                f"expected last dimension to be divisible by world_size, last dimension "
                f"{input.shape[-1]} world size {world_size}"
            ),
        )
    else:
        _check(input.dim() == 1, "reduce_scatter expected 1D input")
        _check(output.dim() == 1, "reduce_scatter expected 1D output")
        _check(
            output.numel() == input.numel() // world_size,
            lambda: f"{op}: output must have input.numel() / world_size elements",
        )
    _check(input.dtype == output.dtype, lambda: f"{op}: input and output dtypes differ")
    if input.numel() == 0:
        return output
    _reducible(op, input)
    rows = input.numel() // input.shape[-1] if split_last_dim else 1
    members = _members(handle)
    place, dtype = _place(handle, input), _NAMES[input.dtype]
    _into_private(
        output,
        lambda into: _native.symm_reduce_scatter(place, dtype, members, rows, _private(into)),
    )
    return output


# ---------------------------------------------------------------------------------------------
# all_to_all_vdev and its 2-D forms (MoE dispatch and combine): every member reads the splits
# the others published, then gets the rows it receives from each of them.


def _rows(op: str, input: torch.Tensor, out: torch.Tensor) -> None:
    """Checks the data tensors of an all-to-all (rows of ``stride(0)`` elements)."""
    _check(
        input.is_contiguous() and out.is_contiguous(),
        lambda: f"{op}: input and out must be contiguous",
    )
    _check(
        input.dim() >= 1 and out.dim() >= 1,
        lambda: f"{op}: input and out must have at least 1 dimension",
    )
    _check(
        input.dtype == out.dtype and input.stride(0) == out.stride(0),
        lambda: f"{op}: input and out must have the same dtype and the same stride at dim 0",
    )


def _splits(op: str, *tensors: torch.Tensor) -> None:
    for tensor in tensors:
        _check(tensor.is_contiguous(), lambda: f"{op}: splits and offsets must be contiguous")
        _check(tensor.dtype == torch.int64, lambda: f"{op}: splits and offsets must be int64")


def _all_to_all(
    op: str,
    kind: str,
    major_align: int,
    handle: SymmetricMemory,
    tensors: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
) -> None:
    """The native all-to-all ``kind`` over ``tensors`` = (input, out, splits,
    out_splits_offsets), every one made by ``empty``."""
    input, out, splits, out_splits_offsets = tensors
    what = ("input", "out", "splits", "out_splits_offsets")
    places = [
        _place(_handle(op, tensor, handle.group_name, name), tensor)
        for tensor, name in zip(tensors, what)
    ]
    row_bytes = input.stride(0) * input.element_size()
    _native.symm_all_to_all(kind, major_align, places, max(row_bytes, 1), _members(handle))


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
        lambda: f"in_splits must have world_size ({world_size}) elements, got {in_splits.numel()}",
    )
    _check(
        tuple(out_splits_offsets.shape) == (2, world_size),
        lambda: (
            f"out_splits_offsets must have shape [2, world_size] = [2, {world_size}], got "
            f"{list(out_splits_offsets.shape)}"
        ),
    )
    _all_to_all(op, "flat", 1, handle, (input, out, in_splits, out_splits_offsets))


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
    _all_to_all(op, "dispatch", align, handle, (input, out, in_splits, out_splits_offsets))


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
        lambda: (
            f"out_splits_offsets must have shape [2, {nsplits}], got "
            f"{list(out_splits_offsets.shape)}"
        ),
    )
    _all_to_all(op, "combine", 1, handle, (input, out, in_splits_offsets, out_splits_offsets))


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
    """Registers every kernel (and the fused ones of ``_fused``) for CPU tensors under torch's
    ``symm_mem`` operators (defined by torch when ``torch.distributed._symmetric_memory`` is
    imported). Keep the returned library:
    the registrations last as long as it does."""
    import torch.distributed._symmetric_memory  # noqa: F401  (defines the Python-side ops)

    from ._fused import FUSED

    library = torch.library.Library("symm_mem", "IMPL")
    for name, kernel in {**KERNELS, **FUSED}.items():
        library.impl(name, kernel, "CPU")
    return library
