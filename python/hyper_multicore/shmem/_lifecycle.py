"""The lifecycle: :func:`acquire`, :func:`release`, :func:`restart` (with
:class:`AllocationSpec`, :class:`AllocationReplacement`, :class:`RestartResult`), root groups,
and introspection; also the seed module's private names, for its callers (see "Seed
compatibility" at the end).

The logic is the Rust library's (``hyper_multicore::lifecycle``); this module chooses the root
group's channel (a torch ``ProcessGroup``, a list of launcher world ranks, or the launcher's
world), checks arguments, and keeps the registry of :mod:`._registry` in step with the runtime's
lifetimes (every tensor becomes stale after a restart or the last release).
"""

from __future__ import annotations

import json
import operator
import os
import secrets
import threading
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .. import _native
from . import _backend
from ._backend import check_alignment, check_int, check_shape
from ._data_plane import host_barrier
from ._errors import (
    HyperMulticoreError,
    InvalidArgumentError,
    RetryableError,
    ShmemError,
    native_style,
)
from ._registry import _NO_ALLOCATION, _live, _lookup, _region, _register, _retire

# The registry's lock under its own name: this module's ``_lock`` is the lifecycle's lock (the
# seed's name; see the end of the module).
from ._registry import _lock as _registry_lock

#: The variable that carries the control plane's secret under torch.distributed (see
#: :func:`_share_secret`).
SECRET_VARIABLE = "HYPER_MULTICORE_SHMEM_SECRET"

#: Serialises this module's bookkeeping around the native lifecycle calls (the native lifecycle
#: serialises the calls themselves). Never held by ``reference_count`` or ``debug_state``.
_lifecycle_lock = threading.RLock()
#: Whether torch.distributed was initialised when the active runtime started (``None``: no
#: runtime). A later acquire or release in the other state is refused, as the original runtime
#: did ("torch.distributed state changed").
_started_with_torch: bool | None = None
#: True once a lifecycle call failed as terminal or convergence failure: the runtime is gone for
#: good, and a later acquire must fail at once (natively), without any collective work first.
_invalidated = False
#: The references held when the lifecycle was invalidated (``None`` while it is not): what the
#: seed's ``_reference_count()`` keeps reporting afterwards (the native count drops to 0).
_references_at_invalidation: int | None = None


def _torch_distributed() -> Any:
    """``torch.distributed`` if it is initialised, else None."""
    torch = _backend.torch
    if torch is None:
        return None
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist
    return None


def _heap_problem(value: Any, what: str = "heap_size_bytes") -> str | None:
    """What is wrong with a heap size (a positive int; a bool is not one), or None."""
    if isinstance(value, bool):
        return f"{what} must be a positive integer, not a bool ({value})"
    try:
        size = operator.index(value)
    except TypeError:
        return f"{what} must be a positive integer, not {type(value).__name__} {value!r}"
    if size <= 0:
        return f"{what} must be a positive integer, not {size}"
    return None


def _heap_size(value: Any) -> int | None:
    """An optional heap size, or ``ValueError`` (as the original runtime raised)."""
    if value is None:
        return None
    problem = _heap_problem(value)
    if problem is not None:
        raise ValueError(problem)
    return operator.index(value)


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


def _not_a_member() -> InvalidArgumentError:
    return native_style(
        InvalidArgumentError,
        "acquire",
        "invalid argument",
        "this process is not a member of root_group; only its members call acquire with it",
    )


def _process_group(dist: Any, group: Any) -> Any:
    if group is None:
        return dist.group.WORLD
    if group is dist.GroupMember.NON_GROUP_MEMBER:  # what new_group gives non-members
        raise _not_a_member()
    if not isinstance(group, dist.ProcessGroup):
        raise TypeError(
            "with torch.distributed initialised, root_group must be None or a "
            f"torch.distributed.ProcessGroup, not {type(group).__name__}"
        )
    return group


def _all_gather_object_over(dist: Any, group: Any) -> Callable[[bytes], list[bytes]]:
    """The channel's all-gather over ``group``, which it reaches through a weak reference (see
    :func:`_group_alive`)."""
    size = dist.get_world_size(group)
    reference = weakref.ref(group)

    def allgather(data: bytes) -> list[bytes]:
        live = reference()
        if live is None:
            raise RuntimeError(
                "the root group's torch ProcessGroup was destroyed; acquire over a live group"
            )
        gathered: list[Any] = [None] * size
        dist.all_gather_object(gathered, data, group=live)
        return gathered

    return allgather


