"""Checks a `ddprun report` page against the job's records, read here independently.

usage: report_check.py PAGE LOGDIR MODE [LOSSES]
MODE: running, finished (LOSSES node losses), hung, failed, cut. The embedded JSON (the script
element ddprun-data) must hold what events.jsonl says: each node loss's time, round, node and
reason; each round's start, size, nodes and startup; each recovery's phases; each hang. Lines
that are not events (not JSON, no event name, no time, a round of no possible size) are
counted, not used. Every plot is an SVG, and the timeline and progress plots name every rank."""
import json
import math
import re
import sys

page, logdir, mode = sys.argv[1], sys.argv[2], sys.argv[3]
html = open(page, encoding="utf-8").read()
m = re.search(r"<script type='application/json' id='ddprun-data'>\n(.*?)</script>", html, re.S)
assert m, "no embedded data"
data = json.loads(m.group(1))

events, unread = [], 0
with open(logdir + "/events.jsonl", encoding="utf-8", errors="replace") as f:
    for line in f:
        try:
            e = json.loads(line)
            ok = isinstance(e, dict) and isinstance(e.get("event"), str) and e["event"] and \
                isinstance(e.get("t"), (int, float)) and 0 <= e["t"] < 1e9
            if ok and e["event"] == "membership":
                w = e.get("world_size", 0)
                ok = isinstance(w, (int, float)) and 0 <= w <= (1 << 24)
        except ValueError:
            ok = False
        if ok:
            events.append(e)
        else:
            unread += 1
assert data["unread_event_lines"] == unread, (data["unread_event_lines"], unread)


def close(a, b):
    return abs(a - b) < 0.0015


want = [e for e in events if e["event"] == "node_lost"]
got = data["node_losses"]
assert len(got) == len(want), (got, want)
for g, w in zip(got, want):
    assert close(g["t"], w["t"]) and g["round"] == w.get("round", 0), (g, w)
    assert g["node"] == (w["node"] if isinstance(w.get("node"), str) else ""), (g, w)
    assert g["reason"] == w.get("reason", ""), (g, w)

rounds = []
for e in events:
    r = e.get("round", 0)
    if e["event"] == "membership":
        rounds.append({"round": r, "t": e["t"], "world_size": int(e.get("world_size", 0)),
                       "nodes": e.get("nodes", ""), "group_formed_ms": -1, "first_collective_ms": -1})
    mine = [x for x in rounds if x["round"] == r]
    if mine and e["event"] == "workers_running":
        mine[-1]["t"] = e["t"]
    if mine and e["event"] == "group_formed":
        mine[-1]["group_formed_ms"] = e["after_start_ms"]
    if mine and e["event"] == "first_collective":
        mine[-1]["first_collective_ms"] = e["after_start_ms"]
assert len(data["rounds"]) == len(rounds), (data["rounds"], rounds)
for g, w in zip(data["rounds"], rounds):
    for k in ("round", "world_size", "nodes", "group_formed_ms", "first_collective_ms"):
        assert g[k] == w[k], (k, g, w)
    assert close(g["t"], w["t"]), (g, w)

recs = [e for e in events if e["event"] == "recovery"]
assert len(data["recoveries"]) == len(recs)
for g, w in zip(data["recoveries"], recs):
    for k in ("detected_ms", "stopped_ms", "formed_ms", "started_ms", "group_formed_ms",
              "first_collective_ms"):
        assert g[k] == w.get(k, -1), (k, g, w)
    assert g["cause"] == w["cause"] and g["round"] == w["round"]

hangs = [e for e in events if e["event"] == "hang"]
assert len(data["hangs"]) == len(hangs), (data["hangs"], hangs)
for g, w in zip(data["hangs"], hangs):
    assert close(g["t"], w["t"]) and g["seq"] == w["seq"] and g["ranks"] == w["ranks"], (g, w)
    assert g["collective"] == w["collective"]

# the plots: an SVG each, the timeline's and the progress plot's naming every rank
svgs = dict(re.findall(r"<svg id='([a-z]+)'(.*?)</svg>", html, re.S))
assert set(svgs) == {"timeline", "progress", "startup"}, svgs.keys()
world = max([x["world_size"] for x in rounds] + [s[2] + 1 for s in data["samples"]] +
            [x["rank"] + 1 for x in data["ranks"]] + [0])
for name in ("timeline", "progress"):
    for r in range(world):
        assert re.search(r">rank %d( \(straggler[^<]*\))?<" % r, svgs[name]), (name, r)
for x in rounds:
    assert ">round %d: ranks 0-%d<" % (x["round"], x["world_size"] - 1) in svgs["startup"]

if mode == "running":
    assert not data["finished"] and data["node_losses"] == []
    assert len(data["samples"]) >= 4  # every rank's first report
elif mode == "finished":
    assert data["finished"] and data["status"] == "succeeded" and data["exit_status"] == 0
    assert len(data["node_losses"]) == int(sys.argv[4]) and len(data["recoveries"]) == 1
    # each rank's samples: one per 10 s at most, but for a round's first and last
    for r in range(world):
        for rnd in {s[1] for s in data["samples"]}:
            ts = [s[0] for s in data["samples"] if s[2] == r and s[1] == rnd]
            inner = ts[1:-1]
            assert all(b - a >= 9.9 for a, b in zip(inner, inner[1:])), (r, ts)
    assert data["samples"] and all(s[3] >= 0 for s in data["samples"])
elif mode == "hung":
    assert data["finished"] and data["status"] == "failed" and len(data["hangs"]) == 1
    assert data["hangs"][0]["ranks"] == "1" and data["hangs"][0]["seq"] == 30
    assert "hang: rank 1" in svgs["timeline"]
elif mode == "failed":
    one = [x for x in data["ranks"] if x["rank"] == 1][0]
    lines = one["last_lines"].strip("\n").split("\n")
    assert lines == ["line %d of rank 1" % i for i in range(21, 31)], lines
    assert one["exit_code"] == 3
    assert "line 30 of rank 1" in html.split("<script")[0]  # in the table too
elif mode == "cut":
    assert not data["finished"] and data["job_id"] == "cut-job"
    assert len(data["samples"]) == 2
print("report checked: %d rounds, %d losses, %d recoveries, %d hangs, %d samples, %d unread lines"
      % (len(rounds), len(got), len(recs), len(hangs), len(data["samples"]), unread))
