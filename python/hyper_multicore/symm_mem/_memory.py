"""Symmetric-memory tensors and their handles: :func:`empty`, :func:`rendezvous`,
:func:`is_symm_mem_tensor` and :class:`SymmetricMemory`, torch's API on this runtime.

Every tensor :func:`empty` makes is one allocation of the runtime's heap, laid out as torch's
CUDA backend lays out its blocks: the signal pad (``uint32`` words, zeroed on every PE before
anyone may signal into it), then the data. A handle (:func:`rendezvous`) belongs to one block
and one group: its members' copies of the block, seen directly (``get_buffer``, ``buffer_ptrs``)
where a member shares this host's heap segment, and reached through the runtime (signals, puts,
gets; UCX for another host) everywhere.
"""

from __future__ import annotations

import math
import threading
import warnings
from collections.abc import Sequence
from typing import Any

import torch

from .. import _native, shmem
from ..shmem._registry import _local, _lock, _lookup

#: The name :func:`get_backend` gives this runtime for CPU tensors.
BACKEND = "HYPER_MULTICORE"

#: torch's default signal pad size (bytes), as its CUDA backend has it.
DEFAULT_SIGNAL_PAD_SIZE = 9216

#: Where a block's data starts after its pad: a multiple of this (a cache line), so data and
#: pad words never share one.
DATA_ALIGNMENT = 64

_signal_pad_size = DEFAULT_SIGNAL_PAD_SIZE
#: Blocks by allocation (index, generation).
_blocks: dict[tuple[int, int], _Block] = {}
#: Whether this module took its reference to the runtime.
_acquired = False
_acquire_lock = threading.Lock()


def set_signal_pad_size(size: int) -> None:
    """The signal pad size (bytes) of later allocations; blocks made before keep theirs."""
    global _signal_pad_size
    if type(size) is not int or size < 0:
        raise ValueError(f"the signal pad size must be a non-negative int, not {size!r}")
    _signal_pad_size = size


def get_signal_pad_size() -> int:
    """The signal pad size (bytes) of the next allocation (torch's default: 9216)."""
    return _signal_pad_size


class _Block:
    """One :func:`empty` allocation: the heap allocation, the pad's size, and where the data
    starts (``data_offset`` bytes into the allocation) and ends (``nbytes`` long)."""

    __slots__ = ("allocation", "pad", "data_offset", "nbytes", "handles")

    def __init__(self, allocation: Any, pad: int, data_offset: int, nbytes: int) -> None:
        self.allocation = allocation
        self.pad = pad
        self.data_offset = data_offset
        self.nbytes = nbytes
        #: Handles by group name.
        self.handles: dict[str, SymmetricMemory] = {}

    @property
    def key(self) -> tuple[int, int]:
        return (self.allocation.index, self.allocation.generation)


def _ensure_runtime() -> None:
    """Takes this module's reference to the runtime, over the whole world (torch.distributed's
    WORLD when it is initialised, else the launcher's world), the first time."""
    global _acquired
    with _acquire_lock:
        if not _acquired or shmem.reference_count() == 0:
            shmem.acquire()
            _acquired = True


def _size(size: tuple[Any, ...]) -> tuple[int, ...]:
    if len(size) == 1 and isinstance(size[0], Sequence):
        size = tuple(size[0])
    dims = tuple(int(d) for d in size)
    if any(d < 0 for d in dims):
        raise RuntimeError(f"Trying to create tensor with negative dimension: {list(dims)}")
    return dims


