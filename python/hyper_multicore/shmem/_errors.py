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
whose allocation was freed, or released by ``restart``/``release``. Malformed arguments are
``TypeError``/``ValueError``; arguments the runtime rejects (a membership that does not match the
active root, a larger heap than the active one, a view passed to ``free``, a bad alignment, a
root group this process is not a member of, arguments that differ across ranks) are
:class:`InvalidArgumentError`, which is both a ``ValueError`` and -- as the original runtime
raised ``RuntimeError`` for them -- a ``RuntimeError`` (through :class:`ShmemError`).

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


class InvalidArgumentError(ShmemError, ValueError):
    """The runtime rejected an argument, or the ranks passed different arguments to a collective
    call (reported identically on every rank). Both a ``ValueError`` and a ``RuntimeError``
    (code written for the original runtime catches ``RuntimeError`` for these)."""


#: The hint that ends every lifecycle error of each recovery class (as the native runtime's).
HINTS = {
    "retryable": "the runtime remains usable",
    "terminal": "restart the process",
    "convergence failure": "the runtime cannot be managed safely any more; restart the process",
}


def native_style(
    cls: type[HyperMulticoreError],
    operation: str,
    kind: str,
    message: str,
    *,
    stage: str | None = None,
    recovery: str | None = None,
) -> HyperMulticoreError:
    """An exception found by the Python front, worded and attributed as the native runtime's:
    ``"<operation> failed[ during <stage>]: <kind>: <message>[; <hint>]"``."""
    where = f" during {stage}" if stage else ""
    hint = f"; {HINTS[recovery]}" if recovery else ""
    error = cls(f"{operation} failed{where}: {kind}: {message}{hint}")
    error.kind, error.operation, error.stage, error.recovery = kind, operation, stage, recovery
    return error


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
