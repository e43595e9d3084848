#!/usr/bin/env bash
# Builds the workspace and runs the README demo: 4 PEs under hmrun.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_system_packages.sh # libucx-dev, libclang-dev when missing
cargo build --release --quiet -p hmrun -p hyper-multicore --examples --bins
exec target/release/hmrun -n "${PES:-4}" --timeout 60 -- target/release/examples/demo