def empty(*size: Any, dtype: torch.dtype | None = None, device: Any = None) -> torch.Tensor:
    """A new symmetric tensor of ``size`` (as :func:`torch.empty`: variadic or one sequence)
    on the CPU; ``dtype`` defaults to :func:`torch.get_default_dtype`.

    A collective call over the runtime's root (every PE of the job makes it, in the same order,
    with the same arguments), as NVSHMEM's allocation is: it allocates on every PE and zeroes the
    signal pad, then passes a barrier so that no peer signals into a pad not yet zeroed. The
    runtime is started over the world the first time. The data is uninitialised.
    """
    dims = _size(size)
    dtype = torch.get_default_dtype() if dtype is None else dtype
    device = torch.get_default_device() if device is None else torch.device(device)
    if device.type != "cpu":
        raise ValueError(
            f"hyper_multicore.symm_mem holds CPU tensors, not {device.type} ones; use "
            "torch.distributed._symmetric_memory for accelerators"
        )
    itemsize = torch.empty((), dtype=dtype).element_size()
    nbytes = math.prod(dims) * itemsize
    pad = _signal_pad_size
    data_offset = -(-pad // DATA_ALIGNMENT) * DATA_ALIGNMENT
    _ensure_runtime()
    with _lock:
        blob = shmem.empty(data_offset + nbytes, dtype=torch.uint8)
        allocation = _lookup(blob)
        block = _Block(allocation, pad, data_offset, nbytes)
        _blocks[block.key] = block
    blob[:pad].zero_()
    shmem.barrier()
    return blob[data_offset:].view(dtype).view(dims)


def _block_of(tensor: Any) -> _Block | None:
    """The live block ``tensor`` (or a view of it) lies in, or None."""
    if not isinstance(tensor, torch.Tensor):
        return None
    allocation = _lookup(tensor)
    if allocation is None or not allocation.live:
        return None
    return _blocks.get((allocation.index, allocation.generation))


def is_symm_mem_tensor(tensor: torch.Tensor) -> bool:
    """True if ``tensor`` (or the tensor it is a view of) was made by :func:`empty`."""
    return _block_of(tensor) is not None


def _resolve_group_name(group: Any) -> str:
    if isinstance(group, str):
        return group
    process_group = getattr(torch.distributed, "ProcessGroup", None)
    if process_group is not None and isinstance(group, process_group):
        return group.group_name
    raise TypeError(f"unsupported group type: {type(group)}")


def _group_members(group_name: str) -> list[int]:
    """The global ranks of the group named ``group_name``, in group order: a torch.distributed
    group's, or (without torch.distributed) the launcher's world for ``"0"``."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        from torch.distributed import distributed_c10d as c10d

        return list(dist.get_process_group_ranks(c10d._resolve_process_group(group_name)))
    if group_name != "0":
        raise ValueError(
            f"group {group_name!r} is unknown: without torch.distributed, the only group is "
            '"0", the launcher\'s world'
        )
    return list(shmem.root_members())


def rendezvous(tensor: torch.Tensor, group: Any) -> SymmetricMemory | None:
    """The handle of ``tensor``'s block over ``group`` (a group name or a ``ProcessGroup``;
    ``"0"`` is the world, as in torch).

    Collective in torch; here it needs no communication (every block is symmetric by
    construction: allocated collectively, with the runtime checking that every PE asked for
    the same), so each member may call it when it likes. The handle is made once per block and
    group and returned again after. A tensor not made by :func:`empty` gives None and a
    warning, as in torch.
    """
    group_name = _resolve_group_name(group)
    block = _block_of(tensor)
    if block is None:
        warnings.warn(
            "Pointer not within any SymmetricMemory allocation, is the tensor allocated from "
            "SymmetricMemory?",
            stacklevel=2,
        )
        return None
    handle = block.handles.get(group_name)
    if handle is None:
        handle = SymmetricMemory(block, group_name, _group_members(group_name))
        block.handles[group_name] = handle
    return handle


def _check_rank(rank: int, world_size: int) -> None:
    if not 0 <= rank < world_size:
        raise RuntimeError(f"rank {rank} is out of range for a group of {world_size}")


def _timeout(timeout_ms: int) -> float | None:
    """torch's ``timeout_ms`` (0: wait as long as it takes) as the runtime's deadline in
    seconds (0: the runtime's configured deadline, ``HYPER_MULTICORE_SHMEM_TIMEOUT_SEC``)."""
    if timeout_ms < 0:
        raise ValueError(f"timeout_ms must be non-negative, not {timeout_ms}")
    return timeout_ms / 1000 if timeout_ms else None


class SymmetricMemory:
    """A block's handle over one group: torch's ``_SymmetricMemory`` on CPU tensors.

    ``rank``/``world_size`` are this process's rank in the group and its size; ``buffer_ptrs``
    and ``signal_pad_ptrs`` each member's data and pad in this process (0 for a member on
    another host: its memory is reached through the runtime only); ``buffer_size`` and
    ``signal_pad_size`` their sizes in bytes. ``barrier``, ``put_signal`` and ``wait_signal``
    work with every member; ``get_buffer`` and ``get_signal_pad`` only with members on this
    host.
    """

    def __init__(self, block: _Block, group_name: str, members: list[int]) -> None:
        me = _native.my_pe()
        if me not in members:
            raise ValueError(
                f"this PE (global rank {me}) is not a member of group {group_name!r} "
                f"(ranks {members})"
            )
        self._block = block
        self.group_name = group_name
        #: The members' PEs (global ranks), in group order.
        self.pes = tuple(members)
        self._pe_list = list(members)
        self._rank = members.index(me)
        bases = _native.symm_addresses(block.key, list(members))
        self._bases = bases
        self._buffer_ptrs = [b + block.data_offset if b else 0 for b in bases]
        self._signal_pad_ptrs = list(bases)
        # CPU stand-ins for the device arrays of pointers torch's CUDA backend keeps.
        self._buffer_ptrs_array = torch.tensor(self._buffer_ptrs, dtype=torch.int64)
        self._signal_pad_ptrs_array = torch.tensor(self._signal_pad_ptrs, dtype=torch.int64)
        self._views: dict[tuple[int, int, int, torch.dtype], torch.Tensor] = {}
        #: What the operators' kernels take of the handle (``_ops._members``), once made.
        self._members: tuple[Any, list[int], int, int] | None = None

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return len(self.pes)

    @property
    def buffer_ptrs(self) -> list[int]:
        return list(self._buffer_ptrs)

    @property
    def buffer_ptrs_dev(self) -> int:
        """The address of an int64 array of :attr:`buffer_ptrs` (host memory here)."""
        return self._buffer_ptrs_array.data_ptr()

    @property
    def signal_pad_ptrs(self) -> list[int]:
        return list(self._signal_pad_ptrs)

    @property
    def signal_pad_ptrs_dev(self) -> int:
        """The address of an int64 array of :attr:`signal_pad_ptrs` (host memory here)."""
        return self._signal_pad_ptrs_array.data_ptr()

    @property
    def buffer_size(self) -> int:
        return self._block.nbytes

    @property
    def signal_pad_size(self) -> int:
        return self._block.pad

    @property
    def offset(self) -> int:
        """The handle's byte offset in the block's data: 0 (a block is one tensor's storage)."""
        return 0

    @property
    def multicast_ptr(self) -> int:
        """0: there is no multicast memory on the CPU."""
        return 0

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    def _peer_tensor(self, rank: int, byte_offset: int, nbytes: int) -> torch.Tensor:
        """``nbytes`` bytes at ``byte_offset`` of member ``rank``'s block, as a uint8 tensor
        over that memory (cached: the same view for the same range)."""
        key = (rank, byte_offset, nbytes, torch.uint8)
        view = self._views.get(key)
        if view is None:
            if not self._bases[rank]:
                raise RuntimeError(
                    f"Cannot get buffer across nodes, my rank: {self._rank}, peer: {rank} "
                    f"(PE {self.pes[rank]} is reached through the network, not mapped in this "
                    "process: direct access is within a host; use put/get, signals and the "
                    "symm_mem ops for it)"
                )
            capsule = _native.symm_peer_capsule(
                self._block.key, self.pes[rank], byte_offset, [nbytes], "uint8"
            )
            view = torch._C._from_dlpack(capsule)
            self._views[key] = view
        return view

    def get_buffer(
        self,
        rank: int,
        sizes: Sequence[int],
        dtype: torch.dtype,
        storage_offset: int = 0,
    ) -> torch.Tensor:
        """Member ``rank``'s data as a tensor of ``sizes`` and ``dtype``, starting
        ``storage_offset`` elements in: a view of its memory, for a member on this host."""
        _check_rank(rank, self.world_size)
        itemsize = torch.empty((), dtype=dtype).element_size()
        offset = storage_offset * itemsize
        nbytes = math.prod(sizes) * itemsize
        if storage_offset < 0 or offset + nbytes > self.buffer_size:
            raise RuntimeError(
                f"SymmetricMemory::get_buffer: the requested size ({offset + nbytes} bytes) "
                f"exceeds the allocated size ({self.buffer_size} bytes)"
            )
        raw = self._peer_tensor(rank, self._block.data_offset + offset, nbytes)
        return raw.view(dtype).view(tuple(sizes))

    def get_remote_tensor(
        self, peer: int, sizes: Sequence[int], dtype: torch.dtype
    ) -> torch.Tensor:
        """:meth:`get_buffer` at the handle's :attr:`offset`."""
        return self.get_buffer(peer, sizes, dtype, self.offset)

    def get_signal_pad(
        self,
        rank: int,
        sizes: Sequence[int] = (),
        dtype: torch.dtype | None = None,
        storage_offset: int = 0,
    ) -> torch.Tensor:
        """Member ``rank``'s signal pad as a tensor (default: the whole pad as uint32 words)."""
        _check_rank(rank, self.world_size)
        dtype = torch.uint32 if dtype is None else dtype
        itemsize = torch.empty((), dtype=dtype).element_size()
        shape = tuple(sizes) if len(sizes) else (self.signal_pad_size // itemsize,)
        offset = storage_offset * itemsize
        nbytes = math.prod(shape) * itemsize
        if storage_offset < 0 or offset + nbytes > self.signal_pad_size:
            raise RuntimeError(
                f"SymmetricMemory::get_signal_pad: the requested size ({offset + nbytes} "
                f"bytes) exceeds the allocated size ({self.signal_pad_size} bytes)"
            )
        return self._peer_tensor(rank, offset, nbytes).view(dtype).view(shape)

    def _row(self, channel: int) -> int:
        """The byte offset of ``channel``'s row of signal words in every member's pad."""
        if type(channel) is not int or channel < 0:
            raise RuntimeError(
                "channel for barrier(), put_signal() and wait_signal() must be greater than 0 "
                f"(got {channel})"
            )
        row_bytes = 4 * self.world_size
        channels = self.signal_pad_size // row_bytes
        if channel >= channels:
            raise RuntimeError(
                "The maximum supported channel for barrier(), put_signal() and wait_signal() "
                f"is {channels - 1} (got {channel})"
            )
        return row_bytes * channel

    def barrier(self, channel: int = 0, timeout_ms: int = 0) -> None:
        """Waits until every member has called it on ``channel``: a signal to every other
        member, then one from each (their earlier puts and signals are visible after it)."""
        small = self._block.pad < 4 * len(self.pes)
        row = self._row(channel) if channel or small else 0
        timeout = None if timeout_ms == 0 else _timeout(timeout_ms)
        _native.symm_barrier(self._block.key, self._pe_list, self._rank, row, timeout)

    def put_signal(self, dst_rank: int, channel: int = 0, timeout_ms: int = 0) -> None:
        """Signals member ``dst_rank`` on ``channel`` (after this PE's earlier puts to it)."""
        _check_rank(dst_rank, self.world_size)
        _timeout(timeout_ms)
        word = self._row(channel) + 4 * self._rank
        _native.symm_put_signal(self._block.key, word, self.pes[dst_rank])

    def wait_signal(self, src_rank: int, channel: int = 0, timeout_ms: int = 0) -> None:
        """Waits for a signal from member ``src_rank`` on ``channel`` and consumes it."""
        _check_rank(src_rank, self.world_size)
        word = self._row(channel) + 4 * src_rank
        _native.symm_wait_signal(self._block.key, word, _timeout(timeout_ms))

    def __repr__(self) -> str:
        return (
            f"SymmetricMemory(group={self.group_name!r}, rank={self.rank}, "
            f"world_size={self.world_size}, buffer_size={self.buffer_size})"
        )


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
