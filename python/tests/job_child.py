"""One PE of a job that ``test_failures.py`` starts under hmrun (not collected by pytest).

``python job_child.py SCENARIO OUT_DIR``: runs SCENARIO and writes what this rank saw to
``OUT_DIR/rank<R>.json``. The PE that a scenario kills dies before writing. Survivors ignore
hmrun's SIGTERM (sent when a rank dies) so they can report how *they* failed; hmrun's
``--grace`` gives them the time.
"""

from __future__ import annotations

import datetime
import gc
import json
import os
import signal
import sys
import time
import weakref

from hyper_multicore import shmem

signal.signal(signal.SIGTERM, signal.SIG_IGN)
SCENARIO, OUT = sys.argv[1], sys.argv[2]
RANK = int(os.environ["RANK"])
report: dict = {"rank": RANK, "backend": shmem.backend()}

if os.environ.get("HM_CHILD_DIST") == "1":
    import torch.distributed as dist

    timeout = float(os.environ["HYPER_MULTICORE_SHMEM_TIMEOUT_SEC"])
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=timeout))
    report["channel"] = "torch"
else:
    report["channel"] = "world"


def outcome(call) -> dict:
    started = time.monotonic()
    try:
        call()
        return {"error": None, "elapsed": time.monotonic() - started}
    except Exception as error:  # noqa: BLE001 - the report says what it was
        cause = error.__cause__
        return {
            "error": type(error).__name__,
            "message": str(error),
            "stage": getattr(error, "stage", None),
            "recovery": getattr(error, "recovery", None),
            "peer": getattr(error, "peer", None),
            "cause": None if cause is None else type(cause).__name__,
            "elapsed": time.monotonic() - started,
        }


def replacements(tensors):
    return [shmem.AllocationReplacement(t, shmem.AllocationSpec.like(t)) for t in tensors]


def grow_scenario() -> None:
    """A shared root of three consumers grows while HYPER_MULTICORE_TEST_FAULT kills a rank
    (or fails a stage); then: is the root usable, and is any heap still mapped?"""
    root = shmem.SharedRoot()
    moe0 = root.reserve(shmem.ConsumerSpec("moe0", "moe-dispatch", 4 << 20, "dispatch"))
    moe1 = root.reserve(shmem.ConsumerSpec("moe1", "moe-dispatch", 4 << 20, "dispatch"))
    attn = root.reserve(shmem.ConsumerSpec("attn", "workspace", 2 << 20, "scratch"))
    root.activate()
    with attn.lease():
        workspace = attn.empty(1024, dtype="int64")
        workspace[:] = RANK
    with moe1.lease():
        moe1.empty(4096)
    lease = moe0.claim()
    buffer = moe0.growable(64, 1024, dtype="uint8")
    report["grow"] = outcome(lambda: buffer.ensure_capacity(4096))
    os.environ.pop("HYPER_MULTICORE_TEST_FAULT", None)
    report["after"] = outcome(lambda: moe0.empty(8))
    report["state"] = root.debug_state().get("phase")
    if report["grow"]["error"] == "RetryableError":
        lease.release()
        with attn.lease():
            report["kept"] = int(workspace.sum()) == RANK * 1024
    else:
        # The failed root retired every tensor: once this process drops its own, no heap may
        # stay mapped.
        del workspace, buffer
        gc.collect()
        with open("/proc/self/maps") as maps:
            report["heap_mappings"] = sum("hyper_multicore-heap" in line for line in maps)
    report["acquire"] = outcome(lambda: shmem.acquire(heap_size_bytes=8 << 20))


if SCENARIO == "grow":
    grow_scenario()
else:
    shmem.acquire(heap_size_bytes=8 << 20)
    tensors = [shmem.empty(64), shmem.empty(8, dtype="int64")]

if SCENARIO == "grow":
    pass
elif SCENARIO == "restart":
    # HYPER_MULTICORE_TEST_FAULT makes a stage fail or a rank die.
    report["restart"] = outcome(
        lambda: shmem.restart(heap_size_bytes=16 << 20, replacements=replacements(tensors))
    )
    os.environ.pop("HYPER_MULTICORE_TEST_FAULT", None)
    report["after"] = outcome(lambda: shmem.barrier())
    if report["restart"]["error"] == "RetryableError":
        # Retryable: the same restart works once the cause is gone.
        result = {}
        report["retry"] = outcome(
            lambda: result.update(
                r=shmem.restart(heap_size_bytes=16 << 20, replacements=replacements(tensors))
            )
        )
        for tensor in result["r"].tensors:
            shmem.free(tensor)
        shmem.release()
    else:
        report["acquire"] = outcome(lambda: shmem.acquire(heap_size_bytes=8 << 20))
elif SCENARIO == "peer_lost":
    shmem.barrier()
    if RANK == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    # Outside the lifecycle: a barrier and a wait that the dead PE can never complete.
    report["barrier"] = outcome(shmem.barrier)
    report["wait"] = outcome(lambda: shmem.wait_signal(tensors[1][0:1], 1))
elif SCENARIO == "destroyed_process_group":
    # acquire over torch.distributed, then destroy_process_group(): later lifecycle calls are
    # refused before any communication (the group is gone), on every rank.
    for tensor in tensors:
        shmem.free(tensor)
    group = weakref.ref(dist.group.WORLD)
    dist.destroy_process_group()
    gc.collect()
    # The runtime still holds its reference, but not the group: destroyed, it is gone.
    report["group_freed"] = group() is None
    report["acquire"] = outcome(lambda: shmem.acquire(heap_size_bytes=8 << 20))
    report["release"] = outcome(shmem.release)
    report["references"] = shmem.reference_count()
elif SCENARIO == "release":
    # HYPER_MULTICORE_TEST_FAULT makes a stage of the last release fail.
    for tensor in tensors:
        shmem.free(tensor)
    report["release"] = outcome(shmem.release)
    os.environ.pop("HYPER_MULTICORE_TEST_FAULT", None)
    report["references"] = shmem.reference_count()
    report["acquire"] = outcome(lambda: shmem.acquire(heap_size_bytes=8 << 20))
    report["references_after_acquire"] = shmem.reference_count()
    report["stale"] = outcome(lambda: shmem.put(tensors[0], tensors[0], 0))
else:  # pragma: no cover
    raise SystemExit(f"unknown scenario {SCENARIO}")

with open(os.path.join(OUT, f"rank{RANK}.json"), "w") as out:
    json.dump(report, out)

# torch's gloo process group must be destroyed before the interpreter finalises: left to exit,
# its worker threads can abort the process ("terminate called without an active exception",
# pytorch/pytorch#190489), which would fail the job for a reason that is not the runtime's.
if report["channel"] == "torch" and dist.is_initialized():
    dist.destroy_process_group()
