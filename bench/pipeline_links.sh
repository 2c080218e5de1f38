#!/usr/bin/env bash
# PipeDream's claim on this machine: data parallelism vs the planned hybrid pipeline vs a
# straight pipeline, training Fashion-MNIST's wide-tail MLP (ddprun-fmnist --hidden WIDTHS) on 4
# SSH test hosts (network namespaces from tests/lib/sshd.bash, one rank each) whose links are
# rate-limited with tc (tbf on both ends of each host's veth) at each of RATES.
#
# Every configuration runs under ddprun from a job spec: data parallel is a plain job; the
# hybrid is `pipeline: {auto: {profile, bandwidth: RATE}}` (PipeDream's planner on the model's
# profile, taken on this machine first with --profile-graph) and the straight pipeline the same
# with `straight: true`, both 1F1B with weight stashing. For each: samples/s over a run of
# STEPS_DP data-parallel steps or STEPS_PIPE pipeline minibatches (rank 0's count, fill and
# drain included), the bytes the 4 hosts sent per sample (their veths' counters: training,
# store and SSH traffic together), and the planner's prediction (minibatch / its time per
# minibatch: the slowest stage, or data parallelism's compute + ring all-reduce).
#
# Time to ACC test accuracy = epochs to reach it x 60000 / samples/s on the link, where the
# epochs come from each configuration trained without a rate limit for up to EPOCHS epochs
# (1F1B's statistical efficiency differs from data parallelism's; the link changes only the
# speed). With NO_ACC=1 that part is skipped.
#
# Needs root, iproute2 (tc), openssh-server. With fewer cores than hosts (this 2-core VM) the
# hosts share them; the profile is then taken with 4 profilers running at once (SHARED=1), so
# the planner sees the compute a host has while all four work.
# Usage: bench/pipeline_links.sh [BUILD_DIR]
set -euo pipefail
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
bench_record pipeline_links "$@" # its output goes to bench/results/<machine>/pipeline_links.md too
cd "$(dirname "$0")/.."
B=$(cd "${1:-build/release}" && pwd)
RATES=${RATES:-"100Mbit 1Gbit"}
WIDTHS=${WIDTHS:-2048,2048,2048}
BATCH=${BATCH:-64}
STEPS_DP=${STEPS_DP:-6}
STEPS_PIPE=${STEPS_PIPE:-240}
EPOCHS=${EPOCHS:-3}
ACC=${ACC:-85}
BATS_TEST_TMPDIR=$(mktemp -d)
# shellcheck source=../tests/lib/sshd.bash
. tests/lib/sshd.bash
trap 'sshd_teardown; rm -rf "$BATS_TEST_TMPDIR"' EXIT
cd "$BATS_TEST_TMPDIR"
sshd_setup
[ -n "$SSHD_NETNS" ] || { echo "needs network namespaces (root, iproute2)" >&2; exit 1; }
for k in 1 2 3 4; do sshd_start "$k"; done

sent_bytes() { # what the 4 hosts sent: the host sides' receive counters
  local k t=0
  for k in 1 2 3 4; do t=$((t + $(cat "/sys/class/net/vd$SSHD_TAG-$k/statistics/rx_bytes"))); done
  echo "$t"
}

# The profile: with fewer cores than hosts (SHARED=1, the default then), taken while 3 more
# copies of the profiler run, so that each layer's time is what a host gets when all 4 compute.
SHARED=${SHARED:-$([ "$(nproc)" -lt 4 ] && echo 1 || echo 0)}
for k in $(seq "$([ "$SHARED" = 1 ] && echo 4 || echo 1)"); do
  "$B/ddprun-fmnist" --hidden "$WIDTHS" --batch "$BATCH" --profile-graph "profile$k.txt" >/dev/null &
done
wait
mv profile1.txt profile.txt

# job.yaml for configuration $1 (dp, planned, straight) at rate $2 ("none": planned for
# 100Gbit), training args after
job() { # config rate args...
  local cfg=$1 rate=$2; shift 2
  [ "$rate" = none ] && rate=100Gbit
  # data parallelism: a minibatch of BATCH on every host (ddprun-fmnist's --batch is global), as
  # the planner's data-parallel time assumes
  ssh_job job.yaml 1 1 2 3 4 -- "$B/ddprun-fmnist" --hidden "$WIDTHS" --lr 0.01 \
    --batch "$([ "$cfg" = dp ] && echo $((BATCH * 4)) || echo "$BATCH")" "$@"
  case $cfg in
  planned) echo "pipeline: {auto: {profile: $PWD/profile.txt, bandwidth: $rate}}" >>job.yaml ;;
  straight) echo "pipeline: {auto: {profile: $PWD/profile.txt, bandwidth: $rate, straight: true}}" >>job.yaml ;;
  esac
}

