"""CPU kernels for torch's fused operators ``fused_all_gather_matmul`` and
``fused_matmul_reduce_scatter``, and the group workspace they use
(:func:`get_symm_mem_workspace`, torch's function of that name on the CPU).

torch implements them in Python over CUDA streams and its device workspace, pipelining each
shard's copy with the previous shard's matmul. On the CPU there is no second stream to overlap
with, so these do the collective in one step and the matmul in one call, through this module's
operators: the all-gather copies every member's shard out of the group's symmetric workspace
(:func:`~hyper_multicore.symm_mem.get`: direct on this host, over the runtime across hosts),
and the reduce-scatter is ``torch.ops.symm_mem.reduce_scatter_out`` over the workspace. The
results are those of torch's unfused reference (its fallback): ``all_gather(A) @ B``, and
``reduce_scatter(A @ B)`` with the members' products summed in rank order.
"""

from __future__ import annotations

from typing import Any

import torch

from ._memory import SymmetricMemory, empty, get, is_symm_mem_tensor, rendezvous

#: Each group's workspace (a uint8 tensor made by ``empty``), by group name.
_workspaces: dict[str, torch.Tensor] = {}


def get_symm_mem_workspace(group_name: str, min_size: int) -> SymmetricMemory:
    """The handle of ``group_name``'s workspace, a symmetric block of at least ``min_size``
    bytes, made (or replaced by a larger one) when it is smaller, as torch's function does.

    Making one is collective over the whole job, as :func:`~hyper_multicore.symm_mem.empty` is:
    every PE calls this (or a fused operator needing a larger workspace) for the group at the
    same point, members of the group or not. Replaced workspaces are not freed (see
    ``empty``); one of an earlier lifetime of the runtime is replaced too."""
    tensor = _workspaces.get(group_name)
    size = 0 if tensor is None or not is_symm_mem_tensor(tensor) else tensor.numel()
    if size == 0 or size < min_size:
        # At least one byte: a block of none has no address to find it by.
        tensor = empty(max(size, min_size, 1), dtype=torch.uint8)
        _workspaces[group_name] = tensor
    handle = rendezvous(tensor, group_name)
    assert handle is not None
    return handle


def _group_size(group_name: str) -> int:
    """The number of members of the group (its workspace's handle knows)."""
    return get_symm_mem_workspace(group_name, 0).world_size


def _workspace_view(group_name: str, like: torch.Tensor) -> torch.Tensor:
    """The start of the group's workspace as a flat tensor of ``like``'s dtype and size."""
    nbytes = like.numel() * like.element_size()
    get_symm_mem_workspace(group_name, nbytes)
    return _workspaces[group_name][:nbytes].view(like.dtype)


def _all_gather_rows(shard: torch.Tensor, group_name: str) -> torch.Tensor:
    """Every member's ``shard`` (contiguous, the same shape on every member) stacked along
    dim 0 in rank order, through the group's workspace."""
    staged = _workspace_view(group_name, shard)
    handle = rendezvous(staged, group_name)
    assert handle is not None
    gathered = shard.new_empty((handle.world_size * shard.shape[0], *shard.shape[1:]))
    chunks = gathered.chunk(handle.world_size) if shard.numel() else []
    # As torch's pipeline: nobody still reads a workspace when it is overwritten (channel 0),
    # every shard is staged before anyone reads one (channel 1).
    handle.barrier(channel=0)
    staged.copy_(shard.view(-1))
    handle.barrier(channel=1)
    for rank, chunk in enumerate(chunks):
        if rank == handle.rank:
            chunk.copy_(shard)
        else:
            get(chunk, handle, rank)
    handle.barrier(channel=0)
    return gathered


def fused_all_gather_matmul(
    A_shard: torch.Tensor,
    Bs: list[torch.Tensor],
    gather_dim: int,
    group_name: str,
    *,
    return_A: bool = True,
) -> tuple[torch.Tensor | None, list[torch.Tensor]]:
    """``all_gather(A_shard, gather_dim) @ B`` for every ``B`` of ``Bs`` (and the gathered
    ``A`` if ``return_A``), with torch's checks and shapes."""
    if A_shard.dim() < 2:
        raise ValueError("A_shard must be a matrix")
    for B in Bs:
        if B.dim() != 2:
            raise ValueError("B must be a matrix")
    if gather_dim < 0 or gather_dim >= A_shard.dim():
        raise ValueError("Invalid gather_dim")
    if gather_dim == A_shard.dim() - 1:
        # The shards side by side along the last dimension.
        leading = list(A_shard.shape[:-1])
        gathered = _all_gather_rows(A_shard.flatten(0, -2).contiguous(), group_name)
        A = torch.cat(gathered.chunk(_group_size(group_name)), dim=-1)
        outputs = [(A @ B).view(*leading, -1) for B in Bs]
        return (A.view(*leading, -1) if return_A else None), outputs
    # The gather dimension first, the rest flattened into rows.
    moved = A_shard.movedim(gather_dim, 0)
    rows = moved.flatten(0, -2).contiguous()
    A_flat = _all_gather_rows(rows, group_name)
    leading = [_group_size(group_name), *moved.shape[:-1]]

    def unflatten(t: torch.Tensor) -> torch.Tensor:
        return t.view(*leading, -1).flatten(0, 1).movedim(0, gather_dim)

    outputs = [unflatten(A_flat @ B) for B in Bs]
    return (unflatten(A_flat) if return_A else None), outputs


def fused_matmul_reduce_scatter(
    A: torch.Tensor, B: torch.Tensor, reduce_op: str, scatter_dim: int, group_name: str
) -> torch.Tensor:
    """``reduce_scatter(A @ B, reduce_op, scatter_dim)``: this member's block (along
    ``scatter_dim``) of the members' products summed in rank order (``"avg"``: divided by the
    group's size), with torch's checks and shapes."""
    if A.dim() < 2:
        raise ValueError("A_shard must be a matrix")
    if scatter_dim < 0 or scatter_dim >= A.dim():
        raise ValueError("Invalid gather_dim")
    if B.dim() != 2:
        raise ValueError("B must be a matrix")
    if reduce_op not in ("sum", "avg"):
        raise ValueError("reduce_op must be sum or avg")
    product = (A @ B).movedim(scatter_dim, 0).contiguous()
    staged = _workspace_view(group_name, product)
    world_size = _group_size(group_name)
    if product.shape[0] % world_size:
        raise ValueError(
            f"scatter dimension {scatter_dim} of A @ B has {product.shape[0]} elements, not "
            f"a multiple of the group's size {world_size}"
        )
    staged.copy_(product.view(-1))
    block = product.new_empty(product.numel() // world_size)
    torch.ops.symm_mem.reduce_scatter_out(staged, group_name, False, block)
    result = block.view(product.shape[0] // world_size, *product.shape[1:])
    if reduce_op == "avg":
        result = result / world_size
    return result.movedim(0, scatter_dim)


#: The kernels, by torch's operator name.
FUSED: dict[str, Any] = {
    "fused_all_gather_matmul": fused_all_gather_matmul,
    "fused_matmul_reduce_scatter": fused_matmul_reduce_scatter,
}
