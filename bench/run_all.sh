#!/usr/bin/env bash
# Runs every benchmark in a release build — `hm-bench shmem` (2, 4, 8, 16, 32 PEs) and the
# managed restart's timings (`examples/restart_timings`, 2 PEs), Open MPI
# OSHMEM's run of the same patterns (if `oshcc`/`oshrun` are installed), the same patterns'
# source built with `hmcc` against our OpenSHMEM C API (2 PEs), issue 40's rows of how real
# programs call us (`hm-bench programs`, `oshmem_bench --programs` built with oshcc and with hmcc;
# 2, 4, 8 PEs), the UCX route (ours with
# `--transport ucx` next to OSHMEM's `spml ucx`, both over UCX_TLS=tcp,self, on loopback and
# across two namespace hosts), `hm-bench control`, the Python front next to the Rust API and the
# MoE example next to torch.distributed gloo — into bench/results/, then regenerates docs/benchmarks.md and docs/benchmarks/*.png with
# bench/report.py. Takes a few minutes. The machine should be otherwise idle: every figure is
# compared with a reference from the same run, but a busy neighbour still skews both; the
# load average before and after is recorded in the document.
#
#   bench/run_all.sh                       # everything
#   HM_BENCH_PES=2,4 HM_BENCH_CONTROL=0 bench/run_all.sh   # a shorter run
#   HM_BENCH_SHMEM=0 OSHMEM=0 HM_BENCH_CONTROL=0 HM_BENCH_C_API=0 bench/run_all.sh   # only UCX
#
# Environment: CARGO_TARGET_DIR (default target), HM_BENCH_PES (default 2,4,8,16,32),
# OSHMEM_BARRIER_PES (PE counts besides 2 for OSHMEM's barrier, default "4 8 16 32"),
# HM_BENCH_SHMEM=0 to skip our shared-memory run, OSHMEM=0 to skip OSHMEM's shared-memory run,
# HM_BENCH_C_API=0 to skip the C API's run, HM_BENCH_ROUNDS (default 3) for the alternated rounds
# of the 2-PE runs (ours, OSHMEM, the C API),
# HM_BENCH_UCX=0 to skip the UCX route, HM_BENCH_UCX_ROUNDS (default 3) for its alternated
# rounds of ours and OSHMEM (also those of the two namespace hosts), HM_BENCH_TWO_HOSTS=0 to skip
# the UCX route across two namespace hosts (it needs root), HM_BENCH_CONTROL=0 to skip the
# control plane, HM_BENCH_PYTHON=0 to skip the Python front (it needs torch and maturin),
# HM_BENCH_PROGRAMS=0 to skip issue 40's programs rows, HM_BENCH_PROGRAMS_PES (default "2 4 8")
# for their PE counts and HM_BENCH_PROGRAMS_MAX_BYTES for their largest transfer (a short look),
# HM_BENCH_QUICK=1 for the smoke-test method everywhere (to check the plumbing; its figures mean
# nothing). A step that is skipped leaves its earlier results in bench/results/ as they were.
set -euo pipefail
cd "$(dirname "$0")/.."
target="${CARGO_TARGET_DIR:-target}"
results=bench/results
pes="${HM_BENCH_PES:-2,4,8,16,32}"
oshmem_barrier_pes="${OSHMEM_BARRIER_PES:-4 8 16 32}"
launches=5
rounds="${HM_BENCH_ROUNDS:-3}"
ucx_rounds="${HM_BENCH_UCX_ROUNDS:-3}"
quick=()
if [[ "${HM_BENCH_QUICK:-0}" != 0 ]]; then
    quick=(--quick)
    launches=3
    rounds="${HM_BENCH_ROUNDS:-1}"
    ucx_rounds="${HM_BENCH_UCX_ROUNDS:-1}"
fi
mkdir -p "$results"
have_oshmem=0
if command -v oshcc >/dev/null && command -v oshrun >/dev/null; then
    have_oshmem=1
