#!/usr/bin/env bash
# Smoke test of the benchmark harness (CI): runs `hm-bench control` in quick mode on 2 and 4 PEs
# and checks that every output line is a JSON object with the required keys. It checks that the
# benchmarks work, never how fast they are.
set -euo pipefail
cd "$(dirname "$0")/.."
out="$(mktemp)"
trap 'rm -f "$out"' EXIT
cargo run --quiet -p hm-bench -- control --quick --json --pes 2,4 >"$out"
python3 -c '
import json, sys

required = {"op", "bytes", "pes", "median_ns", "ref_ns"}
expected = {(op, pes) for op in ("rendezvous", "barrier", "allgather", "broadcast") for pes in (2, 4)}
seen = set()
lines = open(sys.argv[1]).read().splitlines()
if not lines:
    sys.exit("hm-bench smoke: no output")
for number, line in enumerate(lines, 1):
    try:
        row = json.loads(line)
    except ValueError as error:
        sys.exit(f"hm-bench smoke: line {number} is not JSON ({error}): {line!r}")
    if not isinstance(row, dict):
        sys.exit(f"hm-bench smoke: line {number} is not a JSON object: {line!r}")
    missing = required - row.keys()
    if missing:
        sys.exit(f"hm-bench smoke: line {number} lacks {sorted(missing)}: {line!r}")
    if not (isinstance(row["median_ns"], (int, float)) and row["median_ns"] > 0):
        sys.exit(f"hm-bench smoke: line {number} has no positive median_ns: {line!r}")
    seen.add((row["op"], row["pes"]))
absent = expected - seen
if absent:
    sys.exit(f"hm-bench smoke: no row for {sorted(absent)}")
print(f"hm-bench smoke OK: {len(lines)} JSON lines with the required keys")
' "$out"
