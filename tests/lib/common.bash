# Shared setup for the bats suite: where the binaries are, and a real `ddprun store` to talk to.
load '/usr/lib/bats/bats-support/load'
load '/usr/lib/bats/bats-assert/load'

REPO="$(cd "$BATS_TEST_DIRNAME/../.." && pwd)"
BUILD="${DDP_BUILD_DIR:-$REPO/build/ci}"
DDPRUN="$BUILD/ddprun"
STORETOOL="$BUILD/tests/storetool"

# Tests whose time goes mostly to training a model under a sanitizer (the trainer instrumented
# too) run in the CI build only; the sanitizer stages keep the shorter tests of the same paths.
trains() {
  case "$BUILD" in */asan | */tsan) skip "trains a model: run by the CI build only" ;; esac
}

# The first CPU this test may run on (`taskset -c "$(first_cpu)"`: a container's cpuset need
# not hold CPU 0).
first_cpu() {
  sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' /proc/self/status | sed 's/[-,].*//'
}
# Starts `ddprun store` on 127.0.0.1 with a fresh token; sets STORE_PID, STORE_ADDR, TOKFILE.
start_store() {
  TOKFILE="$BATS_TEST_TMPDIR/token"
  (umask 077 && head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$TOKFILE")
  # a store started before in this test left its address there: the new one's shell truncates
  # the file only once it runs, so it must not be there for the wait below to see
  rm -f "$BATS_TEST_TMPDIR/store.out"
  "$DDPRUN" store --listen 127.0.0.1:0 --token-file "$TOKFILE" --log-level info "$@" \
    >"$BATS_TEST_TMPDIR/store.out" 2>"$BATS_TEST_TMPDIR/store.err" &
  STORE_PID=$!
  for _ in $(seq 100); do
    [ -s "$BATS_TEST_TMPDIR/store.out" ] && break
    sleep 0.05
  done
  STORE_ADDR=$(head -n1 "$BATS_TEST_TMPDIR/store.out")
  [ -n "$STORE_ADDR" ] || { cat "$BATS_TEST_TMPDIR/store.err" >&2; return 1; }
}

stop_store() {
  if [ -n "${STORE_PID:-}" ] && kill -0 "$STORE_PID" 2>/dev/null; then
    kill -TERM "$STORE_PID"
    wait "$STORE_PID" || true
  fi
  STORE_PID=
}

# storetool against the running store.
st() {
  "$STORETOOL" --addr "$STORE_ADDR" --token-file "$TOKFILE" "$@"
}

# The same, exec'd, for `st_bg ... &`: then $! is storetool's own pid, not a subshell's.
st_bg() {
  exec "$STORETOOL" --addr "$STORE_ADDR" --token-file "$TOKFILE" "$@"
}

store_alive() {
  kill -0 "$STORE_PID" && st set alive yes && run st get alive && [ "$output" = yes ]
}

# Waits up to $2 seconds for file $1 to contain pattern $3.
wait_for_line() {
  local file=$1 secs=$2 pat=$3
  for _ in $(seq $((secs * 20))); do
    grep -q -- "$pat" "$file" 2>/dev/null && return 0
    sleep 0.05
  done
  echo "timed out waiting for '$pat' in $file:" >&2
  cat "$file" >&2 || true
  return 1
}

store_port() {
  echo "${STORE_ADDR##*:}"
}

# The pid of the local agent of node NODE (a job's host label): the parent of a rank, not a warm
# interpreter, whose DDPRUN_NODE is NODE; empty when none is found.
local_agent_of() {
  local e p pp
  for e in /proc/[0-9]*/environ; do
    tr '\0' '\n' <"$e" 2>/dev/null | grep -qx "DDPRUN_NODE=$1" || continue
    p=${e#/proc/}
    p=${p%/environ}
    [ "$(cat "/proc/$p/comm" 2>/dev/null)" = ddprun-warm ] && continue
    pp=$(ps -o ppid= -p "$p" | tr -d ' ')
    tr '\0' ' ' <"/proc/$pp/cmdline" 2>/dev/null | grep -q '^ddprun agent' && { echo "$pp"; return 0; }
  done
  return 0
}

# job.yaml of tests/helpers/hangtest on two local nodes of 2 ranks (localhost, 127.0.0.1), logs
# in ./logs; EXTRA (YAML lines) after, ARGS the program's. HANG_ELASTIC: the elastic line
# (default heartbeats 500ms, timeout 5s; "" for none, to give one in EXTRA).
hangtest_job() { # extra, then hangtest arguments
  local extra=$1 args="" a el="elastic: {heartbeat_interval: 500ms, heartbeat_timeout: 5s}"
  shift
  [ -n "${HANG_ELASTIC+set}" ] && el=$HANG_ELASTIC
  for a in "$@"; do args="$args, \"$a\""; done
  cat >job.yaml <<JOB
command: ["$BUILD/tests/hangtest"$args]
nodes:
  - {host: localhost, slots: 2}
  - {host: 127.0.0.1, slots: 2}
$el
logs: {dir: logs}
stop_grace: 2s
$extra
JOB
}

