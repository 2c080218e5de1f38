# Helpers the bench scripts source (". bench/lib.sh" from the repository root).

# A TCP port free on 127.0.0.1 now: the kernel's pick for a bind to port 0, released at once.
# A random number in 30000-50000 lies in the ephemeral range, where an outgoing connection may
# already hold it (a benchmark died on "Address already in use" that way).
free_port() {
  /usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# What most bench scripts set first: B, the build folder (their first argument, default
# build/release) as an absolute path, and T, a scratch folder removed when the script exits.
bench_dirs() {
  # shellcheck disable=SC2034 # B is the caller's
  B=$(cd "${1:-build/release}" && pwd)
  T=$(mktemp -d)
  trap 'rm -rf "$T"' EXIT
}

# Two test hosts for the TCP benchmarks, run from the repository root: network namespaces 1 and
# 2 on veth through a bridge (tests/lib/sshd.bash), their links limited to RATE (default none:
# the veths' own speed). Moves into a scratch folder; at exit the hosts and the folder go, and
# so does the process in $store where the caller set one. Sets ns1, ns2 and a1 (host 1's address).
two_netns_hosts() {
  BATS_TEST_TMPDIR=$(mktemp -d)
  # shellcheck source=../tests/lib/sshd.bash
  . tests/lib/sshd.bash
  trap '[ -n "${store:-}" ] && kill "$store" 2>/dev/null; sshd_teardown; rm -rf "$BATS_TEST_TMPDIR"' EXIT
  cd "$BATS_TEST_TMPDIR" || exit 1
  netns_setup
  [ -n "$SSHD_NETNS" ] || { echo "needs network namespaces (root, iproute2)" >&2; exit 1; }
  for k in 1 2; do sshd_make_ns "$k"; done
  # shellcheck disable=SC2034 # the caller's
  ns1=$(sshd_ns 1) ns2=$(sshd_ns 2) a1=$(sshd_addr 1)
  for k in 1 2; do sshd_limit "$k" "${RATE:-none}"; done
}

# This machine's name in bench/results/: its CPU's maker and line, its CPUs, and its GPU
# (amd-epyc-2c, intel-xeon-16c-h100).
bench_machine() {
  local cpu gpu
  cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n1)
  case "$cpu" in
  *EPYC*) cpu=amd-epyc ;;
  *Xeon*) cpu=intel-xeon ;;
  *) cpu=$(echo "$cpu" | tr 'A-Z' 'a-z' | tr -cs 'a-z0-9' '-' | cut -c1-24 | sed 's/-$//') ;;
  esac
  gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n1 |
    grep -o '[AHLB][0-9]\{2,3\}' | head -n1 | tr 'A-Z' 'a-z' || true)
  echo "$cpu-$(nproc)c${gpu:+-$gpu}"
}

# Records what this script prints as bench/results/<machine>/NAME.md, after a head saying what
# produced it (the command, the commit, the date, the machine); bench/report renders the newest
# of each into BENCHMARKS.md. Called first, with the script's arguments: it runs the script again
# with its output recorded and exits with its status (a failed run leaves the last result).
bench_record() { # name args...
  [ -n "${DDP_BENCH_RECORDING:-}" ] && return 0
  local name=$1 m dir out env="" v rc self root
  shift
  self=$(cd "$(dirname "$0")" && pwd)/$(basename "$0")
  root=$(dirname "$(dirname "$self")")
  m=$(bench_machine)
  dir="$root/bench/results/$m"
  out="$dir/$name.md"
  mkdir -p "$dir"
  if [ ! -e "$dir/machine.md" ]; then
    { sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n1 | tr -d '\n'
      echo ", $(nproc) CPUs, $(free -g | awk '/^Mem:/ { print $2 }') GiB, $(uname -r)$(
        nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n1 | sed 's/^/; /')."
    } >"$dir/machine.md"
  fi
  for v in REPS SECS RUNS RATE BIND NPROC SIZES; do
    [ -n "${!v:-}" ] && env="$env$v=${!v} "
  done
  { echo "bench: $name"
    echo "command: ${env}bench/$(basename "$0")${*:+ $*}"
    echo "commit: $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)"
    echo "date: $(date -u +%F)"
    echo "machine: $m"
    echo
  } >"$out.new"
  set +e # the run's own status, whatever the caller's options
  DDP_BENCH_RECORDING=1 "$self" "$@" | tee -a "$out.new"
  rc=${PIPESTATUS[0]}
  if [ "$rc" -eq 0 ]; then
    mv "$out.new" "$out"
    echo "recorded in ${out#"$root"/} (bench/report > BENCHMARKS.md renders it)" >&2
  else
    rm -f "$out.new"
  fi
  exit "$rc"
}