def _group_alive(dist: Any, group: Any) -> Callable[[], bool]:
    """Whether ``group`` can still communicate: torch.distributed initialised and the group not
    destroyed (the runtime's channel asks this before every later lifecycle call).

    The channel's callables hold ``group`` weakly: a strong reference (the native runtime or a
    shared root keeps the channel until it is dropped) would keep the ProcessGroup alive past
    ``destroy_process_group()``, so its gloo worker threads would still run at interpreter exit
    and abort the process when one needs the GIL then ("terminate called without an active
    exception", pytorch/pytorch#190489)."""
    reference = weakref.ref(group)

    def alive() -> bool:
        live = reference()
        if live is None or not (dist.is_available() and dist.is_initialized()):
            return False
        try:
            dist.get_process_group_ranks(live)  # raises for a destroyed group
        except (ValueError, KeyError, RuntimeError):
            return False
        return True

    return alive


def _share_secret(dist: Any, group: Any, members: list[int]) -> None:
    """Group rank 0 draws the control plane's secret (or keeps the one it was given) and every
    member takes it from there, over the process group, into ``HYPER_MULTICORE_SHMEM_SECRET``.

    The secret authenticates the runtime's rendezvous; without it, a launcher world under
    torchrun would derive one from public values (``MASTER_ADDR``, ``MASTER_PORT``). It travels
    the way the unique ID does: over the torch process group, which only the job's members
    share. Called at every first acquire under torch.distributed (unless the lifecycle was
    invalidated: that acquire fails at once), before any native call that could build the
    launcher's world.
    """
    if dist.get_rank(group) == 0:
        secret = os.environ.get(SECRET_VARIABLE) or secrets.token_hex(16)
    else:
        secret = None
    shared = [secret]
    try:
        dist.broadcast_object_list(shared, src=members[0], group=group)
    except Exception as error:  # a torch/gloo failure: nothing was started
        raise native_style(
            RetryableError,
            "acquire",
            "backend error",
            f"sharing the control plane's secret over the process group failed: {error!r}",
            recovery="retryable",
        ) from error
    os.environ[SECRET_VARIABLE] = shared[0]


def _torch_state_changed(operation: str, now: bool) -> str:
    then = "with" if _started_with_torch else "without"
    state = "initialised" if now else "not initialised (or destroyed)"
    if operation in ("release", "restart"):
        fix = (
            f"{operation} in the state the runtime started in (release every reference before "
            "torch.distributed.destroy_process_group(), initialise it after)"
        )
    else:
        fix = "release every reference first, then acquire again"
    return (
        f"torch.distributed state changed: the runtime started {then} torch.distributed, and "
        f"it is now {state}; {fix}"
    )


def _check_torch_state(operation: str, dist: Any) -> None:
    """Refuses a later acquire or the release of a runtime started in the other torch state."""
    now = dist is not None
    if _started_with_torch is None or _started_with_torch == now:
        return
    message = _torch_state_changed(operation, now)
    if operation in ("release", "restart"):
        raise native_style(
            RetryableError,
            operation,
            "invalid state",
            message,
            stage="Preflight",
            recovery="retryable",
        )
    raise native_style(ShmemError, operation, "invalid state", message)


def _note(error: HyperMulticoreError, held: int) -> None:
    """Remembers that the lifecycle was invalidated, if ``error`` says so, and the references
    ``held`` when the failing call began (the first invalidation's count is kept)."""
    global _invalidated, _references_at_invalidation
    if error.recovery in ("terminal", "convergence failure"):
        _invalidated = True
        if _references_at_invalidation is None:
            _references_at_invalidation = held


def _forget_if_gone() -> None:
    """After a lifecycle call: once no reference is left (a clean last release, or a terminal
    failure), every tensor is stale and the torch state is forgotten."""
    global _started_with_torch
    if _native.reference_count() == 0:
        _started_with_torch = None
        with _registry_lock:
            for allocation in list(_live.values()):
                _retire(allocation)


