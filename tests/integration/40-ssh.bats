#!/usr/bin/env bats
# Remote nodes over SSH (libssh), against real OpenSSH sshd test hosts (tests/lib/sshd.bash:
# a network namespace per node joined by veth to a bridge, or sshd on 127.0.0.x where
# namespaces cannot be made): provisioning, host-key policy, provisioning failures, teardown,
# ddprun doctor.
load '../lib/common'
load '../lib/sshd'

FMNIST="$BUILD/ddprun-fmnist"

setup() {
  [ "$(id -u)" -eq 0 ] || skip "the sshd test hosts need root"
  [ -x /usr/sbin/sshd ] || fail "openssh-server is not installed (./dev.sh deps installs it)"
  cd "$BATS_TEST_TMPDIR"
  sshd_setup
}

teardown() {
  sshd_teardown
}

rx() { sed 's/\./\\./g' <<<"$1"; } # an address as a regular expression

@test "3 nodes x 2 ranks over SSH: the Fashion-MNIST example trains across them" {
  for k in 1 2 3; do sshd_start "$k"; done
  ssh_job job.yaml 2 1 2 3 -- "$FMNIST" --max-steps 60 --eval-every 1
  run "$DDPRUN" job.yaml
  [ "$status" -eq 0 ] || { echo "$output"; cat ssh/node*/sshd.log; return 1; }
  assert_output --partial "[$(sshd_addr 1):0] ddprun-fmnist: 6 ranks"
  if [ -n "$SSHD_NETNS" ]; then   # the nodes really were separate network namespaces
    [[ "$(sshd_addr 1)" == 10.213.* ]]
    grep -q "^$(sshd_ns 1)" <(ip netns list)
  fi
  assert_output --partial "test-acc"
  # every node's ranks ran, with their node rank, and logs came back to this machine
  for r in 0 1 2 3 4 5; do [ -e "$(ls -d logs/*)/rank-$r.log" ]; done
  grep -q "test-acc" "$(ls -d logs/*)/rank-0.log"
  run "$DDPRUN" plan job.yaml
  assert_output --partial "$(sshd_addr 3)"
  for k in 1 2 3; do only_sshd_in "$k"; done
}

@test "a store barrier job across 2 nodes reports each rank's node" {
  for k in 1 2; do sshd_start "$k"; done
  ssh_job job.yaml 2 1 2 -- "$DDPRUN" __smoke-worker
  run "$DDPRUN" job.yaml
  assert_success
  assert_output --partial "4 ranks met at the store"
  assert_output --regexp "  2 +$(rx "$(sshd_addr 2)") +exit 0"
  assert_output --regexp "  3 +$(rx "$(sshd_addr 2)") +exit 0"
}

@test "an unknown host key is refused under strict checking and accepted (and recorded) with accept-new" {
  sshd_start 1 nokh
  ssh_job job.yaml 1 1 -- "$DDPRUN" __smoke-worker
  run "$DDPRUN" job.yaml
  assert_failure 3
  a=$(sshd_addr 1)
  assert_output --partial "node '$a': the host key of $a port $SSH_PORT is not in $SSH_KH (strict_host_key_checking: yes)"
  [ ! -s "$SSH_KH" ]
  run "$DDPRUN" job.yaml --set ssh.strict_host_key_checking=accept-new
  assert_success
  grep -qF "$a" "$SSH_KH"
  run "$DDPRUN" job.yaml   # now known: strict checking passes
  assert_success
}

@test "a changed host key is refused, naming the host and the known_hosts file, even with accept-new" {
  sshd_start 1
  sshd_stop 1
  rm ssh/node1/host_ed25519 ssh/node1/host_ed25519.pub
  sshd_start 1 nokh   # same address, new key
  ssh_job job.yaml 1 1 -- "$DDPRUN" __smoke-worker
  a=$(sshd_addr 1)
  for mode in yes accept-new; do
    run "$DDPRUN" job.yaml --set ssh.strict_host_key_checking=$mode
    assert_failure 3
    assert_output --partial "node '$a': the host key of $a port $SSH_PORT has CHANGED from the one recorded in $SSH_KH; refusing to connect"
  done
}

@test "a node without sshd, a wrong user key, and a missing remote ddprun: status 3 naming the node and cause, the good node cleaned up" {
  sshd_start 1
  # node 8: nobody there
  ssh_job job.yaml 1 1 8 -- sleep 30
  SECONDS=0
  run "$DDPRUN" job.yaml
  assert_failure 3
  a=$(sshd_addr 8)
  assert_output --partial "node '$a': cannot connect to $a port $SSH_PORT"
  [ "$SECONDS" -lt 20 ]
  ! pgrep -f "^sleep 30" >/dev/null || false
  only_sshd_in 1
  # a key the nodes do not accept
  ssh-keygen -q -t ed25519 -N '' -f other_key
  ssh_job job.yaml 1 1 -- "$DDPRUN" __smoke-worker
  run "$DDPRUN" job.yaml --set ssh.identity="$PWD/other_key"
  assert_failure 3
  assert_output --partial "node '$(sshd_addr 1)': the server refused the key $PWD/other_key"
  # ddprun missing on the node
  run "$DDPRUN" job.yaml --set ssh.remote_ddprun=/nonexistent/ddprun
  assert_failure 3
  assert_output --partial "node '$(sshd_addr 1)': '/nonexistent/ddprun' was not found there"
}

@test "interrupting ddprun leaves no process of the job on any node" {
  for k in 1 2; do sshd_start "$k"; done
  marker="ddprun-ssh-test-$RANDOM$RANDOM"
  ssh_job job.yaml 2 1 2 -- /bin/sh -c 'while :; do sleep 0.2; done' "$marker"
  "$DDPRUN" job.yaml >out.txt 2>&1 &
  pid=$!
  for _ in $(seq 100); do [ "$(pgrep -fc "$marker" || true)" -ge 4 ] && break; sleep 0.1; done
  [ "$(pgrep -fc "$marker")" -ge 4 ]
  kill -INT "$pid"
  rc=0; wait "$pid" || rc=$?
  [ "$rc" -eq 130 ]
  for _ in $(seq 50); do pgrep -f "$marker" >/dev/null || break; sleep 0.1; done
  ! pgrep -f "$marker" || false
  ! pgrep -f "ddprun agent" -P "$(cat ssh/node1/sshd.pid)" || false
  for k in 1 2; do only_sshd_in "$k"; done
}

@test "SIGKILL of ddprun: the remote agents see the connection close and stop their ranks" {
  sshd_start 1
  marker="ddprun-ssh-kill-$RANDOM$RANDOM"
  ssh_job job.yaml 2 1 -- /bin/sh -c 'while :; do sleep 0.2; done' "$marker"
  "$DDPRUN" job.yaml >out.txt 2>&1 &
  pid=$!
  for _ in $(seq 100); do [ "$(pgrep -fc "$marker" || true)" -ge 2 ] && break; sleep 0.1; done
  [ "$(pgrep -fc "$marker")" -ge 2 ]
  kill -9 "$pid"
  wait "$pid" || true
  for _ in $(seq 100); do pgrep -f "$marker" >/dev/null || break; sleep 0.1; done
  ! pgrep -f "$marker" || false
  for _ in $(seq 50); do only_sshd_in 1 >/dev/null && break; sleep 0.1; done
  only_sshd_in 1
}

