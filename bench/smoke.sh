#!/usr/bin/env bash
# Smoke test of the benchmark harness (CI): runs `hm-bench control` in quick mode on 2 and 4 PEs,
# `hm-bench shmem` in quick mode on 2 PEs, `hm-bench programs` (issue 40's rows) in quick mode on
# 2 and 4 PEs and the same rows through the C API (`bench/oshmem/oshmem_bench.c --programs
# --quick` built with hmcc, under `hmrun -n 2` and `-n 4`), the restart timings
# (`examples/restart_timings` under `hmrun -n 2`), the C API's scaling program
# (`bench/oshmem/scaling.c`, quick), the bare
# UCX loops (`bench/ucx_floor/ucx_floor.c`, quick), the plain-socket loop beside them
# (`bench/ucx_floor/nested_epoll.c`, quick) and the
# 2-PE rows across two namespace hosts (where it runs as root), and checks that every output
# line is a JSON object with the required keys and that every expected row is there. It checks
# that the benchmarks work, never how fast they are. Needs neither OSHMEM nor matplotlib.
set -euo pipefail
cd "$(dirname "$0")/.."
control="$(mktemp)"
shmem="$(mktemp)"
restart="$(mktemp)"
programs="$(mktemp)"
c_programs="$(mktemp)"
trap 'rm -f "$control" "$shmem" "$restart" "$programs" "$c_programs"' EXIT
cargo run --quiet -p hm-bench -- control --quick --json --pes 2,4 >"$control"
cargo run --quiet -p hm-bench -- shmem --quick --json --pes 2 >"$shmem"
# Unpinned: these check that the rows work, and on a busy machine a PE pinned to a CPU waits for
# that CPU at every barrier (3× longer runs).
cargo run --quiet -p hm-bench -- programs --quick --no-pin --json --pes 2,4 >"$programs"
cargo build --quiet -p hmrun -p hyper-multicore --bins --example restart_timings
target/debug/hmrun -n 2 -- target/debug/examples/restart_timings | sed -n 's/^\[0\] {/{/p' >"$restart"
# The C API's scaling program: built with hmcc (the library next to it, from `cargo build`), its
# eight lines printed by PE 0.
cargo build --quiet -p hyper-multicore-shmem-c
scaling="$(mktemp -d)/scaling"
target/debug/hmcc -O2 -o "$scaling" bench/oshmem/scaling.c
lines="$(target/debug/hmrun -n 2 -- "$scaling" --quick | grep -c '^\[0\] ')"
rm -rf "$(dirname "$scaling")"
[ "$lines" -eq 8 ] || { echo "bench smoke (scaling.c): $lines lines from PE 0, expected 8" >&2; exit 1; }
echo "bench smoke OK (scaling.c): 8 lines"
# Issue 40's rows through the C API: oshmem_bench.c --programs --quick built with hmcc, PE 0's
# JSON lines (checked with the Rust API's below).
bench="$(mktemp -d)/oshmem_bench"
target/debug/hmcc -O2 -std=gnu11 -o "$bench" bench/oshmem/oshmem_bench.c
for n in 2 4; do
    timeout 300 target/debug/hmrun -n "$n" -- "$bench" --programs --quick --no-pin |
        sed -n 's/^\[0\] //p' >>"$c_programs"
done
rm -rf "$(dirname "$bench")"
# The bare UCX loops (bench/ucx_floor/ucx_floor.c): every row, in all three contexts, one JSON line
# each from PE 0.
floor="$(mktemp -d)/ucx_floor"
gcc -O2 -Wall -Werror -o "$floor" bench/ucx_floor/ucx_floor.c -lucp -lucs
lines=0
for row in signal put_word get fetch_add put_quiet put_1m get_1m all_to_all am_word am_quiet; do
    for context in oshmem wakeup ours; do
        out="$(UCX_TLS=tcp,self timeout 60 "$floor" "$row" --context "$context" --quick)"
        grep -q "^{\"op\":\"$row\",\"layer\":\"ucx-floor\",\"context\":\"$context\"" <<<"$out" &&
            lines=$((lines + 1))
    done