def acquire(root_group: Any = None, *, heap_size_bytes: int | None = None) -> None:
    """Takes a reference to the process-wide runtime over ``root_group``.

    The first reference starts the runtime: a collective call over the group (every member
    calls it), where group rank 0 creates the unique ID and the others receive it. Later
    references must name the same ordered membership, may not ask for a larger heap, and must be
    made in the torch.distributed state of the first; they do no collective work.

    Under torch.distributed, the first reference also shares the control plane's secret from
    group rank 0 over the group (``HYPER_MULTICORE_SHMEM_SECRET``).

    Args:
        root_group: with ``torch.distributed`` initialised, a ``ProcessGroup`` (``None`` =
            WORLD); without it, ``None`` (the hmrun/torchrun world, or a standalone one-PE root)
            or a sequence of world ranks forming an ordered subgroup.
        heap_size_bytes: bytes per PE; ``None`` = ``HYPER_MULTICORE_SHMEM_HEAP_SIZE``, else 1 GiB.

    Raises:
        ValueError: a heap size that is not a positive integer (a bool is not one).
        TypeError: a root group of the wrong type.
        InvalidArgumentError: a membership that differs from the active root's, a larger heap
            than the active one, a group this process is not a member of.
        ShmemError: torch.distributed was initialised or destroyed since the runtime started.
        RetryableError: starting the runtime failed on some rank; nothing changed.
        TerminalError, ConvergenceError: the lifecycle was invalidated earlier.
    """
    global _started_with_torch
    heap = _heap_size(heap_size_bytes)
    with _lifecycle_lock:
        dist = _torch_distributed()
        _check_torch_state("acquire", dist)
        held = _native.reference_count()
        first = held == 0
        try:
            over_root_group(
                root_group,
                heap,
                world=_native.acquire_world,
                ranks=_native.acquire_ranks,
                channel=_native.acquire_channel,
            )
        except HyperMulticoreError as error:
            _note(error, held)
            raise
        if first:
            _started_with_torch = dist is not None


def over_root_group(
    root_group: Any,
    heap: int | None,
    *,
    world: Callable[..., Any],
    ranks: Callable[..., Any],
    channel: Callable[..., Any],
) -> Any:
    """Calls the native function for ``root_group``'s kind: ``channel(rank, members,
    allgather, alive, heap)`` for a torch ProcessGroup (sharing the control plane's secret first
    when no reference is held yet), ``world(heap)`` for the launcher's world, ``ranks(members,
    heap)`` for a list of world ranks."""
    dist = _torch_distributed()
    if dist is not None:
        group = _process_group(dist, root_group)
        rank = dist.get_rank(group)
        if rank < 0:
            raise _not_a_member()
        members = list(dist.get_process_group_ranks(group))
        if _native.reference_count() == 0 and not _invalidated:
            _share_secret(dist, group, members)
        return channel(
            rank, members, _all_gather_object_over(dist, group), _group_alive(dist, group), heap
        )
    if root_group is None:
        return world(heap)
    return ranks(_ranks(root_group), heap)


def release() -> None:
    """Drops a reference; the last one shuts the runtime down collectively (stages Preflight,
    Quiesce, Shutdown).

    The last release needs every tensor freed first; otherwise it raises
    :class:`RetryableError` on every rank and keeps the reference, so free them and call again.
    A release in another torch.distributed state than the runtime started in is refused the
    same way (Preflight, retryable), before any communication.
    """
    with _lifecycle_lock:
        held = _native.reference_count()
        try:
            _check_torch_state("release", _torch_distributed())
            _native.release()
        except HyperMulticoreError as error:
            _note(error, held)
            raise
        finally:
            _forget_if_gone()


def reference_count() -> int:
    """References held in this process (0 once the runtime is gone, also after a failed
    shutdown: the process then stays unable to start another)."""
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
        return cls(tuple(tensor.shape), _native.tensor_dtype(tensor, "tensor"), alignment_bytes)


@dataclass(frozen=True)
class AllocationReplacement:
    """In a :func:`restart`: a complete active allocation (``current``, a tensor returned by
    :func:`empty` or an earlier restart -- not a view) and what replaces it (``target``).

    ``preserve=True`` keeps data: the first min(old, new) bytes of ``current`` are in the new
    tensor after the restart, on every PE (copied straight from the old heap, kept mapped until
    then, into the new one; Preflight checks that the host can hold both). Otherwise the new
    tensor is zero-filled."""

    current: Any
    target: AllocationSpec
    preserve: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.target, AllocationSpec):
            raise TypeError(f"target must be an AllocationSpec, not {type(self.target).__name__}")
        if not _backend.is_tensor(self.current):
            raise TypeError(f"current must be a tensor, not {type(self.current).__name__}")
        if not isinstance(self.preserve, bool):
            raise TypeError(f"preserve must be a bool, not {type(self.preserve).__name__}")


