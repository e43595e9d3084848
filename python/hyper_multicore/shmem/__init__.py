"""Symmetric memory for multi-process PyTorch (or NumPy) programs.

Every process (PE) of a root group owns a heap of the same size; a collective :func:`empty`
returns a tensor at the same offset on every PE, so any PE can :func:`put`, :func:`get`,
:func:`signal` and run atomics on a peer's copy without the peer taking part. Tensors are
PyTorch CPU tensors (NumPy arrays where torch is not installed) that view the heap directly.

The runtime is process-wide and reference counted: :func:`acquire` starts it collectively over a
root group (or takes another reference), :func:`release` drops one (the last one shuts it down
collectively), and :func:`restart` resizes the heap and replaces every allocation on every rank
at once. Every rank either succeeds at each stage or all fail with the same diagnosis naming the
failing ranks, as :class:`RetryableError`, :class:`TerminalError` or :class:`ConvergenceError`.

Root groups: with ``torch.distributed`` initialised, a ``ProcessGroup`` (``None`` = WORLD); the
runtime's unique ID travels over it from group rank 0. Without it, the launcher's environment
(``hmrun`` or ``torchrun``) defines the world, and a root group may be given as a sequence of
world ranks; with neither, the process is a standalone root of one PE.

Example (run with ``hmrun -n 4 -- python ring.py`` or ``torchrun --nproc-per-node 4 ring.py``)::

    import torch, torch.distributed as dist
    from hyper_multicore import shmem

    dist.init_process_group("gloo")
    shmem.acquire(heap_size_bytes=64 << 20)
    me, n = shmem.my_pe(), shmem.n_pes()
    data = shmem.empty(8, dtype=torch.float32)
    flag = shmem.empty(1, dtype=torch.int64)
    flag.zero_()
    shmem.barrier()
    shmem.put_signal(data, torch.full((8,), float(me)), flag, 1, (me + 1) % n)
    shmem.wait_signal(flag, 1)
    assert data[0].item() == (me - 1) % n
    shmem.barrier()
    shmem.free(flag)
    shmem.free(data)
    shmem.release()

Protocol facts: signal words written concurrently should be at least 64 bytes apart (the default
alignment of every allocation is 64, so separately allocated words are); every rank must
initialise a slot and pass a :func:`barrier` before any peer writes into it remotely. Allocation,
free, barrier and the collectives are collective calls: every PE of the root makes them in the
same order with the same arguments.
"""

from __future__ import annotations

import json
import operator
import pickle
import threading
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .. import _native
from . import _backend
from ._backend import Layout, check_int, check_word
from ._errors import (
    ConvergenceError,
    HyperMulticoreError,
    InvalidArgumentError,
    PeerLostError,
    RetryableError,
    ShmemError,
    StaleTensorError,
    TerminalError,
    WaitTimeoutError,
)

__all__ = [
    # lifecycle
    "acquire",
    "release",
    "restart",
    "root_members",
    "reference_count",
    "AllocationSpec",
    "AllocationReplacement",
    "RestartResult",
    "STAGE_KEYS",
    # allocation
    "empty",
    "free",
    # data plane
    "put",
    "get",
    "put_signal",
    "signal",
    "wait_signal",
    "quiet",
    "fence",
    "atomic_fetch",
    "atomic_set",
    "atomic_swap",
    "atomic_compare_swap",
    "atomic_fetch_add",
    "atomic_add",
    # collectives
    "barrier",
    "host_barrier",
    "all_gather",
    "broadcast",
    "all_to_all",
    "all_reduce",
    # introspection
    "my_pe",
    "n_pes",
    "debug_state",
    "backend",
    # errors
    "HyperMulticoreError",
    "ShmemError",
    "RetryableError",
    "TerminalError",
    "ConvergenceError",
    "PeerLostError",
    "WaitTimeoutError",
    "StaleTensorError",
    "InvalidArgumentError",
]


def backend() -> str:
    """``"torch"`` if tensors are torch CPU tensors, ``"numpy"`` if they are NumPy arrays
    (torch is not installed)."""
    return _backend.backend()