@test "ddprun doctor: passing nodes pass, a node without sshd and one with an unknown key fail with the reason" {
  sshd_start 1
  sshd_start 2
  sshd_start 3 nokh
  ssh_job job.yaml 1 1 2 3 8 -- "$FMNIST" --epochs 1
  run "$DDPRUN" doctor job.yaml
  assert_failure 1
  a1=$(rx "$(sshd_addr 1)") a2=$(rx "$(sshd_addr 2)") a3=$(rx "$(sshd_addr 3)") a8=$(rx "$(sshd_addr 8)")
  fm=$(sha256sum "$FMNIST" | cut -c1-8)
  # the interface: the node's own (a veth in its namespace), or lo on 127.0.0.x; the code: the
  # start of the SHA-256 of the program each node would run
  assert_line --regexp "^$a1 +ok +ok +ok +ok +ok +ok +ok +(vn[0-9]+-1|lo) +ok +$fm +pass$"
  assert_line --regexp "^$a2 +ok +ok +ok +ok +ok +ok +ok +(vn[0-9]+-2|lo) +ok +$fm +pass$"
  assert_line --regexp "^$a3 +ok +FAIL .*FAIL: the host key of $a3 port $SSH_PORT is not in $SSH_KH"
  assert_line --regexp "^$a8 +FAIL .*FAIL: cannot connect to $a8 port $SSH_PORT"
  assert_output --partial "4 nodes checked: 2 passed, 2 failed"
  # accept-new: the unknown key is reported as new, and nothing is written
  run "$DDPRUN" doctor job.yaml --set ssh.strict_host_key_checking=accept-new --set "nodes=[$(sshd_addr 3)]"
  assert_success
  assert_line --regexp "^$a3 +ok +new +ok +ok +ok +ok +ok +[a-z0-9-]+ +$fm +pass$"
  ! grep -qF "$(sshd_addr 3)" "$SSH_KH" || false
  # node 2's sessions (its sshd's, inherited) may open 300 files: under the 352 that 48 ranks
  # can take (2 per rank + 256); node 1 passes with the suite's own limit
  prlimit --pid "$(cat "$SSH_DIR/node2/sshd.pid")" --nofile=300:4096
  run "$DDPRUN" doctor job.yaml --set "nodes=[$(sshd_addr 1), $(sshd_addr 2)]" --set nproc_per_node=24
  echo "$output"
  assert_failure 1
  assert_line --regexp "^$a1 +ok +ok +ok +ok +ok +ok +ok +(vn[0-9]+-1|lo) +ok +([0-9]+|inf) +$fm +pass$"
  assert_line --regexp "^$a2 +ok +ok +ok +ok +ok +ok +ok +(vn[0-9]+-2|lo) +ok +FAIL +$fm +FAIL: its ranks may run out of open files: their soft limit is 300 \\(ulimit -n\\), under the 352 a job of 48 ranks can take .* up to the hard limit 4096 "
  # a node whose clock is 30 s ahead (libfaketime in its ranks' environment, where the
  # doctor's probe runs there) fails, naming how far; this machine's clock is the reference
  ft=/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1
  [ -e "$ft" ] || fail "libfaketime is not installed (./dev.sh deps installs it)"
  run "$DDPRUN" doctor job.yaml --set "nodes=[$(sshd_addr 1)]" \
    --set "env={LD_PRELOAD: $ft, FAKETIME: '+30', FAKETIME_DONT_FAKE_MONOTONIC: '1', ASAN_OPTIONS: 'verify_asan_link_order=0'}"
  echo "$output"
  assert_failure 1
  assert_output --regexp " +interface +clock +code +result"$'\n'
  assert_line --regexp "^$a1 +ok +ok +ok +ok +ok +ok +ok +(vn[0-9]+-1|lo) +FAIL +$fm +FAIL: its clock is (29\\.[5-9]|30\\.[0-4]) s ahead of this machine's \\(to within [0-9]+ ms\\): .* is NTP \\(chrony, systemd-timesyncd\\) running there\\?$"
  # a command missing on the node, and a ddprun of another version
  run "$DDPRUN" doctor job.yaml --set "command=[/nonexistent/trainer]" --set "nodes=[$(sshd_addr 1)]"
  assert_failure 1
  assert_output --partial "FAIL: '/nonexistent/trainer' is not an executable program there"
  # a workdir missing on the node; a program relative to the workdir, found there
  run "$DDPRUN" doctor job.yaml --set workdir=/nonexistent/wd --set "nodes=[$(sshd_addr 1)]"
  assert_failure 1
  assert_line --regexp "^$a1 +ok +ok +ok +FAIL +- .*FAIL: workdir '/nonexistent/wd' is not a folder there"
  mkdir wd && printf '#!/bin/sh\n' >wd/train.sh && chmod +x wd/train.sh
  run "$DDPRUN" doctor job.yaml --set workdir=wd --set "command=[./train.sh]" --set "nodes=[$(sshd_addr 1)]"
  assert_success
  run "$DDPRUN" doctor job.yaml --set "command=[./train.sh]" --set "nodes=[$(sshd_addr 1)]"
  assert_failure 1
  assert_output --partial "FAIL: './train.sh' is not an executable program there (from workdir $PWD)"
  # (the checks run in one session there: after a failed one, nothing else is run)
  printf '#!/bin/sh\necho "$*" >>%s/old-calls\necho "ddprun 0.0.1"\n' "$PWD" >old-ddprun
  chmod +x old-ddprun
  run "$DDPRUN" doctor job.yaml --set ssh.remote_ddprun="$PWD/old-ddprun" --set "nodes=[$(sshd_addr 1)]"
  assert_failure 1
  assert_output --partial "there is 'ddprun 0.0.1', this is ddprun"
  [ "$(cat old-calls)" = "--version" ]
  run "$DDPRUN" doctor job.yaml --set ssh.remote_ddprun=/nonexistent/ddprun --set "nodes=[$(sshd_addr 1)]"
  assert_failure 1
  assert_line --regexp "^$a1 +ok +ok +FAIL +- .*FAIL: '/nonexistent/ddprun' is missing or broken there \(exit 127\)$"
}

