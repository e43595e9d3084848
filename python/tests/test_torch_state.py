"""torch.distributed as the Python front sees it, in child interpreters of one process each
(initialising torch.distributed in the test session itself would change every later test):

- a runtime started without torch.distributed refuses a later acquire or release once it is
  initialised ("torch.distributed state changed"; issue 9, item 4);
- under torch.distributed, the control plane's secret comes from group rank 0 over the process
  group, not from public values (issue 9, item 12).

The multi-process sides: ``test_failures.py`` (a destroyed process group) and
``test_a_secret_is_shared_by_every_rank`` below, on every rank of an hmrun job.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap

import pytest
from conftest import DIST, LAUNCHED, TIMEOUT, TORCH, gather_text
from hyper_multicore import shmem

needs_one_process_with_torch = pytest.mark.skipif(
    LAUNCHED or not TORCH, reason="starts its own single-process interpreters; needs torch"
)

SECRET = "HYPER_MULTICORE_SHMEM_SECRET"

_STANDALONE_THEN_TORCH = """
import json, sys
import torch.distributed as dist
from hyper_multicore import shmem

def outcome(call):
    try:
        call()
        return {"error": None}
    except Exception as error:
        return {"error": type(error).__name__, "message": str(error),
                "stage": getattr(error, "stage", None)}

report = {}
shmem.acquire(heap_size_bytes=8 << 20)  # standalone: no launcher, no torch.distributed
dist.init_process_group("gloo", rank=0, world_size=1, init_method="file://" + sys.argv[1])
report["acquire"] = outcome(lambda: shmem.acquire(heap_size_bytes=8 << 20))
report["release"] = outcome(shmem.release)
report["references"] = shmem.reference_count()
dist.destroy_process_group()  # back to the state it started in: release works
report["release_after"] = outcome(shmem.release)
report["references_after"] = shmem.reference_count()
print(json.dumps(report))
"""

_SECRET_OF_A_JOB = """
import os, sys
import torch.distributed as dist
from hyper_multicore import shmem

dist.init_process_group("gloo", rank=0, world_size=1, init_method="file://" + sys.argv[1])
shmem.acquire(heap_size_bytes=8 << 20)
print(os.environ["HYPER_MULTICORE_SHMEM_SECRET"])
shmem.release()
dist.destroy_process_group()  # gloo's threads must not outlive the interpreter (SIGABRT at exit)
"""


def run_child(source: str, *args: str, env: dict | None = None) -> str:
    command = [sys.executable, "-c", textwrap.dedent(source), *args]
    environment = dict(os.environ, **(env or {}))
    environment.pop(SECRET, None)
    run = subprocess.run(
        command, capture_output=True, text=True, timeout=6 * TIMEOUT, env=environment
    )
    assert run.returncode == 0, run.stdout + run.stderr
    return run.stdout.strip().splitlines()[-1]


@needs_one_process_with_torch
def test_initialising_torch_distributed_after_a_standalone_start_is_a_changed_state(tmp_path):
    report = json.loads(run_child(_STANDALONE_THEN_TORCH, str(tmp_path / "store")))
    assert report["acquire"]["error"] == "ShmemError", report
    assert "torch.distributed state changed" in report["acquire"]["message"]
    release = report["release"]
    assert release["error"] == "RetryableError", report
    assert release["stage"] == "Preflight"
    assert "torch.distributed state changed" in release["message"]
    assert release["message"].endswith("the runtime remains usable")
    assert report["references"] == 1
    assert report["release_after"]["error"] is None, report
    assert report["references_after"] == 0


@needs_one_process_with_torch
def test_each_job_draws_its_own_secret(tmp_path):
    # The same public values (what torchrun's environment would show) for both jobs.
    public = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29999", "TORCHELASTIC_RUN_ID": "job"}
    first = run_child(_SECRET_OF_A_JOB, str(tmp_path / "first"), env=public)
    second = run_child(_SECRET_OF_A_JOB, str(tmp_path / "second"), env=public)
    for secret in (first, second):
        assert re.fullmatch(r"[0-9a-f]{32}", secret), secret
    assert first != second


@pytest.mark.skipif(not DIST, reason="needs torch.distributed over several ranks")
def test_a_secret_is_shared_by_every_rank(runtime):
    secret = os.environ.get(SECRET, "")
    assert re.fullmatch(r"[0-9a-f]{32}", secret), secret
    assert len(set(gather_text(secret))) == 1
    assert shmem.reference_count() == 1