fi
shared_memory=0
if [[ "${HM_BENCH_SHMEM:-1}" != 0 || ("${OSHMEM:-1}" != 0 && $have_oshmem == 1) ||
    "${HM_BENCH_C_API:-1}" != 0 || "${HM_BENCH_CONTROL:-1}" != 0 ]]; then
    shared_memory=1
    rm -f "$results"/{machine,commands}.txt
fi
[[ "${HM_BENCH_SHMEM:-1}" == 0 ]] || rm -f "$results/shmem.jsonl"
[[ "${OSHMEM:-1}" == 0 ]] || rm -f "$results"/oshmem.{jsonl,txt}
[[ "${HM_BENCH_C_API:-1}" == 0 ]] || rm -f "$results/c_api.jsonl"
[[ "${HM_BENCH_CONTROL:-1}" == 0 ]] || rm -f "$results/control.jsonl"
[[ "${HM_BENCH_UCX:-1}" == 0 ]] || rm -f "$results"/{shmem_ucx,oshmem_ucx}.jsonl "$results"/ucx_{machine,commands,oshmem}.txt
# The file the commands of the current step are recorded in.
commands="$results/commands.txt"

# Liveness across hosts (issue 42): how long after a host is lost (link cut, processes killed,
# host frozen) every agent of a four-namespace-host job has exited, 10 runs of each
# (bench/liveness.sh; needs root, adds nothing otherwise). A failed run is reported, not fatal.
if [[ "${HM_BENCH_LIVENESS:-1}" != 0 ]]; then
    rm -f "$results/liveness.jsonl"
    bench/liveness.sh 10 "$results/liveness.jsonl" || echo "bench/liveness.sh: some runs failed" >&2
fi

# Job start on 2, 4, 8 and 16 namespace hosts × 2 PEs, 5 runs each (bench/startup_hosts.sh;
# needs root, adds nothing otherwise). A failure is reported, not fatal.
if [[ "${HM_BENCH_STARTUP_HOSTS:-1}" != 0 ]]; then
    rm -f "$results/startup_hosts.jsonl"
    bench/startup_hosts.sh 5 "$results/startup_hosts.jsonl" ||
        echo "bench/startup_hosts.sh failed" >&2
fi

