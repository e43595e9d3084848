#!/usr/bin/env bash
# Liveness across hosts (issue 42): how long after a host is lost every hmrun agent of a job on
# four network-namespace hosts has exited. Runs the lost-host tests of
# crates/hmrun/tests/launcher/lost_host.rs (peer timeout 2 s) ROUNDS times each and appends
# their `DETECTED` JSON lines to OUT; a run that fails is reported on stderr with its output
# and counted, and the script exits non-zero at the end. Needs root (the tests print SKIPPED and
# add nothing otherwise).
#
#   bench/liveness.sh [ROUNDS] [OUT]     # defaults: 10, bench/results/liveness.jsonl
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-10}
out=${2:-bench/results/liveness.jsonl}
tests=(
    lost_host::a_host_whose_link_is_cut_is_named_lost_on_every_host
    lost_host::a_host_whose_processes_are_killed_is_named_lost_on_every_host
    lost_host::a_host_frozen_past_the_peer_timeout_is_named_lost_on_every_host
)
cargo test -p hmrun --test launcher --no-run
failed=0
log=$(mktemp)
trap 'rm -f "$log"' EXIT
for ((round = 1; round <= rounds; round++)); do
    for test in "${tests[@]}"; do
        if cargo test -q -p hmrun --test launcher "$test" -- --exact --nocapture >"$log" 2>&1; then
            sed -n 's/^DETECTED //p' "$log" >>"$out"
        else
            failed=$((failed + 1))
            echo "== $test failed in round $round:" >&2
            cat "$log" >&2
        fi
    done
done
echo "liveness: $((rounds * ${#tests[@]})) runs, $failed failed"
[[ $failed == 0 ]]
