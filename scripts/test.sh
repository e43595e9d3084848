#!/usr/bin/env bash
# Runs every test of the project: unit, property and multi-process tests of every crate, the
# loom models of the shared-memory protocols, then the benchmark harness in smoke mode.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --workspace --all-targets
cargo test --workspace --doc
# The barrier / signal / abort protocols under loom (a separate build with --cfg loom).
RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom \
  cargo test -p hyper-multicore --lib --release loom_tests
if [ -x bench/smoke.sh ]; then
  bench/smoke.sh
fi
if [ -x scripts/test_python.sh ]; then
  scripts/test_python.sh
fi