#: An allocation index no runtime ever hands out: a rank whose own argument to a collective
#: free/restart is invalid still takes part with it, so the others fail at once instead of
#: waiting for it.
_NO_ALLOCATION = 2**64 - 1


# ---------------------------------------------------------------------------------------------
# The allocations this process holds


class _Allocation:
    """One allocation handed to Python: its identity, where it lives, and its full tensor."""

    __slots__ = (
        "index",
        "generation",
        "heap_offset",
        "nbytes",
        "alignment",
        "address",
        "live",
        "tensor",
        "__weakref__",
    )

    def __init__(self, exported: tuple) -> None:
        index, generation, heap_offset, nbytes, alignment, buffer = exported
        self.index = index
        self.generation = generation
        self.heap_offset = heap_offset
        self.nbytes = nbytes
        self.alignment = alignment
        self.address = buffer.address
        self.live = True
        #: The full tensor, referenced while the allocation is live (so its storage, and the
        #: storage's key, stay unique); dropped when it is freed or released.
        self.tensor: Any = None


_lock = threading.RLock()
#: Live allocations by (index, generation).
_live: dict[tuple[int, int], _Allocation] = {}
#: torch storages (``_cdata``) of every allocation whose memory may still be viewed, live or
#: stale; an entry goes when the storage dies (see ``_register``).
_by_storage: dict[int, _Allocation] = {}


def _register(exported: tuple, shape: tuple[int, ...], dtype: str) -> Any:
    allocation = _Allocation(exported)
    tensor, raw = _backend.heap_tensor(exported[5], shape, dtype, allocation)
    allocation.tensor = tensor
    with _lock:
        _live[(allocation.index, allocation.generation)] = allocation
        key = _backend.storage_key(tensor)
        if key is not None:
            _by_storage[key] = allocation
            # The storage references ``raw`` (the ctypes array over the heap), so ``raw`` dies
            # exactly when the storage does -- and only then may its key be reused.
            weakref.finalize(raw, _by_storage.pop, key, None)
    return tensor


def _retire(allocation: _Allocation) -> None:
    """Marks an allocation freed/released: its tensors become stale."""
    allocation.live = False
    allocation.tensor = None
    _live.pop((allocation.index, allocation.generation), None)


def _lookup(x: Any) -> _Allocation | None:
    """The allocation a tensor or array views (live or stale), or None."""
    key = _backend.storage_key(x)
    if key is not None:
        return _by_storage.get(key)
    raw = _backend.heap_bytes_of(x)
    return getattr(raw, "hm_allocation", None)


def _stale(role: str, allocation: _Allocation) -> StaleTensorError:
    return StaleTensorError(
        f"{role} views allocation {allocation.index}, which was freed or released by a "
        "restart or release; allocate a new tensor"
    )


def _region(x: Any, role: str) -> tuple[int, int, int, int]:
    """A symmetric tensor (or view) as ``(index, generation, byte offset, bytes)``."""
    layout = Layout(x, role)
    allocation = _lookup(x)
    if allocation is None:
        raise ValueError(
            f"{role} must be a symmetric tensor (made by hyper_multicore.shmem.empty or "
            "restart) or a view of one"
        )
    if not allocation.live:
        raise _stale(role, allocation)
    if not layout.contiguous:
        raise ValueError(f"{role} must be contiguous")
    # torch reports address 0 for a tensor without elements: any offset will do then.
    offset = layout.address - allocation.address if layout.nbytes else 0
    if not 0 <= offset <= allocation.nbytes - layout.nbytes:
        raise ValueError(f"{role} lies outside its allocation")  # pragma: no cover
    return (allocation.index, allocation.generation, offset, layout.nbytes)


def _buffer(x: Any, role: str, *, writable: bool = False) -> tuple[int, ...]:
    """A local buffer: a symmetric tensor's region, or ``(address, nbytes)`` of any other
    contiguous CPU tensor or array."""
    allocation = _lookup(x)
    if allocation is not None:
        return _region(x, role)
    layout = Layout(x, role)
    if not layout.contiguous:
        raise ValueError(f"{role} must be contiguous")
    if writable and not layout.writable:
        raise ValueError(f"{role} is read-only")
    return (layout.address, layout.nbytes)