# "layout predicted_ms": the configuration's stages and the planner's time per minibatch
predicted() { # config rate
  local rate=$2 p
  [ "$rate" = none ] && rate=100Gbit
  if [ "$1" = dp ]; then
    p=$("$B/ddprun" pipeline plan "$BATS_TEST_TMPDIR/profile.txt" --machines 4 --bandwidth "$rate")
    echo "4 $(sed -n 's/.*data parallel on 4 machines \([0-9.]*\) ms.*/\1/p' <<<"$p")"
    return
  fi
  job "$1" "$2" --epochs 1
  p=$("$B/ddprun" plan job.yaml | grep '^pipeline:')
  local reps ms
  reps=$(sed -n 's/.*replicas: \[\([0-9, ]*\)\].*/\1/p' <<<"$p" | tr -d ' ' | tr , -)
  ms=$(sed -n 's/.*: \([0-9.e+]*\) ms per minibatch.*/\1/p' <<<"$p")
  echo "$reps $ms"
}

run_speed() { # config rate -> "samples_per_s bytes_per_sample"
  local cfg=$1 rate=$2 steps
  [ "$3" = 4 ] && cfg=dp # the planner chose one stage on all 4 hosts: data parallelism
  steps=$([ "$cfg" = dp ] && echo "$STEPS_DP" || echo "$STEPS_PIPE")
  job "$cfg" "$rate" --epochs 1 --max-steps "$steps" --eval-every 0
  for k in 1 2 3 4; do sshd_limit "$k" "$rate"; done
  local b0 b1
  b0=$(sent_bytes)
  "$B/ddprun" job.yaml >run.txt 2>&1 || { echo "$cfg at $rate failed:" >&2; cat run.txt >&2; exit 1; }
  b1=$(sent_bytes)
  for k in 1 2 3 4; do sshd_limit "$k" none; done
  local line sps step samples
  line=$(grep -o 'epoch 1/1 step [0-9]* .* [0-9]* samples/s' run.txt | tail -n1)
  sps=$(sed 's/.* \([0-9]*\) samples\/s/\1/' <<<"$line")
  step=$(sed 's/epoch 1\/1 step \([0-9]*\) .*/\1/' <<<"$line")
  samples=$((step * BATCH * ($([ "$cfg" = dp ] && echo 4 || echo 1))))
  echo "$sps $(awk -v b=$((b1 - b0)) -v s="$samples" 'BEGIN { printf "%.0f", b / s }')"
}

# epochs to reach ACC without a rate limit, or ">EPOCHS", for a configuration as planned for
# the rate (cached by its stages: the link changes the speed, not what is computed)
declare -A EP
epochs_to_acc() { # config rate layout -> EP_OUT
  local key=$3
  [ "$3" = 4 ] && key=dp
  if [ -z "${EP[$key]:-}" ]; then
    if [ -n "${NO_ACC:-}" ]; then EP[$key]=-; else
      job "$([ "$key" = dp ] && echo dp || echo "$1")" "$2" --epochs "$EPOCHS"
      "$B/ddprun" job.yaml >acc.txt 2>&1 || { echo "$1: training failed" >&2; cat acc.txt >&2; exit 1; }
      local e
      e=$(grep -o 'epoch [0-9]*/[0-9]* .*test-acc [0-9.]*' acc.txt |
        awk -v a="$ACC" '{ split($2, x, "/"); for (i = 1; i <= NF; i++) if ($i == "test-acc") v = $(i + 1);
                           if (v + 0 >= a) { print x[1]; exit } }')
      EP[$key]=${e:->$EPOCHS}
    fi
  fi
  EP_OUT=${EP[$key]}
}

echo "# $(date -u +%F) $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores;" \
  "4 hosts x 1 rank; --hidden $WIDTHS, minibatch $BATCH, 1F1B; profile taken $([ "$SHARED" = 1 ] &&
    echo "with 4 profilers sharing the cores" || echo "alone")"
echo "| link | configuration | stages (workers) | samples/s | predicted samples/s | measured / predicted | bytes sent / sample | epochs to $ACC% | time to $ACC%, s | vs data parallel |"
echo "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"
for rate in $RATES; do
  dp_sps=
  for cfg in dp planned straight; do
    read -r layout pms < <(predicted "$cfg" "$rate")
    read -r sps bps < <(run_speed "$cfg" "$rate" "$layout")
    [ "$cfg" = dp ] && dp_sps=$sps
    pred=- ratio=-
    if [ "$pms" != - ]; then
      pred=$(awk -v m="$pms" -v b="$BATCH" 'BEGIN { printf "%.0f", b / (m / 1000) }')
      ratio=$(awk -v a="$sps" -v p="$pred" 'BEGIN { printf "%.2f", a / p }')
    fi
    epochs_to_acc "$cfg" "$rate" "$layout"
    ep=$EP_OUT tta=-
    [[ "$ep" =~ ^[0-9]+$ ]] && tta=$(awk -v e="$ep" -v s="$sps" 'BEGIN { printf "%.0f", e * 60000 / s }')
    printf '| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n' "$rate" "$cfg" "$layout" "$sps" \
      "$pred" "$ratio" "$bps" "$ep" "$tta" \
      "$(awk -v a="$sps" -v d="$dp_sps" 'BEGIN { printf "%.2fx", a / d }')"
  done
done
