"""The allocations this process holds, and how tensors become the native call's arguments.

The registry itself is native (``crates/hyper-multicore-py/src/registry``): each allocation
handed to Python (by :func:`~hyper_multicore.shmem.empty` or
:func:`~hyper_multicore.shmem.restart`) is recorded there with its identity (index,
generation), address and size, in two maps read here as mappings: :data:`_live`, and
:data:`_by_storage`, keyed by the allocation's torch storage (or, for NumPy, by the
``HeapBuffer`` at the root of an array's ``base`` chain). Freed and released allocations stay
known (their tensors are *stale*) for as long as their memory can still be viewed.

The data plane's calls (``_native.put`` and the others, ``src/data_plane.rs``) inspect their
tensors natively, once per torch tensor (``src/seen.rs``); :func:`_region` and :func:`_local`
are the same inspection and checks for the Python callers that need a native argument.
"""

from __future__ import annotations

import os
from typing import Any

from .. import _native
from . import _backend

#: An allocation index no runtime ever hands out: a rank whose own argument to a collective
#: free/restart is invalid still takes part with it, so the others fail at once instead of
#: waiting for it.
_NO_ALLOCATION = 2**64 - 1


#: One allocation handed to Python: its identity (``index``, ``generation``), where it lives
#: (``heap_offset``, ``nbytes``, ``alignment``, ``address``), whether it is ``live``, its full
#: ``tensor`` (held while live, so its storage and the storage's key stay unique) and the
#: shared root consumer that is its ``owner`` (None outside a shared root: data-plane calls on
#: it need that consumer's lease).
_Allocation = _native.Allocation


#: Held by whatever changes the registry, and around collective allocation calls (one
#: thread's at a time, so that every PE makes them in the same order). Reentrant; the native
#: registry takes it without a Python call.
_lock = _native.RegistryLock()
# A forked child has only the forking thread: a lock another thread held would stay held.
os.register_at_fork(after_in_child=_lock.after_fork_in_child)

#: The registry (``_native.Registry``): registration and allocation in one native call each,
#: the plain cases of ``empty`` and ``free``, ``_retire`` and the lookups, each under ``_lock``.
_native_registry = _native.Registry(_lock, _backend)
#: Live allocations by (index, generation).
_live = _native_registry.live
#: torch storages (``_cdata``) of every allocation whose memory may still be viewed, live or
#: stale; an entry goes when the storage dies.
_by_storage = _native_registry.by_storage


def _register(exported: tuple, shape: tuple[int, ...], dtype: str) -> Any:
    """Records a new allocation and returns its tensor (or array), under ``_lock`` (a caller
    holds it around the call too when the registry must not change between its steps).

    What lives exactly as long as tensors over the memory do (the owner of the DLPack capsule a
    torch storage was made from, or the ``HeapBuffer`` at the root of NumPy arrays' ``base``
    chains) removes the allocation's entry from ``_by_storage``, and lets the heap mapping go,
    when it dies (and only then).
    """
    return _native_registry.register(exported, tuple(shape), dtype)


def _allocate(shape: tuple[int, ...], dtype: str, alignment: int | None) -> Any:
    """Collective: a new allocation of ``shape`` and heap dtype ``dtype``, registered (see
    :func:`_register`), under ``_lock``."""
    return _native_registry.allocate(shape, dtype, alignment)


#: Marks an allocation freed/released: its tensors become stale (``_live`` forgets it).
_retire = _native_registry.retire

#: ``_lookup(x)``: the allocation a tensor or array views (live or stale), or None.
_lookup = _native_registry.lookup

#: ``_allocation_made_as(x)``: the live allocation whose tensor ``empty`` or ``restart``
#: returned is ``x`` itself, wherever ``x``'s storage points now (``share_memory_()`` copies it
#: out of the heap), or None.
_allocation_made_as = _native_registry.made_as

#: ``_region(x, role)``: a symmetric tensor (or view), checked (live, its consumer's lease
#: held, contiguous), as ``(index, generation, byte offset, bytes)``.
_region = _native.region

#: ``_local(x, role, *, writable=False)``: a local buffer, checked -- a symmetric tensor
#: (as :func:`_region`), or any other contiguous CPU tensor or array (writable for a
#: destination) -- as the native argument: a region, or ``(address, nbytes)``.
_local = _native.local_buffer
