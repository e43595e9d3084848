"""The exceptions of :mod:`hyper_multicore.shmem`.

Every exception raised by the runtime derives from :class:`HyperMulticoreError` and carries the
native error's details as attributes. Lifecycle failures (``acquire``, ``release``, ``restart``)
are classified by what recovery is possible, and their message ends with the hint:

- :class:`RetryableError` -- "the runtime remains usable": fix the cause, call again.
- :class:`TerminalError` -- "restart the process".
- :class:`ConvergenceError` -- the ranks could not agree any more (a peer died, an exchange
  timed out): "the runtime cannot be managed safely any more; restart the process".

Outside the lifecycle, :class:`PeerLostError` reports a dead PE (a wait woken by the loss of a
peer), :class:`WaitTimeoutError` a deadline that passed, and :class:`StaleTensorError` a tensor
whose allocation was freed, or released by ``restart``/``release``. Argument errors are
``TypeError``/``ValueError``; those found by the native runtime (including arguments that differ
across ranks) are :class:`InvalidArgumentError`, a ``ValueError``.

The native cause of an error is chained as ``__cause__``.
"""

from __future__ import annotations


class HyperMulticoreError(Exception):
    """Base of every exception raised by the hyper_multicore runtime.

    Attributes (``None`` where unknown or not applicable):

    - ``kind``: the native error kind (``"invalid state"``, ``"peer lost"``, ``"timeout"``, ...).
    - ``operation``: the operation that failed (``"restart"``, ``"allocate"``, ``"put"``, ...).
    - ``rank``: the root rank that raised it.
    - ``peer``: the root rank it is about (the lost or late peer).
    - ``stage``: the lifecycle stage that failed (``"Preflight"``, ``"Quiesce"``, ...).
    - ``recovery``: ``"retryable"``, ``"terminal"`` or ``"convergence failure"``.
    """

    kind: str | None = None
    operation: str | None = None
    rank: int | None = None
    peer: int | None = None
    stage: str | None = None
    recovery: str | None = None


class ShmemError(HyperMulticoreError, RuntimeError):
    """A runtime failure (state, backend or protocol error); base of the classes below."""


class RetryableError(ShmemError):
    """A lifecycle operation failed and changed nothing: the runtime remains usable."""


class TerminalError(ShmemError):
    """The runtime is gone and this process may not start another: restart the process."""


class ConvergenceError(ShmemError):
    """The root's ranks could no longer agree (a peer died or an exchange timed out): the runtime
    cannot be managed safely any more; restart the process."""


class PeerLostError(ShmemError):
    """A PE of the root died or left during an operation outside the lifecycle (a wait, a
    barrier, a collective); ``peer`` names it when known."""


class WaitTimeoutError(ShmemError):
    """A blocking wait reached its deadline (``HYPER_MULTICORE_SHMEM_TIMEOUT_SEC`` by default)."""


class StaleTensorError(ShmemError):
    """The tensor's allocation was freed, or released by ``restart`` or ``release``: it can no
    longer be used by any operation (its memory stays mapped, so reading it never crashes)."""


class InvalidArgumentError(HyperMulticoreError, ValueError):
    """The native runtime rejected an argument, or the ranks passed different arguments to a
    collective call (reported identically on every rank)."""


__all__ = [
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