def _same_dtype(a: Layout, b: Layout, what: str) -> None:
    if a.dtype != b.dtype:
        raise TypeError(f"{what}: dtypes differ ({a.dtype} and {b.dtype})")


def _pe(value: Any, what: str = "pe") -> int:
    pe = check_int(value, what)
    if pe < 0:
        raise ValueError(f"{what} must be non-negative, not {pe}")
    return pe


# ---------------------------------------------------------------------------------------------
# Lifecycle


def _torch_distributed() -> Any:
    """``torch.distributed`` if it is initialised, else None."""
    torch = _backend.torch
    if torch is None:
        return None
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist
    return None


def _heap_size(value: Any, what: str = "heap_size_bytes", *, optional: bool = True) -> int | None:
    if value is None and optional:
        return None
    size = check_int(value, what)
    if size <= 0:
        raise ValueError(f"{what} must be a positive integer, not {size}")
    return size


def _ranks(group: Any) -> list[int]:
    if isinstance(group, (str, bytes)) or not isinstance(group, Sequence):
        raise TypeError(
            "without torch.distributed, root_group must be None or a sequence of world ranks, "
            f"not {type(group).__name__}"
        )
    members = [check_int(rank, "a root group member") for rank in group]
    if not members:
        raise ValueError("a root group needs at least one member")
    if any(rank < 0 for rank in members):
        raise ValueError(f"world ranks are non-negative: {members}")
    if len(set(members)) != len(members):
        raise ValueError(f"a world rank is listed twice in {members}")
    return members


def _process_group(dist: Any, group: Any) -> Any:
    if group is None:
        return dist.group.WORLD
    if group is dist.GroupMember.NON_GROUP_MEMBER:  # what new_group gives non-members
        raise ValueError("this process is not a member of root_group")
    if not isinstance(group, dist.ProcessGroup):
        raise TypeError(
            "with torch.distributed initialised, root_group must be None or a "
            f"torch.distributed.ProcessGroup, not {type(group).__name__}"
        )
    return group


def _all_gather_object_over(dist: Any, group: Any) -> Callable[[bytes], list[bytes]]:
    size = dist.get_world_size(group)

    def allgather(data: bytes) -> list[bytes]:
        gathered: list[Any] = [None] * size
        dist.all_gather_object(gathered, data, group=group)
        return gathered

    return allgather


def acquire(root_group: Any = None, *, heap_size_bytes: int | None = None) -> None:
    """Takes a reference to the process-wide runtime over ``root_group``.

    The first reference starts the runtime: a collective call over the group (every member
    calls it), where group rank 0 creates the unique ID and the others receive it. Later
    references must name the same ordered membership and may not ask for a larger heap; they do
    no collective work.

    Args:
        root_group: with ``torch.distributed`` initialised, a ``ProcessGroup`` (``None`` =
            WORLD); without it, ``None`` (the hmrun/torchrun world, or a standalone one-PE root)
            or a sequence of world ranks forming an ordered subgroup.
        heap_size_bytes: bytes per PE; ``None`` = ``HYPER_MULTICORE_SHMEM_HEAP_SIZE``, else 1 GiB.

    Raises:
        TypeError, ValueError: bad arguments (a bool is not an integer).
        RetryableError: starting the runtime failed on some rank; nothing changed.
        TerminalError, ConvergenceError: the lifecycle was invalidated earlier.
    """
    heap = _heap_size(heap_size_bytes)
    dist = _torch_distributed()
    if dist is not None:
        group = _process_group(dist, root_group)
        rank = dist.get_rank(group)
        if rank < 0:
            raise ValueError("this process is not a member of root_group")
        members = list(dist.get_process_group_ranks(group))
        _native.acquire_channel(rank, members, _all_gather_object_over(dist, group), heap)
    elif root_group is None:
        _native.acquire_world(heap)
    else:
        _native.acquire_ranks(_ranks(root_group), heap)