@test "ddprun doctor: every node reaches the others where their ranks would listen; behind a firewall between two nodes, the one that cannot reach fails naming the other" {
  [ -n "$SSHD_NETNS" ] || skip "needs network-namespace test hosts"
  command -v nft >/dev/null || fail "nftables is not installed (./dev.sh deps installs it)"
  for k in 1 2 3; do sshd_start "$k"; done
  ssh_job job.yaml 1 1 2 3 -- /bin/true
  a1=$(rx "$(sshd_addr 1)") a2=$(rx "$(sshd_addr 2)") a3=$(rx "$(sshd_addr 3)")
  run "$DDPRUN" doctor job.yaml
  assert_success
  assert_output --regexp " +interface +mesh +code +result"$'\n'
  for a in "$a1" "$a2" "$a3"; do
    assert_line --regexp "^$a +ok +ok +ok +ok +ok +ok +ok +vn[0-9]+-[0-9] +ok +[0-9a-f]{8} +pass$"
  done
  # node 2 drops what node 1 opens to it but SSH, as a firewall between compute nodes that
  # lets the login node's SSH through: node 1 reaches the store's address, not node 2's ranks
  ip netns exec "$(sshd_ns 2)" nft -f - <<NFT
table inet ddptest {
  chain input {
    type filter hook input priority 0; policy accept;
    ct state established,related accept
    ip saddr $(sshd_addr 1) tcp dport != $SSH_PORT drop
  }
}
NFT
  SECONDS=0
  run "$DDPRUN" doctor job.yaml
  echo "$output"
  assert_failure 1
  assert_line --regexp "^$a1 +ok +ok +ok +ok +ok +ok +ok +vn[0-9]+-1 +FAIL +[0-9a-f]{8} +FAIL: cannot reach '$a2' \($a2\): Connection timed out, where its ranks would listen \(a firewall between the nodes\? ranks connect to each other on any port\)$"
  # node 2's own connections to node 1 are answered; node 3 reaches both
  assert_line --regexp "^$a2 +ok +ok +ok +ok +ok +ok +ok +vn[0-9]+-2 +ok +[0-9a-f]{8} +pass$"
  assert_line --regexp "^$a3 +ok +ok +ok +ok +ok +ok +ok +vn[0-9]+-3 +ok +[0-9a-f]{8} +pass$"
  assert_output --partial "3 nodes checked: 2 passed, 1 failed"
  [ "$SECONDS" -le 20 ]
  # a job across them (rank 1 on node 1 connects to rank 0 on node 2) fails within its group's
  # timeout, naming the peer and the cause; a blocking connect waited out the SYN retries (2 min)
  ssh_job fw.yaml 1 2 1 -- "$FMNIST" --max-steps 2
  echo 'env: {DDP_PG_TIMEOUT_MS: "4000"}' >>fw.yaml
  SECONDS=0
  run "$DDPRUN" fw.yaml
  echo "$output"
  assert_failure
  # rank 1 says why it cannot connect; rank 0, which waits a second longer, names rank 1 if
  # rank 1 started its group more than that later
  assert_output --regexp "cannot connect to peer rank 0 \([^)]* at $a2:[0-9]+\): Connection timed out \(\`ddprun doctor\` checks that the nodes reach each other\)|timed out waiting for rank 1 \([^)]*\) to connect to this rank \(\`ddprun doctor\` checks that the nodes reach each other\)"
  [ "$SECONDS" -le 30 ]
  # a node that fails its own checks takes no part; one node left is no mesh
  run "$DDPRUN" doctor job.yaml --set "nodes=[$(sshd_addr 1), $(sshd_addr 8)]"
  assert_failure 1
  refute_output --partial "mesh"
  for k in 1 2 3; do only_sshd_in "$k"; done
}

