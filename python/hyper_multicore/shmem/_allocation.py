"""Allocation: :func:`empty` (a new symmetric tensor) and :func:`free`, both collective."""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any

from .. import _native
from . import _backend
from ._backend import MAX_DIMENSION, check_alignment, check_extent, check_shape
from ._errors import HyperMulticoreError, InvalidArgumentError, StaleTensorError, native_style
from ._registry import (
    _NO_ALLOCATION,
    _allocate,
    _allocation_made_as,
    _lock,
    _lookup,
    _native_registry,
    _retire,
)


def _size_args(size: tuple[Any, ...]) -> tuple[int, ...]:
    # Plain dimensions, the common case (a bool is not an int here); one of them, most common,
    # without the generator's cost.
    if len(size) == 1 and type(size[0]) is int and 0 <= size[0] <= MAX_DIMENSION:
        return size
    if size and all(type(d) is int and 0 <= d <= MAX_DIMENSION for d in size):
        return size
    if not size:
        raise TypeError("empty() needs a size: empty(2, 3) or empty((2, 3)); empty(()) is a scalar")
    if len(size) == 1 and not isinstance(size[0], (bool, int)) and isinstance(size[0], Sequence):
        return check_shape(size[0], "size")
    if len(size) == 1 and not isinstance(size[0], bool):
        try:  # a 0-d integer tensor or NumPy integer counts as an int, as in torch
            operator.index(size[0])
        except TypeError:
            if isinstance(size[0], Sequence) or hasattr(size[0], "__iter__"):
                return check_shape(tuple(size[0]), "size")
    return check_shape(size, "size")


def _empty_full(size: tuple[Any, ...], dtype: Any, alignment: Any) -> Any:
    """:func:`empty` past its native plain case (torch or NumPy; int sizes; None or a dtype
    seen before; the default alignment): checks every argument, then allocates."""
    try:
        shape, name, align = _allocation_args(size, dtype, alignment)
    except Exception as problem:
        raise problem from _join_refused(lambda: _native.allocate([0], "uint8", _NO_ALIGNMENT))
    return _allocate(shape, name, align)


def _allocation_args(
    size: tuple[Any, ...], dtype: Any, alignment: Any
) -> tuple[tuple[int, ...], str, int | None]:
    """``empty``'s arguments (also a consumer's) checked, as the shape, the heap dtype name and
    the alignment the runtime takes."""
    shape = _size_args(size)
    name = _backend.default_dtype_name() if dtype is None else _backend.dtype_name(dtype)
    check_extent(shape, name)
    return shape, name, check_alignment(alignment)


#: An alignment the runtime refuses on every rank (not a power of two), after its cross-rank
#: argument check: a rank whose own ``empty`` arguments are invalid allocates with it.
_NO_ALIGNMENT = 3


def _join_refused(call: Callable[[], object]) -> HyperMulticoreError | None:
    """Takes this rank's part in a collective whose own arguments are invalid: ``call`` makes
    it with arguments the runtime refuses on every rank after its cross-rank check, so the other
    ranks fail at once ("arguments differ across ranks") instead of waiting, and nothing
    changes. Returns that mismatch, if the other ranks' arguments differed, as the cause of
    this rank's own error."""
    with _lock:
        try:
            call()
        except HyperMulticoreError as refused:
            if "differ across ranks" in str(refused):
                return refused
    return None


def _free_full(tensor: Any) -> None:
    """:func:`free` past its native plain case (a live, whole, unowned tensor or the array
    :func:`empty` made): finds the allocation, or the precise error."""
    problem: Exception | None = None
    allocation = None
    if not _backend.is_tensor(tensor):
        problem = TypeError(f"free() takes a symmetric tensor, not {type(tensor).__name__}")
    else:
        allocation = _lookup(tensor)
        left_heap = False
        if allocation is None:
            # The tensor empty() returned, whose storage torch moved out of the heap since
            # (share_memory_() copies it into new shared memory): still its allocation's.
            allocation = _allocation_made_as(tensor)
            left_heap = allocation is not None
        if allocation is None:
            problem = native_style(
                InvalidArgumentError,
                "free",
                "invalid argument",
                "free() takes a tensor made by empty() or restart()",
            )
        elif not allocation.live:
            problem = StaleTensorError(
                f"allocation {allocation.index} was already freed or released (double free)"
            )
        elif not left_heap:
            address, nbytes = _backend.extent(tensor)
            # (torch reports address 0 for a tensor without elements)
            moved = nbytes > 0 and address != allocation.address
            if moved or nbytes != allocation.nbytes:
                problem = native_style(
                    InvalidArgumentError,
                    "free",
                    "invalid argument",
                    "free() takes the whole tensor empty() returned; a view cannot be freed on "
                    "its own",
                )
    if problem is not None:
        raise problem from _join_refused(lambda: _native.free_allocation(_NO_ALLOCATION, 0))
    assert allocation is not None
    with _lock:
        _native.free_allocation(allocation.index, allocation.generation)
        _retire(allocation)


_native_registry.install(_empty_full, _free_full)

#: ``shmem.empty(*size, dtype=None, alignment=None)``, natively: a Python wrapper's frame cost
#: a tenth of the call. Its docstring is the native function's.
empty = _native.empty

#: ``shmem.free(tensor)``, natively (as :data:`empty`).
free = _native.free
