"""The data plane: put/get, signals, atomics, quiet/fence, and the collectives over the root
(barrier, all_gather, broadcast, all_to_all, all_reduce).

Symmetric tensors travel to the native runtime as regions ``(index, generation, byte offset,
bytes)`` (:mod:`._registry`), local tensors as ``(address, nbytes)``; every call goes through the
runtime's guarded path (refused when no reference is held or the runtime was invalidated).

The small calls first try their ``_native.*_seen`` twin, which takes the tensors themselves and
does the whole call natively when every tensor was inspected before and is unchanged (see
``crates/hyper-multicore-py/src/seen.rs``); it returns ``NotImplemented`` otherwise, without
doing anything, and the call goes on here with the full checks.
"""

from __future__ import annotations

from typing import Any

from .. import _native
from . import _backend
from ._backend import check_word
from ._registry import _local, _pe, _same_dtype, _symmetric


def put(remote_dst: Any, local_src: Any, target_pe: int) -> None:
    """Copies ``local_src`` into PE ``target_pe``'s copy of the symmetric ``remote_dst`` (same
    dtype and number of elements; either may be a view)."""
    if _native.put_seen(remote_dst, local_src, target_pe) is None:
        return
    dst = _symmetric(remote_dst, "remote_dst")
    src = _local(local_src, "local_src")
    _same_dtype(dst, src, "put")
    _native.put(dst.arg, src.arg, _pe(target_pe, "target_pe"))


def get(local_dst: Any, remote_src: Any, source_pe: int) -> None:
    """Copies PE ``source_pe``'s copy of the symmetric ``remote_src`` into ``local_dst``."""
    if _native.get_seen(local_dst, remote_src, source_pe) is None:
        return
    src = _symmetric(remote_src, "remote_src")
    dst = _local(local_dst, "local_dst", writable=True)
    _same_dtype(dst, src, "get")
    _native.get(dst.arg, src.arg, _pe(source_pe, "source_pe"))


def _word(signal_tensor: Any, role: str) -> tuple[tuple[int, ...], str]:
    seen = _symmetric(signal_tensor, role)
    layout = seen.layout
    if layout.dtype not in _backend.WORD_DTYPES:
        raise TypeError(
            f"{role} must be an int32, uint32, int64 or uint64 tensor, not {layout.dtype}"
        )
    if layout.numel != 1:
        raise ValueError(
            f"{role} must hold exactly one element (a signal word), not {layout.numel}"
        )
    return seen.arg, layout.dtype  # type: ignore[return-value]


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
    seen = _native.put_signal_seen(
        remote_dst, local_src, remote_signal, value, target_pe, operation
    )
    if seen is None:
        return
    dst = _symmetric(remote_dst, "remote_dst")
    src = _local(local_src, "local_src")
    _same_dtype(dst, src, "put_signal")
    word, dtype = _word(remote_signal, "remote_signal")
    _native.put_signal(
        dst.arg,
        src.arg,
        word,
        dtype,
        check_word(value, dtype, "value"),
        _choice(operation, _SIGNAL_OPS, "operation"),
        _pe(target_pe, "target_pe"),
    )


def signal(remote_signal: Any, value: int, target_pe: int, *, operation: str = "set") -> None:
    """Sets (``operation="set"``) or adds to (``"add"``, wrapping) PE ``target_pe``'s copy of
    the one-element signal word ``remote_signal``, and wakes its waiters."""
    if _native.signal_seen(remote_signal, value, target_pe, operation) is None:
        return
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
    seen = _native.wait_signal_seen(signal, value, comparison, timeout)
    if seen is not NotImplemented:
        return seen  # type: ignore[no-any-return]
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
    seen = _native.atomic_seen(operation, target, pe, **values)
    if seen is not NotImplemented:
        return seen  # type: ignore[no-any-return]
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
    out = _symmetric(output, "output")
    src = _local(input, "input")
    _same_dtype(out, src, "all_gather")
    out_layout, in_layout = out.layout, src.layout
    pes = _native.n_pes()
    if out_layout.numel != pes * in_layout.numel:
        raise ValueError(
            f"all_gather: output holds {out_layout.numel} elements but {pes} PEs x "
            f"{in_layout.numel} input elements need {pes * in_layout.numel}"
        )
    _native.all_gather(out.arg, src.arg)


def broadcast(output: Any, input: Any, root: int) -> None:
    """Collective: copies PE ``root``'s ``input`` into every PE's symmetric ``output``.
    ``input`` is only read on ``root`` (it may be ``None`` elsewhere)."""
    out = _symmetric(output, "output")
    root_pe = _pe(root, "root")
    src = None
    if input is not None and _native.my_pe() == root_pe:
        seen = _local(input, "input")
        _same_dtype(out, seen, "broadcast")
        out_layout, in_layout = out.layout, seen.layout
        src = seen.arg
        if out_layout.numel != in_layout.numel:
            raise ValueError(
                f"broadcast: output holds {out_layout.numel} elements, input {in_layout.numel}"
            )
    _native.broadcast(out.arg, src, root_pe)


def all_to_all(output: Any, input: Any) -> None:
    """Collective: sends block ``j`` of ``input`` to PE ``j``, which stores it as block
    ``my_pe()`` of its symmetric ``output``. Both hold ``n_pes() * block`` elements."""
    out = _symmetric(output, "output")
    src = _local(input, "input")
    _same_dtype(out, src, "all_to_all")
    out_layout, in_layout = out.layout, src.layout
    pes = _native.n_pes()
    if out_layout.numel != in_layout.numel or in_layout.numel % pes:
        raise ValueError(
            f"all_to_all: input ({in_layout.numel}) and output ({out_layout.numel}) must hold "
            f"the same number of elements, a multiple of the {pes} PEs"
        )
    _native.all_to_all(out.arg, src.arg)


_REDUCE_OPS = ("sum", "min", "max")


def all_reduce(output: Any, input: Any, op: str = "sum") -> None:
    """Collective: combines every PE's symmetric ``input`` element-wise with ``op`` (``"sum"``,
    ``"min"``, ``"max"``) into every PE's symmetric ``output``; they may be the same tensor.
    Dtypes: int32, uint32, int64, uint64, float32, float64."""
    out = _symmetric(output, "output")
    src = _symmetric(input, "input")
    _same_dtype(out, src, "all_reduce")
    out_layout, in_layout = out.layout, src.layout
    if out_layout.numel != in_layout.numel:
        raise ValueError(
            f"all_reduce: output ({out_layout.numel}) and input ({in_layout.numel}) lengths differ"
        )
    _native.all_reduce(out.arg, src.arg, out_layout.dtype, _choice(op, _REDUCE_OPS, "op"))
