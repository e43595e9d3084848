"""The allocations this process holds, and how tensors become the native call's arguments.

Each allocation handed to Python (by :func:`~hyper_multicore.shmem.empty` or
:func:`~hyper_multicore.shmem.restart`) is recorded here with its identity (index, generation),
address and size, keyed by its torch storage (or, for NumPy, by the ``HeapBuffer`` at the root
of an array's ``base`` chain). An operation resolves a tensor to a *region*
``(index, generation, byte offset, bytes)``; the native runtime then checks that the allocation
is live. Freed and released allocations stay known (their tensors are *stale*) for as long as
their memory can still be viewed. A torch tensor is inspected once and remembered per object
(:func:`_seen`); liveness and a consumer's lease are checked on every call.
"""

from __future__ import annotations

import os
import weakref
from typing import Any

from .. import _native
from . import _backend
from ._backend import WORD_DTYPES, Layout, check_int
from ._errors import StaleTensorError

#: An allocation index no runtime ever hands out: a rank whose own argument to a collective
#: free/restart is invalid still takes part with it, so the others fail at once instead of
#: waiting for it.
_NO_ALLOCATION = 2**64 - 1


#: One allocation handed to Python: its identity (``index``, ``generation``), where it lives
#: (``heap_offset``, ``nbytes``, ``alignment``, ``address``), whether it is ``live``, its full
#: ``tensor`` (held while live, so its storage and the storage's key stay unique) and the
#: shared root consumer that is its ``owner`` (None outside a shared root: data-plane calls on
#: it need that consumer's lease). A native class, so that ``_native.Registry`` reaches its
#: fields directly.
_Allocation = _native.Allocation


#: Held by whatever changes the registry, and around collective allocation calls (one
#: thread's at a time, so that every PE makes them in the same order). Reentrant; the native
#: registry takes it without a Python call.
_lock = _native.RegistryLock()
# A forked child has only the forking thread: a lock another thread held would stay held.
os.register_at_fork(after_in_child=_lock.after_fork_in_child)
#: Live allocations by (index, generation).
_live: dict[tuple[int, int], _Allocation] = {}
#: torch storages (``_cdata``) of every allocation whose memory may still be viewed, live or
#: stale; an entry goes when the storage dies (see ``_register``).
_by_storage: dict[int, _Allocation] = {}


#: The registry's native side (``_native.Registry``): registration and allocation in one
#: native call each, the plain cases of ``empty`` and ``free``, and ``_retire``, each under
#: ``_lock``. It works on the state above, by the same rules.
_native_registry = _native.Registry(_live, _by_storage, _lock, _backend)


def _register(exported: tuple, shape: tuple[int, ...], dtype: str) -> Any:
    """Records a new allocation and returns its tensor (or array), under ``_lock`` (a caller
    holds it around the call too when the registry must not change between its steps).

    What lives exactly as long as tensors over the memory do (the owner of the DLPack capsule a
    torch storage was made from, or the ``HeapBuffer`` at the root of NumPy arrays' ``base``
    chains) removes the
    allocation's entry from ``_by_storage``, and lets the heap mapping go, when it dies (and
    only then: ``_native.Registry``).
    """
    return _native_registry.register(exported, tuple(shape), dtype)


def _allocate(shape: tuple[int, ...], dtype: str, alignment: int | None) -> Any:
    """Collective: a new allocation of ``shape`` and heap dtype ``dtype``, registered (see
    :func:`_register`), under ``_lock``."""
    return _native_registry.allocate(shape, dtype, alignment)


#: Marks an allocation freed/released: its tensors become stale (``_live`` forgets it).
_retire = _native_registry.retire


def _lookup(x: Any) -> _Allocation | None:
    """The allocation a tensor or array views (live or stale), or None."""
    key = _backend.storage_key(x)
    if key is None:  # NumPy: the HeapBuffer at the root of the array's ``base`` chain
        key = id(_backend.root_base(x))
    return _by_storage.get(key)


def _allocation_made_as(x: Any) -> _Allocation | None:
    """The live allocation whose tensor ``empty`` or ``restart`` returned is ``x`` itself,
    wherever ``x``'s storage points now (``share_memory_()`` copies it out of the heap), or
    None."""
    with _lock:  # another thread's empty() may add to ``_live`` meanwhile
        for allocation in _live.values():
            if allocation.tensor is x:
                return allocation
    return None


def _stale(role: str, allocation: _Allocation) -> StaleTensorError:
    return StaleTensorError(
        f"{role} views allocation {allocation.index}, which was freed or released by a "
        "restart or release; allocate a new tensor"
    )


