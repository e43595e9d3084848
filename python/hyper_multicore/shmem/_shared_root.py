"""One heap for several consumers: :class:`SharedRoot`, its :class:`Consumer` objects (budgets,
ownership, execution leases) and :class:`GrowableBuffer` (heap growth that keeps every
consumer's data).

The logic is the Rust library's (``hyper_multicore::lifecycle::SharedRoot``); this module keeps
the declarations while planning, chooses the root group's channel as :func:`acquire` does, and
keeps the registry of :mod:`._registry` in step: a consumer's tensors are owned by it (their
data-plane calls need its lease), and a growth replaces every consumer's tensors by new ones
holding the same bytes (:meth:`Consumer.refresh` finds a tensor's replacement).

Example (every rank runs it; ``hmrun -n 2 -- python example.py``)::

    from hyper_multicore import shmem

    root = shmem.SharedRoot()
    moe = root.reserve(shmem.ConsumerSpec("moe0", "moe-dispatch", 8 << 20, "dispatch"))
    attn = root.reserve(shmem.ConsumerSpec("attn", "workspace", 2 << 20, "scratch"))
    root.activate()
    with moe.lease():
        dispatch = moe.growable(1024, 256, dtype="float32")   # 1024 token rows
        dispatch.ensure_capacity(3000)  # grows the heap for everyone, keeping data
        moe.free(dispatch.tensor)
    moe.close(); attn.close(); root.close()
"""

from __future__ import annotations

import json
import sys
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .. import _native
from . import _backend
from ._allocation import _allocation_args, _size_args
from ._errors import HyperMulticoreError, ShmemError, native_style
from ._lifecycle import _heap_size, _note, over_root_group, with_device_index
from ._registry import _NO_ALLOCATION, _live, _lock, _lookup, _register, _retire

#: The references an active shared root holds (the process's single one): what a failure of
#: its close or of a growth leaves the seed's ``_reference_count()`` reporting, if it invalidates.
_ACTIVE_REFERENCES = 1


@dataclass(frozen=True)
class ConsumerSpec:
    """A consumer's declaration: a name unique in the root, its kind, the bytes of heap it may
    hold at once (see :func:`allocation_budget`), a layout (any value; compared across ranks by
    its ``repr``) and, optionally, the largest budget a growth may give it."""

    name: str
    kind: str
    budget_bytes: int
    layout: Any = ""
    max_budget_bytes: int | None = None

    def __post_init__(self) -> None:
        for field_name in ("name", "kind"):
            if not isinstance(getattr(self, field_name), str):
                raise TypeError(f"{field_name} must be a str")
        for field_name in ("budget_bytes", "max_budget_bytes"):
            value = getattr(self, field_name)
            if value is None and field_name == "max_budget_bytes":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{field_name} must be a positive int, not {value!r}")


def allocation_budget(shape: Sequence[int], dtype: Any, alignment: int | None = None) -> int:
    """What one tensor of ``shape`` and ``dtype`` costs a consumer's budget (the allocator's
    rounding and the worst-case alignment padding included)."""
    size = _size_args((shape,))
    return _native.allocation_budget(list(size), _backend.dtype_name(dtype), alignment)


def _caller_site() -> str:
    """``file:line`` of the code that called into this module (for the log)."""
    frame = sys._getframe(1)
    while frame.f_back is not None and frame.f_globals.get("__name__") == __name__:
        frame = frame.f_back
    return f"{frame.f_code.co_filename}:{frame.f_lineno}"


def _dropped(allocation: Any, consumer: str, site: str) -> None:
    """Finalizer of a consumer's tensor: warns if its allocation is still live."""
    if allocation.live:
        _native.warn(
            f"a symmetric tensor of consumer {consumer} (allocation {allocation.index}, "
            f"allocated at {site}) was dropped while its allocation is live; free it with "
            "consumer.free() (the heap holds it until then)"
        )


def _watched(allocation: Any, tensor: Any, consumer: str, site: str) -> Any:
    """A view of ``tensor`` (``allocation``'s full tensor) that warns if it is dropped while
    the allocation is live."""
    view = tensor[...]
    weakref.finalize(view, _dropped, allocation, consumer, site).atexit = False
    return view


def _state_error(operation: str, message: str) -> ShmemError:
    return native_style(ShmemError, operation, "invalid state", message)


class Lease:
    """A consumer's execution lease (see :meth:`Consumer.claim`); a context manager that
    releases it on exit. Its :attr:`generation` grows with every claim in the process."""

    def __init__(self, consumer: Consumer, native: Any) -> None:
        self.consumer = consumer
        self._native = native

    @property
    def generation(self) -> int:
        """The claim's generation (each claim in the process gets a larger one)."""
        return self._native.generation

    def release(self) -> None:
        """Releases the lease; a lease of an earlier generation (released already) is refused."""
        self._native.release()

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self._native.check("release lease")
        except HyperMulticoreError:
            return  # released already (or the root failed): nothing to give back
        self._native.release()


