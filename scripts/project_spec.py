#!/usr/bin/env python3
"""Speculative speedup projected for another model (docs/benchmarks.md
section 25): per task of a `loraplex bench --speculate` report (measured on
the demo model), the best configuration's tokens per pass over plain's,
divided by the other model's cost of a pass of that many rows (relative to
one row; linear between the given R, extended past the last two). With
ranges (2:1.05-1.14) it projects once with the low and once with the high
ends. Standard library only.

    scripts/project_spec.py --costs 2:1.05-1.14,3:1.05-1.16,4:1.07-1.33,6:1.35-1.75,8:1.68-2.33 REPORT...

Take the costs from `loraplex bench --speculate none -m OTHER.lpx --data D
-t T` (its first table), measured several times on a quiet machine.
"""
import re, statistics, sys

def parse_costs(text):
    lo, hi = [(1, 1.0)], [(1, 1.0)]
    for item in text.split(','):
        r, c = item.split(':')
        a, _, b = c.partition('-')
        lo.append((float(r), float(a)))
        hi.append((float(r), float(b or a)))
    return sorted(lo), sorted(hi)

def cost(table, rows):
    for (r0, c0), (r1, c1) in zip(table, table[1:]):
        if rows <= r1:
            return c0 + (c1 - c0) * (rows - r0) / (r1 - r0)
    (r0, c0), (r1, c1) = table[-2], table[-1]
    return c1 + (c1 - c0) * (rows - r1) / (r1 - r0)

def tasks(report):
    """{task: (plain tok/pass, [(config, tok/pass, rows/pass)])}"""
    out = {}
    for block in re.split(r'\n(?=\S+ \(\d+ prompts\):)', report):
        head = re.match(r'(\S+) \(\d+ prompts\):', block)
        if not head:
            continue
        plain, configs = None, []
        for line in block.split('\n'):
            m = re.match(r'\s+(\S+)\s+[\d.]+\s+[\d.]+x\s+([\d.]+)\s+([\d.]+)', line)
            if not m:
                continue
            if m.group(1) == 'plain':
                plain = float(m.group(2))
            else:
                configs.append((m.group(1), float(m.group(2)), float(m.group(3))))
        if plain and configs:
            out[head.group(1)] = (plain, configs)
    return out

def main():
    args = sys.argv[1:]
    if len(args) < 3 or args[0] != '--costs':
        sys.exit(__doc__)
    lo, hi = parse_costs(args[1])
    for path in args[2:]:
        found = tasks(open(path).read())
        if not found:
            sys.exit(f'{path}: no bench --speculate task tables')
        means = [[], []]
        for task, (plain, configs) in found.items():
            cells = []
            for k, table in enumerate((lo, hi)):
                speed, name, rows = max(((tp / plain) / cost(table, rp), name, rp) for name, tp, rp in configs)
                means[k].append(speed)
                cells.append(f'{speed:.2f}x ({name}, {rows:.1f} rows at {cost(table, rows):.2f})')
            print(f'{path}: {task:14s} low costs {cells[0]}  high costs {cells[1]}')
        print(f'{path}: mean of {len(found)} tasks: {statistics.mean(means[0]):.2f}x .. {statistics.mean(means[1]):.2f}x')

if __name__ == '__main__':
    main()
