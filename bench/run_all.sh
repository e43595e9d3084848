#!/usr/bin/env bash
# Runs every benchmark in a release build — `hm-bench shmem` (2, 4, 8, 16, 32 PEs), Open MPI
# OSHMEM's run of the same patterns (if `oshcc`/`oshrun` are installed), `hm-bench control` —
# into bench/results/, then regenerates docs/benchmarks.md and docs/benchmarks/*.png with
# bench/report.py. Takes a few minutes. The machine should be otherwise idle: every figure is
# compared with a reference from the same run, but a busy neighbour still skews both; the
# load average before and after is recorded in the document.
#
#   bench/run_all.sh                       # everything
#   HM_BENCH_PES=2,4 HM_BENCH_CONTROL=0 bench/run_all.sh   # a shorter run
#
# Environment: CARGO_TARGET_DIR (default target), HM_BENCH_PES (default 2,4,8,16,32),
# OSHMEM_BARRIER_PES (PE counts besides 2 for OSHMEM's barrier, default "4 8 16 32"),
# HM_BENCH_CONTROL=0 to skip the control plane, OSHMEM=0 to skip OSHMEM, HM_BENCH_QUICK=1 for
# the smoke-test method everywhere (to check the plumbing; its figures mean nothing).
set -euo pipefail
cd "$(dirname "$0")/.."
target="${CARGO_TARGET_DIR:-target}"
results=bench/results
pes="${HM_BENCH_PES:-2,4,8,16,32}"
oshmem_barrier_pes="${OSHMEM_BARRIER_PES:-4 8 16 32}"
launches=5
quick=()
if [[ "${HM_BENCH_QUICK:-0}" != 0 ]]; then
    quick=(--quick)
    launches=3
fi
mkdir -p "$results"
rm -f "$results"/{shmem,oshmem,control}.jsonl "$results"/{machine,commands,oshmem}.txt
touch "$results/commands.txt"

# run OUTPUT COMMAND…: records the command, runs it, appends its stdout to OUTPUT.
run() {
    local output="$1"
    shift
    printf '%s >>%s\n' "$*" "$output" >>"$results/commands.txt"
    "$@" >>"$output"
}

describe_machine() {
    echo "date: $(date -u +%FT%TZ)"
    echo "git commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
    echo "uncommitted changes: $(git status --porcelain 2>/dev/null | awk '{print $2}' | tr '\n' ' ')"
    lscpu | grep -E '^(Model name|CPU\(s\)|Thread\(s\) per core|Core\(s\) per socket|Socket\(s\)|L1d cache|L2 cache|L3 cache|Hypervisor vendor):' || true
    echo "kernel: $(uname -sr)"
    grep MemTotal /proc/meminfo
    echo "THP: $(cat /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null || echo ?); shmem THP: $(cat /sys/kernel/mm/transparent_hugepage/shmem_enabled 2>/dev/null || echo ?)"
    echo "rustc: $(rustc -V)"
    if command -v ompi_info >/dev/null; then
        echo "Open MPI: $(ompi_info --version 2>/dev/null | head -1)"
    fi
    echo "load average before: $(cat /proc/loadavg)"
}
describe_machine >"$results/machine.txt"

printf 'cargo build --release -p hm-bench\n' >>"$results/commands.txt"
cargo build --release -p hm-bench
hm_bench="$target/release/hm-bench"

run "$results/shmem.jsonl" "$hm_bench" shmem --json --pes "$pes" "${quick[@]}"

if [[ "${OSHMEM:-1}" != 0 ]] && command -v oshcc >/dev/null && command -v oshrun >/dev/null; then
    notes="$results/oshmem.txt"
    oshmem_bench="$target/oshmem_bench"
    printf 'oshcc -O2 -std=gnu11 -o %s bench/oshmem/oshmem_bench.c\n' "$oshmem_bench" >>"$results/commands.txt"
    oshcc -O2 -std=gnu11 -o "$oshmem_bench" bench/oshmem/oshmem_bench.c
    oshrun=(timeout 300 oshrun --allow-run-as-root --oversubscribe --mca osc ucx)
    # oshmem RUN…: one oshrun; a failure is noted and the run goes on.
    oshmem() {
        local status=0
        printf '%s %s >>%s\n' "${oshrun[*]}" "$*" "$results/oshmem.jsonl" >>"$results/commands.txt"
        "${oshrun[@]}" "$@" >>"$results/oshmem.jsonl" 2>>"$notes.stderr" || status=$?
        if [[ $status != 0 ]]; then
            echo "FAILED (exit $status): oshrun $*" >>"$notes"
        fi
    }
    for ((launch = 0; launch < launches; launch++)); do
        # The start time is taken just before oshrun starts (printed as "$(date +%s%N)").
        start="$(date +%s%N)"
        printf '%s -np 2 %s --init-only --job-start "$(date +%%s%%N)" %s>>%s\n' "${oshrun[*]}" \
            "$oshmem_bench" "${quick[*]}${quick[*]:+ }" "$results/oshmem.jsonl" >>"$results/commands.txt"
        "${oshrun[@]}" -np 2 "$oshmem_bench" --init-only --job-start "$start" "${quick[@]}" \
            >>"$results/oshmem.jsonl" 2>>"$notes.stderr" ||
            echo "FAILED (exit $?): oshrun -np 2 --init-only" >>"$notes"
    done
    oshmem -np 2 "$oshmem_bench" "${quick[@]}"
    for n in $oshmem_barrier_pes; do
        oshmem -np "$n" "$oshmem_bench" "${quick[@]}"
    done
    {
        echo "Open MPI OSHMEM: $(ompi_info --version 2>/dev/null | head -1)"
        echo "launcher: ${oshrun[*]}"
        echo "start-up launches at 2 PEs: $launches; full pattern set at 2 PEs; barrier only at: $oshmem_barrier_pes"
        if [[ -s "$notes.stderr" ]]; then
            echo "stderr of the OSHMEM runs (last 20 lines):"
            tail -20 "$notes.stderr"
        else
            echo "the OSHMEM runs wrote nothing to stderr"
        fi
    } >>"$notes"
    rm -f "$notes.stderr"
else
    echo "OSHMEM not run (OSHMEM=0, or oshcc/oshrun not installed)" >"$results/oshmem.txt"
fi

if [[ "${HM_BENCH_CONTROL:-1}" != 0 ]]; then
    run "$results/control.jsonl" "$hm_bench" control --json --pes "$pes" "${quick[@]}"
fi

echo "load average after: $(cat /proc/loadavg)" >>"$results/machine.txt"
printf 'python3 bench/report.py\n' >>"$results/commands.txt"
python3 bench/report.py
