#!/usr/bin/env bash
# The scale model: what a job of 1,000 and 10,000 nodes would cost, extrapolated from this machine's
# newest measurements in bench/results/ (slurm_launch: provisioning through srun and SSH, a round's
# start, the launching host's memory per node; store_compare: the store's CPU per request). Each
# phase is a fixed cost plus a per-node cost fitted to the 1- and 16-host rows. On 2 vCPUs every
# node's slurmstepd, sshd and agent run here too, so the per-node costs are an upper bound of the
# launcher's share. Usage: bench/scale_model.sh [MACHINE]   (default: this machine's name)
set -euo pipefail
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
bench_record scale_model "$@" # its output goes to bench/results/<machine>/scale_model.md too
cd "$(dirname "$0")/.."
m=${1:-$(bench_machine)}
/usr/bin/python3 - "bench/results/$m" <<'PY'
import os, re, sys
d = sys.argv[1]
def table_rows(path, first_header):
    rows, on = [], False
    for line in open(path):
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if cells[0] == first_header:
                on, head = True, cells
                continue
            if on and not set(cells[0]) <= set("-:"):
                rows.append(dict(zip(head, cells)))
        elif on and rows:
            break
    return rows
slurm = os.path.join(d, "slurm_launch.md")
if not os.path.exists(slurm):
    sys.exit("no %s: run bench/slurm_launch.sh first" % slurm)
rows = table_rows(slurm, "hosts")
text = open(slurm).read()
date = re.search(r"^date: (.*)$", text, re.M).group(1)
def at(hosts, launcher, col):
    for r in rows:
        if r["hosts"] == str(hosts) and r["launcher"] == launcher:
            return float(r[col])
    raise SystemExit("%s has no %s row for %d hosts" % (slurm, launcher, hosts))
def fit(launcher, col):
    per = (at(16, launcher, col) - at(1, launcher, col)) / 15
    return at(1, launcher, col) - per, per
us_req = 7.0
store = os.path.join(d, "store_compare.md")
if os.path.exists(store):
    for r in table_rows(store, "op"):
        if r.get("op") == "get" and r.get("clients") == "64" and "server CPU us/op ddprun" in r:
            us_req = float(r["server CPU us/op ddprun"])
            break
kib = re.search(r"\((\d+) KiB per node\)", text)
kib = int(kib.group(1)) if kib else None
def dur(ms):
    s = ms / 1000
    return "%.1f s" % s if s < 10 else "%.0f s" % s if s < 120 else "%.1f min" % (s / 60)
print("# from %s (%s) and the store's %.1f us of server CPU per request; 8 ranks per node" % (slurm, date, us_req))
print()
print("| phase | cost measured | 1,000 nodes | 10,000 nodes | what it is bound by |")
print("|---|---|---:|---:|---|")
for launcher, what in (("srun", "one srun per node: fork and exec, a step created by slurmctld one at a time, the launch RPC"),
                       ("ssh", "key exchange and authentication per node, all done by the launcher at once")):
    a, b = fit(launcher, "provision")
    print("| provision, %s | %.0f ms + %.1f ms/node | %s | %s | %s |" % (launcher, a, b, dur(a + 1000 * b), dur(a + 10000 * b), what))
a, b = fit("srun", "start")
print("| start | %.0f ms + %.2f ms/node | %s | %s | one START frame per agent, the ranks' forks there |" % (a, b, dur(a + 1000 * b), dur(a + 10000 * b)))
print("| barrier (store) | 3 requests per rank | %s | %s | the store's one thread at %.1f us of CPU per request |"
      % (dur(3 * us_req * 8000 / 1000), dur(3 * us_req * 80000 / 1000), us_req))
if kib:
    print("| launching host's memory, srun | %d KiB per node | %.1f GiB | %.1f GiB | two srun processes per node |"
          % (kib, kib * 1000 / 2**20, kib * 10000 / 2**20))
PY