class Consumer:
    """A consumer of a :class:`SharedRoot` (made by :meth:`SharedRoot.reserve`)."""

    def __init__(self, root: SharedRoot, spec: ConsumerSpec) -> None:
        self.root = root
        self.spec = spec
        self._native: Any = None  # set by activate
        #: The latest lease claimed (kept after release, so a call made without the lease is
        #: refused by the runtime on every rank, as a stale lease).
        self._last: Any = None

    @property
    def name(self) -> str:
        """The consumer's name."""
        return self.spec.name

    def __repr__(self) -> str:
        return f"Consumer({self.name!r}, kind={self.spec.kind!r})"

    def _active(self, operation: str) -> Any:
        if self._native is None:
            raise native_style(
                ShmemError,
                operation,
                "invalid state",
                "the shared root is not active yet; call activate first",
            )
        return self._native

    def claim(self, *, wait: bool = True) -> Lease:
        """Claims the execution lease: waits while another consumer of this process holds it
        (up to ``HYPER_MULTICORE_SHMEM_TIMEOUT_SEC``), or with ``wait=False`` fails at once
        saying which consumer holds it."""
        native = self._active("claim").claim(wait)
        self._last = native
        return Lease(self, native)

    def lease(self) -> Lease:
        """``with consumer.lease():`` -- claims the lease for the block (see :meth:`claim`)."""
        return self.claim()

    def release(self) -> None:
        """Releases the lease this consumer holds."""
        if self._last is None:
            raise _state_error("release lease", f"consumer {self.name} never claimed the lease")
        self._last.release()

    def check_lease(self, role: str) -> None:
        """Fails unless this consumer holds the lease now (the data plane's check)."""
        if self._last is None:
            raise _state_error(
                role,
                f"consumer {self.name} does not hold the lease; make its calls inside "
                "`with consumer.lease():`",
            )
        self._last.check(role)

    def _lease_for(self, operation: str) -> Any:
        self._active(operation)
        if self._last is None:
            raise _state_error(
                operation,
                f"consumer {self.name} never claimed the lease; make its calls inside "
                "`with consumer.lease():`",
            )
        return self._last

    def empty(self, *size: Any, dtype: Any = None, alignment: int | None = None) -> Any:
        """Collective: a new symmetric tensor billed to this consumer (as
        :func:`~hyper_multicore.shmem.empty`). Refused on every rank, before any collective
        work, when it would exceed the budget on any rank or the lease is not held."""
        return self._allocate(size, dtype, alignment, growable=False)[1]

    def growable(
        self, *size: Any, dtype: Any = None, alignment: int | None = None
    ) -> GrowableBuffer:
        """Collective: a :class:`GrowableBuffer` of ``size`` (its first dimension is rows)."""
        native, tensor = self._allocate(size, dtype, alignment, growable=True)
        return GrowableBuffer(self, native, tensor)

    def _allocate(
        self, size: tuple[Any, ...], dtype: Any, alignment: int | None, *, growable: bool
    ) -> tuple[Any, Any]:
        shape, name, align = _allocation_args(size, dtype, alignment)
        lease = self._lease_for("allocate")
        site = _caller_site()
        with _lock:
            native, (exported, _, _) = lease.allocate(list(shape), name, align, site, growable)
            return native, self._own(_register(exported, shape, name), site)

    def _own(self, tensor: Any, site: str) -> Any:
        """Marks ``tensor``'s allocation as this consumer's and returns the caller's view of
        it, which warns (through the runtime's log) if it is dropped while still live."""
        allocation = _lookup(tensor)
        assert allocation is not None
        allocation.owner = self
        self.root._sites[(allocation.index, allocation.generation)] = site
        return _watched(allocation, tensor, self.name, site)

    def free(self, tensor: Any) -> None:
        """Collective: frees a tensor of this consumer. Another consumer's tensor is refused
        ("owned by consumer Y") on every rank; a failed free keeps the bill."""
        allocation = _lookup(tensor) if _backend.is_tensor(tensor) else None
        key = (
            (allocation.index, allocation.generation)
            if allocation is not None and allocation.live
            else (_NO_ALLOCATION, 0)
        )
        lease = self._lease_for("free")
        with _lock:
            lease.free(*key)
            if allocation is not None:
                _retire(allocation)
                self.root._sites.pop(key, None)

    def grow(self, budget_bytes: int) -> bool:
        """Collective: makes this consumer's budget at least the largest ``budget_bytes`` of
        any rank (times the root's growth factor, capped by ``max_budget_bytes``), growing the
        heap for every consumer and keeping every tensor's data (use :meth:`refresh` for the
        new tensors). False when the budget already covers every rank's need."""
        lease = self._lease_for("grow")
        return self.root._apply(self, lambda: lease.grow(budget_bytes))

    def ensure_capacity(self, rows: int, *buffers: GrowableBuffer) -> bool:
        """Collective: :meth:`GrowableBuffer.ensure_capacity` of several of this consumer's
        buffers at once (one growth: the receive buffers of a layer grow together)."""
        for buffer in buffers:
            if not isinstance(buffer, GrowableBuffer) or buffer.consumer is not self:
                raise ValueError(f"{buffer!r} is not a growable buffer of {self!r}")
        lease = self._lease_for("grow")
        natives = [buffer._native for buffer in buffers]
        return self.root._apply(self, lambda: lease.ensure_capacity(natives, int(rows)))

    def refresh(self, tensor: Any) -> Any:
        """The live tensor of ``tensor``'s allocation: after growths, its replacement (same
        bytes, new heap); otherwise the tensor itself. A replacement is one tensor per
        allocation while any reference to it is held; dropped while its allocation is live, it
        warns (as the tensors of :meth:`empty` do) naming where the allocation was made."""
        allocation = _lookup(tensor)
        if allocation is None:
            raise ValueError("refresh() takes a tensor made by a consumer")
        key = (allocation.index, allocation.generation)
        with _lock:
            while key in self.root._moved:
                key = self.root._moved[key]
            current = _live.get(key)
            if current is None:
                raise native_style(
                    ShmemError, "refresh", "invalid state", f"allocation {key[0]} was freed"
                )
            if current is allocation:
                return tensor
            view = self.root._refreshed.get(key)
            if view is None:
                site = self.root._sites.get(key, "an earlier heap")
                view = _watched(current, current.tensor, self.name, site)
                self.root._refreshed[key] = view
            return view

    def close(self) -> None:
        """Closes this consumer (refused while it owns tensors or holds the lease)."""
        if self._native is None:
            self.root._planned.pop(self.name, None)
            return
        self._native.close()


