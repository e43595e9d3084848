"""Symmetric memory for multi-process PyTorch (or NumPy) programs.

Every process (PE) of a root group owns a heap of the same size; a collective :func:`empty`
returns a tensor at the same offset on every PE, so any PE can :func:`put`, :func:`get`,
:func:`signal` and run atomics on a peer's copy without the peer taking part. Tensors are
PyTorch CPU tensors (NumPy arrays where torch is not installed) that view the heap directly.

The runtime is process-wide and reference counted: :func:`acquire` starts it collectively over a
root group (or takes another reference), :func:`release` drops one (the last one shuts it down
collectively), and :func:`restart` resizes the heap and replaces every allocation on every rank
at once (keeping data with ``preserve=True``). Several modules share one heap through a
:class:`SharedRoot`: declared consumers with budgets, ownership, execution leases, and heap
growth that keeps every consumer's data (:class:`GrowableBuffer`). Every rank either succeeds
at each stage or all fail with the same diagnosis naming the failing ranks, as
:class:`RetryableError`, :class:`TerminalError` or :class:`ConvergenceError`.

Root groups: with ``torch.distributed`` initialised, a ``ProcessGroup`` (``None`` = WORLD); the
runtime's unique ID travels over it from group rank 0. Without it, the launcher's environment
(``hmrun`` or ``torchrun``) defines the world, and a root group may be given as a sequence of
world ranks; with neither, the process is a standalone root of one PE.

Example (run with ``hmrun -n 4 -- python ring.py`` or ``torchrun --nproc-per-node 4 ring.py``)::

    import torch, torch.distributed as dist
    from hyper_multicore import shmem

    dist.init_process_group("gloo")
    shmem.acquire(heap_size_bytes=64 << 20)
    me, n = shmem.my_pe(), shmem.n_pes()
    data = shmem.empty(8, dtype=torch.float32)
    flag = shmem.empty(1, dtype=torch.int64)
    flag.zero_()
    shmem.barrier()
    shmem.put_signal(data, torch.full((8,), float(me)), flag, 1, (me + 1) % n)
    shmem.wait_signal(flag, 1)
    assert data[0].item() == (me - 1) % n
    shmem.barrier()
    shmem.free(flag)
    shmem.free(data)
    shmem.release()

Protocol facts: signal words written concurrently should be at least 64 bytes apart (the default
alignment of every allocation is 64, so separately allocated words are); every rank must
initialise a slot and pass a :func:`barrier` before any peer writes into it remotely. Allocation,
free, barrier and the collectives are collective calls: every PE of the root makes them in the
same order with the same arguments.

The package's modules: :mod:`._lifecycle` (acquire, release, restart, root groups,
introspection), :mod:`._shared_root` (SharedRoot and its consumers), :mod:`._allocation`
(empty, free), :mod:`._data_plane` (RMA, signals, atomics,
collectives), :mod:`._registry` (the allocations this process holds), :mod:`._backend` (torch or
NumPy tensors) and :mod:`._errors`; this module only re-exports their public names.
"""

from __future__ import annotations

from ._allocation import empty, free
from ._backend import backend
from ._data_plane import (
    all_gather,
    all_reduce,
    all_to_all,
    atomic_add,
    atomic_compare_swap,
    atomic_fetch,
    atomic_fetch_add,
    atomic_set,
    atomic_swap,
    barrier,
    broadcast,
    fence,
    get,
    host_barrier,
    put,
    put_signal,
    quiet,
    signal,
    wait_signal,
)
from ._errors import (
    ConvergenceError,
    HyperMulticoreError,
    InvalidArgumentError,
    PeerLostError,
    RetryableError,
    ShmemError,
    StaleTensorError,
    TerminalError,
    WaitTimeoutError,
)
from ._lifecycle import (
    STAGE_KEYS,
    AllocationReplacement,
    AllocationSpec,
    RestartResult,
    acquire,
    debug_state,
    my_pe,
    n_pes,
    reference_count,
    release,
    restart,
    root_members,
)
from ._shared_root import (
    Consumer,
    ConsumerSpec,
    GrowableBuffer,
    Lease,
    SharedRoot,
    allocation_budget,
)

__all__ = [
    # lifecycle
    "acquire",
    "release",
    "restart",
    "root_members",
    "reference_count",
    "AllocationSpec",
    "AllocationReplacement",
    "RestartResult",
    "STAGE_KEYS",
    # shared root
    "SharedRoot",
    "ConsumerSpec",
    "Consumer",
    "Lease",
    "GrowableBuffer",
    "allocation_budget",
    # allocation
    "empty",
    "free",
    # data plane
    "put",
    "get",
    "put_signal",
    "signal",
    "wait_signal",
    "quiet",
    "fence",
    "atomic_fetch",
    "atomic_set",
    "atomic_swap",
    "atomic_compare_swap",
    "atomic_fetch_add",
    "atomic_add",
    # collectives
    "barrier",
    "host_barrier",
    "all_gather",
    "broadcast",
    "all_to_all",
    "all_reduce",
    # introspection
    "my_pe",
    "n_pes",
    "debug_state",
    "backend",
    # errors
    "HyperMulticoreError",
    "ShmemError",
    "RetryableError",
    "TerminalError",
    "ConvergenceError",
    "PeerLostError",
    "WaitTimeoutError",
    "StaleTensorError",
    "InvalidArgumentError",
]
