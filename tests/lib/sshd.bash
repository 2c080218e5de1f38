# Test hosts for the SSH tests: real OpenSSH sshd processes, one per "node", each with its own
# generated host key, accepting a generated user key.
#
# Where network namespaces can be made (root, iproute2), node K is a namespace of its own with
# address 10.213.X.(K+1)/24 on a veth pair joined to a bridge that holds 10.213.X.1 (the
# "login node"): its sshd, agent and ranks live in it. Otherwise node K is an sshd on
# 127.0.0.(K+1). Either way all traffic stays on this machine.
#
#   sshd_setup            user key, known_hosts file, port, bridge; sets SSH_DIR SSH_PORT SSH_KEY
#                         SSH_KH and SSHD_NETNS (1 when the nodes are namespaces)
#   netns_setup           the bridge alone (no sshd: node K's namespace by sshd_make_ns K)
#   sshd_start K          starts node K (K >= 1) at $(sshd_addr K), host key in known_hosts; with
#                         SSHD_TMPFS=DIR, in a mount namespace of its own where DIR (which must
#                         exist) is a private tmpfs: a disk no other node sees
#   node_run K CMD...     runs CMD in node K's mount namespace (its private tmpfs)
#   sshd_stop K           stops its sshd
#   sshd_ns_pids K        the pids inside node K's namespace (empty without namespaces)
#   sshd_tree K           node K's sshd pid, then every process it started, their children, ...
#   sshd_teardown         stops every node, removes namespaces, links and the bridge
#   sshd_limit K RATE     tc rate limit (e.g. 1Gbit) on both ends of node K's veth; "none" frees
#   only_sshd_in K        nothing but node K's sshd is left in its namespace (within 5 s)

sshd_setup() {
  SSH_DIR="$BATS_TEST_TMPDIR/ssh"
  mkdir -p "$SSH_DIR" /run/sshd
  chmod 700 "$SSH_DIR"
  ssh-keygen -q -t ed25519 -N '' -C ddprun-test -f "$SSH_DIR/id_ed25519"
  cp "$SSH_DIR/id_ed25519.pub" "$SSH_DIR/authorized_keys"
  SSH_KEY="$SSH_DIR/id_ed25519"
  SSH_KH="$SSH_DIR/known_hosts"
  : >"$SSH_KH"
  SSH_PORT=$((20000 + RANDOM % 20000))
  netns_setup
}

# The bridge alone, for hosts without sshd (bench/tcp_link_compare.sh starts its ranks in the
# namespaces itself): sets SSHD_TAG, and SSHD_NETNS to 1 where namespaces can be made.
netns_setup() {
  SSHD_NODES=
  SSHD_NETNS=
  local try
  for try in 1 2 3 4 5; do # a tag no other test's bridge has
    SSHD_TAG=$((RANDOM % 200 + 20))
    if [ -z "${SSHD_NO_NETNS:-}" ] && [ "$(id -u)" -eq 0 ] && command -v ip >/dev/null &&
      ip link add "ddpbr$SSHD_TAG" type bridge 2>/dev/null; then
      ip addr add "10.213.$SSHD_TAG.1/24" dev "ddpbr$SSHD_TAG"
      ip link set "ddpbr$SSHD_TAG" up
      SSHD_NETNS=1
      netns_clear_stale
      break
    fi
    [ -z "${SSHD_NO_NETNS:-}" ] && [ "$(id -u)" -eq 0 ] && command -v ip >/dev/null || break
  done
}

# The bridge is the tag's lock: whoever made it owns the tag, so namespaces and veths with the tag
# that exist now are another test's leftovers (a namespace outlives its name while its last
# processes exit, and its veth with it; CI runs two suites at once, and tags are reused).
netns_clear_stale() {
  local ns l
  for ns in $(ip netns list | grep -o "^ddp$SSHD_TAG-[0-9]*"); do ip netns del "$ns" 2>/dev/null || true; done
  for l in $(ip -o link show 2>/dev/null | grep -o "vd$SSHD_TAG-[0-9]*@" | tr -d @); do
    ip link del "$l" 2>/dev/null || true
  done
}

