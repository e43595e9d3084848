"""Shared fixtures of the Python test suite.

The suite runs in three shapes (``scripts/test_python.sh`` runs them all):

- one process, no launcher: a standalone root of one PE, plus the tests that start their own
  jobs under ``hmrun`` (peer loss, fault injection);
- every rank of an ``hmrun -n N`` (or ``torchrun``) job runs the same pytest session: tests are
  rank-aware, make the same collective calls in the same order on every rank, and every wait is
  bounded (``HYPER_MULTICORE_SHMEM_TIMEOUT_SEC``, small by default here);
- NumPy only: the same, with torch hidden (``python/tests/numpy_only`` on ``PYTHONPATH``).

With torch installed and a multi-rank launcher, the session initialises ``torch.distributed``
(gloo), so root groups are ProcessGroups; without torch they are the launcher's world and lists
of world ranks.
"""

from __future__ import annotations

import datetime
import os
import re

import pytest

# Bounded waits everywhere, before the runtime reads its configuration.
os.environ.setdefault("HYPER_MULTICORE_SHMEM_TIMEOUT_SEC", "20")

from hyper_multicore import shmem  # noqa: E402

try:
    import torch
except ImportError:
    torch = None  # type: ignore[assignment]

import numpy as np  # noqa: E402

#: This process's world rank and the world size (1 without a launcher).
RANK = int(os.environ.get("RANK", os.environ.get("HYPER_MULTICORE_RANK", "0")))
WORLD = int(os.environ.get("WORLD_SIZE", os.environ.get("HYPER_MULTICORE_WORLD_SIZE", "1")))
LAUNCHED = "RANK" in os.environ or "HYPER_MULTICORE_RANK" in os.environ
HEAP = 16 << 20
TIMEOUT = float(os.environ["HYPER_MULTICORE_SHMEM_TIMEOUT_SEC"])

TORCH = torch is not None
DIST = TORCH and LAUNCHED and WORLD > 1 and os.environ.get("HM_TEST_TORCH_DIST", "1") == "1"

if TORCH and LAUNCHED:
    torch.set_num_threads(1)  # several PEs share few cores

if DIST:
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=TIMEOUT))


def pytest_sessionfinish(session, exitstatus) -> None:
    """Destroys the gloo process group before the interpreter finalises: left to exit, its
    worker threads can abort the process (pytorch/pytorch#190489)."""
    if DIST and dist.is_initialized():
        dist.destroy_process_group()


multi_rank = pytest.mark.skipif(WORLD < 2, reason="needs a launcher with at least 2 ranks")
single_process = pytest.mark.skipif(LAUNCHED, reason="runs without a launcher only")
needs_torch = pytest.mark.skipif(not TORCH, reason="needs torch")


class Backend:
    """Local tensors of the suite's backend (torch, or NumPy when torch is hidden)."""

    name = shmem.backend()

    @staticmethod
    def dtype(name: str):
        return getattr(torch, name) if TORCH else np.dtype(name)

    @staticmethod
    def arange(n: int, dtype: str = "float32", start: int = 0):
        if TORCH:
            return torch.arange(start, start + n).to(getattr(torch, dtype))
        return np.arange(start, start + n).astype(dtype)

    @staticmethod
    def full(shape, value, dtype: str = "float32"):
        if TORCH:
            return torch.full(
                shape if isinstance(shape, tuple) else (shape,), value, dtype=getattr(torch, dtype)
            )
        return np.full(shape, value, dtype=dtype)

    @staticmethod
    def zeros(shape, dtype: str = "float32"):
        if TORCH:
            return torch.zeros(shape, dtype=getattr(torch, dtype))
        return np.zeros(shape, dtype=dtype)

    @staticmethod
    def tolist(x):
        return x.tolist()

    @staticmethod
    def fill(x, value):
        if TORCH:
            x.fill_(value)
        else:
            x.fill(value)

    @staticmethod
    def dtype_name(x) -> str:
        return str(x.dtype).removeprefix("torch.") if TORCH else x.dtype.name

    @staticmethod
    def data_ptr(x) -> int:
        return x.data_ptr() if TORCH else x.__array_interface__["data"][0]


B = Backend()


@pytest.fixture
def xp() -> Backend:
    return B


@pytest.fixture
def runtime():
    """An acquired runtime over the whole world for one test; released afterwards (after
    freeing what the test left, so a failed test does not poison the next one)."""
    shmem.acquire(heap_size_bytes=HEAP)
    yield shmem
    cleanup()


def cleanup() -> None:
    """Frees every live allocation and releases every reference (a collective call)."""
    from hyper_multicore.shmem._registry import _live  # the suite's backdoor for cleanup only

    try:
        for allocation in sorted(_live.values(), key=lambda a: a.index):
            if allocation.tensor is not None:
                shmem.free(allocation.tensor)
        while shmem.reference_count() > 0:
            shmem.release()
    except shmem.HyperMulticoreError as error:  # pragma: no cover - reported, not hidden
        pytest.fail(f"cleanup failed: {error}")


def normalized(message: str) -> str:
    """An error message without the raising rank, so ranks can compare diagnoses."""
    return re.sub(r" on rank \d+", "", message)


def gather_text(text: str, size: int = 1024) -> list[str]:
    """Every root rank's ``text``, in root-rank order, gathered over the symmetric heap."""
    local = _bytes(text.encode()[:size], size)
    out = shmem.empty(shmem.n_pes(), size, dtype="uint8")
    try:
        shmem.all_gather(out, local)
        return [bytes(bytearray(row)).rstrip(b"\0").decode() for row in B.tolist(out)]
    finally:
        shmem.free(out)


def _bytes(data: bytes, size: int):
    padded = data + b"\0" * (size - len(data))
    if TORCH:
        return torch.frombuffer(bytearray(padded), dtype=torch.uint8)
    return np.frombuffer(padded, dtype=np.uint8)
