#!/usr/bin/env bash
# Runs every test of the project: unit, property and multi-process tests of every crate,
# then the benchmark harness in smoke mode.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --workspace --all-targets
if [ -x bench/smoke.sh ]; then
  bench/smoke.sh
fi
