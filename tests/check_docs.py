#!/usr/bin/env python3
"""Checks that every document reference in the repository points at something
that exists (`make check-docs`; `make test` runs it too).

- A reference to a section of one of the project's documents, written as
  `DESIGN.md §3.1`, `DESIGN §3.5`, `PROTOCOL.md 4.4`, `CONFIG.md section 7`,
  … must name a document that exists (docs/DESIGN.md, proto/PROTOCOL.md,
  docs/CONFIG.md) and a section that has a heading with that number.
- A relative Markdown link `[text](path)` must point at a file or folder that
  exists.
- Nothing may cite a style guide by rule number, or a document outside the
  repository.

Prints one line per broken reference (file:line: what) and a summary line;
exits 1 if any reference is broken.
"""
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = {
    "DESIGN": "docs/DESIGN.md",
    "PROTOCOL": "proto/PROTOCOL.md",
    "CONFIG": "docs/CONFIG.md",
    "HTTP": "docs/HTTP.md",
}
SECTION_REF = re.compile(
    r"\b(DESIGN|PROTOCOL|CONFIG|HTTP)(?:\.md)?`?(?:[ ,]+(?:§ ?|sections? )|[ ,]*§ ?|[ ]+)"
    r"(\d+(?:\.\d+)*[a-z]?)(?:[-–](\d+(?:\.\d+)*))?")
BARE_SECTION = re.compile(r"\(?§ ?(\d+(?:\.\d+)*)")
MD_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
FORBIDDEN = [
    # (spelled in two pieces so that this file does not match itself)
    (re.compile(r"STY" r"LE(\.md| rule)|Hou" r"se rule"), "cites a style guide the repository does not have"),
    (re.compile(r"\.\./shared/"), "cites a document outside the repository"),
]
HEADING = re.compile(r"^#{1,6}\s+(\d+(?:\.\d+)*[a-z]?)[.\s]")


def tracked_files():
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True)
    return [p for p in out.stdout.decode().split("\0") if p]


def sections(path):
    """The set of section numbers that have a heading in a Markdown file."""
    found = set()
    try:
        with open(os.path.join(ROOT, path), encoding="utf-8") as f:
            for line in f:
                m = HEADING.match(line)
                if m:
                    num = m.group(1)
                    found.add(num)
                    found.add(num.rstrip("."))
    except OSError:
        return None
    return found


def main():
    known = {name: sections(path) for name, path in DOCS.items()}
    bad = []
    checked = 0
    for rel in tracked_files():
        if rel.startswith(".git") or "node_modules/" in rel or rel == "tests/check_docs.py":
            continue
        full = os.path.join(ROOT, rel)
        if os.path.islink(full) or not os.path.isfile(full):
            continue
        try:
            with open(full, encoding="utf-8") as f:
                lines = f.readlines()
        except (UnicodeDecodeError, OSError):
            continue
        for n, line in enumerate(lines, 1):
            for rx, why in FORBIDDEN:
                if rx.search(line):
                    bad.append("%s:%d: %s" % (rel, n, why))
            for m in SECTION_REF.finditer(line):
                name = m.group(1)
                checked += 1
                secs = known[name]
                if secs is None:
                    bad.append("%s:%d: %s does not exist" % (rel, n, DOCS[name]))
                    continue
                for num in (m.group(2), m.group(3)):
                    if num and num not in secs:
                        bad.append("%s:%d: %s has no section %s" % (rel, n, DOCS[name], num))
            if rel.endswith(".md"):
                # A bare "§N" inside a document refers to that document.
                name = next((k for k, v in DOCS.items() if v == rel), None)
                if name:
                    for m in BARE_SECTION.finditer(SECTION_REF.sub("", line)):
                        checked += 1
                        if m.group(1) not in known[name]:
                            bad.append("%s:%d: no section %s in this document" % (rel, n, m.group(1)))
                for m in MD_LINK.finditer(line):
                    target = m.group(1)
                    if re.match(r"^[a-z]+:", target):
                        continue
                    checked += 1
                    path = os.path.normpath(os.path.join(os.path.dirname(full), target))
                    if not os.path.exists(path):
                        bad.append("%s:%d: link to missing %s" % (rel, n, target))
    for line in bad:
        print(line)
    print("check-docs: %d references checked, %d broken" % (checked, len(bad)))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