done
rm -rf "$(dirname "$floor")"
[ "$lines" -eq 30 ] || { echo "bench smoke (ucx_floor.c): $lines rows, expected 30" >&2; exit 1; }
echo "bench smoke OK (ucx_floor.c): 30 rows"
# The plain-socket loop beside them (bench/ucx_floor/nested_epoll.c): both forms, one JSON line each.
nested="$(mktemp -d)/nested_epoll"
gcc -O2 -Wall -Werror -o "$nested" bench/ucx_floor/nested_epoll.c
lines=0
for outer in off on; do
    out="$(timeout 60 "$nested" --outer "$outer" --quick)"
    grep -q "^{\"op\":\"tcp_round_trip\",\"layer\":\"nested-epoll\",\"outer\":\"$outer\"" <<<"$out" &&
        lines=$((lines + 1))
done
rm -rf "$(dirname "$nested")"
[ "$lines" -eq 2 ] || { echo "bench smoke (nested_epoll.c): $lines rows, expected 2" >&2; exit 1; }
echo "bench smoke OK (nested_epoll.c): 2 rows"
# The two-host form (bench/run_all.sh's step across two network namespaces): one PE per host,
# rank 0 printing rows; skipped, saying why, where the namespaces cannot be made (not root).
two_hosts="$(mktemp)"
pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    rm -f "$control" "$shmem" "$restart" "$programs" "$c_programs" "$two_hosts" "$two_hosts".{0,1}
    bench/namespace_hosts.sh down 2>/dev/null || true
}
trap cleanup EXIT
two_hosts_ran=skipped
if why=$(bench/namespace_hosts.sh up 2>&1); then
    secret=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
    for node in 1 0; do
        timeout 120 bench/namespace_hosts.sh exec "$node" \
            env HYPER_MULTICORE_SHMEM_SECRET="$secret" \
            target/debug/hmrun -n 1 --nnodes 2 --node-rank "$node" --master-addr 198.18.0.1 \
            -- target/debug/hm-bench pe-shmem --heap 67108864 --quick --no-pin --rows \
            --only latency,fetch-add >"$two_hosts.$node" &
        pids+=($!)
    done
    status=0
    for pid in "${pids[@]}"; do wait "$pid" || status=$?; done
    pids=()
    if [[ $status != 0 ]]; then
        echo "bench smoke (two hosts): the job failed ($status)" >&2
        tail -20 "$two_hosts".{0,1} >&2
        exit 1
    fi
    sed -n 's/^\[0\] //p' "$two_hosts.0" >"$two_hosts"
    bench/namespace_hosts.sh down
    two_hosts_ran=ran
else
    echo "bench smoke SKIPPED (two hosts): $why"
fi
python3 -c '
import json, sys

required = {"op", "bytes", "pes", "median_ns", "ref_ns"}

def check(path, family, expected, with_reference=(), extra_keys=()):
    seen = {}
    lines = open(path).read().splitlines()
    if not lines:
        sys.exit(f"hm-bench smoke ({family}): no output")
    for number, line in enumerate(lines, 1):
        try:
            row = json.loads(line)
        except ValueError as error:
            sys.exit(f"hm-bench smoke ({family}): line {number} is not JSON ({error}): {line!r}")
        if not isinstance(row, dict):
            sys.exit(f"hm-bench smoke ({family}): line {number} is not a JSON object: {line!r}")
        missing = (required | set(extra_keys)) - row.keys()
        if missing:
            sys.exit(f"hm-bench smoke ({family}): line {number} lacks {sorted(missing)}: {line!r}")
        if not (isinstance(row["median_ns"], (int, float)) and row["median_ns"] > 0):
            sys.exit(f"hm-bench smoke ({family}): line {number} has no positive median_ns: {line!r}")
        seen[(row["op"], row["pes"])] = row
    absent = expected - seen.keys()
    if absent:
        sys.exit(f"hm-bench smoke ({family}): no row for {sorted(absent)}")
    for key in with_reference:
        ref = seen[key]["ref_ns"]
        if not (isinstance(ref, (int, float)) and ref > 0):
            sys.exit(f"hm-bench smoke ({family}): {key} has no same-run reference: {seen[key]}")
    print(f"hm-bench smoke OK ({family}): {len(lines)} JSON lines with the required keys")

