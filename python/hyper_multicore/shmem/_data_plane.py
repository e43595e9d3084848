"""The data plane: put/get, signals, atomics, quiet/fence, and the collectives over the root
(barrier, all_gather, broadcast, all_to_all, all_reduce).

Each function here is the native one (``crates/hyper-multicore-py/src/data_plane.rs``), which
does the whole call in one: it inspects its tensors -- a symmetric tensor becomes a region
``(index, generation, byte offset, bytes)`` of its allocation, a local one ``(address,
nbytes)``; a torch tensor is inspected once and remembered (``src/seen.rs``) -- checks every
argument, raising the precise error (a stale tensor, a foreign one, dtypes, sizes, contiguity,
a consumer's lease, a PE or value out of range), and enters the runtime once, through its guard
(refused when no reference is held or the runtime was invalidated).
"""

from __future__ import annotations

from .. import _native

put = _native.put
get = _native.get
put_signal = _native.put_signal
signal = _native.signal
wait_signal = _native.wait_signal
quiet = _native.quiet
fence = _native.fence
atomic_fetch = _native.atomic_fetch
atomic_set = _native.atomic_set
atomic_swap = _native.atomic_swap
atomic_compare_swap = _native.atomic_compare_swap
atomic_fetch_add = _native.atomic_fetch_add
atomic_add = _native.atomic_add

# Collectives
barrier = _native.barrier
host_barrier = _native.host_barrier
all_gather = _native.all_gather
broadcast = _native.broadcast
all_to_all = _native.all_to_all
all_reduce = _native.all_reduce
