#!/usr/bin/env python3
"""Checks the shape of the tree (issue 15, ../shared/STYLE.md "Structure as the project grows"):

  includes  no cycle of #include "..." between project files
  calls     no cycle of calls between files: in the build's object files, a file that uses a
            global symbol another file defines calls it (static functions stay inside a file)
  rooms     cli/ is in rooms (its folders), each using only the rooms that cli/CMakeLists.txt's
            table lets it (ddp_room(NAME USES ...)): an include or a call from a file of one room
            into another that the table does not allow is a problem, as is a source file of cli/
            outside every room (but cli/main.c, the command table, which may use them all and
            which nothing uses), a room the table lacks, and a file outside cli/ that uses cli/
  size      no source file over 800 lines unless its opening comment says why ("over 800 lines")

Usage: check_structure.py REPO BUILD_DIR. Prints each problem; exits 1 if there is one."""
import os
import re
import subprocess
import sys

DIRS = ["common", "rendezvous", "worker", "reducer", "cli", "examples", "bench", "tests"]
MAX_LINES = 800


def sources(repo):
    for d in DIRS:
        for root, _, files in os.walk(os.path.join(repo, d)):
            for f in files:
                if f.endswith((".c", ".h", ".cu")):
                    yield os.path.relpath(os.path.join(root, f), repo)


def cycles(graph):
    """Strongly connected components of more than one node, or a node with an edge to itself."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]
    sys.setrecursionlimit(10000)

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or v in graph.get(v, ()):
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def include_graph(repo):
    g = {}
    for f in sources(repo):
        with open(os.path.join(repo, f), errors="replace") as fh:
            for line in fh:
                m = re.match(r'\s*#\s*include\s+"([^"]+)"', line)
                if m and os.path.exists(os.path.join(repo, m.group(1))):
                    g.setdefault(f, set()).add(m.group(1))
    return g


def call_graph(repo, build):
    """file -> files whose global symbols it uses, from every object file of the build."""
    defs, uses = {}, {}
    for root, _, files in os.walk(build):
        for f in files:
            if not f.endswith((".c.o", ".cu.o")) or "CMakeFiles" not in root:
                continue
            obj = os.path.join(root, f)
            # "BUILD/<folder of its CMakeLists.txt>/CMakeFiles/<target>.dir/<path from there>.o"
            rel = os.path.relpath(obj, build)
            m = re.match(r"^(?:(.*?)/)?CMakeFiles/[^/]+\.dir/(.*)\.o$", rel)
            if not m:
                continue
            src = os.path.join(m.group(1) or "", m.group(2).replace("__/", "../"))
            src = os.path.normpath(src)
            if src.startswith("tests/") or src.startswith("bench/"):
                continue  # test programs call what they test; they are not part of the tree
            if not os.path.exists(os.path.join(repo, src)):
                continue  # an object left from a file since renamed
            out = subprocess.run(["nm", "--defined-only", "-g", obj], capture_output=True,
                                 text=True).stdout
            for line in out.splitlines():
                parts = line.split()
                if len(parts) == 3:
                    defs.setdefault(parts[2], set()).add(src)
            out = subprocess.run(["nm", "-u", obj], capture_output=True, text=True).stdout
            uses.setdefault(src, set()).update(l.split()[-1] for l in out.splitlines() if l.strip())
    g = {}
    for src, syms in uses.items():
        for s in syms:
            for d in defs.get(s, ()):
                # examples define their own main etc.; a symbol defined in several files is
                # not a call between project files
                if d != src and len(defs[s]) == 1:
                    g.setdefault(src, set()).add(d)
    return g


def rooms_table(repo):
    """{room: set of rooms it may use} from cli/CMakeLists.txt's ddp_room(NAME USES ...) lines."""
    path = os.path.join(repo, "cli", "CMakeLists.txt")
    if not os.path.exists(path):
        return None
    table = {}
    with open(path) as fh:
        for m in re.finditer(r"^ddp_room\((\w+)((?:\s+\w+)*)\s*\)", fh.read(), re.M):
            words = m.group(2).split()
            table[m.group(1)] = set(words[1:]) if words[:1] == ["USES"] else set()
    return table


def room_of(f):
    """'sys' for cli/sys/x.c; '' for a file directly in cli/ (main.c, which may use every room);
    None outside cli/."""
    parts = f.split("/")
    if parts[0] != "cli":
        return None
    return parts[1] if len(parts) > 2 else ""


def room_problems(repo, graph, table):
    out = []
    order = list(table)
    for r in order:  # rooms below it only: the rooms cannot use each other in a circle
        for u in sorted(table[r]):
            if u not in order[: order.index(r)]:
                out.append("cli/CMakeLists.txt: room %s uses %s, which is not before it in the table"
                           % (r, u))
    for f in sources(repo):
        r = room_of(f)
        if r == "" and f != "cli/main.c":
            out.append("%s: in no room (cli/'s files live in its folders; main.c alone is at the "
                       "top)" % f)
        elif r and r not in table:
            out.append("%s: its room '%s' is not in cli/CMakeLists.txt's table" % (f, r))
    for a in sorted(graph):
        ra = room_of(a)
        for b in sorted(graph[a]):
            rb = room_of(b)
            if rb is None or ra == rb:
                continue
            if rb == "":
                out.append("%s uses %s: nothing uses cli/main.c, the command table" % (a, b))
            elif ra is None:
                if not a.startswith(("tests/", "bench/")):
                    out.append("%s uses %s: only cli/ uses cli/" % (a, b))
            elif ra in table and rb in table and rb not in table[ra]:
                out.append("%s uses %s: room %s may not use %s (cli/CMakeLists.txt)" % (a, b, ra, rb))
    return out


def main():
    repo, build = sys.argv[1], sys.argv[2]
    bad = 0
    for c in cycles(include_graph(repo)):
        print("include cycle: " + " -> ".join(c))
        bad += 1
    cg = call_graph(repo, build)
    if not cg:
        print("no object files under %s: build first" % build)
        bad += 1
    for c in cycles(cg):
        print("call cycle between files: " + ", ".join(c))
        bad += 1
    table = rooms_table(repo)
    if table is not None:
        both = {}
        for g in (include_graph(repo), cg):
            for a, bs in g.items():
                both.setdefault(a, set()).update(bs)
        for p in room_problems(repo, both, table):
            print(p)
            bad += 1
    for f in sources(repo):
        with open(os.path.join(repo, f), errors="replace") as fh:
            text = fh.read()
        n = text.count("\n")
        head = text[:1500]
        if n > MAX_LINES and "over 800 lines" not in head:
            print("%s: %d lines (over %d, and its opening comment does not say why)" %
                  (f, n, MAX_LINES))
            bad += 1
    files = sum(1 for _ in sources(repo))
    print("%d files, %d with calls between them checked, %d rooms: %d problem%s" %
          (files, len(cg), len(table or {}), bad, "" if bad == 1 else "s"))
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
