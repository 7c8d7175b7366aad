#!/usr/bin/env bash
# A multi-node Docker Swarm on one machine: this host's dockerd is the manager, and each worker
# is one more dockerd in its own network namespace, joined over a bridge made for it.
#
#   sudo deploy/swarm-on-one-machine.sh up [--workers 2] [--name cfsw] [--subnet 10.231.0]
#                                          [--image coordinator-free-peer:latest]
#   sudo deploy/swarm-on-one-machine.sh status [--name cfsw]
#   sudo deploy/swarm-on-one-machine.sh down [--name cfsw]
#
# up: a bridge NAME-br (SUBNET.1/24, addresses that exist only inside this machine, no route
# out), a FORWARD accept rule for the bridge's own traffic (bridge netfilter is on and FORWARD
# may drop by default), per worker k a namespace NAME-w<k> hung on the bridge by a veth pair
# (SUBNET.<10+k>), and a dockerd in it (its own config, tmpfs data root, exec root, pid file,
# socket /run/NAME-w<k>.sock, cgroup parent), started with nsenter + unshare (`ip netns exec`
# remounts /sys, which dockerd cannot live with). Then `docker swarm init` on the bridge
# address (it refuses if this host is already in a swarm), each worker joins, the nodes are
# labelled cfree.group=0 (manager), 1, 2, ... for `cfree stack --groups`, and --image is copied
# to every worker with docker save | docker load. No address outside the bridge is ever used.
#
# down: undoes all of it (swarm left on every node, daemons stopped, data roots unmounted and
# removed, namespaces, veths, bridge and the FORWARD rule deleted), and leaves this host's
# swarm only if `up` initialised it. It is safe to run again, and after a failed `up`.
#
# The kernel here may lack IP_VS: the routing mesh then cannot work, so `cfree stack` gives
# every service `endpoint_mode: dnsrr`. Drive the workers with `docker -H unix:///run/NAME-w<k>.sock`.
set -euo pipefail

action=${1:-}
[ $# -gt 0 ] && shift
workers=2
name=cfsw
subnet=10.231.0
image=
while [ $# -gt 0 ]; do
  case "$1" in
    --workers) workers=$2; shift 2 ;;
    --name) name=$2; shift 2 ;;
    --subnet) subnet=$2; shift 2 ;;
    --image) image=$2; shift 2 ;;
    -h|--help) sed -n '2,27p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "swarm-on-one-machine: unknown argument $1 (try --help)" >&2; exit 2 ;;
  esac
done

die() { echo "swarm-on-one-machine: $*" >&2; exit 1; }
say() { echo "== $*"; }
state=/run/cfree-swarm/$name
bridge=$name-br
manager_ip=$subnet.1
comment="cfree-swarm-$name"
worker_ns() { echo "$name-w$1"; }
worker_sock() { echo "unix:///run/$name-w$1.sock"; }
worker_ip() { echo "$subnet.$((10 + $1))"; }
worker_root() { echo "/var/lib/cfree-swarm/$name/w$1"; }
wdocker() { local k=$1; shift; docker -H "$(worker_sock "$k")" "$@"; }

need_tools() {
  [ "$(id -u)" = 0 ] || die "needs root (network namespaces, a bridge, dockerd)"
  for t in docker dockerd ip nsenter unshare iptables mount; do
    command -v "$t" >/dev/null || die "$t is not installed"
  done
}

