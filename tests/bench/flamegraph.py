#!/usr/bin/env python3
"""flamegraph.py — `perf script` output to a flame graph (SVG) and a summary.

    perf script -i perf.data | python3 tests/bench/flamegraph.py \
        --title "..." --svg out.svg --top out.txt

Reads the samples `perf script` prints (a header line, then one frame per
line, leaf first, then a blank line), folds identical stacks, and draws
them root at the bottom: a frame's width is its share of the samples. Each
frame has a tooltip with its samples and share. Colours tell where the code
lives: warm for polygw's own binary, green for the libraries it links,
blue for the kernel.

--folded writes the folded stacks (one "root;...;leaf count" line each, the
format other flame graph tools read).

--top writes the functions by self samples (the leaf of each stack) and by
inclusive samples (anywhere on it), with their share, plus the same split
by object (binary, library, kernel).

Standard library only; no input ever makes it read more than one sample at
a time beyond the folded counts.
"""
import argparse
import collections
import html
import re
import sys

FRAME = re.compile(r'^\s*[0-9a-f]+\s+(.*?)\s+\((.*)\)\s*$')
OFFSET = re.compile(r'\+0x[0-9a-f]+$')


def frame_name(sym, dso):
    sym = OFFSET.sub('', sym)
    if sym in ('[unknown]', ''):
        base = dso.rsplit('/', 1)[-1]
        return '[%s]' % base
    return sym


def dso_kind(dso, own):
    if dso.startswith('[kernel') or dso == '[vdso]' or 'vmlinux' in dso:
        return 'kernel'
    if own and dso.rsplit('/', 1)[-1] in own:
        return 'own'
    return 'lib'


def read_stacks(f, own):
    """Yields (frames root first, as (name, kind)) for each sample."""
    frames = []
    in_sample = False
    for line in f:
        line = line.rstrip('\n')
        if not line.strip():
            if frames:
                yield tuple(reversed(resolve_inlined(frames)))
            frames = []
            in_sample = False
            continue
        if not in_sample:
            in_sample = True  # the header line: comm pid time event
            continue
        m = FRAME.match(line)
        if m:
            frames.append((frame_name(m.group(1), m.group(2)), dso_kind(m.group(2), own),
                           m.group(2).rsplit('/', 1)[-1]))
    if frames:
        yield tuple(reversed(resolve_inlined(frames)))


def resolve_inlined(frames):
    """perf prints a function inlined into another with the object
    "(inlined)", leaf first, before the frame it was inlined into: give it
    that frame's object."""
    out = list(frames)
    for i in range(len(out) - 1, -1, -1):
        if out[i][2] == 'inlined':
            j = i + 1
            while j < len(out) and out[j][2] == 'inlined':
                j += 1
            if j < len(out):
                out[i] = (out[i][0], out[j][1], out[j][2])
    return out


class Node:
    __slots__ = ('name', 'kind', 'count', 'children')

    def __init__(self, name, kind):
        self.name = name
        self.kind = kind
        self.count = 0
        self.children = {}


def colour(name, kind):
    h = 0
    for ch in name:
        h = (h * 31 + ord(ch)) & 0xffff
    v = h / 0xffff
    if kind == 'own':
        return 'rgb(%d,%d,%d)' % (230, 110 + int(v * 70), 40)
    if kind == 'kernel':
        return 'rgb(%d,%d,%d)' % (80 + int(v * 40), 140 + int(v * 50), 220)
    return 'rgb(%d,%d,%d)' % (110 + int(v * 60), 190 + int(v * 40), 80)