check(sys.argv[1], "control",
      {(op, pes) for op in ("rendezvous", "barrier", "allgather", "broadcast") for pes in (2, 4)})
shmem_ops = ("init", "init_call", "shutdown", "barrier", "put_quiet", "get", "put_bandwidth",
             "get_bandwidth", "pingpong_signal", "pingpong_put_signal", "fetch_add",
             "malloc_free", "all_to_all", "put_quiet_guarded", "get_guarded", "fetch_add_guarded",
             "put_quiet_guarded_call", "get_guarded_call", "fetch_add_guarded_call")
check(sys.argv[2], "shmem", {(op, 2) for op in shmem_ops},
      with_reference=[(op, 2) for op in ("barrier", "put_bandwidth", "get_bandwidth",
                                         "pingpong_signal", "all_to_all")],
      extra_keys=("layer", "min_ns", "max_ns", "ratio", "ref"))
check(sys.argv[3], "restart", {("restart", 2)}, extra_keys=("layer", "min_ns", "max_ns", "stages_ms"))
# The rows of issue 40 (`hm-bench programs --quick`, oshmem_bench.c --programs --quick with hmcc):
# every operation at every quick size — RMA and collectives up to 64 KiB — with its same-run
# reference, the point-to-point rows on 2 PEs, the collectives on 2 and 4.
QUICK_SIZES = (8, 4096, 65536)
RMA_SIZES = tuple(4 ** k for k in range(9))  # 1 B … 64 KiB
def programs_expected(rma_ops, collectives):
    rows = {(op, size, 2) for op in rma_ops[:4] for size in RMA_SIZES}
    rows |= {(op, size, 2) for op in rma_ops[4:6] for size in (8, 4096)}
    rows.add((rma_ops[6], 1 << 20, 2))
    rows |= {(op, size, pes) for op in collectives for size in QUICK_SIZES for pes in (2, 4)}
    return rows
def check_programs(path, family, layer, expected):
    rows = [json.loads(line) for line in open(path).read().splitlines()]
    check(path, family, {(op, pes) for op, _, pes in expected}, extra_keys=("layer", "ratio", "ref"))
    seen = {(r["op"], r["bytes"], r["pes"]): r for r in rows if r["layer"] == layer}
    absent = expected - seen.keys()
    if absent:
        sys.exit(f"hm-bench smoke ({family}): no row for {sorted(absent)}")
    unreferenced = [key for key in expected if not seen[key].get("ref_ns")]
    if unreferenced:
        sys.exit(f"hm-bench smoke ({family}): no same-run reference for {sorted(unreferenced)}")
rma_ops = ("put_private", "put_heap", "get_private", "get_heap", "put_rate_private",
           "put_rate_heap", "memcpy_waiting_peer")
check_programs(sys.argv[6], "programs", "shmem", programs_expected(rma_ops, (
    "broadcast", "all_gather", "all_to_all", "all_reduce_sum_f64", "all_reduce_sum_i64",
    "all_reduce_min_f64", "all_reduce_max_f64")))
collectives = ("broadcast64", "collect64", "fcollect64", "alltoall64", "alltoalls64",
               "double_sum_to_all", "long_sum_to_all", "double_min_to_all", "double_max_to_all")
teams = ("long_broadcast", "long_collect", "long_fcollect", "long_alltoall", "long_alltoalls",
         "double_sum_reduce", "long_sum_reduce", "double_min_reduce", "double_max_reduce")
check_programs(sys.argv[7], "C API programs", "oshmem",
               programs_expected(rma_ops, collectives + teams))
if sys.argv[5] == "ran":
    check(sys.argv[4], "two hosts", {(op, 2) for op in ("put_quiet", "get", "fetch_add")},
          extra_keys=("layer",))
    # Every pair between the two hosts is on the UCX route, unforced.
    layers = {json.loads(line)["layer"] for line in open(sys.argv[4]).read().splitlines()}
    if layers != {"shmem-ucx"}:
        sys.exit(f"hm-bench smoke (two hosts): rows of layers {sorted(layers)}, not shmem-ucx")
' "$control" "$shmem" "$restart" "$two_hosts" "$two_hosts_ran" "$programs" "$c_programs"