sshd_addr() {
  if [ -n "${SSHD_NETNS:-}" ]; then echo "10.213.$SSHD_TAG.$(($1 + 1))"; else echo "127.0.0.$(($1 + 1))"; fi
}

sshd_ns() { echo "ddp$SSHD_TAG-$1"; }

# Creates node K's namespace (once): veth into the bridge, address, loopback up.
sshd_make_ns() {
  local k=$1 ns
  ns=$(sshd_ns "$k")
  ip netns list | grep -q "^$ns\b" && return 0
  ip netns add "$ns"
  for _ in $(seq 50); do # a leftover veth of this name goes once its namespace is freed
    ip link add "vd$SSHD_TAG-$k" type veth peer name "vn$SSHD_TAG-$k" 2>/dev/null && break
    ip link del "vd$SSHD_TAG-$k" 2>/dev/null || sleep 0.1
  done
  ip link show "vd$SSHD_TAG-$k" >/dev/null || return 1
  ip link set "vn$SSHD_TAG-$k" netns "$ns"
  ip link set "vd$SSHD_TAG-$k" master "ddpbr$SSHD_TAG" up
  ip netns exec "$ns" ip link set lo up
  ip netns exec "$ns" ip addr add "$(sshd_addr "$k")/24" dev "vn$SSHD_TAG-$k"
  ip netns exec "$ns" ip link set "vn$SSHD_TAG-$k" up
  ip netns exec "$ns" ip route add default via "10.213.$SSHD_TAG.1"
}

sshd_ns_pids() {
  [ -n "${SSHD_NETNS:-}" ] && ip netns pids "$(sshd_ns "$1")" 2>/dev/null || true
}

sshd_tree() {
  local todo p all=""
  todo=$(cat "$SSH_DIR/node$1/sshd.pid" 2>/dev/null || true)
  while [ -n "$todo" ]; do
    set -- $todo
    p=$1; shift
    all="$all $p"
    todo=$(echo "$@" $(pgrep -P "$p" || true))
  done
  echo $all
}