def svg(root, title, out, width=1200, fh=16, min_px=0.3):
    depth = [0]

    def measure(n, d):
        depth[0] = max(depth[0], d)
        for c in n.children.values():
            if c.count * width / root.count >= min_px:
                measure(c, d + 1)
    measure(root, 0)
    top = 50
    height = top + (depth[0] + 1) * fh + 30
    o = []
    o.append('<?xml version="1.0" standalone="no"?>\n')
    o.append('<svg version="1.1" width="%d" height="%d" xmlns="http://www.w3.org/2000/svg" '
             'font-family="Verdana, sans-serif" font-size="11">\n' % (width, height))
    o.append('<rect x="0" y="0" width="%d" height="%d" fill="#fdfdf6"/>\n' % (width, height))
    o.append('<text x="%d" y="22" text-anchor="middle" font-size="15">%s</text>\n'
             % (width / 2, html.escape(title)))
    o.append('<text x="10" y="40" fill="#555">%d samples; width = share of samples; '
             'orange: polygw, green: libraries, blue: kernel. Hover for counts.</text>\n'
             % root.count)

    def draw(n, x, d):
        w = n.count * width / root.count
        y = height - 30 - (d + 1) * fh
        pct = 100.0 * n.count / root.count
        label = n.name if d else 'all'
        o.append('<g><title>%s (%d samples, %.2f%%)</title><rect x="%.2f" y="%d" width="%.2f" '
                 'height="%d" fill="%s" stroke="#fdfdf6" stroke-width="0.5"/>'
                 % (html.escape(label), n.count, pct, x, y, w, fh - 1,
                    colour(n.name, n.kind) if d else 'rgb(200,200,200)'))
        chars = int((w - 4) / 6.5)
        if chars >= 3:
            text = label if len(label) <= chars else label[:chars - 2] + '..'
            o.append('<text x="%.2f" y="%d">%s</text>' % (x + 2, y + fh - 4, html.escape(text)))
        o.append('</g>\n')
        cx = x
        for c in sorted(n.children.values(), key=lambda c: c.name):
            cw = c.count * width / root.count
            if cw >= min_px:
                draw(c, cx, d + 1)
            cx += cw
    draw(root, 0.0, 0)
    o.append('</svg>\n')
    out.write(''.join(o))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--title', default='flame graph')
    ap.add_argument('--svg', required=True)
    ap.add_argument('--top', help='write the self / inclusive summary here')
    ap.add_argument('--own', action='append', default=[],
                    help="file name of polygw's own binary (repeatable), for colours and the split")
    ap.add_argument('--folded', help='also write the folded stacks here ("a;b;c count")')
    ap.add_argument('--rows', type=int, default=40)
    a = ap.parse_args()

    own = set(a.own)
    root = Node('all', 'root')
    self_c = collections.Counter()
    incl_c = collections.Counter()
    obj_c = collections.Counter()
    folded = collections.Counter()
    for stack in read_stacks(sys.stdin, own):
        root.count += 1
        if a.folded:
            folded[';'.join(fr[0] for fr in stack)] += 1
        n = root
        seen = set()
        for name, kind, dso in stack:
            c = n.children.get(name)
            if c is None:
                c = n.children[name] = Node(name, kind)
            c.count += 1
            n = c
            if name not in seen:
                incl_c[name] += 1
                seen.add(name)
        if stack:
            self_c[stack[-1][0]] += 1
            obj_c['%s (%s)' % (stack[-1][2], stack[-1][1])] += 1
    if root.count == 0:
        sys.exit('flamegraph.py: no samples on stdin')
    with open(a.svg, 'w') as f:
        svg(root, a.title, f)
    if a.folded:
        with open(a.folded, 'w') as f:
            for k, v in sorted(folded.items()):
                f.write('%s %d\n' % (k, v))
    if a.top:
        with open(a.top, 'w') as f:
            f.write('%s\n%d samples\n\n' % (a.title, root.count))
            f.write('self samples by object (where the CPU was):\n')
            for k, v in obj_c.most_common(a.rows):
                f.write('  %6.2f%%  %s\n' % (100.0 * v / root.count, k))
            f.write('\nself samples by function:\n')
            for k, v in self_c.most_common(a.rows):
                f.write('  %6.2f%%  %s\n' % (100.0 * v / root.count, k))
            f.write('\ninclusive samples by function (on the stack):\n')
            for k, v in incl_c.most_common(a.rows):
                f.write('  %6.2f%%  %s\n' % (100.0 * v / root.count, k))


if __name__ == '__main__':
    main()