def release() -> None:
    """Drops a reference; the last one shuts the runtime down collectively (stages Preflight,
    Quiesce, Shutdown).

    The last release needs every tensor freed first; otherwise it raises
    :class:`RetryableError` on every rank and keeps the reference, so free them and call again.
    """
    _native.release()
    if _native.reference_count() == 0:
        with _lock:
            for allocation in list(_live.values()):
                _retire(allocation)


def reference_count() -> int:
    """References held in this process."""
    return _native.reference_count()


def root_members(group: Any = None) -> tuple[int, ...]:
    """The ordered membership (global ranks) of ``group``.

    With ``torch.distributed`` initialised: the ranks of the ``ProcessGroup`` (``None`` =
    WORLD). Without it: the launcher's world for ``None`` (``(0,)`` for a standalone process;
    creating the world is a collective call the first time), or the given sequence of ranks.
    """
    dist = _torch_distributed()
    if dist is not None:
        return tuple(dist.get_process_group_ranks(_process_group(dist, group)))
    if group is None:
        return tuple(_native.world_members())
    return tuple(_ranks(group))


def _shape_of(shape: Any, what: str) -> tuple[int, ...]:
    if isinstance(shape, (str, bytes)) or not isinstance(shape, Sequence):
        raise TypeError(f"{what} must be a sequence of integers, not {type(shape).__name__}")
    dims = tuple(check_int(d, f"{what} entry") for d in shape)
    if any(d < 0 for d in dims):
        raise ValueError(f"{what} has a negative dimension: {dims}")
    return dims


def _alignment(alignment: Any) -> int | None:
    if alignment is None:
        return None
    value = check_int(alignment, "alignment")
    if value < 0:
        raise ValueError(f"alignment must be a power of two (or None), not {value}")
    return value or None  # 0 means the default, as None does


@dataclass(frozen=True)
class AllocationSpec:
    """What to allocate: a non-empty shape of positive ints, a dtype and an alignment.

    ``dtype`` may be a torch dtype, a NumPy dtype or a name (``"bfloat16"``); it is stored as
    its name. ``alignment_bytes`` is ``None`` (64 bytes) or a power of two.
    """

    shape: tuple[int, ...]
    dtype: Any
    alignment_bytes: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", _shape_of(self.shape, "shape"))
        object.__setattr__(self, "dtype", _backend.dtype_name(self.dtype))
        object.__setattr__(self, "alignment_bytes", _alignment(self.alignment_bytes))

    @classmethod
    def like(cls, tensor: Any, *, alignment_bytes: int | None = None) -> AllocationSpec:
        """The spec of a tensor's shape and dtype."""
        layout = Layout(tensor, "tensor")
        return cls(tuple(tensor.shape), layout.dtype, alignment_bytes)


@dataclass(frozen=True)
class AllocationReplacement:
    """In a :func:`restart`: a complete active allocation (``current``, a tensor returned by
    :func:`empty` or an earlier restart -- not a view) and what replaces it (``target``)."""

    current: Any
    target: AllocationSpec

    def __post_init__(self) -> None:
        if not isinstance(self.target, AllocationSpec):
            raise TypeError(f"target must be an AllocationSpec, not {type(self.target).__name__}")
        if not _backend.is_tensor(self.current):
            raise TypeError(f"current must be a tensor, not {type(self.current).__name__}")


#: The keys of :attr:`RestartResult.stages_ms`, in stage order.
STAGE_KEYS = (
    "preflight_ms",
    "quiesce_ms",
    "release_ms",
    "finalize_ms",
    "bootstrap_ms",
    "initialize_ms",
    "restore_ms",
)


@dataclass(frozen=True)
class RestartResult:
    """What :func:`restart` returns: the new tensors in request order, and how long each stage
    took in milliseconds (keys ``preflight_ms``, ``quiesce_ms``, ``release_ms``,
    ``finalize_ms``, ``bootstrap_ms``, ``initialize_ms``, ``restore_ms``)."""

    tensors: tuple[Any, ...]
    stages_ms: dict[str, float] = field(default_factory=dict)


def _hook_bytes(value: Any) -> bytes:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, str):
        return value.encode()
    return pickle.dumps(value, protocol=4)


