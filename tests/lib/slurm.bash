# A real Slurm for the tests (Debian's slurm-wlm 22.05): slurmctld on the "login node" (this
# machine's namespace, on the test bridge's address) and one slurmd per compute node, each in
# the network namespace of an sshd test host (tests/lib/sshd.bash) with a UTS namespace of its
# own, so that its host name is its Slurm node name (n1, n2, ...), and a mount namespace whose
# /etc/hosts names every node, as a cluster's DNS would (slurm_login gives the login node's
# commands the same). Authentication is Slurm's
# auth/none and cred/none (no munge), processes are tracked by process group, no cgroups. The
# whole cluster lives under $SLURM_DIR and is gone at slurm_teardown.
#
#   slurm_setup N [CPUS]  a cluster of N nodes (CPUS each, default 4); sets SLURM_DIR, SLURM_CONF
#                         (exported: srun, salloc, sbatch, scontrol use it); skips the test where
#                         Slurm or namespaces are missing or slurmctld does not start
#   slurm_login CMD...    runs CMD where the node names resolve (srun, salloc, ddprun, ...)
#   slurm_node_addr K     node K's address (that of sshd test host K)
#   slurm_kill_node K     SIGKILLs node K's slurmd and everything in its namespace
#   slurm_teardown        stops every daemon and job, removes the namespaces

slurm_setup() {
  local n=$1 cpus=${2:-4} k
  command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v srun >/dev/null ||
    skip "Slurm (slurmctld, slurmd, srun) is not installed (./dev.sh deps installs slurm-wlm)"
  [ "$(id -u)" -eq 0 ] || skip "the Slurm test cluster needs root"
  sshd_setup
  [ -n "$SSHD_NETNS" ] || skip "the Slurm test cluster needs network namespaces"
  SLURM_DIR="$BATS_TEST_TMPDIR/slurm"
  mkdir -p "$SLURM_DIR/state" "$SLURM_DIR/spool"
  # slurmctld's and slurmd's ports free now (a taken one leaves slurmctld unreachable), below
  # the kernel's range for outgoing connections (32768 up by default), which any connect made
  # meanwhile could take
  local ctl
  for _ in $(seq 50); do
    ctl=$((10000 + RANDOM % 20000))
    [ -z "$(ss -Htan "( sport = :$ctl or sport = :$((ctl + 1)) )")" ] && break # no socket on either
  done
  SLURM_NODES=$n
  {
    echo "ClusterName=ddptest"
    echo "SlurmctldHost=$(hostname -s)(10.213.$SSHD_TAG.1)"
    echo "SlurmctldPort=$ctl"
    echo "SlurmdPort=$((ctl + 1))"
    echo "SrunPortRange=$((ctl + 2))-$((ctl + 400))"
    echo "AuthType=auth/none"
    echo "CredType=cred/none"
    echo "SlurmUser=root"
    echo "SlurmdUser=root"
    echo "StateSaveLocation=$SLURM_DIR/state"
    echo "SlurmdSpoolDir=$SLURM_DIR/spool/%n"
    echo "SlurmctldPidFile=$SLURM_DIR/slurmctld.pid"
    echo "SlurmdPidFile=$SLURM_DIR/slurmd-%n.pid"
    echo "SlurmctldLogFile=$SLURM_DIR/slurmctld.log"
    echo "SlurmdLogFile=$SLURM_DIR/slurmd-%n.log"
    echo "ProctrackType=proctrack/pgid"
    echo "TaskPlugin=task/none"
    echo "SwitchType=switch/none"
    echo "MpiDefault=none"
    echo "JobAcctGatherType=jobacct_gather/none"
    echo "AccountingStorageType=accounting_storage/none"
    echo "JobCompType=jobcomp/none"
    echo "SchedulerType=sched/builtin"
    echo "SelectType=select/cons_tres"
    echo "SelectTypeParameters=CR_CPU"
    echo "SlurmdParameters=config_overrides"
    echo "ReturnToService=2"
    echo "SlurmdTimeout=10"
    echo "MessageTimeout=5"
    echo "KillWait=10" # between a job's SIGTERM and SIGKILL: ddprun's stop (stop_grace 2 s) fits
    echo "InactiveLimit=0"
    echo "MinJobAge=5"
    echo "SlurmctldDebug=info"
    echo "SlurmdDebug=info"
    for k in $(seq "$n"); do
      echo "NodeName=n$k NodeAddr=$(sshd_addr "$k") CPUs=$cpus RealMemory=1000 State=UNKNOWN"
    done
    echo "PartitionName=test Nodes=n[1-$n] Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO"
  } >"$SLURM_DIR/slurm.conf"
  export SLURM_CONF="$SLURM_DIR/slurm.conf"
  { cat /etc/hosts; for k in $(seq "$n"); do echo "$(sshd_addr "$k") n$k"; done; } >"$SLURM_DIR/hosts"
  slurmctld -i -f "$SLURM_CONF" || skip "slurmctld did not start: $(tail -n3 "$SLURM_DIR/slurmctld.log")"
  for k in $(seq "$n"); do
    sshd_make_ns "$k"
    SSHD_NODES="$SSHD_NODES $k"
    # nsenter, not `ip netns exec`: that remounts /sys, and slurmd wants the cgroup mounts
    nsenter --net="/run/netns/$(sshd_ns "$k")" unshare --uts --mount sh -c \
      "hostname n$k && mount --bind '$SLURM_DIR/hosts' /etc/hosts && exec slurmd -f '$SLURM_CONF'" ||
      skip "slurmd n$k did not start: $(tail -n3 "$SLURM_DIR/slurmd-n$k.log" 2>/dev/null)"
  done
  # up when every node is idle: 30 s at most, however long an unanswered sinfo waits
  local until=$((SECONDS + 30))
  while [ "$SECONDS" -lt "$until" ]; do
    [ "$(timeout 3 sinfo -h -N -t idle -o %N 2>/dev/null | wc -l)" -eq "$n" ] && return 0
    sleep 0.1
  done
  timeout 3 sinfo -N >&2 || true
  tail -n 20 "$SLURM_DIR"/*.log >&2
  skip "the Slurm test cluster's nodes did not come up"
}

slurm_node_addr() { sshd_addr "$1"; }

slurm_login() {
  unshare --mount sh -c 'mount --bind "$0" /etc/hosts && exec "$@"' "$SLURM_DIR/hosts" "$@"
}

slurm_kill_node() {
  ip netns pids "$(sshd_ns "$1")" | xargs -r kill -9 2>/dev/null || true
}

slurm_teardown() {
  [ -n "${SLURM_DIR:-}" ] || return 0
  timeout 5 scancel --full --quiet --user root 2>/dev/null || true
  local p
  for p in "$SLURM_DIR"/slurmd-*.pid "$SLURM_DIR"/slurmctld.pid; do
    [ -s "$p" ] && kill -9 "$(cat "$p")" 2>/dev/null || true
  done
  sshd_teardown
  SLURM_DIR=
}
