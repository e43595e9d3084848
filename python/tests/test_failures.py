"""Failures across processes: a PE killed during a restart or a barrier, and stage failures
injected by the library's test-only fault injection (``HYPER_MULTICORE_TEST_FAULT``; the
extension must be built with the cargo feature ``fault-injection``).

Each test starts its own 3-PE job under hmrun (``HMRUN``, else the workspace's
``target/debug/hmrun``) running ``job_child.py``, and reads what each surviving PE saw. These
tests run without a launcher (they are skipped on the ranks of a multi-rank session).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import LAUNCHED, TORCH
from hyper_multicore import _native

ROOT = Path(__file__).resolve().parents[2]
CHILD = Path(__file__).with_name("job_child.py")
DEADLINE = 10.0  # HYPER_MULTICORE_SHMEM_TIMEOUT_SEC of the jobs


def hmrun() -> str | None:
    candidates = [os.environ.get("HMRUN")]
    target = os.environ.get("CARGO_TARGET_DIR", str(ROOT / "target"))
    candidates += [str(Path(target) / "debug" / "hmrun"), str(Path(target) / "release" / "hmrun")]
    return next((c for c in candidates if c and os.access(c, os.X_OK)), None)


HMRUN = hmrun()
pytestmark = [
    pytest.mark.skipif(LAUNCHED, reason="starts its own jobs; run without a launcher"),
    pytest.mark.skipif(
        HMRUN is None, reason="hmrun not built (cargo build -p hmrun) nor in $HMRUN"
    ),
]
needs_faults = pytest.mark.skipif(
    not _native.FAULT_INJECTION, reason="the extension was built without fault-injection"
)
CHANNELS = ["world"] + (["torch"] if TORCH else [])


def run_job(tmp_path: Path, scenario: str, channel: str, fault: str | None = None) -> dict:
    env = dict(os.environ)
    env.pop("HYPER_MULTICORE_TEST_FAULT", None)
    if fault:
        env["HYPER_MULTICORE_TEST_FAULT"] = fault
    env["HYPER_MULTICORE_SHMEM_TIMEOUT_SEC"] = str(DEADLINE)
    env["HM_CHILD_DIST"] = "1" if channel == "torch" else "0"
    command = [
        HMRUN,
        "-n",
        "3",
        "--grace",
        "60",
        "--timeout",
        "120",
        "--",
        sys.executable,
        str(CHILD),
        scenario,
        str(tmp_path),
    ]
    job = subprocess.run(command, env=env, capture_output=True, text=True, timeout=180)
    reports = {}
    for path in tmp_path.glob("rank*.json"):
        report = json.loads(path.read_text())
        reports[report["rank"]] = report
    assert job.returncode != 124, f"the job hung:\n{job.stdout}\n{job.stderr}"
    return {"status": job.returncode, "reports": reports, "output": job.stdout + job.stderr}


@needs_faults
@pytest.mark.parametrize("channel", CHANNELS)
def test_a_rank_killed_during_restart_fails_the_survivors_in_time(tmp_path, channel):
    job = run_job(tmp_path, "restart", channel, fault="restart:Quiesce:1:abort")
    reports = job["reports"]
    assert sorted(reports) == [0, 2], job["output"]
    assert job["status"] == 128 + 9  # rank 1's SIGKILL
    for report in reports.values():
        assert report["channel"] == channel
        restart = report["restart"]
        assert restart["error"] == "ConvergenceError", restart
        assert restart["stage"] == "Quiesce" and restart["recovery"] == "convergence failure"
        assert restart["elapsed"] < DEADLINE, restart
        assert "restart failed during Quiesce" in restart["message"]
        assert restart["message"].endswith(
            "the runtime cannot be managed safely any more; restart the process"
        )
        assert restart["cause"] is not None
        # Invalidated: nothing works any more, and a new acquire says why.
        assert report["after"]["error"] == "ConvergenceError"
        assert report["acquire"]["error"] == "ConvergenceError"
        assert "restart the process" in report["acquire"]["message"]


@needs_faults
@pytest.mark.parametrize("channel", CHANNELS)
def test_an_injected_preflight_failure_is_retryable_on_every_rank(tmp_path, channel):
    job = run_job(tmp_path, "restart", channel, fault="restart:Preflight:1:retryable")
    reports = job["reports"]
    assert job["status"] == 0, job["output"]
    assert sorted(reports) == [0, 1, 2]
    messages = set()
    for report in reports.values():
        restart = report["restart"]
        assert restart["error"] == "RetryableError", restart
        assert "root_ranks=[1]" in restart["message"]
        assert restart["message"].endswith("the runtime remains usable")
        messages.add(restart["message"].replace(f"on rank {report['rank']}", ""))
        assert report["after"]["error"] is None
        assert report["retry"]["error"] is None
    assert len(messages) == 1, messages


@needs_faults
def test_a_failure_after_release_allocations_is_terminal(tmp_path):
    job = run_job(tmp_path, "restart", "world", fault="restart:ReleaseAllocations:1:retryable")
    reports = job["reports"]
    assert sorted(reports) == [0, 1, 2], job["output"]
    for report in reports.values():
        assert report["restart"]["error"] == "TerminalError", report
        assert report["restart"]["stage"] == "ReleaseAllocations"
        assert report["restart"]["message"].endswith("restart the process")
        assert report["after"]["error"] == "TerminalError"
        assert report["acquire"]["error"] == "TerminalError"


@pytest.mark.parametrize("channel", CHANNELS)
def test_a_dead_peer_ends_barriers_and_waits_with_peer_lost(tmp_path, channel):
    job = run_job(tmp_path, "peer_lost", channel)
    reports = job["reports"]
    assert sorted(reports) == [0, 2], job["output"]
    for report in reports.values():
        for step in ("barrier", "wait"):
            assert report[step]["error"] == "PeerLostError", report
            assert report[step]["elapsed"] < DEADLINE
        assert "rank 1" in report["barrier"]["message"]


@needs_faults
@pytest.mark.parametrize("channel", CHANNELS)
def test_after_a_failed_shutdown_nothing_is_held_and_nothing_starts(tmp_path, channel):
    """Issue 9, item 9: a failed Shutdown of the last release is terminal; the runtime is gone,
    so reference_count() is 0, and a new acquire is refused with the terminal hint."""
    job = run_job(tmp_path, "release", channel, fault="release:Shutdown:1:retryable")
    reports = job["reports"]
    assert sorted(reports) == [0, 1, 2], job["output"]
    for report in reports.values():
        assert report["release"]["error"] == "TerminalError", report
        assert report["release"]["stage"] == "Shutdown"
        assert report["references"] == 0, report
        assert report["acquire"]["error"] == "TerminalError", report
        assert report["acquire"]["message"].endswith("restart the process")
        assert report["references_after_acquire"] == 0
        assert report["stale"]["error"] == "StaleTensorError", report


@pytest.mark.skipif(not TORCH, reason="needs torch")
def test_a_destroyed_process_group_is_a_changed_torch_state(tmp_path):
    """Issue 9, item 4: acquire(pg), destroy_process_group(), then acquire() or release():
    "torch.distributed state changed" on every rank, before any communication; the release is
    refused in its Preflight, retryable. The runtime does not keep the destroyed ProcessGroup
    alive (its gloo threads would abort the process at interpreter exit)."""
    job = run_job(tmp_path, "destroyed_process_group", "torch")
    reports = job["reports"]
    assert sorted(reports) == [0, 1, 2], job["output"]
    for report in reports.values():
        acquire, release = report["acquire"], report["release"]
        assert acquire["error"] == "ShmemError", report
        assert "torch.distributed state changed" in acquire["message"]
        assert release["error"] == "RetryableError", report
        assert release["stage"] == "Preflight" and release["recovery"] == "retryable"
        assert "torch.distributed state changed" in release["message"]
        assert release["message"].endswith("the runtime remains usable")
        assert report["references"] == 1
        assert report["group_freed"], "the runtime kept the destroyed ProcessGroup alive"


GROWTH_KILLS = [
    ("world", stage) for stage in ("Agree", "PreserveData", "Initialize", "RestoreAllocations")
] + [(channel, "Agree") for channel in CHANNELS if channel != "world"]


@needs_faults
@pytest.mark.parametrize("channel, stage", GROWTH_KILLS)
def test_a_rank_killed_during_growth_fails_the_survivors_and_leaks_nothing(
    tmp_path, channel, stage
):
    job = run_job(tmp_path, "grow", channel, fault=f"grow:{stage}:1:abort")
    reports = job["reports"]
    assert sorted(reports) == [0, 2], job["output"]
    for report in reports.values():
        grow = report["grow"]
        assert grow["error"] == "ConvergenceError", grow
        assert grow["stage"] == stage, grow
        assert grow["message"].endswith("restart the process")
        # The root and its consumers say so; no heap is left mapped.
        assert report["after"]["error"] is not None
        assert "restart the process" in report["after"]["message"]
        assert report["state"].startswith("failed")
        assert report["heap_mappings"] == 0
        assert report["acquire"]["error"] == "ConvergenceError"


@needs_faults
def test_an_injected_failure_before_teardown_of_a_growth_keeps_the_data(tmp_path):
    job = run_job(tmp_path, "grow", "world", fault="grow:PreserveData:1:retryable")
    reports = job["reports"]
    assert sorted(reports) == [0, 1, 2], job["output"]
    for report in reports.values():
        assert report["grow"]["error"] == "RetryableError", report
        assert report["grow"]["stage"] == "PreserveData"
        assert report["kept"] is True
