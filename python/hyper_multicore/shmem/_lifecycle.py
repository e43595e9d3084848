"""The lifecycle: :func:`acquire`, :func:`release`, :func:`restart` (with
:class:`AllocationSpec`, :class:`AllocationReplacement`, :class:`RestartResult`), root groups,
and introspection.

The logic is the Rust library's (``hyper_multicore::lifecycle``); this module chooses the root
group's channel (a torch ``ProcessGroup``, a list of launcher world ranks, or the launcher's
world), checks arguments, and keeps the registry of :mod:`._registry` in step with the runtime's
lifetimes (every tensor becomes stale after a restart or the last release).
"""

from __future__ import annotations

import json
import pickle
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .. import _native
from . import _backend
from ._backend import Layout, check_alignment, check_int, check_shape
from ._registry import _NO_ALLOCATION, _live, _lock, _lookup, _region, _register, _retire


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
        object.__setattr__(self, "shape", check_shape(self.shape, "shape"))
        object.__setattr__(self, "dtype", _backend.dtype_name(self.dtype))
        object.__setattr__(self, "alignment_bytes", check_alignment(self.alignment_bytes))

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
