#!/usr/bin/env bash
# Job start across hosts (issue 42): how long from starting `hmrun -n 2` on each of 2, 4, 8 and
# 16 network-namespace hosts on one bridge until every PE has joined the world and the runtime
# and passed a first barrier. Runs the ignored test lost_host::job_start_on_namespace_hosts of
# crates/hmrun/tests/launcher/lost_host.rs and appends its `STARTUP` JSON lines to OUT. Needs
# root (the test prints SKIPPED and adds nothing otherwise). All hosts share this machine's
# cores: the rows show how start-up grows with hosts, not a cluster's start-up time.
#
#   bench/startup_hosts.sh [ROUNDS] [OUT] [HOSTS]   # defaults: 5, bench/results/startup_hosts.jsonl,
#                                                   # 2,4,8,16
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-5}
out=${2:-bench/results/startup_hosts.jsonl}
hosts=${3:-2,4,8,16}
log=$(mktemp)
trap 'rm -f "$log"' EXIT
if HM_BENCH_HOSTS="$hosts" HM_BENCH_ROUNDS="$rounds" cargo test -q -p hmrun --test launcher \
    lost_host::job_start_on_namespace_hosts -- --ignored --exact --nocapture >"$log" 2>&1; then
    sed -n 's/^STARTUP //p' "$log" >>"$out"
    grep -h "SKIPPED" "$log" >&2 || true
    echo "startup_hosts: $(grep -c '^STARTUP ' "$log" || true) runs"
else
    cat "$log" >&2
    exit 1
fi
