#!/usr/bin/env bash
# ddprun's developer entry point.
#   ./dev.sh quickstart   install missing Debian packages, build ddprun and the example (release), run the default job
#   ./dev.sh test         build and run the whole suite: unit + bats (CI build), ASan/UBSan, TSan, fuzz
#   ./dev.sh deps         only install missing Debian packages
#   ./dev.sh deb          build the Debian package build/deb/ddprun_VERSION_ARCH.deb (install it on every node)
set -euo pipefail
cd "$(dirname "$0")"

BUILD_DEPS=(cmake make gcc g++ pkg-config libyaml-dev libssh-dev libcurl4-openssl-dev libssl-dev
            libopenblas-dev zlib1g-dev dataset-fashion-mnist elfutils)
TEST_DEPS=(bats bats-assert bats-support inotify-tools clang libclang-rt-14-dev man-db groff-base bsdextrautils procps
           openssh-server openssh-client iproute2 util-linux python3 python3-torch slurm-client slurmctld
           slurmd etcd-server openssl curl nftables libfaketime dpkg-dev
           python3-cryptography)
# Installed without their recommends, and with no service of theirs started (the tests start
# their own, on free loopback ports): Prometheus' server and promtool; Chromium, which renders
# `ddprun report`'s page headless in 97-report.
QUIET_DEPS=(prometheus chromium)
JOBS=${JOBS:-$(nproc)}

need() { # prints the packages of "$@" that are not installed
  for p in "$@"; do
    dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q '^install ok installed$' || echo "$p"
  done
}

deps() {
  local missing
  missing=$(need "$@")
  [ -z "$missing" ] && return 0
  if [ "$(id -u)" -ne 0 ]; then
    echo "dev.sh: missing Debian packages: $missing" >&2
    echo "dev.sh: run: sudo apt-get install -y $missing" >&2
    exit 3
  fi
  echo "dev.sh: installing $missing" >&2
  DEBIAN_FRONTEND=noninteractive apt-get update -q
  # shellcheck disable=SC2086
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q $missing
}

quiet_deps() { # packages whose services must not start: installed under a policy-rc.d that says no
  local missing
  missing=$(need "$@")
  [ -z "$missing" ] && return 0
  [ "$(id -u)" -eq 0 ] || { echo "dev.sh: missing Debian packages: $missing (sudo apt-get install --no-install-recommends -y $missing)" >&2; exit 3; }
  local own=""
  [ -e /usr/sbin/policy-rc.d ] || { printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d; chmod 755 /usr/sbin/policy-rc.d; own=1; }
  echo "dev.sh: installing $missing (no recommends, no service started)" >&2
  # shellcheck disable=SC2086
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $missing || { [ -n "$own" ] && rm -f /usr/sbin/policy-rc.d; exit 1; }
  [ -n "$own" ] && rm -f /usr/sbin/policy-rc.d
  return 0
}

build() { # preset
  cmake --preset "$1" >/dev/null
  cmake --build --preset "$1" -j "$JOBS"
}

suite() { # preset: unit tests through ctest, then the bats integration tests
  build "$1"
  ctest --test-dir "build/$1" --output-on-failure -j "$JOBS"
  integration "$1"
}

integration() { # preset: the bats integration tests of build/$1
  DDP_BUILD_DIR="$PWD/build/$1" "${ISOLATE[@]}" bats --timing --print-output-on-failure tests/integration
}

# Two builds' integration tests can run at once when each runs in a PID namespace of its own: the
# tests' checks that nothing is left (pgrep) then see only their own processes, and whatever one
# leaves is killed with it. Their network test hosts and ports are already picked free. Needs
# root and util-linux's unshare; without them the suites run one after the other.
ISOLATE=()
if [ "$(id -u)" -eq 0 ] && unshare --pid --fork --mount-proc --kill-child true 2>/dev/null; then
  ISOLATE=(unshare --pid --fork --mount-proc --kill-child)
fi

case "${1:-}" in
deps)
  deps "${BUILD_DEPS[@]}" "${TEST_DEPS[@]}"
  quiet_deps "${QUIET_DEPS[@]}"
  ;;