def restart(
    *,
    heap_size_bytes: int,
    replacements: Sequence[AllocationReplacement],
    preflight_hook: Callable[[], Any] | None = None,
) -> RestartResult:
    """Replaces the runtime by one with a new heap, replacing every active allocation on every
    rank at once. A collective call; only with exactly one reference held.

    ``replacements`` must cover every active allocation exactly once. The new tensors are
    zero-filled (contents are not carried over), returned in request order; every old tensor
    becomes stale. ``preflight_hook`` returns a snapshot of the caller's own state that must be
    equal on every rank (bytes and str are compared as they are, anything else pickled).

    Stages (each converged over the root): Preflight, Quiesce, ReleaseAllocations,
    ValidateShutdown, Shutdown, Bootstrap, Initialize, RestoreAllocations.

    Raises:
        TypeError, ValueError: malformed arguments (checked locally, before any collective).
        RetryableError: a failure before ReleaseAllocations (bad replacements, values that differ
            across ranks, a raising hook); the runtime and its tensors remain usable.
        TerminalError: a failure from ReleaseAllocations on; restart the process.
        ConvergenceError: the ranks could not agree (a peer died); restart the process.
    """
    heap = _heap_size(heap_size_bytes, optional=False)
    if isinstance(replacements, (str, bytes)) or not isinstance(replacements, Sequence):
        raise TypeError("replacements must be a sequence of AllocationReplacement")
    requests = []
    for i, replacement in enumerate(replacements):
        if not isinstance(replacement, AllocationReplacement):
            raise TypeError(
                f"replacements[{i}] must be an AllocationReplacement, not "
                f"{type(replacement).__name__}"
            )
        allocation = _lookup(replacement.current)
        if allocation is None or not allocation.live:
            # Preflight rejects it on this rank, and every rank raises the same error.
            current = (_NO_ALLOCATION, 0, 0, 0)
        else:
            index, generation, offset, nbytes = _region(replacement.current, "current")
            current = (index, generation, allocation.heap_offset + offset, nbytes)
        target = replacement.target
        requests.append((current, (list(target.shape), target.dtype, target.alignment_bytes)))
    if preflight_hook is not None and not callable(preflight_hook):
        raise TypeError("preflight_hook must be callable (or None)")
    hook = None if preflight_hook is None else (lambda: _hook_bytes(preflight_hook()))
    with _lock:
        exported, stages = _native.restart(heap, requests, hook)
        for allocation in list(_live.values()):
            _retire(allocation)
        tensors = tuple(
            _register(record, r.target.shape, r.target.dtype)
            for record, r in zip(exported, replacements)
        )
    return RestartResult(tensors=tensors, stages_ms={key: stages[key] for key in STAGE_KEYS})


# ---------------------------------------------------------------------------------------------
# Allocation


def _size_args(size: tuple[Any, ...]) -> tuple[int, ...]:
    if not size:
        raise TypeError("empty() needs a size: empty(2, 3) or empty((2, 3)); empty(()) is a scalar")
    if len(size) == 1 and not isinstance(size[0], (bool, int)) and isinstance(size[0], Sequence):
        return _shape_of(size[0], "size")
    if len(size) == 1 and not isinstance(size[0], bool):
        try:  # a 0-d integer tensor or NumPy integer counts as an int, as in torch
            operator.index(size[0])
        except TypeError:
            if isinstance(size[0], Sequence) or hasattr(size[0], "__iter__"):
                return _shape_of(tuple(size[0]), "size")
    return _shape_of(size, "size")


def empty(*size: Any, dtype: Any = None, alignment: int | None = None) -> Any:
    """Collective: a new symmetric tensor of ``size``, uninitialised, viewing the heap.

    Follows ``torch.empty``'s size conventions: ``empty(2, 3)``, ``empty((2, 3))`` or
    ``empty([2, 3])``. ``dtype`` defaults to ``torch.get_default_dtype()`` (float32 with NumPy).
    ``alignment`` (bytes) defaults to 64; otherwise a power of two up to 2 MiB. Every PE must
    make the same call; arguments that differ across ranks raise :class:`InvalidArgumentError`
    on every rank, and nothing is allocated.
    """
    shape = _size_args(size)
    name = _backend.default_dtype_name() if dtype is None else _backend.dtype_name(dtype)
    align = _alignment(alignment)
    with _lock:
        exported = _native.allocate(list(shape), name, align)
        return _register(exported, shape, name)


