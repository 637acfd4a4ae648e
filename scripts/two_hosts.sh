#!/usr/bin/env bash
# Two hosts on this machine, for running a dptrain job across "machines"
# (docs/launch.md, "Two hosts on one machine"). Each host is a network
# namespace joined to the other by a veth pair (10.213.0.1 and 10.213.0.2,
# private addresses that exist only inside these two namespaces) and has a
# host name of its own (a UTS namespace per process, set to the same name
# for every process of a host): the engine uses shared memory between ranks
# whose host names match and MPI between the others. /dev/shm stays shared,
# as it would not be across real machines; the host name is what decides.
#
#   two_hosts.sh check                 exit 0 if namespaces can be made here,
#                                      else print why and exit 77
#   two_hosts.sh up NAME [SLOTS]       make hosts NAME-a and NAME-b (SLOTS
#                                      ranks each, default 2)
#   two_hosts.sh run NAME -- CMD...    run CMD on NAME-a with Open MPI told
#                                      how to reach NAME-b: CMD is a plain
#                                      `mpirun` or `dpt launch` with
#                                      --hostfile "$(two_hosts.sh hostfile NAME)"
#   two_hosts.sh hostfile NAME         print the path of the hosts' hostfile
#   two_hosts.sh cut NAME              take the link between the hosts down
#   two_hosts.sh down NAME             end every process on the hosts, remove them
#   two_hosts.sh agent HOST CMD...     (Open MPI's rsh agent, set by `run`)
#
# NAME: letters, digits and '-' (tests use one per process, so concurrent
# runs never meet). `up` first removes hosts of the same NAME and any hosts
# whose owner (TWO_HOSTS_OWNER, default the calling process) has exited, so
# a killed earlier run leaves nothing behind for long.
set -euo pipefail

state_root=/run/dpt-two-hosts
addr_a=10.213.0.1 addr_b=10.213.0.2

ns_exists() { ip netns list 2>/dev/null | awk -v n="$1" '$1 == n { found = 1 } END { exit !found }'; }
die() { echo "two_hosts.sh: $*" >&2; exit 1; }
check_name() { [[ ${1:-} =~ ^[A-Za-z0-9-]{1,40}$ ]] || die "bad or missing host pair name '${1:-}'"; }

# Removes hosts NAME-a/NAME-b: every process in them first (only processes
# this script started live there), then the namespaces (the veth goes with them).
down() {
  local ns pid
  for ns in "$1-a" "$1-b"; do
    ns_exists "$ns" || continue
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
  done
  for ns in "$1-a" "$1-b"; do
    for _ in 1 2 3 4 5 6 7 8 9 10; do  # deletion waits for the killed processes to go
      ns_exists "$ns" || break
      ip netns delete "$ns" 2>/dev/null && break
      sleep 0.2
    done
  done
  rm -rf "${state_root:?}/$1"
  # Open MPI's session directories, named after the host.
  rm -rf "${TMPDIR:-/tmp}/ompi.$1-a."* "${TMPDIR:-/tmp}/ompi.$1-b."*
}

# Hosts left by a run that was killed before its `down`.
sweep() {
  local d owner
  for d in "$state_root"/*/; do
    [[ -f $d/owner ]] || continue
    owner=$(<"$d/owner")
    kill -0 "$owner" 2>/dev/null || down "$(basename "$d")"
  done
}

cmd=${1:-}; shift || true
case $cmd in
  check)
    if [[ $(id -u) != 0 ]]; then echo "two hosts need network namespaces: not root"; exit 77; fi
    probe="dpt-probe-$$"
    if ! err=$(ip netns add "$probe" 2>&1); then
      echo "two hosts need network namespaces: ip netns add failed: $err"; exit 77
    fi
    err=$(ip link add veth0 netns "$probe" type veth peer name veth1 netns "$probe" 2>&1) || true
    ip netns delete "$probe"
    if [[ -n $err ]]; then echo "two hosts need a veth pair: ip link add failed: $err"; exit 77; fi
    if ! err=$(unshare --uts true 2>&1); then
      echo "two hosts need UTS namespaces: unshare --uts failed: $err"; exit 77
    fi
    ;;
  up)
    name=${1:-}; check_name "$name"; slots=${2:-2}
    [[ $slots =~ ^[1-9][0-9]*$ ]] || die "slots must be a positive number (got '$slots')"
    mkdir -p "$state_root"
    sweep
    down "$name"
    mkdir -p "$state_root/$name"
    trap 'down "$name"' ERR  # half made: leave nothing
    echo "${TWO_HOSTS_OWNER:-$PPID}" > "$state_root/$name/owner"
    ip netns add "$name-a"
    ip netns add "$name-b"
    ip link add veth0 netns "$name-a" type veth peer name veth0 netns "$name-b"
    ip -n "$name-a" addr add "$addr_a/24" dev veth0
    ip -n "$name-b" addr add "$addr_b/24" dev veth0
    for ns in "$name-a" "$name-b"; do
      ip -n "$ns" link set lo up
      ip -n "$ns" link set veth0 up
    done
    printf '%s slots=%s\n%s slots=%s\n' "$addr_a" "$slots" "$addr_b" "$slots" > "$state_root/$name/hostfile"
    ;;
  hostfile)
    check_name "${1:-}"; echo "$state_root/$1/hostfile" ;;
  run)
    name=${1:-}; check_name "$name"; shift
    [[ ${1:-} == -- ]] && shift
    (($#)) || die "run: no command after --"
    [[ -d $state_root/$name ]] || die "hosts $name are not up: run '$0 up $name' first"
    # Open MPI reads OMPI_MCA_* from the environment: its rsh launcher
    # starts the remote daemon through this script (instead of ssh), and
    # its out-of-band and TCP traffic stay on the veth.
    export TWO_HOSTS_NAME=$name
    export OMPI_MCA_plm_rsh_agent="$(realpath "$0") agent"
    export OMPI_MCA_oob_tcp_if_include=10.213.0.0/24
    export OMPI_MCA_btl_tcp_if_include=10.213.0.0/24
    exec ip netns exec "$name-a" unshare --uts /bin/sh -c 'hostname "$0" && exec "$@"' "$name-a" "$@"
    ;;
  agent)
    # Called by mpirun as ssh would be: `agent HOST word...`, the words one
    # shell command line (ssh joins them and the remote shell runs them).
    host=${1:-}; shift
    name=${TWO_HOSTS_NAME:?agent: TWO_HOSTS_NAME is not set (use run)}
    case $host in
      "$addr_a" | "$name-a") ns=$name-a ;;
      "$addr_b" | "$name-b") ns=$name-b ;;
      *) die "agent: unknown host '$host' (expected $addr_a or $addr_b)" ;;
    esac
    exec ip netns exec "$ns" unshare --uts /bin/sh -c "hostname $ns && $*"
    ;;
  cut)
    check_name "${1:-}"; ip -n "$1-a" link set veth0 down ;;
  down)
    check_name "${1:-}"; down "$1" ;;
  *)
    die "usage: two_hosts.sh check | up NAME [SLOTS] | run NAME -- CMD... | hostfile NAME | cut NAME | down NAME" ;;
esac
