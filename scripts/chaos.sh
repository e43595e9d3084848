#!/usr/bin/env bash
# The chaos and abuse suite of hyper_multicore, in one command (see docs/reliability.md):
#
#   scripts/chaos.sh          # full: every fault point on 2, 3 and 4 PEs, a 1000-cycle soak,
#                             # the bootstrap abuse, the host faults (as root), the parser
#                             # property tests and corpus replay, and a burst of libFuzzer when
#                             # nightly and cargo-fuzz are there
#   scripts/chaos.sh --ci     # bounded (about a minute on 2 cores; fault points stop being
#                             # started after 300 s whatever happens): every fault point on 3
#                             # and 4 PEs, a 200-cycle soak, the abuse, the host faults (as
#                             # root), the property tests; no fuzzing
#
# Other arguments go to `hm-chaos run` (--only TEXT, --pes 2,3, --json FILE, --soak-cycles N).
# HM_CHAOS_FUZZ_SECONDS (default 60) is the fuzzing time per target in the full form.
# The last line is the verdict: `fault points: N tried, N survived, hangs: H, leaks: L, host
# faults: K` (K: how many of the tried points were host faults, or `skipped` where the
# namespace hosts cannot be made — not root); the exit status is non-zero unless every point
# survived.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never

mode=full
args=()
for arg in "$@"; do
  case "$arg" in
    --ci) mode=ci; args+=(--ci) ;;
    *) args+=("$arg") ;;
  esac
done
target="${CARGO_TARGET_DIR:-target}"
case "$target" in /*) ;; *) target="$PWD/$target" ;; esac

cargo build --quiet -p hm-chaos -p hmrun
# Frame decoder and unique-ID parser: property tests and the fuzz corpus replay, on stable.
if parsers="$(cargo test --quiet -p hm-chaos --test parsers 2>&1)"; then
  echo "parsers (property tests, fuzz corpus replay): $(grep -E 'test result' <<<"$parsers")"
else
  echo "$parsers"; echo "parsers: FAILED"; exit 1
fi

if [ "$mode" = full ]; then
  if cargo +nightly --version >/dev/null 2>&1 && cargo fuzz --version >/dev/null 2>&1; then
    seconds="${HM_CHAOS_FUZZ_SECONDS:-60}"
    for fuzz_target in frame_decoder unique_id; do
      scratch="$(mktemp -d)"
      log="$scratch/fuzz.log"
      # New inputs go to the scratch corpus; the committed one (fuzz/corpus) only seeds.
      if (cd fuzz && cargo +nightly fuzz run --target-dir "$target/fuzz" "$fuzz_target" \
            "$scratch" "corpus/$fuzz_target" -- -max_total_time="$seconds") >"$log" 2>&1; then
        echo "fuzz $fuzz_target: ${seconds} s, $(grep -Eo '#[0-9]+' "$log" | tail -1 | tr -d '#') runs, no crash"
      else
        echo "fuzz $fuzz_target: FAILED (see $log)"; tail -30 "$log"; exit 1
      fi
      rm -rf "$scratch"
    done
  else
    echo "fuzz: skipped (needs the nightly toolchain and cargo-fuzz: cargo install cargo-fuzz)"
  fi
fi

exec "$target/debug/hm-chaos" run --hmrun "$target/debug/hmrun" "${args[@]}"