quickstart)
  deps "${BUILD_DEPS[@]}"
  # what the default job runs: ddprun and the example (the tests, benchmarks and the CUDA
  # trainer are the whole build's: cmake --build --preset release)
  cmake --preset release >/dev/null
  cmake --build --preset release -j "$JOBS" --target ddprun ddprun-fmnist >/dev/null
  exec ./build/release/ddprun
  ;;
deb)
  deps "${BUILD_DEPS[@]}" dpkg-dev
  cmake --preset deb >/dev/null
  cmake --build --preset deb -j "$JOBS" >/dev/null
  (cd build/deb && cpack -G DEB >/dev/null)
  ls build/deb/ddprun_*.deb
  ;;
test)
  deps "${BUILD_DEPS[@]}" "${TEST_DEPS[@]}"
  quiet_deps "${QUIET_DEPS[@]}"
  export ASAN_OPTIONS=detect_leaks=1 LSAN_OPTIONS="suppressions=$PWD/tests/lsan.supp"
  if [ "${#ISOLATE[@]}" -eq 0 ]; then
    echo "== [${SECONDS} s] CI build (-Werror): unit and integration tests"
    suite ci
    echo "== [${SECONDS} s] ASan + UBSan: unit and integration tests"
    suite asan
  else
    echo "== [${SECONDS} s] CI build (-Werror) and ASan + UBSan: builds and unit tests"
    build ci
    build asan
    ctest --test-dir build/ci --output-on-failure -j "$JOBS"
    ctest --test-dir build/asan --output-on-failure -j "$JOBS"
    # The two suites at once, each in its own PID namespace: most of a suite's time is waiting
    # (timeouts, leases, daemons starting), about half of two cores when run alone. The CI
    # build's output streams; the ASan build's follows once both have ended.
    echo "== [${SECONDS} s] integration tests of the CI build and, at the same time, of the ASan + UBSan build"
    rm -f build/asan/integration.log
    integration asan >build/asan/integration.log 2>&1 &
    asan=$!
    # Meanwhile the TSan and fuzzing builds, on the cores' idle time alone (SCHED_IDLE: they
    # run only where no test process is ready to): the two suites wait on timeouts, leases and
    # daemons, which left 14% of the two cores idle in a run measured here, more than these
    # builds need. Nothing else runs at that priority: the fuzzers' own timeouts are wall time.
    ( chrt --idle -p 0 "$BASHPID" >/dev/null 2>&1 || true
      build tsan && build fuzz ) >build/idle-builds.log 2>&1 &
    idle=$!
    rc=0
    integration ci || rc=$?
    arc=0
    wait "$asan" || arc=$?
    echo "== [${SECONDS} s] ASan + UBSan: integration tests (run beside the CI build's, above)"
    cat build/asan/integration.log
    brc=0
    wait "$idle" || brc=$?
    echo "== [${SECONDS} s] the TSan and fuzzing builds (made beside the integration tests) ended"
    [ "$rc" -eq 0 ] || { echo "dev.sh: the CI build's integration tests failed (above)" >&2; exit 1; }
    [ "$arc" -eq 0 ] || { echo "dev.sh: the ASan + UBSan build's integration tests failed (above)" >&2; exit 1; }
    [ "$brc" -eq 0 ] || { tail -n 60 build/idle-builds.log; echo "dev.sh: the TSan or fuzzing build failed (above)" >&2; exit 1; }
  fi
  unset ASAN_OPTIONS LSAN_OPTIONS
  echo "== [${SECONDS} s] TSan: unit tests (the threaded client and server)"
  build tsan
  TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" \
    ctest --test-dir build/tsan --output-on-failure -L unit -j "$JOBS"
  echo "== [${SECONDS} s] TSan: the launcher and agent threads (store, lease watcher, heartbeats) in elastic jobs"
  TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" DDP_BUILD_DIR="$PWD/build/tsan" \
    bats --timing --print-output-on-failure -f "failed worker|fails once|hung node" \
    tests/integration/50-elastic.bats
  echo "== [${SECONDS} s] TSan: the pipeline runtime beside the point-to-point engine and sub-groups"
  TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" DDP_BUILD_DIR="$PWD/build/tsan" \
    bats --timing --print-output-on-failure -f "1F1B with weight stashing" \
    tests/integration/92-pipeline-runtime.bats
  echo "== [${SECONDS} s] TSan: the same threads with etcd (watch streams, keepalives failing over)"
  TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" DDP_BUILD_DIR="$PWD/build/tsan" \
    bats --timing --print-output-on-failure -f "3-member" tests/integration/96-etcd.bats
  echo "== [${SECONDS} s] TSan: the agents' checkpoint copies (the copying thread, the replication port's threads)"
  TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" DDP_BUILD_DIR="$PWD/build/tsan" \
    bats --timing --print-output-on-failure -f "counted lost|replication port" \
    tests/integration/52-ckpt.bats
  build fuzz
  # -timeout: an input that takes seconds (quadratic key handling, say) is a failure too;
  # -max_len: room for deep nesting and many keys; job_spec gets a dictionary of YAML tokens;
  # torch_store sends each input to a real server's TCPStore port. $JOBS fuzzers at once,
  # each on a core of its own for its whole time; each writes its log, status and failing
  # inputs under build/fuzz/ with its own name. FUZZ_SECONDS (default 10) each, from the
  # committed seed corpora: 30 until 2026-11-27, when the whole suite reached 19 minutes in a
  # slow hour of the 2-vCPU VM; 20 until the suite reached 1197 s (ninth session); 15 until a
  # run of 1075 s to the integration tests' end (2026-11-28). Longer runs by hand: 240 s each,
  # 2026-11-28, no failure (0.34M to 4.2M inputs per fuzzer).
  fuzzers=()
  for t in store_proto:corpus: torch_store:corpus-torch: torch_proxy:corpus-tproxy: job_spec:corpus-job:-dict=tests/fuzz/job.dict \
    json:corpus-json: profile:corpus-profile:-max_len=8192 agent_proto:corpus-agent: \
    agent_wire:corpus-wire: http_head:corpus-http: report:corpus-report:; do
    IFS=: read -r name corpus extra <<<"$t"
    fuzzers+=("$name")
    mkdir -p "build/fuzz/$corpus"
    rm -f "build/fuzz/$name".rc "build/fuzz/$name"-{crash,timeout,oom,leak}-*
    if [ "${#fuzzers[@]}" -gt "$JOBS" ]; then wait -n || true; fi # one ended: its core is free
    echo "== [${SECONDS} s] libFuzzer: $name, ${FUZZ_SECONDS:-10} s"
    # shellcheck disable=SC2086
    (
      rc=0
      ./build/fuzz/tests/fuzz_"$name" -max_total_time="${FUZZ_SECONDS:-10}" -print_final_stats=1 \
        -timeout=10 -max_len=65536 -artifact_prefix="build/fuzz/$name-" $extra \
        "build/fuzz/$corpus" "tests/fuzz/$corpus" >"build/fuzz/$name.log" 2>&1 || rc=$?
      echo "$rc" >"build/fuzz/$name.rc"
    ) &
  done
  wait
  for name in "${fuzzers[@]}"; do
    echo "== libFuzzer: $name"
    if [ "$(cat "build/fuzz/$name.rc" 2>/dev/null)" != 0 ]; then
      # The whole log is kept: on a failure, its report (the sanitizer's stack or the abort's
      # place, and the input in hex) is what CI shows, not only the final statistics.
      sed -n '/^==[0-9]*==\|^ERROR\|^SUMMARY\|^Deadly\|deadly signal/,$p' "build/fuzz/$name.log" | head -n 120
      for a in "build/fuzz/$name"-{crash,timeout,oom,leak}-*; do
        [ -f "$a" ] && echo "input $a: $(od -An -c "$a" | head -c 4000)"
      done
      echo "dev.sh: fuzz_$name found a failing input (above)" >&2
      exit 1
    fi
    tail -n 6 "build/fuzz/$name.log"
  done
  echo "== [${SECONDS} s] all suites passed"
  ;;
*)
  sed -n '2,6p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
  ;;
esac
