#!/usr/bin/env bash
# Installs the system packages the build needs, only when they are missing (idempotent; apt):
#   libucx-dev    OpenUCX headers and libraries (hyper-multicore's default feature `ucx`)
#   libclang-dev  libclang, which bindgen loads to generate the UCX bindings (crates/hm-ucx-sys)
#   iproute2      `ip`, with which the multi-host tests make two network-namespace hosts (tests only)
#   iptables      random packet loss on a namespace host's link (the lost-host tests; tests only)
#   valgrind      memcheck, under which the C API's tests run one program (tests only)
# Called by .ci/run, scripts/test.sh and scripts/demo.sh. Builds without UCX need neither:
# `cargo build -p hyper-multicore --no-default-features`.
set -euo pipefail

missing=()
[ -f /usr/include/ucp/api/ucp.h ] || missing+=(libucx-dev)
if [ -z "${LIBCLANG_PATH:-}" ] && ! dpkg -s libclang-dev >/dev/null 2>&1; then
  missing+=(libclang-dev)
fi
command -v ip >/dev/null || missing+=(iproute2)
command -v iptables >/dev/null || missing+=(iptables)
command -v valgrind >/dev/null || missing+=(valgrind)
[ ${#missing[@]} -eq 0 ] && exit 0

if ! command -v apt-get >/dev/null; then
  echo "missing ${missing[*]}: install UCX (>= 1.10, with headers) and libclang with this" \
       "system's package manager, or build with --no-default-features (no UCX transport)" >&2
  exit 1
fi
sudo=()
[ "$(id -u)" -eq 0 ] || sudo=(sudo)
echo "== installing ${missing[*]} (apt)"
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get install -y -qq "${missing[@]}" >/dev/null ||
  { "${sudo[@]}" apt-get update -qq && "${sudo[@]}" apt-get install -y -qq "${missing[@]}" >/dev/null; }