@test "ddprun doctor on a Python job: each node's python and torch versions; a node with another torch, or one that fails to import, fails naming both" {
  /usr/bin/python3 -c "import torch" 2>/dev/null || skip "needs Debian's python3-torch"
  sshd_start 1
  # node 2's sessions find another torch first on their PYTHONPATH: a node set up apart
  mkdir -p other/torch && echo '__version__ = "2.1.0"' >other/torch/__init__.py
  SSHD_EXTRA_CONFIG="SetEnv PYTHONPATH=$PWD/other" sshd_start 2
  ssh_job job.yaml 1 1 2 -- /usr/bin/python3 train.py
  printf 'print(1)\n' >train.py
  ht=$(sha256sum train.py | cut -c1-8)
  want=$(/usr/bin/python3 -c 'import sys, torch; print(sys.version.split()[0], torch.__version__)')
  py=${want% *} torch=${want#* }
  run "$DDPRUN" doctor job.yaml
  assert_failure 1
  a1=$(rx "$(sshd_addr 1)") a2=$(rx "$(sshd_addr 2)")
  assert_output --regexp " +interface +mesh +python +torch +code +result"$'\n'
  assert_line --regexp "^$a1 +ok +ok +ok +ok +ok +ok +ok +[a-z0-9-]+ +ok +$py +$torch +$ht +pass$"
  assert_line --regexp "^$a2 +ok +ok +ok +ok +ok +ok +ok +[a-z0-9-]+ +ok +$py +2\.1\.0 +$ht +FAIL: python $py with torch 2\.1\.0 on this node, python $py with torch $torch on $a1: the ranks must run the same"
  # a torch that is there but fails to import (as a missing CUDA library makes it): its error
  mkdir -p broken/torch && echo 'raise ImportError("libcudnn.so.8: cannot open shared object file")' >broken/torch/__init__.py
  run env PYTHONPATH="$PWD/broken" "$DDPRUN" doctor job.yaml --set "nodes=[localhost]"
  assert_failure 1
  assert_line --regexp "^localhost +local +local +ok +ok +ok +ok +ok +[a-z0-9]+ +FAIL +- +- +FAIL: '/usr/bin/python3' fails to start, or to import torch, here: ImportError: libcudnn.so.8: cannot open shared object file$"
  # a job that is not Python has no such columns
  run "$DDPRUN" doctor job.yaml --set "command=[sleep, '1']" --set "nodes=[$(sshd_addr 1)]"
  assert_success
  refute_output --partial "python"
}

@test "ddprun doctor on a Python job: a node that cannot find a module the program imports at its top level fails, naming it" {
  /usr/bin/python3 -c "import torch" 2>/dev/null || skip "needs Debian's python3-torch"
  sshd_start 1
  # only node 2's sessions find ddp_only_here (on their PYTHONPATH)
  mkdir -p mods && echo 'x = 1' >mods/ddp_only_here.py
  SSHD_EXTRA_CONFIG="SetEnv PYTHONPATH=$PWD/mods" sshd_start 2
  ssh_job job.yaml 1 1 2 -- /usr/bin/python3 train.py
  # an optional import (in try) and one inside a function do not count
  printf 'import os, numpy\nimport ddp_only_here\ntry:\n    import not_needed_xyz\nexcept ImportError:\n    pass\ndef f():\n    import nor_this_xyz\n' >train.py
  run "$DDPRUN" doctor job.yaml
  assert_failure 1
  a1=$(rx "$(sshd_addr 1)") a2=$(rx "$(sshd_addr 2)")
  assert_line --regexp "^$a1 .* FAIL: '/usr/bin/python3' there cannot import ddp_only_here, which the program imports at its top level: its ranks would fail at once \(install it there, or run the job with the interpreter that has it\)$"
  assert_line --regexp "^$a2 .* pass$"
  # here, and for python -m
  run "$DDPRUN" doctor job.yaml --set "nodes=[localhost]" --set 'command=[/usr/bin/python3, -m, train]'
  assert_failure 1
  assert_output --partial "FAIL: '/usr/bin/python3' here cannot import ddp_only_here, which the program imports at its top level"
  run env PYTHONPATH="$PWD/mods" "$DDPRUN" doctor job.yaml --set "nodes=[localhost]" --set 'command=[/usr/bin/python3, -m, train]'
  assert_success
}

@test "ddprun doctor on a local job checks the workdir, the command (from the workdir) and the store address" {
  printf 'command: [/nonexistent/x]\n' >job.yaml
  run "$DDPRUN" doctor job.yaml
  assert_failure 1
  assert_line --regexp "^localhost +local +local +ok +ok +FAIL"
  printf 'command: [sleep, "1"]\n' >job.yaml
  run "$DDPRUN" doctor job.yaml
  assert_success
  assert_line --regexp "^localhost +local +local +ok +ok +ok +ok +ok +lo +$(sha256sum "$(command -v sleep)" | cut -c1-8) +pass$"
  # the program relative to the workdir, which is relative to the job file's folder
  mkdir -p sub/wd && printf '#!/bin/sh\n' >sub/wd/t.sh && chmod +x sub/wd/t.sh
  printf 'command: [./t.sh]\nworkdir: wd\n' >sub/job.yaml
  run "$DDPRUN" doctor sub/job.yaml
  assert_success
  assert_line --regexp "^localhost .* +$(sha256sum sub/wd/t.sh | cut -c1-8) +pass$"
  # a Python job's script after python's options (values attached or not); none for -c
  printf 'print(1)\n' >sub/wd/s.py
  printf 'command: [/usr/bin/python3, -X, dev, -Wignore, -uB, --check-hash-based-pycs, never, s.py, -c]\nworkdir: wd\n' >sub/job.yaml
  run "$DDPRUN" doctor sub/job.yaml
  assert_line --regexp "^localhost .* +$(sha256sum sub/wd/s.py | cut -c1-8) +pass$"
  printf 'command: [/usr/bin/python3, -uc, "print(1)"]\n' >job.yaml
  run "$DDPRUN" doctor job.yaml
  assert_success
  refute_output --partial "code"
  refute_output --partial "nofile"
  # the ranks' limit on open files, against 2 per rank + 256: 16 ranks take 288
  printf 'command: [sleep, "1"]\nnproc_per_node: 16\n' >job.yaml
  run bash -c 'ulimit -Sn 287 && exec "$0" doctor job.yaml' "$DDPRUN"
  echo "$output"
  assert_failure 1
  assert_output --regexp " +interface +nofile +code +result"$'\n'
  assert_line --regexp "^localhost +local +local +ok +ok +ok +ok +ok +lo +FAIL +[0-9a-f]{8} +FAIL: its ranks may run out of open files: their soft limit is 287 \(ulimit -n\), under the 288 a job of 16 ranks can take \(2 per rank, a connection to each other, \+ 256\); raise it to at least that, up to the hard limit ([0-9]+|unlimited) \(ulimit -n 288 before ddprun, or limits.conf for SSH sessions\)$"
  run bash -c 'ulimit -Sn 288 && exec "$0" doctor job.yaml' "$DDPRUN"
  assert_success
  refute_output --partial "nofile"
}

@test "ddprun doctor: the code each node would run, hashed there under the ranks' environment; a node with another fails naming both" {
  mkdir a b
  printf '#!/bin/sh\necho a\n' >a/train.sh
  printf '#!/bin/sh\necho b\n' >b/train.sh
  chmod +x a/train.sh b/train.sh
  # each node's sessions find train.sh in a folder of their own on PATH
  SSHD_EXTRA_CONFIG="SetEnv PATH=$PWD/a:/usr/bin:/bin" sshd_start 1
  SSHD_EXTRA_CONFIG="SetEnv PATH=$PWD/b:/usr/bin:/bin" sshd_start 2
  ssh_job job.yaml 1 1 2 -- train.sh
  a1=$(rx "$(sshd_addr 1)") a2=$(rx "$(sshd_addr 2)")
  ha=$(sha256sum a/train.sh | cut -c1-16) hb=$(sha256sum b/train.sh | cut -c1-16)
  # PATH goes from here to remote ranks (the export rule): every node would run b's
  run env PATH="$PWD/b:$PATH" "$DDPRUN" doctor job.yaml
  assert_success
  assert_line --regexp "^$a1 +ok +ok +ok +ok +ok +ok +ok +[a-z0-9-]+ +ok +${hb:0:8} +pass$"
  assert_line --regexp "^$a2 +ok +ok +ok +ok +ok +ok +ok +[a-z0-9-]+ +ok +${hb:0:8} +pass$"
  # and the job's env over it
  run env PATH="$PWD/b:$PATH" "$DDPRUN" doctor job.yaml --set "env.PATH=$PWD/a:/usr/bin:/bin"
  assert_success
  assert_line --regexp "^$a2 +ok +ok +ok +ok +ok +ok +ok +[a-z0-9-]+ +ok +${ha:0:8} +pass$"
  # without PATH exported each node's own: node 2 would run another train.sh
  run "$DDPRUN" doctor job.yaml --set 'export=["-PATH"]'
  assert_failure 1
  assert_line --regexp "^$a1 +ok +ok +ok +ok +ok +ok +ok +[a-z0-9-]+ +ok +${ha:0:8} +pass$"
  assert_line --regexp "^$a2 +ok +ok +ok +ok +ok +ok +ok +[a-z0-9-]+ +ok +${hb:0:8} +FAIL: 'train\.sh' on this node is not the one on $a1 \(SHA-256 $hb\.\.\., there $ha\.\.\.\): every node must run the same code$"
  # a Python job: the script, from the workdir; one that is not there fails each node. (The
  # python column's import of torch, 2-5 s a node, is of a stand-in first on the ranks'
  # PYTHONPATH: the torch checks have a test of their own, above.)
  mkdir -p fake/torch && echo '__version__ = "0.0"' >fake/torch/__init__.py
  export PYTHONPATH=$PWD/fake
  printf 'print(1)\n' >t.py
  run "$DDPRUN" doctor job.yaml --set "command=[/usr/bin/python3, -W, ignore, -u, t.py]"
  assert_success
  assert_line --regexp "^$a2 +ok .* +0\.0 +$(sha256sum t.py | cut -c1-8) +pass$"
  run "$DDPRUN" doctor job.yaml --set "command=[/usr/bin/python3, missing.py]"
  assert_failure 1
  for a in "$a1" "$a2"; do
    assert_line --regexp "^$a +ok .* +FAIL +FAIL: 'missing\.py' cannot be read there \(from workdir $(rx "$PWD")\): No such file or directory$"
  done
  # python -m: a module the interpreter finds, no code column
  run "$DDPRUN" doctor job.yaml --set "command=[/usr/bin/python3, -m, json.tool]"
  refute_output --partial "code"
}

# A ddprun for the nodes that hangs on node 2 (it never answers, never reads its stdin) and is
# the real one elsewhere; the hung process carries $marker.
hang_on_node2() { # marker
  cat >hang.sh <<SH
#!/bin/sh
case "\$SSH_CONNECTION" in
*" $(sshd_addr 2) "*) exec /bin/sh -c 'while :; do sleep 0.2; done' hung-$1 ;;
esac
exec $DDPRUN "\$@"
SH
  chmod +x hang.sh
}

