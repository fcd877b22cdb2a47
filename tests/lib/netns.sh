# Two "nodes" on one machine for multi-node tests: two network namespaces joined by a veth pair.
# Source this file, set an EXIT trap that calls netns_cleanup, then call
#   netns_pair TAG NET    e.g. netns_pair tdl 10.78.0
# which sets A and B (the namespaces, TAG-a-<pid> and TAG-b-<pid>) and VA and VB (their veth
# ends, NET.1/24 in A and NET.2/24 in B), with lo and the veth ends up; nothing else on the
# machine is touched. It exits 77 (skip) without root or namespace support, and returns 1 with a
# message when the pair cannot be wired up. Names carry the test's pid, so namespaces that a
# killed earlier run left behind (SIGKILL skips the trap) are recognised and deleted first.

netns_pair() {
    local tag=$1 net=$2 old
    if [ "$(id -u)" != 0 ]; then echo "SKIP: needs root for ip netns"; exit 77; fi
    if ! ip netns list >/dev/null 2>&1; then echo "SKIP: ip netns is unavailable"; exit 77; fi
    for old in $(ip netns list | sed -n "s/^$tag-[ab]-\([0-9]*\).*/\1/p" | sort -u); do
        kill -0 "$old" 2>/dev/null || {
            ip netns del "$tag-a-$old" 2>/dev/null
            ip netns del "$tag-b-$old" 2>/dev/null
        }
    done
    A=$tag-a-$$ B=$tag-b-$$ VA=${tag}a$$ VB=${tag}b$$
    ip netns add "$A" && ip netns add "$B" || { echo "SKIP: cannot create network namespaces"; exit 77; }
    ip link add "$VA" type veth peer name "$VB" || { echo "SKIP: cannot create a veth pair"; exit 77; }
    ip link set "$VA" netns "$A" && ip link set "$VB" netns "$B" &&
        ip -n "$A" addr add "$net.1/24" dev "$VA" && ip -n "$B" addr add "$net.2/24" dev "$VB" &&
        ip -n "$A" link set lo up && ip -n "$B" link set lo up &&
        ip -n "$A" link set "$VA" up && ip -n "$B" link set "$VB" up ||
        { echo "netns_pair: could not wire $VA ($net.1) in $A to $VB ($net.2) in $B" >&2; return 1; }
}

# Kills whatever still runs in the two namespaces and deletes them (the veth pair goes with them).
netns_cleanup() {
    local ns
    for ns in ${A:-} ${B:-}; do
        ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null
        ip netns del "$ns" 2>/dev/null
    done
}
