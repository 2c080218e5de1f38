#!/usr/bin/env bash
# The scale model: what a job of 10,000 and 100,000 nodes (8 ranks each) would cost the login node,
# computed from this machine's newest measurements in bench/results/, each term citing its source:
# scale (bench/scale.sh: the launcher's marginal CPU, memory and sockets per node from 64 to 1,024
# nodes, the store's requests per node at 8 ranks a node), store_compare (the store's CPU per
# request), slurm_launch (an SSH session's cost, one srun step). On 2 vCPUs every node's agent runs
# here too, so the per-node costs are an upper bound of the launcher's share.
# Usage: bench/scale_model.sh [MACHINE]   (default: this machine's name)
set -euo pipefail
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
bench_record scale_model "$@" # its output goes to bench/results/<machine>/scale_model.md too
cd "$(dirname "$0")/.."
m=${1:-$(bench_machine)}
/usr/bin/python3 - "bench/results/$m" <<'PY'
import math, os, re, sys
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
def result(name):
    p = os.path.join(d, name + ".md")
    if not os.path.exists(p):
        sys.exit("no %s: run bench/%s.sh first" % (p, name))
    t = open(p).read()
    return p, re.search(r"^date: (.*)$", t, re.M).group(1), t
scale_p, scale_date, _ = result("scale")
slurm_p, slurm_date, slurm_text = result("slurm_launch")
sc = table_rows(scale_p, "nodes")
def srow(nodes, ranks):
    for r in sc:
        if r["nodes"] == str(nodes) and r["ranks"] == str(ranks):
            return r
    sys.exit("%s has no row of %d nodes, %d ranks" % (scale_p, nodes, ranks))
lo, hi = srow(64, 128), srow(1024, 2048)
span = 1024 - 64
cpu_ms = (float(hi["launcher CPU s"]) - float(lo["launcher CPU s"])) * 1000 / span
rss_kib = (float(hi["launcher RSS MiB"]) - float(lo["launcher RSS MiB"])) * 1024 / span
socks = (float(hi["launcher sockets"]) - float(lo["launcher sockets"])) / span
r8 = srow(256, 2048)
req8 = float(r8["requests/node"])
us_req, store_src = 7.0, "assumed"
sp = os.path.join(d, "store_compare.md")
if os.path.exists(sp):
    for r in table_rows(sp, "op"):
        if r.get("op") == "get" and r.get("clients") == "64" and "server CPU us/op ddprun" in r:
            us_req, store_src = float(r["server CPU us/op ddprun"]), "store_compare"
            break
sl = table_rows(slurm_p, "hosts")
def at(hosts, launcher, col):
    for r in sl:
        if r["hosts"] == str(hosts) and r["launcher"] == launcher:
            return float(r[col])
    sys.exit("%s has no %s row for %d hosts" % (slurm_p, launcher, hosts))
ssh_ms = (at(16, "ssh", "provision") - at(1, "ssh", "provision")) / 15
srun16 = at(16, "srun", "provision")
K = 32
def levels(n):
    lv, reach = 0, 0
    while reach < n:
        lv += 1
        reach += K ** lv
    return lv
def dur(ms):
    s = ms / 1000
    return "%.1f s" % s if s < 10 else "%.0f s" % s if s < 120 else "%.1f min" % (s / 60) if s < 7200 else "%.1f h" % (s / 3600)
N = (10000, 100000)
print("# from %s (%s), %s (%s) and %s; 8 ranks per node" % (scale_p, scale_date, slurm_p, slurm_date,
      "the store's %.1f us of CPU per request (%s)" % (us_req, store_src)))
print()
print("| term | measured | source | 10,000 nodes | 100,000 nodes | bound by |")
print("|---|---|---|---:|---:|---|")
print("| launcher CPU, start to barrier | %.2f ms/node | scale, 64 to 1,024 nodes | %s | %s | its one thread: handshake, JOIN, START, frames per agent |"
      % (cpu_ms, dur(cpu_ms * N[0]), dur(cpu_ms * N[1])))
print("| launcher memory | %.0f KiB/node | scale, 64 to 1,024 nodes | %.2f GiB | %.1f GiB | a node's buffers and state |"
      % (rss_kib, rss_kib * N[0] / 2**20, rss_kib * N[1] / 2**20))
print("| launcher sockets | %.1f/node | scale, 64 to 1,024 nodes | %s | %s | per node: the agent link, the agent's store connection and its proxy's two (the ranks') |"
      % (socks, f"{socks * N[0]:,.0f}", f"{socks * N[1]:,.0f}"))
print("| store CPU, 8 ranks a node | %.0f requests/node | scale, 256x8 | %s | %s | the store's one thread at %.1f us a request |"
      % (req8, dur(req8 * us_req * N[0] / 1000), dur(req8 * us_req * N[1] / 1000), us_req))
print("| provision, SSH tree (fanout %d) | %.0f ms/session | slurm_launch, ssh 1 to 16 hosts | %d levels: %s | %d levels: %s | %d sessions per parent, a level after another |"
      % (K, ssh_ms, levels(N[0]), dur(levels(N[0]) * K * ssh_ms), levels(N[1]), dur(levels(N[1]) * K * ssh_ms), K))
print("| provision, flat SSH | %.0f ms/session | slurm_launch, ssh 1 to 16 hosts | %s | %s | every session's key exchange on the login node |"
      % (ssh_ms, dur(ssh_ms * N[0]), dur(ssh_ms * N[1])))
try:
    ssh_cpu = (at(16, "ssh", "launcher CPU") - at(1, "ssh", "launcher CPU")) / 15
    print("| login node's CPU, SSH | %.1f ms/session | slurm_launch, ssh 1 to 16 hosts | flat %s, tree %s | flat %s, tree %s | libssh's side of each session it opens |"
          % (ssh_cpu, dur(ssh_cpu * N[0]), dur(ssh_cpu * K), dur(ssh_cpu * N[1]), dur(ssh_cpu * K)))
except (KeyError, ValueError):
    pass
print("| provision, srun | %.0f ms, 16 hosts | slurm_launch, srun 16 hosts | - | - | one step; Slurm's own tree (TreeWidth) beyond |" % srun16)
terms = {"the launcher's one thread": cpu_ms * N[1], "the store's thread": req8 * us_req * N[1] / 1000,
         "the SSH tree": levels(N[1]) * K * ssh_ms}
order = sorted(terms, key=terms.get, reverse=True)
print()
print("At 100,000 nodes the first limit is %s." % ", then ".join("%s (%s)" % (k, dur(terms[k])) for k in order))
PY
