# Hosts for real on one machine: network namespaces joined by a bridge that
# lives in a namespace of its own, addresses 10.200.0.0/24 that exist only
# inside them. Sourced by the tests that need more than loopback.
#   netns_up TAG NODE=ADDRESS ...   creates TAG-sw (the bridge) and TAG-NODE
#                                   (eth0 at ADDRESS/24, lo up) per node;
#                                   the node's port on the bridge is NODE
#   netns_down TAG NODE ...         deletes them
#   netns_cut TAG NODE              takes NODE's bridge port down: its packets
#                                   are dropped, and neither side is told (no
#                                   FIN, no RST, its eth0 still up), as when a
#                                   host loses power or the network splits
# Root only; netns_can_run says why not ("" when it can).

netns_can_run() {
  [ "$(id -u)" = 0 ] || { echo "needs root to create network namespaces"; return; }
  command -v ip >/dev/null || { echo "ip (iproute2) not installed: scripts/setup.sh installs it"; return; }
  local probe="nsprobe$$" err
  if ! err=$(ip netns add "$probe" 2>&1); then echo "cannot create network namespaces here: $err"; return; fi
  ip netns del "$probe"
}

netns_up() {
  local tag=$1; shift
  local sw="$tag-sw" node ns address
  ip netns add "$sw" && ip -n "$sw" link add br0 type bridge && ip -n "$sw" link set br0 up || return 1
  for node in "$@"; do
    ns="$tag-${node%%=*}"
    address=${node#*=}
    node=${node%%=*}
    ip netns add "$ns" || return 1
    # veth pair: one end in the node's namespace (eth0), the other on the
    # bridge. Interface names stay under 15 characters.
    ip link add "$tag$node" netns "$ns" type veth peer name "$node" netns "$sw" || return 1
    ip -n "$ns" link set "$tag$node" name eth0 &&
      ip -n "$ns" addr add "$address/24" dev eth0 &&
      ip -n "$ns" link set eth0 up &&
      ip -n "$ns" link set lo up &&
      ip -n "$sw" link set "$node" master br0 &&
      ip -n "$sw" link set "$node" up || return 1
  done
}

netns_down() {
  local tag=$1 node; shift
  for node in "$@"; do ip netns del "$tag-$node" 2>/dev/null; done
  ip netns del "$tag-sw" 2>/dev/null
}

netns_cut() { ip -n "$1-sw" link set "$2" down; }

# netns_teardown TAG RUN_DIR NODE ...: ends the processes in the caller's
# `pids` array (TERM, then KILL half a second later), deletes the
# namespaces and RUN_DIR. For an EXIT trap.
netns_teardown() {
  local tag=$1 run=$2 p; shift 2
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
  sleep 0.5
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; done
  wait 2>/dev/null
  netns_down "$tag" "$@"
  rm -rf "$run"
}