#: The keys of :attr:`RestartResult.stages_ms`, in stage order.
STAGE_KEYS = (
    "agree_ms",
    "preflight_ms",
    "quiesce_ms",
    "preserve_ms",
    "release_ms",
    "finalize_ms",
    "bootstrap_ms",
    "initialize_ms",
    "restore_ms",
)


@dataclass(frozen=True)
class RestartResult:
    """What :func:`restart` returns: the new tensors in request order, and how long each stage
    took in milliseconds (:data:`STAGE_KEYS`: ``agree_ms`` (0 for a restart: a growth's
    agreement), ``preflight_ms``, ``quiesce_ms``, ``preserve_ms``, ``release_ms``,
    ``finalize_ms``, ``bootstrap_ms``, ``initialize_ms``, ``restore_ms``)."""

    tensors: tuple[Any, ...]
    stages_ms: dict[str, float] = field(default_factory=dict)


def _restart_requests(
    heap_size_bytes: Any, replacements: Any, preflight_hook: Any
) -> tuple[int, list[tuple], str | None]:
    """The native arguments of a restart, and this rank's first argument problem (or None).

    A rank with a problem still takes part: Preflight reports the problem on every rank, so no
    rank waits for one that raised on its own.
    """
    problems: list[str] = []
    heap_problem = _heap_problem(heap_size_bytes)
    if heap_problem is not None:
        problems.append(heap_problem)
    heap = 0 if heap_problem is not None else operator.index(heap_size_bytes)
    if preflight_hook is not None and not callable(preflight_hook):
        problems.append(
            f"preflight_hook must be callable (or None), not {type(preflight_hook).__name__}"
        )
    requests: list[tuple] = []
    if isinstance(replacements, (str, bytes)) or not isinstance(replacements, Sequence):
        problems.append(
            "replacements must be a sequence of AllocationReplacement, not "
            f"{type(replacements).__name__}"
        )
        replacements = ()
    for i, replacement in enumerate(replacements):
        if not isinstance(replacement, AllocationReplacement):
            problems.append(
                f"replacements[{i}] must be an AllocationReplacement, not "
                f"{type(replacement).__name__}"
            )
            continue
        target = replacement.target
        spec = (list(target.shape), target.dtype, target.alignment_bytes)
        allocation = _lookup(replacement.current)
        current = (_NO_ALLOCATION, 0, 0, 0)  # Preflight names it "not an active allocation"
        if allocation is not None and allocation.live:
            try:
                index, generation, offset, nbytes = _region(replacement.current, "current")
            except (TypeError, ValueError) as error:  # e.g. a non-contiguous view
                problems.append(f"replacements[{i}].current: {error}")
            else:
                current = (index, generation, allocation.heap_offset + offset, nbytes)
        requests.append((current, spec, replacement.preserve))
    return heap, requests, (problems[0] if problems else None)


def restart(
    *,
    heap_size_bytes: int,
    replacements: Sequence[AllocationReplacement],
    preflight_hook: Callable[[], Any] | None = None,
) -> RestartResult:
    """Replaces the runtime by one with a new heap, replacing every active allocation on every
    rank at once. A collective call; only with exactly one reference held.

    ``replacements`` must cover every active allocation exactly once. The new tensors are
    zero-filled, except that a replacement with ``preserve=True`` carries the first
    min(old, new) bytes over; they are returned in request order; every old tensor becomes
    stale. ``preflight_hook`` returns a snapshot of the caller's own state (any
    picklable value) that must be equal on every rank: values are compared with ``==``, so a
    set or a dict built in another order is the same value; an error about values that differ
    shows each group of ranks' value (its ``repr``, cut short).

    Every argument problem (a bad heap size, a replacement that is not an
    :class:`AllocationReplacement`, a non-contiguous or stale ``current``, a hook that is not
    callable) is reported by Preflight on *every* rank, naming the rank it was found on: a rank
    with a bad argument still takes part, so nobody waits for it.

    Stages (each converged over the root): Preflight, Quiesce, PreserveData, ReleaseAllocations,
    ValidateShutdown, Shutdown, Bootstrap, Initialize, RestoreAllocations. A failure's message
    begins as the seed's did: ``SHMEM restart failed during <Stage>``, and for values that
    differ across ranks ``...: values differ across Root ranks (...)``.

    Raises:
        RetryableError: a failure before ReleaseAllocations (bad arguments on any rank, values
            that differ across ranks, a raising hook, a torch.distributed state that changed);
            the runtime and its tensors remain usable.
        TerminalError: a failure from ReleaseAllocations on; restart the process.
        ConvergenceError: the ranks could not agree (a peer died); restart the process.
    """
    with _lifecycle_lock:
        held = _native.reference_count()
        try:
            _check_torch_state("restart", _torch_distributed())
            heap, requests, problem = _restart_requests(
                heap_size_bytes, replacements, preflight_hook
            )
            hook = preflight_hook if callable(preflight_hook) else None
            with _registry_lock:
                exported, stages = _native.restart(heap, requests, hook, problem)
                for allocation in list(_live.values()):
                    _retire(allocation)
                tensors = tuple(
                    _register(record, r.target.shape, r.target.dtype)
                    for record, r in zip(exported, replacements)
                )
        except HyperMulticoreError as error:
            _note(error, held)
            _with_seed_prefixes(error)
            raise
        finally:
            _forget_if_gone()
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
    preflight hook): state, root rank/size, device (and the seed's ``device_index``: ``None``,
    the heap is in host memory), effective configuration, reference count, heap usage, live
    allocations sorted by id, and the latest failure."""
    return with_device_index(json.loads(_native.debug_state()))


def with_device_index(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` with the seed's ``device_index`` key: ``None`` for a CPU heap (the only kind)."""
    if "device" in state:
        state.setdefault("device_index", None)
    return state


