#!/usr/bin/env bash
# Two "hosts" on this machine for the benchmarks across hosts (issue 10): network namespaces
# hm-bench-h0 and hm-bench-h1 joined by a veth pair, host 0 at 198.18.0.1 and host 1 at
# 198.18.0.2 (198.18.0.0/15 is set aside for benchmarking network devices), each command run in
# a UTS namespace of its own named hm-host-0 / hm-host-1, and both names resolvable in both
# namespaces (/etc/netns/<namespace>/hosts). Needs root and iproute2.
#
#   bench/namespace_hosts.sh up              # create them (fails saying why if it cannot)
#   bench/namespace_hosts.sh exec N CMD…     # run CMD on host N (0 or 1)
#   bench/namespace_hosts.sh rsh HOST CMD…   # the same by host name, with CMD as one shell
#                                            # string: Open MPI's rsh agent (plm_rsh_agent)
#   bench/namespace_hosts.sh down            # remove them (also when half made)
set -euo pipefail

namespaces=(hm-bench-h0 hm-bench-h1)
devices=(hmbench0 hmbench1)
addresses=(198.18.0.1 198.18.0.2)

# host_index NAME: 0 or 1 for hm-host-0 / hm-host-1.
host_index() {
    case "$1" in
    hm-host-0 | 0) echo 0 ;;
    hm-host-1 | 1) echo 1 ;;
    *)
        echo "unknown host '$1': the hosts are hm-host-0 and hm-host-1" >&2
        exit 2
        ;;
    esac
}

down() {
    # Deleting one end of the veth pair deletes both (left in this namespace by a half-made up).
    ip link del "${devices[0]}" 2>/dev/null || true
    for n in 0 1; do
        ip netns del "${namespaces[$n]}" 2>/dev/null || true
        rm -rf "/etc/netns/${namespaces[$n]}" 2>/dev/null || true
    done
}

# net ARGS…: `ip ARGS…`; on failure, says which step failed, removes what was made and exits 1.
net() {
    local output
    if ! output=$(ip "$@" 2>&1); then
        echo "\`ip $*\` failed: $output" >&2
        down
        exit 1
    fi
}

up() {
    if [[ $(id -u) != 0 ]]; then
        echo "not root: network namespaces need root" >&2
        exit 1
    fi
    command -v ip >/dev/null || { echo "no ip command: install iproute2" >&2; exit 1; }
    command -v unshare >/dev/null || { echo "no unshare command: install util-linux" >&2; exit 1; }
    down
    net netns add "${namespaces[0]}"
    net netns add "${namespaces[1]}"
    net link add "${devices[0]}" type veth peer name "${devices[1]}"
    for n in 0 1; do
        local ns="${namespaces[$n]}"
        net link set "${devices[$n]}" netns "$ns"
        net -n "$ns" addr add "${addresses[$n]}/24" dev "${devices[$n]}"
        net -n "$ns" link set "${devices[$n]}" up
        net -n "$ns" link set lo up
        if ! { mkdir -p "/etc/netns/$ns" &&
            printf '127.0.0.1 localhost\n%s hm-host-0\n%s hm-host-1\n' \
                "${addresses[0]}" "${addresses[1]}" >"/etc/netns/$ns/hosts"; }; then
            echo "cannot write /etc/netns/$ns/hosts" >&2
            down
            exit 1
        fi
    done
}

case "${1:-}" in
up) up ;;
down) down ;;
exec)
    n=$(host_index "$2")
    shift 2
    exec ip netns exec "${namespaces[$n]}" unshare --uts \
        sh -c 'hostname "$0" && exec "$@"' "hm-host-$n" "$@"
    ;;
rsh)
    n=$(host_index "$2")
    shift 2
    exec ip netns exec "${namespaces[$n]}" unshare --uts \
        sh -c 'hostname "$0" && exec sh -c "$*"' "hm-host-$n" "$@"
    ;;
*)
    echo "usage: $0 up | down | exec N CMD… | rsh HOST CMD…" >&2
    exit 2
    ;;
esac
