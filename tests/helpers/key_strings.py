#!/usr/bin/env python3
"""Prints each string literal of cli/spec/'s C files that names a job-file key outside the key
table (cli/spec/keys.def): one equal to a key's place ("elastic", "elastic.min_nodes"), one
holding a dotted key's place or a quoted top-level key ('command'). Words that are also values
(launcher: ssh) are named in VALUES. Usage: key_strings.py REPO; exits 1 if it printed any."""
import glob
import os
import re
import sys

VALUES = {"ssh"}  # launcher's value, beside the section of the same name


def main():
    repo = sys.argv[1]
    keys = []
    with open(os.path.join(repo, "cli/spec/keys.def")) as fh:
        for line in fh:
            m = re.match(r'DDP_[A-Z]+\(\w+, "([^"]+)"', line)
            if m:
                keys.append(m.group(1))
    dotted = [k for k in keys if "." in k]
    top = [k for k in keys if "." not in k]
    bad = 0
    for f in sorted(glob.glob(os.path.join(repo, "cli/spec/*.c"))):
        if f.endswith("/keys.c"):
            continue
        with open(f) as fh:
            src = fh.read()
        src = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), src, flags=re.S)
        for ln, line in enumerate(src.split("\n"), 1):
            if line.lstrip().startswith("#include"):
                continue
            for lit in re.findall(r'"((?:[^"\\]|\\.)*)"', line):
                hit = (lit in keys and lit not in VALUES) or \
                    any(re.search(r"(?<![\w.])" + re.escape(k) + r"(?![\w])", lit) for k in dotted) or \
                    any("'%s'" % k in lit for k in top)
                if hit:
                    print('%s:%d: "%s" names a key outside cli/spec/keys.def' %
                          (os.path.relpath(f, repo), ln, lit))
                    bad += 1
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