def free(tensor: Any) -> None:
    """Collective: frees the allocation of ``tensor`` (the whole tensor :func:`empty` or
    :func:`restart` returned, not a view). The tensor and its views become stale.

    A rank whose argument is invalid (a view, a freed or a foreign tensor) still takes part in
    the collective check, so the other ranks fail at once with :class:`InvalidArgumentError`
    ("arguments differ across ranks") while it raises its own error.
    """
    problem: Exception | None = None
    allocation = None
    if not _backend.is_tensor(tensor):
        problem = TypeError(f"free() takes a symmetric tensor, not {type(tensor).__name__}")
    else:
        allocation = _lookup(tensor)
        if allocation is None:
            problem = ValueError("free() takes a tensor made by empty() or restart()")
        elif not allocation.live:
            problem = StaleTensorError(
                f"allocation {allocation.index} was already freed or released (double free)"
            )
        else:
            layout = Layout(tensor, "tensor")
            # (torch reports address 0 for a tensor without elements)
            moved = layout.nbytes > 0 and layout.address != allocation.address
            if moved or layout.nbytes != allocation.nbytes:
                problem = ValueError(
                    "free() takes the whole tensor empty() returned; a view cannot be freed on "
                    "its own"
                )
    if problem is not None:
        cause = None
        try:
            _native.free(_NO_ALLOCATION, 0)
        except HyperMulticoreError as mismatch:
            if "differ across ranks" in str(mismatch):
                cause = mismatch
        raise problem from cause
    assert allocation is not None
    with _lock:
        _native.free(allocation.index, allocation.generation)
        _retire(allocation)


# ---------------------------------------------------------------------------------------------
# Data plane


def put(remote_dst: Any, local_src: Any, target_pe: int) -> None:
    """Copies ``local_src`` into PE ``target_pe``'s copy of the symmetric ``remote_dst`` (same
    dtype and number of elements; either may be a view)."""
    dst = _region(remote_dst, "remote_dst")
    src = _buffer(local_src, "local_src")
    _same_dtype(Layout(remote_dst, "remote_dst"), Layout(local_src, "local_src"), "put")
    _native.put(dst, src, _pe(target_pe, "target_pe"))


def get(local_dst: Any, remote_src: Any, source_pe: int) -> None:
    """Copies PE ``source_pe``'s copy of the symmetric ``remote_src`` into ``local_dst``."""
    src = _region(remote_src, "remote_src")
    dst = _buffer(local_dst, "local_dst", writable=True)
    _same_dtype(Layout(local_dst, "local_dst"), Layout(remote_src, "remote_src"), "get")
    _native.get(dst, src, _pe(source_pe, "source_pe"))


def _word(signal_tensor: Any, role: str) -> tuple[tuple[int, int, int, int], str]:
    region = _region(signal_tensor, role)
    layout = Layout(signal_tensor, role)
    if layout.dtype not in _backend.WORD_DTYPES:
        raise TypeError(
            f"{role} must be an int32, uint32, int64 or uint64 tensor, not {layout.dtype}"
        )
    if layout.numel != 1:
        raise ValueError(
            f"{role} must hold exactly one element (a signal word), not {layout.numel}"
        )
    return region, layout.dtype


_SIGNAL_OPS = ("set", "add")
_COMPARISONS = ("eq", "ne", "gt", "ge", "lt", "le")