@test "a node that hangs on start: SIGINT ends ddprun at once (no worker of the job runs there yet), status 130, the hung process killed" {
  for k in 1 2; do sshd_start "$k"; done
  marker="ddprun-hang-$RANDOM$RANDOM"
  hang_on_node2 "$marker"
  ssh_job job.yaml 1 1 2 -- /bin/sh -c 'while :; do sleep 0.2; done' "$marker-rank"
  "$DDPRUN" job.yaml --set ssh.remote_ddprun="$PWD/hang.sh" >out.txt 2>&1 &
  pid=$!
  for _ in $(seq 100); do pgrep -f "hung-$marker" >/dev/null && grep -q node_joined logs/*/events.jsonl 2>/dev/null && break; sleep 0.1; done
  pgrep -f "hung-$marker"
  SECONDS=0
  kill -INT "$pid"
  rc=0; wait "$pid" || rc=$?
  cat out.txt
  [ "$rc" -eq 130 ]
  echo "ended after $SECONDS s"
  # not after stop_grace (2 s) + 5 s for agents to report, as for a node running workers
  [ "$SECONDS" -le 5 ]
  grep -q "node '$(rx "$(sshd_addr 2)")': ddprun is ending the node; killing what runs there" out.txt
  for _ in $(seq 50); do pgrep -f "$marker" >/dev/null || break; sleep 0.1; done
  ! pgrep -f "$marker" || false
  for k in 1 2; do only_sshd_in "$k"; done
}

# Processes whose command line has $1, less forks of them that have not exec'd yet (a shell
# loop's child shows its parent's command line until it runs sleep).
count_procs() {
  local all p n=0
  all=" $(pgrep -f "$1" | tr '\n' ' ') "
  for p in $all; do
    [[ "$all" == *" $(ps -o ppid= -p "$p" 2>/dev/null | tr -d ' ') "* ]] || n=$((n + 1))
  done
  echo "$n"
}

@test "a second signal while stopping ends at once, killing remote ranks that ignore the first; the rendezvous timeout names the nodes that never joined" {
  for k in 1 2; do sshd_start "$k"; done
  marker="ddprun-stubborn-$RANDOM$RANDOM"
  # ranks that ignore SIGINT and SIGTERM: only the end of stop_grace (SIGKILL) or a second
  # signal to ddprun ends them
  ssh_job job.yaml 1 1 2 -- /bin/sh -c 'trap "" INT TERM; while :; do sleep 0.2; done' "$marker-rank"
  "$DDPRUN" job.yaml --set stop_grace=60s >out.txt 2>&1 &
  pid=$!
  for _ in $(seq 100); do [ "$(count_procs "$marker-rank")" -ge 2 ] && break; sleep 0.1; done
  [ "$(count_procs "$marker-rank")" -eq 2 ]
  kill -INT "$pid"
  sleep 1
  kill -0 "$pid"   # in its 60 s grace
  [ "$(count_procs "$marker-rank")" -eq 2 ]
  SECONDS=0
  kill -TERM "$pid"
  rc=0; wait "$pid" || rc=$?
  cat out.txt
  [ "$rc" -eq 130 ]
  [ "$SECONDS" -le 8 ]
  for _ in $(seq 50); do pgrep -f "$marker" >/dev/null || break; sleep 0.1; done
  ! pgrep -f "$marker" || false
  # the rendezvous timeout: status 3 naming the node and what is known of it, at once
  marker="ddprun-hang-$RANDOM$RANDOM"
  hang_on_node2 "$marker"
  ssh_job job.yaml 1 1 2 -- /bin/sh -c 'while :; do sleep 0.2; done' "$marker-rank"
  rm -rf logs
  SECONDS=0
  run "$DDPRUN" job.yaml --set ssh.remote_ddprun="$PWD/hang.sh" --set rendezvous.timeout=2s
  assert_failure 3
  assert_output --partial "round 0 cannot start: only 1 of the 2 nodes elastic.min_nodes needs joined within 2 s (rendezvous.timeout); not joined: '$(sshd_addr 2)' (started, no answer)"
  [ "$SECONDS" -le 6 ] # 2 s, not 2 + stop_grace + 5
  for _ in $(seq 50); do pgrep -f "$marker" >/dev/null || break; sleep 0.1; done
  ! pgrep -f "$marker" || false
  for k in 1 2; do only_sshd_in "$k"; done
}

@test "ddprun doctor: the GPUs each node's ranks would see; backend nccl fails a node with fewer than its slots" {
  "$DDPRUN" plan --nproc 1 --no-python --set backend=nccl /bin/true >/dev/null 2>&1 || skip "built without NCCL"
  # node 1's sessions see no GPU, node 2's two (as its sshd sets them for the sessions)
  SSHD_EXTRA_CONFIG="SetEnv CUDA_VISIBLE_DEVICES=-1" sshd_start 1
  SSHD_EXTRA_CONFIG="SetEnv CUDA_VISIBLE_DEVICES=0,1" sshd_start 2
  ssh_job job.yaml 2 1 2 -- /bin/true
  a1=$(rx "$(sshd_addr 1)") a2=$(rx "$(sshd_addr 2)")
  run "$DDPRUN" doctor job.yaml --set backend=nccl
  assert_failure 1
  assert_output --regexp " +interface +mesh +gpus +code +result"$'\n'
  assert_line --regexp "^$a1 +ok +ok +ok +ok +ok +ok +ok +[a-z0-9-]+ +ok +FAIL +[0-9a-f]{8} +FAIL: 0 GPUs visible there for its 2 ranks \(backend: nccl takes a GPU per rank; "
  assert_line --regexp "^$a2 +ok +ok +ok +ok +ok +ok +ok +[a-z0-9-]+ +ok +2 +[0-9a-f]{8} +pass$"
  # 3 slots on node 2: one GPU short
  run "$DDPRUN" doctor job.yaml --set backend=nccl --set "nodes=[{host: $(sshd_addr 2), slots: 3}]"
  assert_failure 1
  assert_output --partial "FAIL: 2 GPUs visible there for its 3 ranks"
  # a CPU job: the count is shown (a node has GPUs), nothing fails on it
  run "$DDPRUN" doctor job.yaml
  assert_success
  assert_line --regexp "^$a1 +ok +ok +ok +ok +ok +ok +ok +[a-z0-9-]+ +ok +0 +[0-9a-f]{8} +pass$"
  # and not shown where no node has any
  run "$DDPRUN" doctor job.yaml --set "nodes=[$(sshd_addr 1)]"
  assert_success
  refute_output --partial "gpus"
}

@test "nproc_per_node gpu|auto counted on each node by its agent, as torchrun counts: 2 ranks on a node with 2 GPUs, 1 on a node with 1; the job's env before the node's; a node without a GPU refused naming it" {
  SSHD_EXTRA_CONFIG="SetEnv CUDA_VISIBLE_DEVICES=0,1" sshd_start 1
  SSHD_EXTRA_CONFIG="SetEnv CUDA_VISIBLE_DEVICES=3" sshd_start 2
  ssh_job job.yaml 1 1 2 -- /bin/sh -c 'echo "rank=$RANK local=$LOCAL_RANK of $LOCAL_WORLD_SIZE world=$WORLD_SIZE node=$GROUP_RANK cvd=$CUDA_VISIBLE_DEVICES"'
  sed -i 's/, slots: 1}/}/' job.yaml   # no slots of their own: nproc_per_node counts them
  a1=$(rx "$(sshd_addr 1)") a2=$(rx "$(sshd_addr 2)")
  run env -u CUDA_VISIBLE_DEVICES -u SLURM_GPUS_ON_NODE "$DDPRUN" plan job.yaml --set nproc_per_node=gpu
  assert_success
  assert_line --regexp "^  - \{host: $a1, slots: gpu\}   # counted there by its agent$"
  assert_line "world_size: <the nodes' counts added up>"
  run env -u CUDA_VISIBLE_DEVICES -u SLURM_GPUS_ON_NODE "$DDPRUN" job.yaml --set nproc_per_node=gpu
  echo "$output"
  assert_success
  assert_line --regexp "^ddprun: round 0: 2 nodes \($a1, $a2\), 3 ranks$"
  assert_line --regexp "^\[$a1:0\] rank=0 local=0 of 2 world=3 node=0 cvd=0,1$"
  assert_line --regexp "^\[$a1:1\] rank=1 local=1 of 2 world=3 node=0 cvd=0,1$"
  assert_line --regexp "^\[$a2:2\] rank=2 local=0 of 1 world=3 node=1 cvd=3$"
  grep -q '"event": "node_counted", "round": 0, "node": "'"$(sshd_addr 2)"'", "nproc_per_node": "gpu", "slots": 1}' logs/*/events.jsonl
  assert_line --regexp "^ddprun: job [^ ]+: a rank per GPU on each of 2 nodes, store on "
  # the job's env is what the ranks see, on every node: 3 devices each
  rm -rf logs
  run env -u CUDA_VISIBLE_DEVICES -u SLURM_GPUS_ON_NODE "$DDPRUN" job.yaml --set nproc_per_node=gpu --set 'env={CUDA_VISIBLE_DEVICES: "4,5,6"}'
  assert_success
  assert_output --partial "6 ranks"
  assert_line --regexp "^\[$a2:5\] rank=5 local=2 of 3 world=6 node=1 cvd=4,5,6$"
  # a node whose ranks see no GPU: auto gives it a rank per CPU there, gpu refuses it
  rm -rf logs
  run env -u CUDA_VISIBLE_DEVICES -u SLURM_GPUS_ON_NODE "$DDPRUN" job.yaml --set nproc_per_node=auto --set 'env={CUDA_VISIBLE_DEVICES: ""}'
  assert_success
  assert_output --partial "$((2 * $(nproc))) ranks"
  rm -rf logs
  run env -u CUDA_VISIBLE_DEVICES -u SLURM_GPUS_ON_NODE "$DDPRUN" job.yaml --set nproc_per_node=gpu --set 'env={CUDA_VISIBLE_DEVICES: "-1"}'
  echo "$output"
  assert_failure
  # both nodes see none: the first to say so is named, and the round cannot start without it
  assert_output --regexp "ddprun: error: the agent on '($a1|$a2)' sees no GPU there for nproc_per_node: gpu \(SLURM_GPUS_ON_NODE, CUDA_VISIBLE_DEVICES, /proc/driver/nvidia/gpus, as its ranks would see them\): give the number of ranks per node"
  refute_output --partial "rank="
  for k in 1 2; do only_sshd_in "$k"; done
  # ddprun doctor says so before a launch: the GPUs each node's ranks would see
  run env -u CUDA_VISIBLE_DEVICES -u SLURM_GPUS_ON_NODE "$DDPRUN" doctor job.yaml --set nproc_per_node=gpu
  assert_success
  assert_line --regexp "^$a2 +ok +ok +ok +ok +ok +ok +ok +[a-z0-9-]+ +ok +1 +[0-9a-f]{8} +pass$"
  run env -u CUDA_VISIBLE_DEVICES -u SLURM_GPUS_ON_NODE "$DDPRUN" doctor job.yaml --set nproc_per_node=gpu --set 'env={CUDA_VISIBLE_DEVICES: "-1"}'
  assert_failure 1
  assert_line --regexp "^$a1 +ok +ok +ok +ok +ok +ok +ok +[a-z0-9-]+ +ok +FAIL +[0-9a-f]{8} +FAIL: no GPU visible there for nproc_per_node: gpu "
  # an agent that counts nothing (a ddprun before the counts): refused, naming why
  fake_agent ranks
  rm -rf logs
  run timeout 60 env -u CUDA_VISIBLE_DEVICES "$DDPRUN" job.yaml --set nproc_per_node=gpu --set "nodes=[$(sshd_addr 1)]" --set ssh.remote_ddprun="$PWD/fake-ranks.sh"
  echo "$output"
  assert_failure
  assert_output --partial "ddprun: error: the agent on '$(sshd_addr 1)' did not count its node's GPUs and CPUs for nproc_per_node: gpu (a ddprun older than this one"
  refute_output --partial "hello from the fake agent"
}