# Writes node K's host key, config, and (unless $2 = nokh) its known_hosts line.
sshd_start() {
  local k=$1 d="$SSH_DIR/node$1" addr
  addr=$(sshd_addr "$k")
  mkdir -p "$d"
  [ -e "$d/host_ed25519" ] || ssh-keygen -q -t ed25519 -N '' -f "$d/host_ed25519"
  cat >"$d/sshd_config" <<CFG
ListenAddress $addr:$SSH_PORT
HostKey $d/host_ed25519
PidFile $d/sshd.pid
AuthorizedKeysFile $SSH_DIR/authorized_keys
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
LogLevel ERROR
${SSHD_EXTRA_CONFIG:-}
CFG
  local pre=()
  # shellcheck disable=SC2016
  [ -n "${SSHD_TMPFS:-}" ] && pre=(unshare -m --propagation private sh -c
    'mount -t tmpfs -o size=512m,mode=0755 ddpck "$0" && exec "$@"' "$SSHD_TMPFS")
  if [ -n "$SSHD_NETNS" ]; then
    sshd_make_ns "$k"
    ip netns exec "$(sshd_ns "$k")" "${pre[@]}" /usr/sbin/sshd -f "$d/sshd_config" -E "$d/sshd.log"
  elif [ ${#pre[@]} -gt 0 ]; then
    "${pre[@]}" /usr/sbin/sshd -f "$d/sshd_config" -E "$d/sshd.log"
  else
    /usr/sbin/sshd -f "$d/sshd_config" -E "$d/sshd.log"
  fi
  for _ in $(seq 500); do [ -s "$d/sshd.pid" ] && break; sleep 0.02; done
  if [ "${2:-}" != nokh ]; then
    echo "[$addr]:$SSH_PORT $(cut -d' ' -f1,2 "$d/host_ed25519.pub")" >>"$SSH_KH"
  fi
  SSHD_NODES="$SSHD_NODES $k"
}

node_run() {
  local k=$1; shift
  nsenter -t "$(cat "$SSH_DIR/node$k/sshd.pid")" -m -- "$@"
}

sshd_stop() {
  local d="$SSH_DIR/node$1"
  [ -s "$d/sshd.pid" ] && kill "$(cat "$d/sshd.pid")" 2>/dev/null || true
  rm -f "$d/sshd.pid"
}

sshd_teardown() {
  local k ns
  for k in ${SSHD_NODES:-}; do sshd_stop "$k"; done
  if [ -n "${SSHD_NETNS:-}" ]; then
    for ns in $(ip netns list | grep -o "^ddp$SSHD_TAG-[0-9]*"); do
      ip netns pids "$ns" | xargs -r kill -9 2>/dev/null || true
      for _ in $(seq 100); do [ -z "$(ip netns pids "$ns" 2>/dev/null)" ] && break; sleep 0.05; done
      ip link del "vd$SSHD_TAG-${ns##*-}" 2>/dev/null || true # now, not when the namespace is freed
      ip netns del "$ns"
    done
    ip link del "ddpbr$SSHD_TAG" 2>/dev/null || true
  fi
  SSHD_NODES=
}

# A job file for nodes $2... with $1 ranks each, running the remaining words after "--".
ssh_job() { # file slots k... -- command words...
  local f=$1 slots=$2; shift 2
  local nodes="" cmd=""
  while [ $# -gt 0 ] && [ "$1" != -- ]; do
    nodes="$nodes    - {host: $(sshd_addr "$1"), slots: $slots}"$'\n'
    shift
  done
  shift
  local w
  for w in "$@"; do cmd="$cmd${cmd:+, }'$w'"; done
  cat >"$f" <<JOB
command: [$cmd]
nodes:
$nodes
ssh: {port: $SSH_PORT, identity: $SSH_KEY, known_hosts: $SSH_KH}
logs: {dir: logs}
stop_grace: 2s
JOB
}

# Rate-limits (or with "none" frees) both directions of node K's link with tc (namespaces only).
sshd_limit() { # K RATE
  local k=$1 rate=$2 dev
  for dev in "vd$SSHD_TAG-$k" "ns:vn$SSHD_TAG-$k"; do
    local pre=()
    [[ $dev == ns:* ]] && { pre=(ip netns exec "$(sshd_ns "$k")"); dev=${dev#ns:}; }
    "${pre[@]}" tc qdisc del dev "$dev" root 2>/dev/null || true
    [ "$rate" = none ] && continue
    # a burst of 2 timer ticks at the rate (at least 256 KB, for veth's 64 KB GSO packets)
    local bps burst
    bps=$(awk -v r="$rate" 'BEGIN { m = r ~ /Gbit/ ? 1e9 : r ~ /Mbit/ ? 1e6 : 1e3; print r * m / 8 }')
    burst=$(awk -v b="$bps" 'BEGIN { x = b / 125; print (x < 262144 ? 262144 : int(x)) }')
    "${pre[@]}" tc qdisc add dev "$dev" root tbf rate "${rate,,}" burst "$burst" latency 50ms
  done
}

# Nothing of the job is left in node K's namespace: only its sshd (without namespaces: nothing to
# check). What a session leaves ends within moments of its connection closing: up to 5 s.
only_sshd_in() {
  [ -z "$SSHD_NETNS" ] && return 0
  local p left="" i
  for i in $(seq 50); do
    left=""
    for p in $(sshd_ns_pids "$1"); do
      [ "$p" = "$(cat "$SSH_DIR/node$1/sshd.pid")" ] || left="$left,$p"
    done
    [ -z "$left" ] && return 0
    sleep 0.1
  done
  echo "left in node $1:"; ps -o pid,ppid,pgid,args -p "${left#,}"; return 1
}