def _choice(value: Any, choices: tuple[str, ...], what: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a string, one of {choices}")
    if value not in choices:
        raise ValueError(f"{what} must be one of {choices}, not {value!r}")
    return value


def put_signal(
    remote_dst: Any,
    local_src: Any,
    remote_signal: Any,
    value: int,
    target_pe: int,
    *,
    operation: str = "set",
) -> None:
    """:func:`put`, then :func:`signal` on the same PE: a waiter that sees the signal sees the
    data."""
    dst = _region(remote_dst, "remote_dst")
    src = _buffer(local_src, "local_src")
    _same_dtype(Layout(remote_dst, "remote_dst"), Layout(local_src, "local_src"), "put_signal")
    word, dtype = _word(remote_signal, "remote_signal")
    _native.put_signal(
        dst,
        src,
        word,
        dtype,
        check_word(value, dtype, "value"),
        _choice(operation, _SIGNAL_OPS, "operation"),
        _pe(target_pe, "target_pe"),
    )


def signal(remote_signal: Any, value: int, target_pe: int, *, operation: str = "set") -> None:
    """Sets (``operation="set"``) or adds to (``"add"``, wrapping) PE ``target_pe``'s copy of
    the one-element signal word ``remote_signal``, and wakes its waiters."""
    word, dtype = _word(remote_signal, "remote_signal")
    _native.signal(
        word,
        dtype,
        check_word(value, dtype, "value"),
        _choice(operation, _SIGNAL_OPS, "operation"),
        _pe(target_pe, "target_pe"),
    )


def wait_signal(
    signal: Any, value: int, *, comparison: str = "eq", timeout: float | None = None
) -> int:
    """Waits until this PE's copy of the signal word compares ``comparison`` (``"eq"``,
    ``"ne"``, ``"gt"``, ``"ge"``, ``"lt"``, ``"le"``) to ``value``; returns the word then.

    ``timeout`` (seconds) defaults to ``HYPER_MULTICORE_SHMEM_TIMEOUT_SEC``; it raises
    :class:`WaitTimeoutError` then, and :class:`PeerLostError` as soon as a PE of the root dies.
    """
    word, dtype = _word(signal, "signal")
    if timeout is not None:
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
            raise TypeError("timeout must be a number of seconds (or None)")
        if timeout < 0:
            raise ValueError(f"timeout must be non-negative, not {timeout}")
    return _native.wait_signal(
        word,
        dtype,
        check_word(value, dtype, "value"),
        _choice(comparison, _COMPARISONS, "comparison"),
        None if timeout is None else float(timeout),
    )


def quiet() -> None:
    """Completes every outstanding operation of this PE (its puts are visible to everyone)."""
    _native.quiet()


def fence() -> None:
    """Orders this PE's earlier puts before its later ones, per target PE."""
    _native.fence()


def _atomic(operation: str, target: Any, pe: int, **values: Any) -> int | None:
    word, dtype = _word(target, "target")
    checked = {k: check_word(v, dtype, k) for k, v in values.items()}
    return _native.atomic(operation, word, dtype, _pe(pe), **checked)


def atomic_fetch(source: Any, pe: int) -> int:
    """Atomically reads PE ``pe``'s copy of the one-element integer tensor ``source``."""
    return _atomic("fetch", source, pe)  # type: ignore[return-value]


def atomic_set(target: Any, value: int, pe: int) -> None:
    """Atomically stores ``value`` into PE ``pe``'s copy of ``target``."""
    _atomic("set", target, pe, value=value)


def atomic_swap(target: Any, value: int, pe: int) -> int:
    """Atomically replaces PE ``pe``'s copy of ``target`` with ``value``; returns the old value."""
    return _atomic("swap", target, pe, value=value)  # type: ignore[return-value]


def atomic_compare_swap(target: Any, expected: int, desired: int, pe: int) -> int:
    """Atomically sets PE ``pe``'s copy of ``target`` to ``desired`` if it equals ``expected``;
    returns the previous value (equal to ``expected`` on success)."""
    return _atomic(  # type: ignore[return-value]
        "compare_swap", target, pe, value=desired, expected=expected
    )


def atomic_fetch_add(target: Any, value: int, pe: int) -> int:
    """Atomically adds ``value`` (wrapping) to PE ``pe``'s copy of ``target``; returns the old
    value."""
    return _atomic("fetch_add", target, pe, value=value)  # type: ignore[return-value]


def atomic_add(target: Any, value: int, pe: int) -> None:
    """Atomically adds ``value`` (wrapping) to PE ``pe``'s copy of ``target``."""
    _atomic("add", target, pe, value=value)


# ---------------------------------------------------------------------------------------------
# Collectives


def barrier() -> None:
    """Collective: waits until every PE of the root has called it; every put made before it is
    visible after it."""
    _native.barrier()


def host_barrier() -> None:
    """Collective: a barrier of the root over its group channel (torch.distributed or the
    control plane) instead of shared memory."""
    _native.host_barrier()


def all_gather(output: Any, input: Any) -> None:
    """Collective: gathers every PE's ``input`` into every PE's symmetric ``output``, in root-rank
    order (``output`` holds ``n_pes() * input.numel()`` elements of the same dtype). A
    zero-element input is a validated no-op."""
    out = _region(output, "output")
    src = _buffer(input, "input")
    out_layout, in_layout = Layout(output, "output"), Layout(input, "input")
    _same_dtype(out_layout, in_layout, "all_gather")
    pes = _native.n_pes()
    if out_layout.numel != pes * in_layout.numel:
        raise ValueError(
            f"all_gather: output holds {out_layout.numel} elements but {pes} PEs x "
            f"{in_layout.numel} input elements need {pes * in_layout.numel}"
        )
    _native.all_gather(out, src)


def broadcast(output: Any, input: Any, root: int) -> None:
    """Collective: copies PE ``root``'s ``input`` into every PE's symmetric ``output``.
    ``input`` is only read on ``root`` (it may be ``None`` elsewhere)."""
    out = _region(output, "output")
    root_pe = _pe(root, "root")
    src = None
    if input is not None and _native.my_pe() == root_pe:
        src = _buffer(input, "input")
        out_layout, in_layout = Layout(output, "output"), Layout(input, "input")
        _same_dtype(out_layout, in_layout, "broadcast")
        if out_layout.numel != in_layout.numel:
            raise ValueError(
                f"broadcast: output holds {out_layout.numel} elements, input {in_layout.numel}"
            )
    _native.broadcast(out, src, root_pe)


def all_to_all(output: Any, input: Any) -> None:
    """Collective: sends block ``j`` of ``input`` to PE ``j``, which stores it as block
    ``my_pe()`` of its symmetric ``output``. Both hold ``n_pes() * block`` elements."""
    out = _region(output, "output")
    src = _buffer(input, "input")
    out_layout, in_layout = Layout(output, "output"), Layout(input, "input")
    _same_dtype(out_layout, in_layout, "all_to_all")
    pes = _native.n_pes()
    if out_layout.numel != in_layout.numel or in_layout.numel % pes:
        raise ValueError(
            f"all_to_all: input ({in_layout.numel}) and output ({out_layout.numel}) must hold "
            f"the same number of elements, a multiple of the {pes} PEs"
        )
    _native.all_to_all(out, src)


_REDUCE_OPS = ("sum", "min", "max")


def all_reduce(output: Any, input: Any, op: str = "sum") -> None:
    """Collective: combines every PE's symmetric ``input`` element-wise with ``op`` (``"sum"``,
    ``"min"``, ``"max"``) into every PE's symmetric ``output``; they may be the same tensor.
    Dtypes: int32, uint32, int64, uint64, float32, float64."""
    out = _region(output, "output")
    src = _region(input, "input")
    out_layout, in_layout = Layout(output, "output"), Layout(input, "input")
    _same_dtype(out_layout, in_layout, "all_reduce")
    if out_layout.numel != in_layout.numel:
        raise ValueError(
            f"all_reduce: output ({out_layout.numel}) and input ({in_layout.numel}) lengths differ"
        )
    _native.all_reduce(out, src, out_layout.dtype, _choice(op, _REDUCE_OPS, "op"))


# ---------------------------------------------------------------------------------------------
# Introspection


def my_pe() -> int:
    """This process's rank in the active root."""
    return _native.my_pe()


def n_pes() -> int:
    """The number of PEs in the active root."""
    return _native.n_pes()


def debug_state() -> dict[str, Any]:
    """A snapshot of the runtime and the lifecycle, safe to call in any state (also from a
    preflight hook): state, root rank/size, device, effective configuration, reference count,
    heap usage, live allocations sorted by id, and the latest failure."""
    return json.loads(_native.debug_state())