# The agent's side of the launcher-agent protocol played by tests/integration/py/fake_agent.py.
fake_agent() { # mode
  printf '#!/bin/sh\nFAKE_AGENT_MODE=%s exec /usr/bin/python3 %s\n' "$1" "$REPO/tests/integration/py/fake_agent.py" >fake-$1.sh
  chmod +x fake-$1.sh
}

@test "malformed frames from an agent: rank frames out of range, truncated or unknown are ignored; a frame over the size limit ends the node, saying so" {
  [ -x /usr/bin/python3 ] || fail "Debian's python3 is missing"
  sshd_start 1
  ssh_job job.yaml 1 1 -- /bin/true
  fake_agent ranks
  run timeout 60 "$DDPRUN" job.yaml --set ssh.remote_ddprun="$PWD/fake-ranks.sh"
  echo "$output"
  assert_success
  a1=$(rx "$(sshd_addr 1)")
  assert_line --regexp "^\[$a1:0\] hello from the fake agent$"
  assert_line --regexp "^\[$a1:0\] still running$"  # no out-of-range EXITED ended the job
  refute_output --partial "EVIL"
  assert_output --regexp "job [^ ]+ succeeded after [0-9.]+ s \(1 rank on 1 node\)"
  assert_line --regexp "^ddprun: round 0: 1 node \($a1\), 1 rank$"
  # a frame longer than the protocol allows (1 MiB): the node is ended, the job fails
  fake_agent length
  rm -rf logs
  SECONDS=0
  run timeout 60 "$DDPRUN" job.yaml --set ssh.remote_ddprun="$PWD/fake-length.sh"
  echo "$output"
  [ "$status" -ne 0 ] && [ "$status" -ne 124 ]
  assert_output --partial "ddprun: error: bad frame from the agent on '$(sshd_addr 1)'; ending it"
  [ "$SECONDS" -le 15 ]
  for _ in $(seq 50); do pgrep -f fake_agent.py >/dev/null || break; sleep 0.1; done
  ! pgrep -f fake_agent.py || false
  only_sshd_in 1
}

@test "an agent of another ddprun (older, without HELLO; or another protocol) is refused, naming both versions; nothing is left" {
  [ -x /usr/bin/python3 ] || fail "Debian's python3 is missing"
  sshd_start 1
  ssh_job job.yaml 1 1 -- /bin/true
  v=$("$DDPRUN" --version | cut -d' ' -f2)
  fake_agent old
  run timeout 60 "$DDPRUN" job.yaml --set ssh.remote_ddprun="$PWD/fake-old.sh"
  echo "$output"
  [ "$status" -ne 0 ] && [ "$status" -ne 124 ]
  assert_output --partial "ddprun: error: the agent on '$(sshd_addr 1)' did not say its version first: a ddprun older than this one ($v) runs there; the same ddprun must run on every node (ssh.remote_ddprun names the one over SSH; \`ddprun doctor\` compares them)"
  refute_output --partial "hello from the fake agent" # refused before any round
  assert_output --partial "'$(sshd_addr 1)' at 20"
  assert_output --regexp "\(\+[0-9.]+ s, round 0\): its agent did not say its version first: a ddprun older than this one \($v\) runs there"
  fake_agent other
  run timeout 60 "$DDPRUN" job.yaml --set ssh.remote_ddprun="$PWD/fake-other.sh"
  echo "$output"
  [ "$status" -ne 0 ] && [ "$status" -ne 124 ]
  assert_output --partial "ddprun: error: the agent on '$(sshd_addr 1)' is ddprun 9.9.9 (agent protocol 99), this is ddprun $v (protocol 7); the same ddprun must run on every node"
  assert_output --partial "round 0): its agent is ddprun 9.9.9 (agent protocol 99), this is ddprun $v (protocol 7)"
  refute_output --partial "did not say its version first" # its JOINED after the refusal: dropped
  refute_output --partial "hello from the fake agent"
  for _ in $(seq 50); do pgrep -f fake_agent.py >/dev/null || break; sleep 0.1; done
  ! pgrep -f fake_agent.py || false
  only_sshd_in 1
}