class GrowableBuffer:
    """A consumer's tensor whose first dimension (rows) grows on demand, keeping its data."""

    def __init__(self, consumer: Consumer, native: Any, tensor: Any) -> None:
        self.consumer = consumer
        self._native = native
        self._origin = tensor
        self._current = tensor

    @property
    def tensor(self) -> Any:
        """The buffer's live tensor (a new one after each growth), held by the buffer."""
        self._current = self.consumer.refresh(self._origin)
        return self._current

    @property
    def capacity(self) -> int:
        """Rows the buffer holds now."""
        return int(self.tensor.shape[0])

    def ensure_capacity(self, rows: int) -> bool:
        """Collective: makes the buffer hold at least the largest ``rows`` of any rank. If it
        does not, its rows grow to that times the growth factor (just the need if the budget
        cap allows no more), the heap grows for every consumer, every tensor keeps its data, and
        True is returned."""
        return self.consumer.ensure_capacity(rows, self)


class SharedRoot:
    """One symmetric heap for several declared consumers over ``root_group`` (as
    :func:`acquire`'s); holds the process's single lifecycle reference while active.

    Planning: :meth:`reserve` declares consumers. :meth:`activate` (collective) checks that every
    rank declared the same ones, sizes the heap as the sum of budgets rounded up to 2 MiB (or
    checks that ``heap_size_bytes`` / ``HYPER_MULTICORE_SHMEM_HEAP_SIZE`` covers it) and starts
    the runtime. While active, bare :func:`acquire`, :func:`release`, :func:`restart`,
    :func:`empty` and :func:`free` are refused. :meth:`close` (collective) releases it once
    every consumer is closed.
    """

    def __init__(
        self,
        root_group: Any = None,
        *,
        heap_size_bytes: int | None = None,
        growth_factor: float = 2.0,
    ) -> None:
        self._root_group = root_group
        self._heap = _heap_size(heap_size_bytes)
        self._growth_factor = float(growth_factor)
        self._planned: dict[str, Consumer] = {}
        self._native: Any = None
        #: (index, generation) of an allocation replaced by a growth -> its replacement's.
        self._moved: dict[tuple[int, int], tuple[int, int]] = {}
        #: Where each live allocation of a consumer was made (``file:line``), by (index,
        #: generation); a growth's replacement keeps its original's.
        self._sites: dict[tuple[int, int], str] = {}
        #: The tensor :meth:`Consumer.refresh` hands out for a replacement, while referenced.
        self._refreshed: weakref.WeakValueDictionary[tuple[int, int], Any] = (
            weakref.WeakValueDictionary()
        )

    def reserve(self, spec: ConsumerSpec) -> Consumer:
        """Declares a consumer (before :meth:`activate` only; names are unique)."""
        if not isinstance(spec, ConsumerSpec):
            raise TypeError(f"reserve() takes a ConsumerSpec, not {type(spec).__name__}")
        if self._native is not None:
            raise native_style(
                ShmemError,
                "reserve",
                "invalid state",
                "the shared root is no longer planning: consumers are declared before activate",
            )
        if spec.name in self._planned:
            raise ValueError(f"a consumer named {spec.name} is already declared")
        consumer = Consumer(self, spec)
        self._planned[spec.name] = consumer
        return consumer

    def activate(self) -> None:
        """Collective: freezes the declarations, compares them across ranks (a difference is
        an error on every rank naming the consumer and the ranks), sizes the heap and starts
        the runtime."""
        if self._native is not None:
            raise native_style(
                ShmemError, "activate", "invalid state", "the shared root is active already"
            )
        held = _native.reference_count()
        try:
            native = over_root_group(
                self._root_group,
                self._heap,
                world=_native.SharedRoot.world,
                ranks=_native.SharedRoot.ranks,
                channel=_native.SharedRoot.channel,
            )
            native.set_growth_factor(self._growth_factor)
            consumers = {
                name: native.reserve(
                    c.spec.name,
                    c.spec.kind,
                    c.spec.budget_bytes,
                    c.spec.layout if isinstance(c.spec.layout, str) else repr(c.spec.layout),
                    c.spec.max_budget_bytes,
                )
                for name, c in self._planned.items()
            }
            native.activate()
        except HyperMulticoreError as error:
            _note(error, held)
            raise
        self._native = native
        for name, consumer in self._planned.items():
            consumer._native = consumers[name]

    def close(self) -> None:
        """Collective: releases the runtime (refused while a consumer is open or a lease is
        held). Idempotent."""
        if self._native is None:
            return
        try:
            self._native.close()
        except HyperMulticoreError as error:
            _note(error, _ACTIVE_REFERENCES)
            raise
        self._retire_all()

    def debug_state(self) -> dict[str, Any]:
        """The runtime's snapshot (with the original runtime's keys: ``reference_count``,
        ``config.heap_size_bytes``, ``config.timeout_seconds``, ``allocated_bytes``,
        ``remaining_bytes``, ``max_allocated_bytes``, ``active_allocations``,
        ``latest_failure``) plus ``consumers`` (budget, use, allocations, lease), ``lease_holder``,
        ``epoch`` and ``growths`` (from/to bytes, stage timings)."""
        if self._native is None:
            return {
                "phase": "planning",
                "consumers": [
                    {"spec": vars(c.spec), "budget_bytes": c.spec.budget_bytes, "used_bytes": 0}
                    for c in self._planned.values()
                ],
                "growths": [],
                "epoch": 0,
            }
        return with_device_index(json.loads(self._native.debug_state()))

    def grow(self, consumer: Consumer, budget_bytes: int) -> bool:
        """Collective: :meth:`Consumer.grow` of ``consumer``."""
        if consumer.root is not self:
            raise ValueError(f"{consumer!r} is not a consumer of this root")
        return consumer.grow(budget_bytes)

    def _retire_all(self) -> None:
        with _lock:
            for allocation in list(_live.values()):
                if allocation.owner is not None and allocation.owner.root is self:
                    _retire(allocation)

    def _apply(self, consumer: Consumer, grow: Any) -> bool:
        """Runs a growth; registers its new tensors (owned as before) and retires the old ones.
        A failure after teardown (or a lost peer) retires every tensor of the root."""
        try:
            growth = grow()
        except HyperMulticoreError as error:
            _note(error, _ACTIVE_REFERENCES)
            if error.recovery in ("terminal", "convergence failure"):
                self._retire_all()
            raise
        if growth is None:
            return False
        _, replaced = growth
        with _lock:
            for (index, generation), (exported, shape, dtype) in replaced:
                old = _live.get((index, generation))
                owner = old.owner if old is not None else consumer
                if old is not None:
                    _retire(old)
                tensor = _register(exported, tuple(shape), dtype)
                new = _lookup(tensor)
                assert new is not None
                new.owner = owner
                self._moved[(index, generation)] = (new.index, new.generation)
                site = self._sites.pop((index, generation), None)
                if site is not None:
                    self._sites[(new.index, new.generation)] = site
        return True