class _Seen:
    """What the data plane needs of one tensor, found by inspecting it once: its layout, the
    allocation it views (None for process-private memory) and the native argument (a region
    ``(index, generation, byte offset, bytes)`` or ``(address, nbytes)``; None when the tensor is
    not contiguous)."""

    __slots__ = ("ref", "address", "dtype", "shape", "stride", "layout", "allocation", "arg")

    def __init__(self, x: Any, role: str) -> None:
        layout = Layout(x, role)
        allocation = _lookup(x)
        arg: tuple[int, ...] | None = None
        if layout.contiguous and allocation is None:
            arg = (layout.address, layout.nbytes)
        elif layout.contiguous:
            # torch reports address 0 for a tensor without elements: any offset will do then.
            offset = layout.address - allocation.address if layout.nbytes else 0
            if not 0 <= offset <= allocation.nbytes - layout.nbytes:
                raise ValueError(f"{role} lies outside its allocation")  # pragma: no cover
            arg = (allocation.index, allocation.generation, offset, layout.nbytes)
        self.ref: Any = None
        self.address = layout.address
        self.layout = layout
        self.allocation = allocation
        self.arg = arg


#: torch tensors already inspected, by ``id``: a call on a tensor whose data pointer, dtype,
#: shape and strides are what they were reuses its :class:`_Seen` (the allocation's liveness and
#: its consumer's lease are still checked on every call). An entry goes when its tensor dies.
#: Each entry is also remembered natively, as a ``_native.Seen`` handle: the ``*_seen``
#: functions make the same checks there, in one call.
_seen_tensors: dict[int, _Seen] = {}
_Tensor: Any = _backend.torch.Tensor if _backend.torch is not None else None


def _forget(key: int, ref: Any) -> None:
    """Weak-reference callback: drops the entry of a tensor that died (unless the id has been
    reused by a newer entry already)."""
    seen = _seen_tensors.get(key)
    if seen is not None and seen.ref is ref:
        del _seen_tensors[key]
    _native.forget(key, ref)


def _seen(x: Any, role: str) -> _Seen:
    """``x`` inspected: from the cache for a plain torch tensor seen before and unchanged since
    (same data pointer, dtype, shape and strides -- what an in-place ``set_``, ``resize_``,
    ``as_strided_`` or ``t_`` would change), otherwise by inspecting it (and caching that)."""
    if type(x) is not _Tensor:
        return _Seen(x, role)
    key = id(x)
    seen = _seen_tensors.get(key)
    if (
        seen is not None
        and seen.ref() is x
        and x.data_ptr() == seen.address
        and x.dtype is seen.dtype
        and x.shape == seen.shape
        and x.stride() == seen.stride
    ):
        return seen
    seen = _Seen(x, role)
    if seen.arg is not None:
        seen.dtype = x.dtype
        seen.shape = x.shape
        seen.stride = x.stride()
        seen.ref = weakref.ref(x, lambda ref, key=key: _forget(key, ref))
        layout = seen.layout
        word = layout.dtype if layout.numel == 1 and layout.dtype in WORD_DTYPES else None
        handle = _native.Seen(
            seen.ref,
            seen.address,
            seen.dtype,
            layout.nbytes,
            seen.allocation,
            seen.arg,
            word,
            layout.writable,
            layout.numel == 1,
        )
        _seen_tensors[key] = seen
        _native.remember(key, handle)
    return seen


def _symmetric(x: Any, role: str) -> _Seen:
    """A symmetric tensor (or view), checked: live, its consumer's lease held, contiguous."""
    seen = _seen(x, role)
    allocation = seen.allocation
    if allocation is None:
        raise ValueError(
            f"{role} must be a symmetric tensor (made by hyper_multicore.shmem.empty or "
            "restart) or a view of one"
        )
    if not allocation.live:
        raise _stale(role, allocation)
    if allocation.owner is not None:
        allocation.owner.check_lease(role)
    if seen.arg is None:
        raise ValueError(f"{role} must be contiguous")
    return seen


def _local(x: Any, role: str, *, writable: bool = False) -> _Seen:
    """A local buffer: a symmetric tensor (checked as :func:`_symmetric`), or any other
    contiguous CPU tensor or array (writable for a destination)."""
    seen = _seen(x, role)
    if seen.allocation is not None:
        return _symmetric(x, role)
    if seen.arg is None:
        raise ValueError(f"{role} must be contiguous")
    if writable and not seen.layout.writable:
        raise ValueError(f"{role} is read-only")
    return seen


def _region(x: Any, role: str) -> tuple[int, int, int, int]:
    """A symmetric tensor (or view) as ``(index, generation, byte offset, bytes)``."""
    return _symmetric(x, role).arg  # type: ignore[return-value]


def _same_dtype(a: _Seen, b: _Seen, what: str) -> None:
    if a.layout.dtype != b.layout.dtype:
        raise TypeError(f"{what}: dtypes differ ({a.layout.dtype} and {b.layout.dtype})")


def _pe(value: Any, what: str = "pe") -> int:
    if type(value) is int and value >= 0:
        return value
    pe = check_int(value, what)
    if pe < 0:
        raise ValueError(f"{what} must be non-negative, not {pe}")
    return pe
