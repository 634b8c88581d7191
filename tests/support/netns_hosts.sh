#!/usr/bin/env bash
# Several "hosts" on one machine for mpirun tests: HOSTS network namespaces made for this run, each with its
# own hostname (a UTS namespace) and one veth interface, gbnet0, on a private subnet (10.231.7.0/24, host i at
# 10.231.7.<i+1>) joined by a bridge in a switch namespace of its own. COMMAND runs on host 0 with Open MPI
# set up as docs/afd_mpi.md#several-hosts sets it up on real machines: a hostfile of the hosts' addresses,
# ranks placed round-robin by host (world rank r on host r mod HOSTS), the ranks' TCP and Open MPI's own
# connections pinned to the subnet and to port ranges (ranks 47000-47099, daemons 46000-46099), and a launch
# agent in place of ssh that starts Open MPI's daemon (orted) inside the namespaces of the host it is given. Afterwards it prints the bytes each host moved over gbnet0 and fails unless every
# other host received at least MIN_BYTES (GB_NETNS_MIN_BYTES, default 16384): the ranks talked over the
# hosts' network, not through anything they share.
# usage: netns_hosts.sh HOSTS SECONDS -- COMMAND...
# The namespaces' names carry this script's pid, so runs side by side do not collide; they are removed (and
# what still runs in them killed) on exit, on a signal, and by a later run when the run that made them is
# gone. COMMAND runs under `timeout SECONDS`. Where namespaces cannot be made (not root, no `ip` or `unshare`,
# no network namespaces) it prints "SKIP: <why>" and exits 77 (the tests' SKIP_RETURN_CODE).
set -u
hosts=$1 seconds=$2
shift 2
[ "${1:-}" = "--" ] && shift
[ "$hosts" -ge 2 ] && [ "$hosts" -le 200 ] || { echo "netns_hosts.sh: HOSTS is $hosts but must be in [2, 200]"; exit 2; }

skip() {
  echo "SKIP: several hosts need network namespaces, and $1"
  exit 77
}
[ "$EUID" -eq 0 ] || skip "this test is not running as root (uid $EUID); run it as root (CI does)"
command -v ip >/dev/null 2>&1 || skip "the ip command is missing (Debian package iproute2; scripts/deps.sh installs it)"
command -v unshare >/dev/null 2>&1 || skip "the unshare command is missing (Debian package util-linux)"

prefix=gbnet
run="$prefix-$$"
subnet=10.231.7
dir=$(mktemp -d)

# Kills what runs in namespace $1 (processes this script or an earlier run of it started there), then
# removes it.
drop_netns() {
  local pids
  pids=$(ip netns pids "$1" 2>/dev/null)
  # shellcheck disable=SC2086
  [ -n "$pids" ] && kill -9 $pids 2>/dev/null
  ip netns del "$1" 2>/dev/null
}
cleanup() {
  trap - EXIT INT TERM HUP
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^$run-"); do drop_netns "$ns"; done
  rm -rf "$dir"
}
trap cleanup EXIT
trap 'cleanup; exit 143' INT TERM HUP

# Namespaces of earlier runs whose script is gone (killed before its trap ran).
for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$prefix-[0-9]+-"); do
  owner=${ns#"$prefix"-}
  owner=${owner%%-*}
  kill -0 "$owner" 2>/dev/null || drop_netns "$ns"
done

sw="$run-sw"
ip netns add "$sw" 2>"$dir/err" || skip "\`ip netns add\` failed: $(cat "$dir/err")"
set -e
ip -n "$sw" link add br0 type bridge
ip -n "$sw" link set br0 up
: >"$dir/hostfile"
addresses=""
for i in $(seq 0 $((hosts - 1))); do
  ns="$run-h$i"
  ip netns add "$ns"
  ip link add name gbnet0 netns "$ns" type veth peer name "p$i" netns "$sw"
  ip -n "$sw" link set "p$i" master br0
  ip -n "$sw" link set "p$i" up
  ip -n "$ns" addr add "$subnet.$((i + 1))/24" dev gbnet0
  ip -n "$ns" link set gbnet0 up
  ip -n "$ns" link set lo up
  echo "$subnet.$((i + 1)) slots=1" >>"$dir/hostfile"
  addresses="$addresses $subnet.$((i + 1))"
done
set +e

# The launch agent: what ssh is on real machines. Open MPI runs `agent [options] HOST COMMAND...`, the command
# being words for the remote shell (e.g. `PATH=/usr/bin:$PATH ; export PATH ; ... orted ...` when mpirun was
# started by its full path); this one runs it with sh in HOST's namespaces under that host's hostname.
cat >"$dir/launch_agent" <<EOF
#!/bin/sh
while [ "\${1#-}" != "\$1" ]; do shift; done
host=\$1
shift
i=\$(( \${host##*.} - 1 ))
exec ip netns exec "$run-h\$i" unshare --uts sh -c "hostname gbhost\$i && \$*"
EOF
chmod +x "$dir/launch_agent"

export OMPI_MCA_plm_rsh_agent="$dir/launch_agent" OMPI_MCA_plm_rsh_no_tree_spawn=1
export OMPI_MCA_orte_default_hostfile="$dir/hostfile" OMPI_MCA_rmaps_base_mapping_policy=node
export OMPI_MCA_btl_tcp_if_include="$subnet.0/24" OMPI_MCA_oob_tcp_if_include="$subnet.0/24"
export OMPI_MCA_btl_tcp_port_min_v4=47000 OMPI_MCA_btl_tcp_port_range_v4=100 OMPI_MCA_oob_tcp_dynamic_ipv4_ports=46000-46099
export GENBRIDGE_NETNS_HOSTS="${addresses# }"
echo "== $hosts hosts (network namespaces $run-h0..h$((hosts - 1))):${addresses}; the command runs on host 0"

ip netns exec "$run-h0" unshare --uts sh -c 'hostname gbhost0 && exec timeout -k 5 "$@"' sh "$seconds" "$@"
rc=$?
[ $rc -eq 124 ] && echo "FAIL: the command ran past its ${seconds} s deadline"

min=${GB_NETNS_MIN_BYTES:-16384}
for i in $(seq 0 $((hosts - 1))); do
  rx=$(ip netns exec "$run-h$i" cat /sys/class/net/gbnet0/statistics/rx_bytes)
  tx=$(ip netns exec "$run-h$i" cat /sys/class/net/gbnet0/statistics/tx_bytes)
  echo "== host $i ($subnet.$((i + 1))): gbnet0 received $rx bytes, sent $tx bytes"
  if [ "$i" -gt 0 ] && [ "$rc" -eq 0 ] && [ "$rx" -lt "$min" ]; then
    echo "FAIL: host $i received $rx bytes, fewer than $min: its ranks did not talk over the hosts' network"
    rc=1
  fi
done
exit $rc
