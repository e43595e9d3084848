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
``all_to_all_vdev_2d_offset``) and torch's fused ones (``fused_all_gather_matmul``,
``fused_matmul_reduce_scatter``), so calls with CPU tensors work unchanged.

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

from . import _ops
from ._fused import get_symm_mem_workspace
from ._memory import (
    BACKEND,
    SymmetricMemory,
    empty,
    get,
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
    "get_symm_mem_workspace",
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
