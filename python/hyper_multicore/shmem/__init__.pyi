"""Type stubs of :mod:`hyper_multicore.shmem` (see the module's docstrings for behaviour)."""

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal, TypeAlias

import numpy
import torch

from ._errors import ConvergenceError as ConvergenceError
from ._errors import HyperMulticoreError as HyperMulticoreError
from ._errors import InvalidArgumentError as InvalidArgumentError
from ._errors import PeerLostError as PeerLostError
from ._errors import RetryableError as RetryableError
from ._errors import ShmemError as ShmemError
from ._errors import StaleTensorError as StaleTensorError
from ._errors import TerminalError as TerminalError
from ._errors import WaitTimeoutError as WaitTimeoutError

#: A torch CPU tensor, or a NumPy array where torch is not installed.
Tensor: TypeAlias = torch.Tensor | numpy.ndarray
#: A torch dtype, a NumPy dtype-like, or a dtype name such as ``"bfloat16"``.
DTypeLike: TypeAlias = torch.dtype | numpy.dtype | type | str
#: A root group: a torch ProcessGroup, or world ranks without torch.distributed.
RootGroup: TypeAlias = torch.distributed.ProcessGroup | Sequence[int] | None

SignalOperation: TypeAlias = Literal["set", "add"]
Comparison: TypeAlias = Literal["eq", "ne", "gt", "ge", "lt", "le"]
ReduceOperation: TypeAlias = Literal["sum", "min", "max"]

STAGE_KEYS: Final[tuple[str, ...]]

def backend() -> Literal["torch", "numpy"]: ...

# lifecycle

def acquire(root_group: RootGroup = None, *, heap_size_bytes: int | None = None) -> None: ...
def release() -> None: ...
def reference_count() -> int: ...
def root_members(group: RootGroup = None) -> tuple[int, ...]: ...

@dataclass(frozen=True)
class AllocationSpec:
    shape: tuple[int, ...]
    dtype: str
    alignment_bytes: int | None = None
    def __init__(
        self, shape: Sequence[int], dtype: DTypeLike, alignment_bytes: int | None = None
    ) -> None: ...
    @classmethod
    def like(cls, tensor: Tensor, *, alignment_bytes: int | None = None) -> AllocationSpec: ...

@dataclass(frozen=True)
class AllocationReplacement:
    current: Tensor
    target: AllocationSpec

@dataclass(frozen=True)
class RestartResult:
    tensors: tuple[Tensor, ...]
    stages_ms: dict[str, float]

def restart(
    *,
    heap_size_bytes: int,
    replacements: Sequence[AllocationReplacement],
    preflight_hook: Callable[[], Any] | None = None,
) -> RestartResult: ...

# allocation

def empty(
    *size: int | Sequence[int], dtype: DTypeLike | None = None, alignment: int | None = None
) -> Tensor: ...
def free(tensor: Tensor) -> None: ...

# data plane

def put(remote_dst: Tensor, local_src: Tensor, target_pe: int) -> None: ...
def get(local_dst: Tensor, remote_src: Tensor, source_pe: int) -> None: ...
def put_signal(
    remote_dst: Tensor,
    local_src: Tensor,
    remote_signal: Tensor,
    value: int,
    target_pe: int,
    *,
    operation: SignalOperation = "set",
) -> None: ...
def signal(
    remote_signal: Tensor, value: int, target_pe: int, *, operation: SignalOperation = "set"
) -> None: ...
def wait_signal(
    signal: Tensor, value: int, *, comparison: Comparison = "eq", timeout: float | None = None
) -> int: ...
def quiet() -> None: ...
def fence() -> None: ...
def atomic_fetch(source: Tensor, pe: int) -> int: ...
def atomic_set(target: Tensor, value: int, pe: int) -> None: ...
def atomic_swap(target: Tensor, value: int, pe: int) -> int: ...
def atomic_compare_swap(target: Tensor, expected: int, desired: int, pe: int) -> int: ...
def atomic_fetch_add(target: Tensor, value: int, pe: int) -> int: ...
def atomic_add(target: Tensor, value: int, pe: int) -> None: ...

# collectives

def barrier() -> None: ...
def host_barrier() -> None: ...
def all_gather(output: Tensor, input: Tensor) -> None: ...
def broadcast(output: Tensor, input: Tensor | None, root: int) -> None: ...
def all_to_all(output: Tensor, input: Tensor) -> None: ...
def all_reduce(output: Tensor, input: Tensor, op: ReduceOperation = "sum") -> None: ...

# introspection

def my_pe() -> int: ...
def n_pes() -> int: ...
def debug_state() -> dict[str, Any]: ...