@test "malformed frames from a launcher: the agent exits at once with status 3, naming the cause, whatever it is sent" {
  # tests/helpers/agentfeed plays the launcher's end of the link: BOOT on the agent's stdin, the
  # handshake on the connection the agent dials back, then the bytes given, sealed
  AGENTFEED="$BUILD/tests/agentfeed"
  agent_fed() { # bytes (printf format) [agentfeed options] -> status, output: the agent's
    local t0=$SECONDS bytes=$1
    shift
    printf "$bytes" >frames.bin
    status=0; timeout 20 "$AGENTFEED" "$@" frames.bin -- "$DDPRUN" agent >hello.bin 2>err.txt || status=$?
    output=$(cat err.txt)
    echo "fed '$bytes' ($*): status $status after $((SECONDS - t0)) s: $output"
    [ "$status" -eq 3 ] # a launch error (124: it waited for more)
  }
  agent_fed '\x00\x00\x00\x00'                # a frame of length 0
  assert_output "ddprun agent: bad frame from the launcher"
  agent_fed '\x02\x00\x10\x00\x03'            # 1 MiB + 2: over the limit
  assert_output "ddprun agent: bad frame from the launcher"
  # HELLO first (protocol 7, version "t"), as every launcher since protocol 2 sends it
  H='\x0a\x00\x00\x00\x08\x07\x00\x00\x00\x01\x00\x00\x00t'
  agent_fed '\x05\x00\x00\x00\x03\xff\xff\xff\x7f'  # JOIN first: a launcher older than HELLO
  assert_output "ddprun agent: the launcher did not say its version first (a ddprun older than this one, $("$DDPRUN" --version | cut -d' ' -f2)?): run the same ddprun on every node"
  agent_fed '\x05\x00\x00\x00\x08\x03\x00\x00\x00'  # HELLO without its version
  assert_output "ddprun agent: malformed HELLO from the launcher"
  agent_fed '\x09\x00\x00\x00\x08\x03\x00\x00\x00\x01\x00\x00\x00'  # an empty version
  assert_output "ddprun agent: malformed HELLO from the launcher"
  # another protocol: the launcher, which said HELLO, names the mismatch (from the agent's)
  agent_fed '\x0a\x00\x00\x00\x08\x63\x00\x00\x00\x01\x00\x00\x00t'
  assert_output ""
  agent_fed "$H"'\x01\x00\x00\x00\x55'            # an unknown type
  assert_output "ddprun agent: unexpected frame 85 from the launcher"
  agent_fed "$H"'\x05\x00\x00\x00\x03\xff\xff\xff\x7f'  # JOIN whose first string claims 2 GiB
  assert_output "ddprun agent: malformed JOIN from the launcher"
  agent_fed "$H"'\x01\x00\x00\x00\x01'            # START before any JOIN
  assert_output "ddprun agent: unexpected frame 1 from the launcher"
  agent_fed "$H$H"                             # HELLO twice
  assert_output "ddprun agent: unexpected frame 8 from the launcher"
  agent_fed "$H"'\x05\x00\x00\x00\x07\x00\x00\x00\x00'  # ACK with 4 bytes, not 8
  assert_output "ddprun agent: malformed ACK from the launcher"
  agent_fed "$H"'\x09\x00\x00\x00\x07\x01\x00\x00\x00\x00\x00\x00\x00'  # ACK of a line never sent
  assert_output "ddprun agent: malformed ACK from the launcher"
  agent_fed "$H"'\x05\x00\x00\x00\x0c\x07\x00\x00\x00'  # the SSH tree's SPAWN, truncated
  assert_output "ddprun agent: malformed frame 12 (the SSH tree's) from the launcher"
  agent_fed "$H"'\x0a\x00\x00\x00\x0d\x07\x00\x00\x00\x01\x00\x00\x00\x09'  # UNSPAWN at level 9
  assert_output "ddprun agent: malformed frame 13 (the SSH tree's) from the launcher"
  # before the link: what the launcher writes on stdin must be BOOT, whole, and the launcher at
  # the address it gives must prove the token; an agent that reaches none names each address
  printf '\x0a\x00\x00\x00\x08\x03\x00\x00\x00\x01\x00\x00\x00t' >boot.bin
  agent_fed '' --boot boot.bin
  assert_output "ddprun agent: the launcher's first frame is not BOOT (a ddprun older than this one, $("$DDPRUN" --version | cut -d' ' -f2)?): run the same ddprun on every node"
  printf '\x09\x00\x00\x00\x09\xff\xff\xff\x7f\x00\x00\x00\x00' >boot.bin
  agent_fed '' --boot boot.bin
  assert_output "ddprun agent: bad BOOT frame from the launcher"
  printf '\x40\x00\x00\x00\x09' >boot.bin
  agent_fed '' --boot boot.bin
  assert_output "ddprun agent: stdin ended inside the launcher's first frame"
  agent_fed '' --wrong-token
  assert_output --regexp "^ddprun agent: cannot reach the launcher at any address it offered: 127\.0\.0\.1:[0-9]+ \(it did not prove the job's token \(another job's launcher\?\)\)$"
  agent_fed '' --addrs '127.0.0.1:1,[::1]:1,no-such-host.invalid:7'
  assert_output "ddprun agent: cannot reach the launcher at any address it offered: 127.0.0.1:1 (Connection refused), [::1]:1 (Connection refused), no-such-host.invalid:7 ($(getent ahosts no-such-host.invalid >/dev/null || echo 'Name or service not known'))"
  # stdin /dev/null: no launcher said where to dial back
  run timeout 10 "$DDPRUN" agent </dev/null
  assert_failure 3
  assert_output "ddprun agent: stdin ended before the launcher said where to dial back (an agent is started by ddprun, or joins a job with --join)"
  # the agent's own first frame is its HELLO: protocol 7, its version, and what its node gives
  # ranks: SLURM_GPUS_ON_NODE unset (-1), CUDA_VISIBLE_DEVICES's 2 devices, the driver's GPUs,
  # 1 CPU in its affinity (little-endian i32, i32, u32, u32); then a port free here (u32)
  v=$("$DDPRUN" --version | cut -d' ' -f2)
  le32() { printf '%08x' "$1" | sed 's/\(..\)\(..\)\(..\)\(..\)/\4\3\2\1/'; }
  drv=$(ls /proc/driver/nvidia/gpus 2>/dev/null | wc -l)
  : >frames.bin
  st=0; env -u SLURM_GPUS_ON_NODE CUDA_VISIBLE_DEVICES=0,1 timeout 20 taskset -c "$(first_cpu)" "$AGENTFEED" --close frames.bin -- "$DDPRUN" agent >hello.bin 2>err.txt || st=$?
  [ "$st" = 3 ] # the link closed before JOIN: told nothing
  od -An -tx1 -v hello.bin | tr -d ' \n' >hello.hex
  exp=$(le32 $((1 + 4 + 4 + ${#v} + 20)))8807000000$(le32 ${#v})$(printf '%s' "$v" | od -An -tx1 | tr -d ' \n')ffffffff$(le32 2)$(le32 "$drv")$(le32 1)
  got=$(cat hello.hex)
  echo "agent's first bytes: $got, expected $exp and a port"
  [ "${got:0:${#exp}}" = "$exp" ] && [ "${#got}" -eq $((${#exp} + 8)) ]
  # the port, for rank 0's TCPStore should this node be node 0: outside the kernel's range for
  # outgoing connections where ports lie outside it (as MASTER_PORT is drawn: cli/sys/sys.c)
  p=${got:${#exp}:8}
  port=$((16#${p:6:2}${p:4:2}${p:2:2}${p:0:2}))
  read -r lo hi </proc/sys/net/ipv4/ip_local_port_range
  [ "$port" -ge 1 ] && [ "$port" -le 65535 ]
  if [ $((lo - 10000)) -ge 1000 ] || [ $((65535 - hi)) -ge 1000 ]; then
    [ "$port" -lt "$lo" ] || [ "$port" -gt "$hi" ]
  fi
}

@test "signals across SSH: SIGUSR1 reaches remote ranks, the first SIGINT reaches them as SIGINT" {
  for k in 1 2; do sshd_start "$k"; done
  cat >sig.sh <<'SH'
#!/bin/bash
for s in INT USR1; do trap "echo got $s" $s; done
echo up
while :; do sleep 0.05; done
SH
  chmod +x sig.sh
  ssh_job job.yaml 1 1 2 -- "$PWD/sig.sh"
  "$DDPRUN" job.yaml >out.txt 2>&1 &
  pid=$!
  for _ in $(seq 100); do [ "$(grep -c '] up' out.txt)" -eq 2 ] && break; sleep 0.1; done
  kill -USR1 "$pid"
  for _ in $(seq 100); do [ "$(grep -c 'got USR1' out.txt)" -eq 2 ] && break; sleep 0.1; done
  kill -INT "$pid"
  rc=0; wait "$pid" || rc=$?
  cat out.txt
  [ "$rc" -eq 130 ]
  for k in 1 2; do
    grep -q "^\[$(rx "$(sshd_addr $k)"):$((k - 1))\] got USR1" out.txt
    grep -q "^\[$(rx "$(sshd_addr $k)"):$((k - 1))\] got INT" out.txt
  done
  for k in 1 2; do only_sshd_in "$k"; done
}

@test "the launching shell's environment reaches remote ranks by the export rule" {
  sshd_start 1
  mkdir venv-bin
  printf '#!/bin/sh\necho "from the venv"\n' >venv-bin/venvtool
  chmod +x venv-bin/venvtool
  ssh_job job.yaml 1 1 -- /bin/sh -c 'venvtool; echo "NCCL_DEBUG=${NCCL_DEBUG:-unset} FOO=${FOO:-unset} WANDB_MODE=${WANDB_MODE:-unset}"'
  # the defaults: PATH (an activated virtualenv) and NCCL_* go, FOO and WANDB_* do not
  PATH="$PWD/venv-bin:$PATH" NCCL_DEBUG=INFO FOO=bar WANDB_MODE=offline run "$DDPRUN" job.yaml
  assert_success
  assert_output --partial ":0] from the venv"
  assert_output --partial ":0] NCCL_DEBUG=INFO FOO=unset WANDB_MODE=unset"
  # export adds and removes patterns; the job's env wins over the shell
  PATH="$PWD/venv-bin:$PATH" NCCL_DEBUG=INFO WANDB_MODE=offline run "$DDPRUN" job.yaml \
    --set 'export=[WANDB_*, -NCCL_DEBUG]'
  assert_output --partial ":0] NCCL_DEBUG=unset FOO=unset WANDB_MODE=offline"
  PATH="$PWD/venv-bin:$PATH" NCCL_DEBUG=INFO run "$DDPRUN" job.yaml --set env.NCCL_DEBUG=WARN
  assert_output --partial ":0] NCCL_DEBUG=WARN"
  # plan says what the remote ranks get
  PATH="$PWD/venv-bin:$PATH" NCCL_DEBUG=INFO run "$DDPRUN" plan job.yaml
  assert_line "NCCL_DEBUG=INFO"
  assert_line "PATH=$PWD/venv-bin:$PATH"
}

@test "a secret the job exports (HF_TOKEN) reaches the remote ranks, and no byte of it crosses the test network in the clear" {
  [ -n "$SSHD_NETNS" ] || skip "needs the test hosts' bridge to capture on"
  for k in 1 2; do sshd_start "$k"; done
  secret="hf_$(openssl rand -hex 24)"
  # each rank proves it has the secret without printing it (its output travels on the link too)
  ssh_job job.yaml 1 1 2 -- /bin/sh -c 'echo "token sha256 $(printf %s "$HF_TOKEN" | sha256sum | cut -c1-16)"'
  # everything on the bridge while the job runs, every frame whole (AF_PACKET)
  /usr/bin/python3 - "ddpbr$SSHD_TAG" >capture.bin <<'PY' &
import os, socket, sys, time
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(3))
s.bind((sys.argv[1], 0))
s.settimeout(0.2)
open("capture.ready", "w").close()
end = time.time() + 30
while time.time() < end:
    try:
        sys.stdout.buffer.write(s.recv(65535))
    except socket.timeout:
        pass
    if os.path.exists("capture.stop"):
        break
PY
  cap=$!
  for _ in $(seq 50); do [ -e capture.ready ] && break; sleep 0.1; done
  HF_TOKEN=$secret run "$DDPRUN" job.yaml
  touch capture.stop
  wait "$cap"
  assert_success
  want=$(printf %s "$secret" | sha256sum | cut -c1-16)
  [ "$(grep -c "\] token sha256 $want$" <<<"$output")" -eq 2 ]
  # the capture saw the job's payloads (SSH's banner is sent in the clear), and not the secret
  [ "$(stat -c %s capture.bin)" -gt 10000 ]
  grep -qaF "SSH-2.0-" capture.bin
  ! grep -qaF "$secret" capture.bin || false
  ! grep -qaF "${secret:3:16}" capture.bin || false
}

@test "rendezvous.torch_store: rank0 with node 0 over SSH: MASTER_PORT is free on node 0 (its agent drew it there), and rank 0's TCPStore serves on it" {
  [ -n "$SSHD_NETNS" ] || skip "needs the test hosts' network namespaces (ports of their own)"
  /usr/bin/python3 -c "import torch" 2>/dev/null || skip "needs Debian's python3-torch"
  for k in 1 2; do sshd_start "$k"; done
  # This machine draws below its range for outgoing connections (10000 up to lo-1, or above hi
  # where that is too small); node 1's range is set so that its draws lie above every one of
  # ours: a port drawn here instead fails the test.
  read -r lo hi </proc/sys/net/ipv4/ip_local_port_range
  top=$((lo - 10000 >= 1000 ? lo - 1 : 65535))
  [ "$top" -le 63000 ] || skip "this machine's ports reach 63000 ($lo-$hi in use)"
  [ "$top" -ge 40001 ] || top=40001
  ip netns exec "$(sshd_ns 1)" sysctl -qw net.ipv4.ip_local_port_range="1024 $top"
  ssh_job job.yaml 1 1 2 -- sh -c 'echo "port=$MASTER_PORT addr=$MASTER_ADDR"'
  printf 'rendezvous: {torch_store: rank0}\n' >>job.yaml
  run "$DDPRUN" job.yaml
  assert_success
  ports=$(sed -n 's/.*port=\([0-9]*\) addr=.*/\1/p' <<<"$output" | sort -u)
  [ "$(wc -w <<<"$ports")" -eq 1 ] && [ "$ports" -gt "$top" ] || { echo "MASTER_PORT $ports, node 1 draws above $top"; return 1; }
  assert_output --partial "addr=$(sshd_addr 1)"
  # a real TCPStore on it: rank 0 hosts it on node 1, rank 1 on node 2 sets a key rank 0 reads
  cat >store.py <<'PY'
import os, torch.distributed as d
r = int(os.environ["RANK"])
s = d.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), 2, r == 0)
if r == 1:
    s.set("k", "from node 2")
print("rank", r, "port", os.environ["MASTER_PORT"], "read", s.get("k").decode())
s.set("done%d" % r, "1"); s.wait(["done0", "done1"])
PY
  ssh_job job.yaml 1 1 2 -- /usr/bin/python3 "$PWD/store.py"
  printf 'rendezvous: {torch_store: rank0}\n' >>job.yaml
  run "$DDPRUN" job.yaml
  assert_success
  assert_output --regexp "rank 0 port [0-9]+ read from node 2"
  port=$(sed -n 's/.*rank 0 port \([0-9]*\) read.*/\1/p' <<<"$output")
  [ "$port" -gt "$top" ]
}