# run OUTPUT COMMAND…: records the command, runs it, appends its stdout to OUTPUT.
run() {
    local output="$1"
    shift
    printf '%s >>%s\n' "$*" "$output" >>"$commands"
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
if [[ $shared_memory == 1 ]]; then
    describe_machine >"$results/machine.txt"
    touch "$commands"
fi

# build: hm-bench (and oshmem_bench when OSHMEM is installed), commands recorded in $commands.
hm_bench="$target/release/hm-bench"
oshmem_bench="$target/oshmem_bench"
build() {
    printf 'cargo build --release -p hm-bench -p hmrun -p hyper-multicore --bins --example restart_timings\n' >>"$commands"
    cargo build --release -p hm-bench -p hmrun -p hyper-multicore --bins --example restart_timings
    if [[ $have_oshmem == 1 ]]; then
        printf 'oshcc -O2 -std=gnu11 -o %s bench/oshmem/oshmem_bench.c\n' "$oshmem_bench" >>"$commands"
        oshcc -O2 -std=gnu11 -o "$oshmem_bench" bench/oshmem/oshmem_bench.c
    fi
}

# oshmem OUTPUT RUN…: one "${oshrun[@]}" RUN… appending to OUTPUT; a failure is noted in
# $notes and the run goes on (stderr collects in $notes.stderr).
oshmem() {
    local output="$1" status=0
    shift
    printf '%s %s >>%s\n' "${oshrun[*]}" "$*" "$output" >>"$commands"
    "${oshrun[@]}" "$@" >>"$output" 2>>"$notes.stderr" || status=$?
    if [[ $status != 0 ]]; then
        echo "FAILED (exit $status): oshrun $*" >>"$notes"
    fi
}

# ucx_notes MACHINE: the notes of a UCX step's OSHMEM runs into $notes, and the load average
# after the step into MACHINE.
ucx_notes() {
    if [[ $have_oshmem == 1 ]]; then
        {
            echo "Open MPI OSHMEM: $(ompi_info --version 2>/dev/null | head -1)"
            echo "launcher: ${oshrun[*]}"
            echo "rounds (ours, then OSHMEM): $ucx_rounds"
            oshmem_stderr
        } >>"$notes"
    else
        echo "OSHMEM not run (oshcc/oshrun not installed)" >"$notes"
    fi
    echo "load average after: $(cat /proc/loadavg)" >>"$1"
}

# oshmem_stderr: appends the last lines OSHMEM wrote to stderr to $notes.
oshmem_stderr() {
    if [[ -s "$notes.stderr" ]]; then
        echo "stderr of the OSHMEM runs (last 20 lines):"
        tail -20 "$notes.stderr"
    else
        echo "the OSHMEM runs wrote nothing to stderr"
    fi
    rm -f "$notes.stderr"
}

if [[ $shared_memory == 1 ]]; then
    build
fi

run_oshmem=0
if [[ "${OSHMEM:-1}" != 0 && $have_oshmem == 1 ]]; then
    run_oshmem=1
    notes="$results/oshmem.txt"
    oshrun=(timeout 300 oshrun --allow-run-as-root --oversubscribe --mca osc ucx)
elif [[ "${OSHMEM:-1}" != 0 ]]; then
    echo "OSHMEM not run (oshcc/oshrun not installed)" >"$results/oshmem.txt"
fi

# The C API: bench/oshmem/oshmem_bench.c unchanged, built with hmcc (libhmshmem) and run under
# hmrun. Its rows carry the source's labels ("oshmem", "reference_oshmem") behind hmrun's "[0] "
# prefix; they are stored as layers "c-api" and "reference_c-api".
c_api_bench="$target/oshmem_bench_hm"
relabel='s/"layer":"\(reference_\)\{0,1\}oshmem"/"layer":"\1c-api"/'
build_c_api() {
    printf 'cargo build --release -p hyper-multicore-shmem-c -p hmrun\n' >>"$commands"
    cargo build --release -p hyper-multicore-shmem-c -p hmrun
    printf '%s -O2 -std=gnu11 -o %s bench/oshmem/oshmem_bench.c\n' "$target/release/hmcc" \
        "$c_api_bench" >>"$commands"
    "$target/release/hmcc" -O2 -std=gnu11 -o "$c_api_bench" bench/oshmem/oshmem_bench.c
}
if [[ "${HM_BENCH_C_API:-1}" != 0 ]]; then
    build_c_api
fi

# Rounds of the 2-PE comparisons — ours, OSHMEM, the C API, one after the other — so that the
# three meet the same minutes of this shared VM (its cache-line transfer changes speed from
# minute to minute); bench/report.py merges a row's rounds (median of the medians, min and max
# over all). The first round also runs the start-up launches, the other PE counts and the
# managed restart.
for ((round = 1; round <= rounds; round++)); do
    if [[ "${HM_BENCH_SHMEM:-1}" != 0 && $round == 1 ]]; then
        run "$results/shmem.jsonl" "$hm_bench" shmem --json --pes "$pes" "${quick[@]}"
        # The managed restart 64 → 128 MiB with 3 allocations (2 PEs, 20 rounds, per stage):
        # rank 0's JSON line of the lifecycle's own benchmark.
        restart_cmd=("$target/release/hmrun" -n 2 -- "$target/release/examples/restart_timings")
        printf '%s | sed -n "s/^\\[0\\] {/{/p" >>%s\n' "${restart_cmd[*]}" "$results/shmem.jsonl" >>"$commands"
        "${restart_cmd[@]}" | sed -n 's/^\[0\] {/{/p' >>"$results/shmem.jsonl"
    elif [[ "${HM_BENCH_SHMEM:-1}" != 0 ]]; then
        run "$results/shmem.jsonl" "$hm_bench" shmem --json --pes 2 \
            --only barrier,latency,bandwidth,pingpong,fetch-add,malloc-free,all-to-all,guarded \
            "${quick[@]}"
    fi
    if [[ $run_oshmem == 1 && $round == 1 ]]; then
        for ((launch = 0; launch < launches; launch++)); do
            # The start time is taken just before oshrun starts (printed as "$(date +%s%N)").
            start="$(date +%s%N)"
            printf '%s -np 2 %s --init-only --job-start "$(date +%%s%%N)" %s>>%s\n' "${oshrun[*]}" \
                "$oshmem_bench" "${quick[*]}${quick[*]:+ }" "$results/oshmem.jsonl" >>"$commands"
            "${oshrun[@]}" -np 2 "$oshmem_bench" --init-only --job-start "$start" "${quick[@]}" \
                >>"$results/oshmem.jsonl" 2>>"$notes.stderr" ||
                echo "FAILED (exit $?): oshrun -np 2 --init-only" >>"$notes"
        done
    fi
    if [[ $run_oshmem == 1 ]]; then
        oshmem "$results/oshmem.jsonl" -np 2 "$oshmem_bench" "${quick[@]}"
    fi
    if [[ $run_oshmem == 1 && $round == 1 ]]; then
        for n in $oshmem_barrier_pes; do
            oshmem "$results/oshmem.jsonl" -np "$n" "$oshmem_bench" "${quick[@]}"
        done
    fi
    if [[ "${HM_BENCH_C_API:-1}" != 0 ]]; then
        printf "%s -n 2 -- %s %s| sed -n 's/^\\[0\\] //p' | sed '%s' >>%s\n" \
            "$target/release/hmrun" "$c_api_bench" "${quick[*]}${quick[*]:+ }" "$relabel" \
            "$results/c_api.jsonl" >>"$commands"
        "$target/release/hmrun" -n 2 -- "$c_api_bench" "${quick[@]}" |
            sed -n 's/^\[0\] //p' | sed "$relabel" >>"$results/c_api.jsonl"
    fi
done
if [[ $run_oshmem == 1 ]]; then
    {
        echo "Open MPI OSHMEM: $(ompi_info --version 2>/dev/null | head -1)"
        echo "launcher: ${oshrun[*]}"
        echo "start-up launches at 2 PEs: $launches; full pattern set at 2 PEs ($rounds rounds, alternated with ours and the C API); barrier only at: $oshmem_barrier_pes"
        oshmem_stderr
    } >>"$notes"
fi

if [[ "${HM_BENCH_CONTROL:-1}" != 0 ]]; then
    run "$results/control.jsonl" "$hm_bench" control --json --pes "$pes" "${quick[@]}"
fi

if [[ $shared_memory == 1 ]]; then
    echo "load average after: $(cat /proc/loadavg)" >>"$results/machine.txt"
fi

# How real programs call us (issue 40): put/get with the local buffer in the heap or in private
# memory, windows of puts, a PE's memcpy while its peer waits in a barrier (2 PEs), and every
# collective at 8 B … 16 MiB, legacy and team forms — the Rust API (`hm-bench programs`), OSHMEM
# and the C API (`oshmem_bench --programs` built with oshcc and with hmcc), one PE count at a
# time in that order, so the three meet the same minutes. The symmetric heap each C run needs:
# 4 N × the largest transfer (the strided all-to-all's source and target) + 6 × it + 64 MiB.
if [[ "${HM_BENCH_PROGRAMS:-1}" != 0 ]]; then
    commands="$results/programs_commands.txt"
    notes="$results/programs_oshmem.txt"
    rm -f "$results"/{programs,c_api_programs,oshmem_programs}.jsonl \
        "$results"/programs_{machine,commands,oshmem}.txt
    touch "$commands"
    describe_machine >"$results/programs_machine.txt"
    build
    build_c_api
    programs_largest=$((16 << 20))
    [[ ${#quick[@]} == 0 ]] || programs_largest=$((64 << 10))
    max_bytes=()
    if [[ -n "${HM_BENCH_PROGRAMS_MAX_BYTES:-}" ]]; then
        programs_largest="$HM_BENCH_PROGRAMS_MAX_BYTES"
        max_bytes=(--max-bytes "$HM_BENCH_PROGRAMS_MAX_BYTES")
    fi
    oshrun=(timeout 1800 oshrun --allow-run-as-root --oversubscribe --mca osc ucx)
    for n in ${HM_BENCH_PROGRAMS_PES:-2 4 8}; do
        heap=$(((4 * n + 6) * programs_largest + (64 << 20)))
        run "$results/programs.jsonl" "$hm_bench" programs --json --pes "$n" "${quick[@]}" \
            "${max_bytes[@]}"
        if [[ $have_oshmem == 1 ]]; then
            oshmem "$results/oshmem_programs.jsonl" -np "$n" -x SHMEM_SYMMETRIC_HEAP_SIZE="$heap" \
                -x SHMEM_SYMMETRIC_SIZE="$heap" "$oshmem_bench" --programs "${quick[@]}" \
                "${max_bytes[@]}"
        fi
        c_api_run=(env SHMEM_SYMMETRIC_SIZE="$heap" "$target/release/hmrun" -n "$n" --
            "$c_api_bench" --programs "${quick[@]}" "${max_bytes[@]}")
        printf "%s | sed -n 's/^\\[0\\] //p' | sed '%s' >>%s\n" "${c_api_run[*]}" "$relabel" \
            "$results/c_api_programs.jsonl" >>"$commands"
        "${c_api_run[@]}" | sed -n 's/^\[0\] //p' | sed "$relabel" >>"$results/c_api_programs.jsonl"
    done
    if [[ $have_oshmem == 1 ]]; then
        {
            echo "Open MPI OSHMEM: $(ompi_info --version 2>/dev/null | head -1)"
            echo "launcher: ${oshrun[*]}"
            oshmem_stderr
        } >>"$notes"
    else
        echo "OSHMEM not run (oshcc/oshrun not installed)" >"$notes"
    fi
    echo "load average after: $(cat /proc/loadavg)" >>"$results/programs_machine.txt"
    printf 'python3 bench/report.py\n' >>"$commands"
fi

# The UCX route, 2 PEs on this host, every pair through UCX over TCP on loopback: ours
# (HYPER_MULTICORE_SHMEM_TRANSPORT=ucx through --transport ucx) and OSHMEM's spml ucx (its MPI
# layer too on pml ucx, so that its barrier and collectives use the same transport), unpinned
# both (bench/README.md: pinned main threads slow our UCX route down).
if [[ "${HM_BENCH_UCX:-1}" != 0 ]]; then
    commands="$results/ucx_commands.txt"
    touch "$commands"
    describe_machine >"$results/ucx_machine.txt"
    build
    ucx_groups=barrier,latency,bandwidth,pingpong,fetch-add,malloc-free,all-to-all,computing-peer,sleeper
    notes="$results/ucx_oshmem.txt"
    oshrun=(timeout 300 oshrun --allow-run-as-root --oversubscribe --mca spml ucx --mca pml ucx
        --mca pml_ucx_tls any --mca pml_ucx_devices any --mca osc ucx -x UCX_TLS=tcp,self)
    # Rounds of ours then OSHMEM, one after the other: this VM has minutes in which our route
    # (four threads on two cores) slows down more than OSHMEM's, so each side is sampled in the
    # same minutes; bench/report.py merges a row's rounds (median of the medians, min and max
    # over all).
    for ((round = 1; round <= ucx_rounds; round++)); do
        run "$results/shmem_ucx.jsonl" env UCX_TLS=tcp,self "$hm_bench" shmem --json --pes 2 \
            --transport ucx --no-pin --only "$ucx_groups" "${quick[@]}"
        if [[ $have_oshmem == 1 ]]; then
            oshmem "$results/oshmem_ucx.jsonl" -np 2 "$oshmem_bench" --no-pin "${quick[@]}"
        fi
    done
    ucx_notes "$results/ucx_machine.txt"
    printf 'python3 bench/report.py\n' >>"$commands"
fi

# The UCX route across two hosts: two network namespaces with host names of their own, joined by
# a veth pair (bench/namespace_hosts.sh; needs root). Ours: one `hmrun --nnodes 2` per host,
# whose PEs run `hm-bench pe-shmem --rows` (root rank 0 prints the rows): 1 PE per host for the
# 2-PE patterns (every pair on UCX without forcing it), then 2 per host for the barrier (shared
# memory within a host, UCX between). OSHMEM: one `oshrun` on host 0 that starts host 1's daemon
# through the namespace script as its rsh agent (`--bind-to none`: bound, both "hosts" would pin
# their PE to the same core of this machine). Both over UCX_TLS=tcp,self, unpinned, in
# alternated rounds.
if [[ "${HM_BENCH_TWO_HOSTS:-1}" != 0 ]]; then
    commands="$results/two_hosts_commands.txt"
    notes="$results/two_hosts_oshmem.txt"
    if why=$(bench/namespace_hosts.sh up 2>&1); then
        trap 'bench/namespace_hosts.sh down' EXIT
        rm -f "$results"/two_hosts{,_oshmem}.jsonl "$results"/two_hosts_{machine,commands,oshmem}.txt
        touch "$commands"
        describe_machine >"$results/two_hosts_machine.txt"
        build
        secret=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
        heap=$((256 << 20))
        [[ ${#quick[@]} == 0 ]] || heap=$((64 << 20))
        # ours PES_PER_HOST GROUPS: one job across the two hosts; rank 0's rows appended.
        ours() {
            local per_host="$1" groups="$2" node status=0 pids=()
            local pe=("$(realpath "$hm_bench")" pe-shmem --heap "$heap" --no-pin --rows --only "$groups" "${quick[@]}")
            printf 'bench/namespace_hosts.sh exec N env UCX_TLS=tcp,self %s -n %s --nnodes 2 --node-rank N --master-addr 198.18.0.1 --master-port 29700 -- %s >>%s\n' \
                "$target/release/hmrun" "$per_host" "${pe[*]}" "$results/two_hosts.jsonl" >>"$commands"
            for node in 1 0; do
                bench/namespace_hosts.sh exec "$node" env UCX_TLS=tcp,self \
                    HYPER_MULTICORE_SHMEM_SECRET="$secret" "$target/release/hmrun" -n "$per_host" \
                    --nnodes 2 --node-rank "$node" --master-addr 198.18.0.1 --master-port 29700 \
                    -- "${pe[@]}" >"$results/two_hosts.node$node" &
                pids+=($!)
            done
            for pid in "${pids[@]}"; do
                wait "$pid" || status=$?
            done
            if [[ $status != 0 ]]; then
                echo "the two-host job of $per_host PEs per host failed ($status):" >&2
                tail -20 "$results"/two_hosts.node{0,1} >&2
                rm -f "$results"/two_hosts.node{0,1}
                exit 1
            fi
            sed -n 's/^\[0\] //p' "$results/two_hosts.node0" >>"$results/two_hosts.jsonl"
            rm -f "$results"/two_hosts.node{0,1}
        }
        oshrun=(timeout 300 bench/namespace_hosts.sh exec 0 oshrun --allow-run-as-root
            --oversubscribe --mca plm_rsh_agent "$PWD/bench/namespace_hosts.sh rsh"
            --bind-to none --mca spml ucx --mca pml ucx --mca pml_ucx_tls any
            --mca pml_ucx_devices any --mca osc ucx --mca btl self,tcp -x UCX_TLS=tcp,self)
        for ((round = 1; round <= ucx_rounds; round++)); do
            ours 1 barrier,latency,bandwidth,pingpong,fetch-add,malloc-free,all-to-all,computing-peer,sleeper
            ours 2 barrier
            if [[ $have_oshmem == 1 ]]; then
                oshmem "$results/two_hosts_oshmem.jsonl" --host hm-host-0,hm-host-1 --map-by node \
                    -np 2 "$(realpath "$oshmem_bench")" --no-pin "${quick[@]}"
                oshmem "$results/two_hosts_oshmem.jsonl" --host hm-host-0:2,hm-host-1:2 \
                    --map-by slot -np 4 "$(realpath "$oshmem_bench")" --no-pin "${quick[@]}"
            fi
        done
        ucx_notes "$results/two_hosts_machine.txt"
        bench/namespace_hosts.sh down
        trap - EXIT
        printf 'python3 bench/report.py\n' >>"$commands"
    else
        echo "two namespace hosts skipped (earlier results left as they were): $why" >&2
    fi
fi

# The Python front (issue 13): `hyper_multicore.shmem` with torch CPU tensors on 2 PEs next to
# the Rust API's rows of the same run (python/bench/front.py runs `hm-bench shmem` itself, then
# its own job), and the MoE dispatch/combine example against torch.distributed gloo's
# all_to_all_single on 2 and 4 PEs. The extension is installed (editable) as a release build
# without fault injection; scripts/test_python.sh installs its own test build again.
if [[ "${HM_BENCH_PYTHON:-1}" != 0 ]]; then
    commands="$results/python_commands.txt"
    if why=$(python3 -c "import torch, maturin" 2>&1); then
        rm -f "$results"/python.jsonl "$results"/python_{machine,commands}.txt
        touch "$commands"
        describe_machine >"$results/python_machine.txt"
        build
        install=(python3 -m pip install --quiet --no-build-isolation --no-deps -e .)
        printf 'MATURIN_PEP517_ARGS="--profile release" %s\n' "${install[*]}" >>"$commands"
        MATURIN_PEP517_ARGS="--profile release" "${install[@]}"
        trials=11
        [[ ${#quick[@]} == 0 ]] || trials=3
        run "$results/python.jsonl" python3 python/bench/front.py --trials "$trials"
        # The example's line on rank 0 ("same steps, N PEs: … X ms/step, … Y ms/step (…)") as
        # one JSON row.
        moe_row='s|^\[0\] same steps, \([0-9]*\) PEs: [^0-9]* \([0-9.]*\) ms/step, [^0-9]* \([0-9.]*\) ms/step.*|{"row": "moe_step", "pes": \1, "ours_ms": \2, "gloo_ms": \3}|p'
        for n in 2 4; do
            moe=(env OMP_NUM_THREADS=1 "$target/release/hmrun" -n "$n" --
                python3 examples/moe_dispatch_combine.py --gloo)
            printf "%s | sed -n '%s' >>%s\n" "${moe[*]}" "$moe_row" "$results/python.jsonl" >>"$commands"
            "${moe[@]}" | sed -n "$moe_row" >>"$results/python.jsonl"
        done
        # torch symmetric memory (issue 44): one_shot_all_reduce and all_to_all_vdev against
        # gloo and the runtime's collectives, on 2 and 4 PEs, in one job per PE count.
        rm -f "$results"/symm_mem.jsonl
        run "$results/symm_mem.jsonl" env HMRUN="$target/release/hmrun" \
            python3 python/bench/symm_mem.py --trials "$trials"
        echo "load average after: $(cat /proc/loadavg)" >>"$results/python_machine.txt"
        printf 'python3 bench/report.py\n' >>"$commands"
    else
        echo "the Python front skipped (earlier results left as they were): $why" >&2
    fi
fi

if [[ $shared_memory == 1 ]]; then
    printf 'python3 bench/report.py\n' >>"$results/commands.txt"
fi
python3 bench/report.py
