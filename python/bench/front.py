"""The Python front's speed against the Rust API, measured in the same run (issue 13).

``python python/bench/front.py [--trials N] [--rounds R]`` runs ``hm-bench shmem --pes 2 --json``
(the Rust API's figures), then itself on 2 PEs under ``hmrun`` with torch CPU tensors, ``R``
times in turn (3 by default: this VM changes speed from minute to minute, so each side is
sampled in the same minutes), and prints one JSON line per row: the Python figure (the median
of the rounds' medians over trials of a batch's time per call, and the least time seen), the
matching Rust row's median of medians, and the median of the rounds' Python / Rust ratios.
Rows: ``put``/``get`` of 8 B and 1 MiB (put with ``quiet``, as the Rust ``put_quiet``),
``signal``, the ``put_signal``/``wait_signal`` round trip, ``barrier``, ``all_to_all`` of 1 MiB
per pair, and ``empty`` and ``free``: each alone (a batch of ``empty`` calls, then a batch freeing
what they made) and as a pair.

Environment: ``HMRUN`` and ``HM_BENCH`` (default ``target/release/{hmrun,hm-bench}``, built with
``cargo build --release -p hmrun -p hm-bench``). The machine should be otherwise idle; the load
average is printed with the rows.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MIB = 1 << 20
#: Python row -> (Rust op, bytes) of ``hm-bench shmem``'s JSON rows (None: no Rust row).
RUST_ROWS = {
    "put_quiet 8": ("put_quiet", 8),
    "get 8": ("get", 8),
    "put_quiet 1048576": ("put_bandwidth", MIB),
    "get 1048576": ("get_bandwidth", MIB),
    "signal 8": None,
    "round_trip 8": ("pingpong_put_signal", 8),
    "barrier 0": ("barrier", 0),
    "all_to_all 1048576": ("all_to_all", MIB),
    "empty_free 8": ("malloc_free", None),
    "empty 8": None,
    "free 8": None,
}


#: The ``hm-bench shmem --only`` groups holding those rows.
RUST_GROUPS = "latency,bandwidth,pingpong,barrier,malloc-free,all-to-all"


#: The shortest batch, as in ``hm-bench``: a short batch would mostly time the peer's spinning
#: (a PE waiting in a barrier spins for tens of microseconds before it sleeps) and clock reads.
MIN_BATCH_NS = 20_000_000


def calibrated(call) -> int:
    """Calls per batch so that one batch takes at least :data:`MIN_BATCH_NS` (for rows only
    one PE runs)."""
    calls = 1
    while True:
        start = time.perf_counter_ns()
        for _ in range(calls):
            call()
        if time.perf_counter_ns() - start >= MIN_BATCH_NS:
            return calls
        calls *= 2


def timed(call, calls: int, trials: int) -> tuple[float, float]:
    """(min, median) over ``trials`` of the time per call of a batch of ``calls``, in ns."""
    per_call = []
    for _ in range(trials):
        start = time.perf_counter_ns()
        for _ in range(calls):
            call()
        per_call.append((time.perf_counter_ns() - start) / calls)
    return min(per_call), statistics.median(per_call)


def timed_apart(make, undo, calls: int, trials: int) -> tuple[tuple[float, float], ...]:
    """(min, median) over ``trials`` of the time per call of a batch of ``calls`` of ``make``,
    and of the batch of ``undo`` calls that then undoes each result, in ns: two calls timed
    apart (e.g. ``empty`` and ``free``). The results die in the second batch (a tensor's end
    is counted with ``free``)."""
    made_ns, undone_ns = [], []
    for _ in range(trials):
        start = time.perf_counter_ns()
        results = [make() for _ in range(calls)]
        middle = time.perf_counter_ns()
        for result in results:
            undo(result)
        del result, results
        made_ns.append((middle - start) / calls)
        undone_ns.append((time.perf_counter_ns() - middle) / calls)
    made = (min(made_ns), statistics.median(made_ns))
    return made, (min(undone_ns), statistics.median(undone_ns))


def worker(out: str, trials: int) -> None:
    """One PE: every row, rank 0 writing the results."""
    import torch
    from hyper_multicore import shmem

    shmem.acquire(heap_size_bytes=64 * MIB)
    me = shmem.my_pe()
    peer = 1 - me
    rows = {}

    def one_sided(name: str, nbytes: int, call) -> None:
        shmem.barrier()
        if me == 0:
            rows[f"{name} {nbytes}"] = timed(call, calibrated(call), trials)
        shmem.barrier()

    # The collective rows run a fixed count on both PEs, sized for batches of about 20 ms here.
    for nbytes in (8, MIB):
        remote = shmem.empty(nbytes, dtype=torch.uint8)
        local = torch.zeros(nbytes, dtype=torch.uint8)

        def put_quiet(remote=remote, local=local) -> None:
            shmem.put(remote, local, peer)
            shmem.quiet()

        one_sided("put_quiet", nbytes, put_quiet)

        def get(remote=remote, local=local) -> None:
            shmem.get(local, remote, peer)

        one_sided("get", nbytes, get)
        shmem.free(remote)
    word = shmem.empty(1, dtype=torch.int64)
    word.zero_()
    shmem.barrier()
    one_sided("signal", 8, lambda: shmem.signal(word, 0, peer, operation="add"))

    data, flag = shmem.empty(8, dtype=torch.uint8), shmem.empty(1, dtype=torch.uint64)
    flag.zero_()
    payload = torch.zeros(8, dtype=torch.uint8)
    shmem.barrier()
    count = [0]

    def round_trip() -> None:
        count[0] += 1
        if me == 0:
            shmem.put_signal(data, payload, flag, count[0], peer)
            shmem.wait_signal(flag, count[0])
        else:
            shmem.wait_signal(flag, count[0])
            shmem.put_signal(data, payload, flag, count[0], peer)

    rows["round_trip 8"] = timed(round_trip, 4000, trials)
    shmem.barrier()
    rows["barrier 0"] = timed(shmem.barrier, 40000, trials)
    output = shmem.empty(2 * MIB, dtype=torch.uint8)
    source = torch.zeros(2 * MIB, dtype=torch.uint8)
    rows["all_to_all 1048576"] = timed(lambda: shmem.all_to_all(output, source), 200, trials)
    rows["empty_free 8"] = timed(lambda: shmem.free(shmem.empty(8, dtype=torch.uint8)), 200, trials)
    rows["empty 8"], rows["free 8"] = timed_apart(
        lambda: shmem.empty(8, dtype=torch.uint8), shmem.free, 200, trials
    )
    for tensor in (output, flag, data, word):
        shmem.free(tensor)
    shmem.release()
    if me == 0:
        with open(out, "w") as file:
            json.dump(rows, file)


def rust_rows(hm_bench: str) -> dict[tuple[str, int | None], float]:
    """``hm-bench shmem --pes 2 --json``'s medians of :data:`RUST_GROUPS` (ns), by (op, bytes)."""
    lines = subprocess.run(
        [hm_bench, "shmem", "--pes", "2", "--json", "--only", RUST_GROUPS],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.splitlines()
    rows = {}
    for line in lines:
        row = json.loads(line)
        if row["layer"] == "shmem" and row["pes"] == 2:
            rows[(row["op"], row["bytes"])] = row["median_ns"]
            rows.setdefault((row["op"], None), row["median_ns"])
    return rows


def main() -> None:
    """The driver (or, with ``--worker``, one PE of the job it starts)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=15)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.trials)
        return
    release = os.path.join(ROOT, "target", "release")
    hmrun = os.environ.get("HMRUN", os.path.join(release, "hmrun"))
    hm_bench = os.environ.get("HM_BENCH", os.path.join(release, "hm-bench"))
    load_before = os.getloadavg()
    rounds = []
    for _ in range(args.rounds):
        rust = rust_rows(hm_bench)
        with tempfile.TemporaryDirectory() as scratch:
            out = os.path.join(scratch, "front.json")
            env = dict(os.environ, OMP_NUM_THREADS="1")
            subprocess.run(
                [hmrun, "-n", "2", "--", sys.executable, __file__, "--worker", out,
                 "--trials", str(args.trials)],
                check=True,
                env=env,
            )  # fmt: skip
            with open(out) as file:
                rounds.append((rust, json.load(file)))
    print(json.dumps({"load_average": [load_before, os.getloadavg()], "rounds": args.rounds}))
    for name in rounds[0][1]:
        match = RUST_ROWS[name]
        medians = [python[name][1] for _, python in rounds]
        rust_ns = [] if match is None else [rust[match] for rust, _ in rounds if match in rust]
        ratios = [
            python[name][1] / rust[match]
            for rust, python in rounds
            if match is not None and rust.get(match)
        ]
        print(
            json.dumps(
                {
                    "row": name,
                    "python_min_ns": round(min(python[name][0] for _, python in rounds), 1),
                    "python_median_ns": round(statistics.median(medians), 1),
                    "rust_op": None if match is None else match[0],
                    "rust_median_ns": statistics.median(rust_ns) if rust_ns else None,
                    "ratio": round(statistics.median(ratios), 3) if ratios else None,
                }
            )
        )


if __name__ == "__main__":
    main()
