"""Tensors: PyTorch CPU tensors when torch is importable, NumPy arrays otherwise.

This module names the backend's dtypes and checks the allocation calls' arguments; the data
plane reads its tensors natively (``crates/hyper-multicore-py/src/seen.rs``).

Zero copy: the native ``HeapBuffer`` of an allocation holds the address of its bytes in this
process and keeps the runtime's shared mapping alive. ``_native.Registry`` makes the tensor:
``torch._C._from_dlpack`` over a DLPack capsule of those bytes, whose owner (dropped with the
last storage over them) holds the mapping; or ``numpy.asarray`` over the
``HeapBuffer``'s ``__array_interface__``, so that the ``HeapBuffer`` is every array's root
``base``. So the memory stays mapped for as long as any tensor or view of it lives, and a stale
tensor can never fault the interpreter.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Sequence
from typing import Any

from .. import _native

try:  # torch is optional: NumPy arrays stand in for tensors without it.
    import torch
except ImportError:  # pragma: no cover - exercised by the numpy-only test run
    torch = None  # type: ignore[assignment]

try:
    import numpy as np
except ImportError:  # pragma: no cover
    np = None  # type: ignore[assignment]

if torch is None and np is None:  # pragma: no cover
    raise ImportError("hyper_multicore.shmem needs torch or numpy")

#: Element types the heap can hold, as torch spells them.
DTYPE_NAMES: tuple[str, ...] = tuple(_native.DTYPES)


def backend() -> str:
    """``"torch"`` if tensors are torch tensors, ``"numpy"`` if they are NumPy arrays."""
    return "numpy" if torch is None else "torch"


def _numpy_dtype(name: str) -> Any:
    if name == "bfloat16":
        try:  # NumPy has no bfloat16 of its own; ml_dtypes adds one if installed.
            import ml_dtypes

            return np.dtype(ml_dtypes.bfloat16)
        except ImportError:
            raise TypeError(
                "bfloat16 arrays need torch or the ml_dtypes package; NumPy has no bfloat16"
            ) from None
    return np.dtype(name)


#: Heap dtype names of the dtype arguments already checked (torch dtypes, NumPy dtypes, names,
#: types: see :func:`_cacheable`): :func:`dtype_name` answers a repeated argument with one
#: lookup, and the native ``empty`` looks torch dtypes up here.
_CHECKED_DTYPES: dict[Any, str] = {}


def _cacheable(dtype: Any) -> bool:
    """Whether ``dtype`` may be a key of :data:`_CHECKED_DTYPES`: a torch or NumPy dtype, a
    name or a type, which only equal arguments naming the same dtype. Not a number, which NumPy
    may take for a dtype-like, but which equals others that name other dtypes or none
    (``np.float16(1.0) == 1 == True``)."""
    kind = type(dtype)
    return (
        kind is str
        or kind is type
        or (torch is not None and kind is torch.dtype)
        or (np is not None and isinstance(dtype, np.dtype))
    )


def dtype_name(dtype: Any) -> str:
    """The heap dtype name of a torch dtype, NumPy dtype-like, or name string."""
    cacheable = _cacheable(dtype)
    if cacheable and dtype in _CHECKED_DTYPES:
        return _CHECKED_DTYPES[dtype]
    name = _checked_dtype_name(dtype)
    if cacheable:
        _CHECKED_DTYPES[dtype] = name
    return name


def _checked_dtype_name(dtype: Any) -> str:
    """:func:`dtype_name` of an argument not seen before."""
    if isinstance(dtype, str):
        name = dtype.removeprefix("torch.")
    elif torch is not None and isinstance(dtype, torch.dtype):
        name = str(dtype).removeprefix("torch.")
    elif dtype is bool:
        name = "bool"
    elif dtype is int:
        name = "int64"
    elif dtype is float:
        name = "float64"
    elif np is not None:
        try:
            numpy_dtype = np.dtype(dtype)
        except TypeError:
            raise TypeError(f"{dtype!r} is not a dtype") from None
        if not numpy_dtype.isnative:
            raise TypeError(
                f"dtype {dtype!r} is not in this machine's byte order; the heap holds native "
                "values (use its native form, e.g. dtype.newbyteorder('='))"
            )
        name = numpy_dtype.name
    else:  # pragma: no cover
        raise TypeError(f"{dtype!r} is not a dtype")
    if name not in DTYPE_NAMES:
        raise TypeError(
            f"dtype {dtype!r} cannot live in the symmetric heap; use one of {list(DTYPE_NAMES)}"
        )
    try:
        to_dtype(name)  # the tensor library has it too (NumPy's bfloat16 needs ml_dtypes)
    except AttributeError:  # pragma: no cover (torch < 2.3 lacks the unsigned 16-64 bit ones)
        raise TypeError(f"this torch has no {name}; torch 2.3 or later does") from None
    return name


def default_dtype_name() -> str:
    """torch's default dtype (``torch.get_default_dtype()``), or float32 for NumPy."""
    if torch is not None:
        return dtype_name(torch.get_default_dtype())
    return "float32"