up() {
  need_tools
  [[ "$workers" =~ ^[1-9][0-9]?$ ]] || die "--workers must be 1..99"
  [ ! -e "$state" ] || die "$state exists: a swarm named $name is up (run down first)"
  local swarm
  swarm=$(docker info --format '{{.Swarm.LocalNodeState}}')
  [ "$swarm" = inactive ] || die "this host's docker is already in a swarm ($swarm); leave it first"
  mkdir -p "$state"
  echo "$workers" >"$state/workers"
  # From here on, a failure undoes whatever was made.
  trap 'rc=$?; if [ $rc != 0 ]; then echo "swarm-on-one-machine: up failed; undoing" >&2; down; fi' EXIT

  say "bridge $bridge ($manager_ip/24) and the FORWARD accept rule for it"
  ip link add "$bridge" type bridge
  ip addr add "$manager_ip/24" dev "$bridge"
  ip link set "$bridge" up
  iptables -I FORWARD -i "$bridge" -o "$bridge" -m comment --comment "$comment" -j ACCEPT

  local k ns root
  for k in $(seq 1 "$workers"); do
    ns=$(worker_ns "$k")
    root=$(worker_root "$k")
    say "worker $k: namespace $ns, address $(worker_ip "$k"), dockerd on $(worker_sock "$k")"
    ip netns add "$ns"
    ip link add "$name-v$k" type veth peer name "$name-p$k"
    ip link set "$name-v$k" master "$bridge" up
    ip link set "$name-p$k" netns "$ns"
    ip -n "$ns" link set "$name-p$k" name eth0
    ip -n "$ns" addr add "$(worker_ip "$k")/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ns" link set lo up
    # A tmpfs data root: removing an image's files from disk took about a minute per node.
    mkdir -p "$root"
    mount -t tmpfs -o size=4g "cfree-swarm-$name-w$k" "$root"
    mkdir -p "$root/data" "$root/exec"
    echo '{}' >"$root/daemon.json"
    nsenter --net="/run/netns/$ns" unshare --uts --mount --propagation slave sh -c \
      "hostname $ns; exec dockerd --config-file $root/daemon.json --data-root $root/data \
       --exec-root $root/exec --pidfile $root/dockerd.pid -H $(worker_sock "$k") \
       --cgroup-parent $ns" >"$state/dockerd-w$k.log" 2>&1 &
    echo $! >"$state/dockerd-w$k.pid"
  done
  for k in $(seq 1 "$workers"); do
    local t=0
    until wdocker "$k" info >/dev/null 2>&1; do
      t=$((t + 1))
      [ "$t" -lt 120 ] || die "the dockerd of worker $k did not answer (log: $state/dockerd-w$k.log)"
      sleep 0.5
    done
  done

  say "swarm init on $manager_ip"
  docker swarm init --advertise-addr "$manager_ip" --listen-addr "$manager_ip:2377" \
    --data-path-addr "$manager_ip" >/dev/null
  touch "$state/initialised"
  docker node update --label-add cfree.group=0 "$(docker info --format '{{.Swarm.NodeID}}')" >/dev/null
  local token
  token=$(docker swarm join-token -q worker)
  for k in $(seq 1 "$workers"); do
    wdocker "$k" swarm join --token "$token" --advertise-addr "$(worker_ip "$k")" \
      "$manager_ip:2377" >/dev/null
    docker node update --label-add "cfree.group=$k" \
      "$(wdocker "$k" info --format '{{.Swarm.NodeID}}')" >/dev/null
  done
  if [ -n "$image" ]; then
    for k in $(seq 1 "$workers"); do
      say "image $image -> worker $k (docker save | docker load)"
      docker save "$image" | wdocker "$k" load >/dev/null
    done
  fi
  trap - EXIT
  status
}

status() {
  [ -e "$state" ] || { echo "no swarm named $name is up"; return 0; }
  docker node ls --format '{{.Hostname}} {{.Status}} {{.Availability}} {{.ManagerStatus}}'
  local k
  for k in $(seq 1 "$(cat "$state/workers")"); do
    echo "worker $k: docker -H $(worker_sock "$k")   (address $(worker_ip "$k"))"
  done
}

down() {
  need_tools
  local n=0 k ns root pid
  [ -f "$state/workers" ] && n=$(cat "$state/workers")
  # Workers found on the system count too (a failed up may not have written everything).
  for ns in $(ip netns list | awk '{print $1}' | grep -E "^$name-w[0-9]+$" || true); do
    k=${ns#"$name-w"}
    [ "$k" -gt "$n" ] && n=$k
  done
  for k in $(seq 1 "$n"); do
    root=$(worker_root "$k")
    wdocker "$k" swarm leave --force >/dev/null 2>&1 || true
    if [ -f "$root/dockerd.pid" ] || [ -f "$state/dockerd-w$k.pid" ]; then
      pid=$(cat "$root/dockerd.pid" 2>/dev/null || cat "$state/dockerd-w$k.pid")
      if kill -0 "$pid" 2>/dev/null; then
        kill "$pid"
        for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
        kill -9 "$pid" 2>/dev/null || true
      fi
    fi
    if mountpoint -q "$root"; then
      # containers' mounts below the data root first, then the tmpfs itself
      grep -F " $root/" /proc/mounts | awk '{print $2}' | sort -r | xargs -r -n1 umount -l || true
      umount -l "$root"
    fi
    rm -rf "$root"
    ip link del "$name-v$k" 2>/dev/null || true
    ip netns del "$(worker_ns "$k")" 2>/dev/null || true
    rm -f "/run/$name-w$k.sock"
  done
  rmdir "/var/lib/cfree-swarm/$name" "/var/lib/cfree-swarm" 2>/dev/null || true
  if [ -e "$state/initialised" ]; then
    docker swarm leave --force >/dev/null 2>&1 || true
  fi
  while iptables -D FORWARD -i "$bridge" -o "$bridge" -m comment --comment "$comment" -j ACCEPT \
    2>/dev/null; do :; done
  ip link del "$bridge" 2>/dev/null || true
  rm -rf "$state"
  rmdir /run/cfree-swarm 2>/dev/null || true
  say "swarm $name is down"
}

case "$action" in
  up) up ;;
  down) down ;;
  status) status ;;
  *) echo "usage: $0 up|status|down [--workers K] [--name NAME] [--subnet A.B.C] [--image IMG]" >&2; exit 2 ;;
esac
