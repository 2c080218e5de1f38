# Test hosts for the SSH tests: real OpenSSH sshd processes, one per "node", each on its own
# loopback address (127.0.0.2, .3, ...) with its own generated host key, accepting a generated
# user key. All traffic stays on 127.0.0.0/8. (Network namespaces would isolate processes too;
# these hosts share the process table, which the tests use to check for leftovers.)
#
#   sshd_setup            user key, known_hosts file, port; sets SSH_DIR SSH_PORT SSH_KEY SSH_KH
#   sshd_start K          starts node K (K >= 1) on 127.0.0.$((K+1)), host key in known_hosts
#   sshd_stop K           stops it
#   sshd_teardown         stops every node started

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
  SSHD_NODES=
}

sshd_addr() { echo "127.0.0.$(($1 + 1))"; }

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
CFG
  /usr/sbin/sshd -f "$d/sshd_config" -E "$d/sshd.log"
  for _ in $(seq 100); do [ -s "$d/sshd.pid" ] && break; sleep 0.02; done
  if [ "${2:-}" != nokh ]; then
    echo "[$addr]:$SSH_PORT $(cut -d' ' -f1,2 "$d/host_ed25519.pub")" >>"$SSH_KH"
  fi
  SSHD_NODES="$SSHD_NODES $k"
}

sshd_stop() {
  local d="$SSH_DIR/node$1"
  [ -s "$d/sshd.pid" ] && kill "$(cat "$d/sshd.pid")" 2>/dev/null || true
  rm -f "$d/sshd.pid"
}

sshd_teardown() {
  local k
  for k in ${SSHD_NODES:-}; do sshd_stop "$k"; done
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