@functools.lru_cache(maxsize=None)
def to_dtype(name: str) -> Any:
    """The backend's dtype object for a heap dtype name."""
    if torch is not None:
        return getattr(torch, name)
    return _numpy_dtype(name)


def is_tensor(x: Any) -> bool:
    """True for a torch tensor or NumPy array."""
    return (torch is not None and isinstance(x, torch.Tensor)) or (
        np is not None and isinstance(x, np.ndarray)
    )


def extent(x: Any) -> tuple[int, int]:
    """The address and byte length of a torch tensor's or NumPy array's elements."""
    if torch is not None and isinstance(x, torch.Tensor):
        return x.data_ptr(), x.nbytes
    return x.__array_interface__["data"][0], x.nbytes


def check_int(value: Any, what: str) -> int:
    """``value`` as an int; a bool is not an integer."""
    if isinstance(value, bool):
        raise TypeError(f"{what} must be an integer, not a bool")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{what} must be an integer, not {type(value).__name__}") from None


#: The largest dimension a tensor can have (torch's are ``int64_t``).
MAX_DIMENSION = 2**63 - 1


def check_shape(shape: Any, what: str) -> tuple[int, ...]:
    """``shape`` as a tuple of non-negative ints (a sequence; a bool is not an integer)."""
    if isinstance(shape, (str, bytes)) or not isinstance(shape, Sequence):
        raise TypeError(f"{what} must be a sequence of integers, not {type(shape).__name__}")
    dims = tuple(check_int(d, f"{what} entry") for d in shape)
    if any(d < 0 for d in dims):
        raise ValueError(f"{what} has a negative dimension: {dims}")
    if any(d > MAX_DIMENSION for d in dims):
        raise ValueError(f"{what} has a dimension above 2**63 - 1, a tensor's limit: {dims}")
    return dims


#: Bytes per element of each heap dtype.
DTYPE_SIZES: dict[str, int] = dict(_native.DTYPE_SIZES)


def check_extent(shape: tuple[int, ...], name: str) -> None:
    """Refuses a shape no tensor of heap dtype ``name`` can have: its contiguous strides in
    bytes (the product of its dimensions, a 0 counted as 1, times the element size) must fit
    an int64, even where it has no elements (torch and NumPy refuse it then too)."""
    extent = DTYPE_SIZES[name]
    for dimension in shape:
        extent *= max(dimension, 1)
    if extent > MAX_DIMENSION:
        raise ValueError(
            f"a {name} tensor of shape {shape} has strides beyond 2**63 - 1 bytes, a tensor's limit"
        )


def check_alignment(alignment: Any) -> int | None:
    """An alignment in bytes: ``None`` (or 0) for the default, else a non-negative int (the
    runtime checks it is a power of two)."""
    if alignment is None:
        return None
    value = check_int(alignment, "alignment")
    if value < 0:
        from ._errors import InvalidArgumentError  # (a RuntimeError too, as in the original)

        raise InvalidArgumentError(f"alignment must be a power of two (or None), not {value}")
    return value or None  # 0 means the default, as None does
