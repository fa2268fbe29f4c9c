#!/usr/bin/env python3
"""The daemon's layout rules, checked against the code (run by `make test`).

sidecar/ is split into folders, one per part of the daemon; each folder may
use the folders listed for it in LAYERS below (and lib/, src/, proto/),
never one above it or beside it. Three checks, each failing with the
offending files named:

  1. includes: a file in folder F includes "G/x.h" only when F may use G;
  2. include cycles: no loop of includes between modules (a module is a
     .c file with its .h);
  3. calls: with --objects DIR (a build's object tree; repeat it for
     several builds), the symbols each object takes from the others (nm)
     may only cross from a folder to one it may use, so no function calls
     up into the process owner or across the two front ends.

`make test` runs it over both of its builds (tests/run-suites.sh), as
`make check-layout` does.

docs/DESIGN.md §2 draws the same picture in prose.
"""
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIDECAR = os.path.join(ROOT, "sidecar")

# Each folder of sidecar/ and the folders it may use. "top" is sidecar/
# itself: the entry point and the process owner, which may use everything.
LAYERS = {
    "codec": [],
    "core": ["codec"],
    "backend": ["codec", "core"],
    "upstream": ["codec", "core"],
    "net": ["codec", "core"],
    "trace": ["codec", "core", "upstream"],
    "metrics": ["codec", "core", "backend", "upstream", "net", "trace"],
    "call": ["codec", "core", "backend", "upstream", "net", "trace", "metrics"],
    "ops": ["codec", "core", "backend", "upstream", "net", "trace", "metrics", "call"],
    "rpc": ["codec", "core", "backend", "upstream", "net", "trace", "metrics", "call", "ops"],
    "http": ["codec", "core", "backend", "upstream", "net", "trace", "metrics", "call", "ops"],
}
LAYERS["top"] = list(LAYERS)
# Folders outside sidecar/ every part may use.
BELOW = {"lib", "src", "proto"}

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def folder_of(path):
    rel = os.path.relpath(path, SIDECAR)
    parts = rel.split(os.sep)
    return "top" if len(parts) == 1 else parts[0]


def sources():
    for dirpath, _, files in os.walk(SIDECAR):
        for f in sorted(files):
            if f.endswith((".c", ".h")):
                yield os.path.join(dirpath, f)


def resolve(inc, path):
    """The sidecar file an include names, or None (a lib/src/proto or
    system header)."""
    here = os.path.join(os.path.dirname(path), inc)
    if os.path.exists(here):
        return os.path.normpath(here)
    top = os.path.join(SIDECAR, inc)
    if os.path.exists(top):
        return os.path.normpath(top)
    return None


def module(path):
    return os.path.splitext(os.path.relpath(path, SIDECAR))[0]


def check_includes(errors):
    graph = {}
    for path in sources():
        src = folder_of(path)
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
        for inc in INCLUDE.findall(text):
            target = resolve(inc, path)
            if target is None:
                continue
            dst = folder_of(target)
            if dst != src and dst not in LAYERS[src]:
                errors.append("%s includes %s: %s may not use %s" %
                              (os.path.relpath(path, ROOT), inc, src, dst))
            a, b = module(path), module(target)
            if a != b:
                graph.setdefault(a, set()).add(b)
    return graph


def find_cycles(graph):
    """Strongly connected components with more than one node (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
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
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def nm(objs, *flags):
    """{object: set of symbols} as `nm -A FLAGS` lists them, one run for
    all the objects (a run per object costs more than the check)."""
    out = {obj: set() for obj in objs}
    if not objs:
        return out
    res = subprocess.run(["nm", "-A", *flags, *objs], capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit("check-layout: nm failed: " + res.stderr.strip())
    for line in res.stdout.splitlines():
        obj, _, rest = line.partition(":")
        if obj in out and rest.split():
            out[obj].add(rest.split()[-1])
    return out


def check_calls(objdir, errors):
    base = os.path.join(objdir, "sidecar")
    if not os.path.isdir(base):
        errors.append("no objects under %s: build first" % base)
        return
    srcs = {}
    for dirpath, _, files in os.walk(base):
        for f in files:
            if not f.endswith(".o"):
                continue
            obj = os.path.join(dirpath, f)
            src = os.path.join(SIDECAR, os.path.relpath(obj, base))[:-2] + ".c"
            if not os.path.exists(src) or folder_of(src) not in LAYERS:
                continue  # a stale object of a moved file
            srcs[obj] = src
    objs = sorted(srcs)
    owner = {}
    for obj, defined in nm(objs, "--defined-only", "-g").items():
        for s in defined:
            owner[s] = srcs[obj]
    uses = {srcs[obj]: used for obj, used in nm(objs, "-u").items()}
    for src, used in sorted(uses.items()):
        a = folder_of(src)
        for s in sorted(used):
            target = owner.get(s)
            if target is None or target == src:
                continue
            b = folder_of(target)
            if b != a and b not in LAYERS[a]:
                errors.append("%s calls %s (%s): %s may not use %s" %
                              (os.path.relpath(src, ROOT), s, os.path.relpath(target, ROOT), a, b))


def main(argv):
    objdirs = []
    args = argv[1:]
    while args:
        if args[0] == "--objects" and len(args) > 1:
            objdirs.append(args[1])
            args = args[2:]
        else:
            print("usage: check_layout.py [--objects DIR]...", file=sys.stderr)
            return 2
    errors = []
    graph = check_includes(errors)
    for comp in find_cycles(graph):
        errors.append("include cycle between modules: " + ", ".join(comp))
    for objdir in objdirs:
        check_calls(objdir, errors)
    for e in errors:
        print("check-layout: " + e)
    n = sum(1 for _ in sources())
    if errors:
        print("check-layout: %d problem(s) in %d files" % (len(errors), n))
        return 1
    print("check-layout: %d files, %d folders: includes and calls follow the layers, no cycle" %
          (n, len(LAYERS) - 1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
