#!/usr/bin/env python3
"""Checks the shape of the tree (issue 15, ../shared/STYLE.md "Structure as the project grows"):

  includes  no cycle of #include "..." between project files
  calls     no cycle of calls between files: in the build's object files, a file that uses a
            global symbol another file defines calls it (static functions stay inside a file)
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
            # ".../CMakeFiles/<target>.dir/<path in the repo>.o"
            src = re.sub(r"^.*?/CMakeFiles/[^/]+\.dir/", "", obj)[: -len(".o")]
            src = src.replace("__/", "../")
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
    print("%d files, %d with calls between them checked: %d problem%s" %
          (files, len(cg), bad, "" if bad == 1 else "s"))
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
