"""The allocations this process holds, and how tensors become the native call's arguments.

Each allocation handed to Python (by :func:`~hyper_multicore.shmem.empty` or
:func:`~hyper_multicore.shmem.restart`) is recorded here with its identity (index, generation),
address and size, keyed by its torch storage (or, for NumPy, found through the ctypes array at
the root of an array's ``base`` chain). An operation resolves a tensor to a *region*
``(index, generation, byte offset, bytes)``; the native runtime then checks that the allocation
is live. Freed and released allocations stay known (their tensors are *stale*) for as long as
their memory can still be viewed. A torch tensor is inspected once and remembered per object
(:func:`_seen`); liveness and a consumer's lease are checked on every call.
"""

from __future__ import annotations

import functools
import threading
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
        "owner",
        "storage_ref",
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
        #: The shared root's consumer that owns it (None outside a shared root): data-plane
        #: calls on it need that consumer's lease (``owner.check_lease(role)``).
        self.owner: Any = None
        #: Weak reference to the ctypes array under the tensor's storage, whose death removes
        #: the allocation's storage entry (see ``_register``).
        self.storage_ref: Any = None


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
            # exactly when the storage does -- and only then may its key be reused. The weak
            # reference lives as long as the entry (a plain one: ``weakref.finalize`` costs
            # microseconds per allocation).
            allocation.storage_ref = weakref.ref(raw, functools.partial(_forget_storage, key))
    return tensor


def _forget_storage(key: int, _dead: Any) -> None:
    """Drops the entry of a storage that died (the callback of ``storage_ref``)."""
    _by_storage.pop(key, None)


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
