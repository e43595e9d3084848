"""torch symmetric memory on CPU against gloo and the runtime's collectives, same run (issue 44).

``python python/bench/symm_mem.py [--trials N] [--pes 2 4]`` starts, for each PE count, a job
under ``hmrun`` with torch.distributed (gloo) initialised, where every PE times, trial after
trial and in turn (so that each side is sampled in the same seconds of this noisy VM):

- ``one_shot_all_reduce`` (``torch.ops.symm_mem.one_shot_all_reduce_out``, float32, 4 KiB and
  1 MiB) against gloo's ``all_reduce`` of a tensor of that size and against the runtime's
  ``all_reduce`` (``shmem.all_reduce``: the Rust collective, one native call);
- ``all_to_all_vdev`` with every PE sending each PE the same rows (4 KiB and 1 MiB per pair)
  against gloo's ``all_to_all_single`` and the runtime's ``all_to_all`` of the same bytes.

Each row also times the operator's native kernel called directly (``native``: the same call
the Python kernel makes, without torch's dispatcher and the argument checks), which splits the
operator's time into the kernel's and what reaching a Python kernel through ``torch.ops``
costs.

It prints one JSON line per row: the medians over trials of a batch's time per call, in µs, and
the ratios ``vs_gloo``, ``vs_rust`` (symm_mem / the other) and ``native_vs_rust``, each the
median of the per-trial ratios.

Environment: ``HMRUN`` (default ``target/release/hmrun``). The machine should be otherwise
idle; the load average is printed with the rows.
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
KIB, MIB = 1 << 10, 1 << 20
SIZES = (4 * KIB, MIB)


def batch_us(call, calls: int) -> float:
    """The time per call of ``calls`` calls, in µs (every PE makes the same calls)."""
    start = time.perf_counter_ns()
    for _ in range(calls):
        call()
    return (time.perf_counter_ns() - start) / calls / 1000


def worker(out: str, trials: int) -> None:
    """One PE: every row, rank 0 writing the results."""
    import hyper_multicore.symm_mem as symm_mem
    import torch
    import torch.distributed as dist
    from hyper_multicore import _native, shmem
    from hyper_multicore.symm_mem import _ops

    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    pes, me = dist.get_world_size(), dist.get_rank()
    rows = []

    def compare(op: str, nbytes: int, calls: int, variants: dict) -> None:
        samples = {name: [] for name in variants}
        for _ in range(trials):
            for name, call in variants.items():
                dist.barrier()
                samples[name].append(batch_us(call, calls))
        median = {name: statistics.median(times) for name, times in samples.items()}
        ratio = {
            name: statistics.median(a / b for a, b in zip(samples["symm_mem"], times))
            for name, times in samples.items()
        }
        native = statistics.median(a / b for a, b in zip(samples["native"], samples["rust"]))
        rows.append(
            {
                "op": op,
                "bytes": nbytes,
                "pes": pes,
                "symm_mem_us": round(median["symm_mem"], 2),
                "gloo_us": round(median["gloo"], 2),
                "rust_us": round(median["rust"], 2),
                "native_us": round(median["native"], 2),
                "vs_gloo": round(ratio["gloo"], 3),
                "vs_rust": round(ratio["rust"], 3),
                "native_vs_rust": round(native, 3),
            }
        )

    def reduce_row(nbytes: int) -> None:
        n = nbytes // 4
        symmetric = symm_mem.empty(n).fill_(me)
        out = torch.empty(n)
        private = torch.full((n,), float(me))
        source, target = shmem.empty(n).fill_(me), shmem.empty(n)
        handle = symm_mem.rendezvous(symmetric, "0")
        kernel = (_ops._place(handle, symmetric), "float32", _ops._members(handle))
        compare(
            "one_shot_all_reduce",
            nbytes,
            200 if nbytes < MIB else 20,
            {
                "symm_mem": lambda: torch.ops.symm_mem.one_shot_all_reduce_out(
                    symmetric, "sum", "0", out
                ),
                "gloo": lambda: dist.all_reduce(private),
                "rust": lambda: shmem.all_reduce(target, source),
                "native": lambda: _native.symm_one_shot(*kernel, _ops._private(out)),
            },
        )
        shmem.free(target)
        shmem.free(source)

    def all_to_all_row(nbytes: int) -> None:
        width = 64  # float32 elements per row
        rows_per_pair = nbytes // (4 * width)
        send = symm_mem.empty(pes * rows_per_pair, width).fill_(me)
        receive = symm_mem.empty(pes * rows_per_pair, width)
        splits = symm_mem.empty(pes, dtype=torch.int64).fill_(rows_per_pair)
        splits_offsets = symm_mem.empty(2, pes, dtype=torch.int64)
        private_in = torch.full((pes * rows_per_pair, width), float(me))
        private_out = torch.empty_like(private_in)
        target = shmem.empty(pes * rows_per_pair, width)
        tensors = (send, receive, splits, splits_offsets)
        handle = symm_mem.rendezvous(send, "0")
        places = [_ops._place(symm_mem.rendezvous(t, "0"), t) for t in tensors]
        kernel = ("flat", 1, places, width * 4, _ops._members(handle))
        compare(
            "all_to_all_vdev",
            nbytes,
            200 if nbytes < MIB else 20,
            {
                "symm_mem": lambda: torch.ops.symm_mem.all_to_all_vdev(
                    send, receive, splits, splits_offsets, "0"
                ),
                "gloo": lambda: dist.all_to_all_single(private_out, private_in),
                "rust": lambda: shmem.all_to_all(target, private_in),
                "native": lambda: _native.symm_all_to_all(*kernel),
            },
        )
        assert receive[:, 0].tolist() == [r for r in range(pes) for _ in range(rows_per_pair)]
        shmem.free(target)

    for nbytes in SIZES:
        reduce_row(nbytes)
    for nbytes in SIZES:
        all_to_all_row(nbytes)
    if me == 0:
        with open(out, "w") as file:
            json.dump(rows, file)
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    """The driver (or, with ``--worker``, one PE of the job it starts)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=11)
    parser.add_argument("--pes", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.trials)
        return
    hmrun = os.environ.get("HMRUN", os.path.join(ROOT, "target", "release", "hmrun"))
    load_before = os.getloadavg()
    results = []
    for pes in args.pes:
        with tempfile.TemporaryDirectory() as scratch:
            out = os.path.join(scratch, "symm_mem.json")
            env = dict(os.environ, OMP_NUM_THREADS="1")
            subprocess.run(
                [hmrun, "-n", str(pes), "--", sys.executable, __file__, "--worker", out,
                 "--trials", str(args.trials)],
                check=True,
                env=env,
            )  # fmt: skip
            with open(out) as file:
                results.extend(json.load(file))
    print(json.dumps({"load_average": [load_before, os.getloadavg()], "trials": args.trials}))
    for row in results:
        print(json.dumps(row))


if __name__ == "__main__":
    main()
