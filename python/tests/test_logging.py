"""The Python front installs the runtime's log subscriber at import: at ``debug`` every line
carries the PE's rank, and lifecycle stages and restarts are logged (issue 9, item 13)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import LAUNCHED, TIMEOUT

pytestmark = pytest.mark.skipif(LAUNCHED, reason="starts its own interpreter")

_CHILD = """
from hyper_multicore import shmem
shmem.acquire(heap_size_bytes=8 << 20)
tensor = shmem.empty(4)
result = shmem.restart(
    heap_size_bytes=16 << 20,
    replacements=[shmem.AllocationReplacement(tensor, shmem.AllocationSpec.like(tensor))],
)
for new in result.tensors:
    shmem.free(new)
shmem.release()
"""


def _run(level: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, HYPER_MULTICORE_SHMEM_LOG_LEVEL=level)
    return subprocess.run(
        [sys.executable, "-c", _CHILD],
        env=env,
        capture_output=True,
        text=True,
        timeout=4 * TIMEOUT,
    )


def test_debug_lines_carry_the_rank_and_the_lifecycle_stages() -> None:
    run = _run("debug")
    assert run.returncode == 0, run.stdout + run.stderr
    lines = [line for line in run.stderr.splitlines() if "DEBUG" in line]
    assert lines, run.stderr
    assert all(line.startswith("[pe 0] ") for line in lines), run.stderr
    assert any("restart: stage Preflight converged" in line for line in lines), run.stderr
    assert any("release: stage Shutdown converged" in line for line in lines), run.stderr


def test_the_default_level_prints_no_debug_lines() -> None:
    run = _run("warn")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "DEBUG" not in run.stderr


def test_a_bad_level_fails_the_import_naming_the_variable() -> None:
    run = _run("loud")
    assert run.returncode != 0
    assert "HYPER_MULTICORE_SHMEM_LOG_LEVEL" in run.stderr


_CONSUMER_CHILD = """
import gc
from hyper_multicore import shmem
root = shmem.SharedRoot()
moe = root.reserve(shmem.ConsumerSpec("moe0", "moe-dispatch", 2 << 20, "a"))
root.activate()
with moe.lease():
    kept = moe.empty(4)
    dropped = moe.empty(8)
    del dropped
    gc.collect()
    moe.free(kept)
    gc.collect()
# The dropped tensor's allocation stays live (the heap holds it): the process ends without
# closing the root.
"""


def test_a_consumer_tensor_logs_where_it_was_allocated_and_warns_when_dropped_live() -> None:
    run = subprocess.run(
        [sys.executable, "-c", _CONSUMER_CHILD],
        env=dict(os.environ, HYPER_MULTICORE_SHMEM_LOG_LEVEL="debug"),
        capture_output=True,
        text=True,
        timeout=4 * TIMEOUT,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    allocated = [line for line in run.stderr.splitlines() if "allocated at <string>:" in line]
    assert any("<string>:8" in line for line in allocated), run.stderr
    assert any("<string>:9" in line for line in allocated), run.stderr
    warnings = [line for line in run.stderr.splitlines() if "was dropped while" in line]
    # The dropped tensor warns, naming where it was allocated; the freed one does not.
    assert len(warnings) == 1 and "<string>:9" in warnings[0], run.stderr
    assert "WARN" in warnings[0]
