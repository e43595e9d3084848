"""torch symmetric memory on CPU: the public API of ``torch.distributed._symmetric_memory``,
served by this runtime, so that a program written for it runs on CPU machines, on one host or
across hosts, with one change::

    import hyper_multicore.symm_mem as symm_mem   # instead of torch.distributed._symmetric_memory

    t = symm_mem.empty(4096, dtype=torch.bfloat16)          # collective over the job
    hdl = symm_mem.rendezvous(t, dist.group.WORLD)          # or the group name, "0"
    peer = hdl.get_buffer((hdl.rank + 1) % hdl.world_size, (4096,), torch.bfloat16)
    hdl.barrier(channel=0)
    out = torch.ops.symm_mem.one_shot_all_reduce(t, "sum", "0")

Importing it registers CPU kernels for torch's own ``torch.ops.symm_mem`` operators
(``one_shot_all_reduce`` and its ``_out``/``_copy``/``_copy_out`` forms, ``two_shot_all_reduce_``
and ``_out``, ``reduce_scatter_out``, ``all_to_all_vdev``, ``all_to_all_vdev_2d``,
``all_to_all_vdev_2d_offset``), so calls with CPU tensors work unchanged.

What differs from torch's CUDA backend (see docs/python.md, "torch symmetric memory"):
:func:`empty` is collective over the whole job (as NVSHMEM's allocation is) and starts the
runtime the first time; tensors are not freed before the process ends; peers on another host
are reached through the runtime only (``buffer_ptrs`` 0, ``get_buffer`` raises); signals
count, so ``put_signal`` never waits for the previous signal to be consumed; ``timeout_ms=0``
means the runtime's deadline, and a timeout raises instead of trapping.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed._symmetric_memory as _torch_symm_mem

from .. import _native
from ..shmem._registry import _local
from . import _ops
from ._memory import (
    BACKEND,
    SymmetricMemory,
    empty,
    get_signal_pad_size,
    is_symm_mem_tensor,
    rendezvous,
    set_signal_pad_size,
)

#: Keeps the CPU kernels registered.
_library = _ops.register()


def is_nvshmem_available() -> bool:
    """False: NVSHMEM is a CUDA library; this backend does not use it."""
    return False


def set_backend(name: str) -> None:
    """Chooses the backend: ``"HYPER_MULTICORE"`` (this runtime, CPU tensors; always in use
    for them) is accepted as it is; torch's own names (``"NVSHMEM"``, ``"CUDA"``, ``"NCCL"``)
    choose torch's backend for its devices, as in torch."""
    if name != BACKEND:
        _torch_symm_mem.set_backend(name)  # type: ignore[arg-type]


def get_backend(device: Any) -> str | None:
    """``"HYPER_MULTICORE"`` for the CPU; torch's answer for other devices."""
    device = torch.device(device)
    if device.type == "cpu":
        return BACKEND
    return _torch_symm_mem.get_backend(device)


def get(dst: torch.Tensor, hdl: SymmetricMemory, peer: int, offset: int = 0) -> None:
    """Copies ``dst.numel()`` elements, starting ``offset`` elements past the handle's offset
    in member ``peer``'s block, into ``dst`` (one-sided; any member, on this host or another)."""
    if dst.device != hdl.device:
        raise ValueError("get: dst must be on the same device as hdl")
    if not dst.is_contiguous():
        raise ValueError("get: dst must be backed by contiguous memory")
    if offset < 0:
        raise ValueError("get: offset must be non-negative")
    if peer < 0 or peer >= hdl.world_size:
        raise ValueError("get: invalid peer")
    start = hdl.offset + offset * dst.element_size()
    nbytes = dst.numel() * dst.element_size()
    if start + nbytes > hdl.buffer_size:
        raise ValueError("get: requested range exceeds symmetric allocation")
    block = hdl._block
    source = (*block.key, block.data_offset + start, nbytes)
    _native.get_region(_local(dst, "dst", writable=True), source, hdl.pes[peer])


def enable_symm_mem_for_group(group_name: str) -> None:
    """Nothing to do (deprecated in torch too): every group can use symmetric memory."""


def is_symm_mem_enabled_for_group(group_name: str) -> bool:
    """True: every group can use symmetric memory here."""
    return True


def get_mem_pool(device: Any) -> Any:
    """torch's: memory pools exist for CUDA and XPU devices only (a CPU device raises)."""
    return _torch_symm_mem.get_mem_pool(device)


def reduce_scatter_offset(
    input: torch.Tensor, out: list[torch.Tensor], group: str, **_: Any
) -> None:
    """Not provided: torch implements it for its NCCL backend only (and raises
    ``NotImplementedError`` for every other backend, as this one does)."""
    raise NotImplementedError(f"reduce_scatter_offset: unsupported backend: {BACKEND}")


def all_to_all_nd(
    input: torch.Tensor, out: torch.Tensor, scatter_dim: int, gather_dim: int, *, group: str
) -> None:
    """Not provided: torch implements it for its NCCL backend only (and raises
    ``NotImplementedError`` for every other backend, as this one does)."""
    raise NotImplementedError(f"all_to_all_nd: unsupported backend: {BACKEND}")


__all__ = [
    "empty",
    "is_symm_mem_tensor",
    "rendezvous",
    "is_nvshmem_available",
    "set_backend",
    "get_backend",
    "get",
    "set_signal_pad_size",
    "get_signal_pad_size",
    "get_mem_pool",
    "reduce_scatter_offset",
    "all_to_all_nd",
    "enable_symm_mem_for_group",
    "is_symm_mem_enabled_for_group",
    "SymmetricMemory",
    "BACKEND",
]