# ---------------------------------------------------------------------------------------------
# Seed compatibility
#
# The module this one replaced (the seed reference implementation, also
# ``hyper_multicore/shmem/_lifecycle.py``) had private names that its callers import. They are
# kept here as thin aliases with the seed's semantics; docs/python.md, "Seed compatibility".

#: The seed's restart entry point: :func:`restart` itself.
_restart = restart
_AllocationSpec = AllocationSpec
_AllocationReplacement = AllocationReplacement
_RestartResult = RestartResult
#: The seed's barrier of the root over the control plane: :func:`host_barrier` itself.
_host_barrier = host_barrier
#: The lifecycle's lock (re-entrant), as in the seed: holding it keeps this process's
#: ``acquire``, ``release`` and ``restart`` out. The registry's lock is ``_registry._lock``.
_lock = _lifecycle_lock

#: The seed's prefix of a restart failure's message ("SHMEM restart failed during <Stage>").
_SEED_RESTART_PREFIX = "SHMEM "
#: How the seed began the Preflight failure for values that differ across the root's ranks.
_SEED_VALUES_DIFFER = "values differ across Root ranks"
_NATIVE_RESTART_FAILED = "restart failed during "
_NATIVE_VALUES_DIFFER = "values differ across root ranks"


def _with_seed_prefixes(error: HyperMulticoreError) -> None:
    """Rewords a restart failure in place to begin as the seed's did, the project's detail after:
    ``restart failed during <Stage>[ on rank N]: <detail>`` becomes ``SHMEM restart failed
    during <Stage>[ on rank N]: <detail>``, and a detail ``<kind>: values differ across root
    ranks (...)`` (the manifests or the preflight hook's snapshots) becomes ``values differ
    across Root ranks (...)`` (the kind stays in ``error.kind``). Other errors are left alone."""
    if len(error.args) != 1 or not isinstance(error.args[0], str):
        return
    message = error.args[0]
    if not message.startswith(_NATIVE_RESTART_FAILED):
        return
    head, separator, detail = message.partition(": ")
    kind = f"{error.kind}: " if error.kind else ""
    if separator and detail.startswith(kind + _NATIVE_VALUES_DIFFER):
        detail = _SEED_VALUES_DIFFER + detail[len(kind + _NATIVE_VALUES_DIFFER) :]
    error.args = (f"{_SEED_RESTART_PREFIX}{head}{separator}{detail}",)


def _reference_count() -> int:
    """The seed's lifecycle reference count: :func:`reference_count`, except that once the
    lifecycle was invalidated (a terminal or convergence failure) it keeps reporting the
    references held when that happened, as the seed's did (the runtime's own count is then 0)."""
    if _references_at_invalidation is not None:
        return _references_at_invalidation
    return _native.reference_count()


def _runtime_is_healthy() -> bool:
    """The seed's health check: True when a reference is active and the runtime is Ready (not
    invalidated, not finalized), else False. Never raises."""
    try:
        if _invalidated:
            return False
        state = json.loads(_native.debug_state())
        return state.get("state") == "Ready" and (state.get("reference_count") or 0) > 0
    except Exception:  # noqa: BLE001 - the seed's contract: a health check never raises
        return False
