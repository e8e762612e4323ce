#!/usr/bin/env python3
"""Draft-free speculation side by side (docs/benchmarks.md section 24):
llama.cpp's `llama-lookup` (no drafts, context n-grams, and context n-grams
plus a static cache from the task's training prompts and completions) and
loraplex (plain, prompt lookup, the forecast file's corpus chain + lookup)
on every demo task: the adapter merged into the base for llama.cpp (`loraplex
adapter merge`), base + adapter for loraplex, the 24 eval prompts, greedy,
one thread, each record a process of its own, per record the fastest of
REPS runs' decode time. Prints per configuration the summed decode time and
whether each output equals loraplex's plain one. Standard library only.

    LLAMA_BIN=/path/to/llama.cpp/build/bin WORLD=/tmp/w/tasks scripts/compare_lookup.py [TASK ...]

environment: LLAMA_BIN (llama-lookup and llama-lookup-create; the "decoded
... in" line is parsed, 3 decimals unless patched), WORLD (a `loraplex world
--seed 1` tasks folder: the static cache's text), WORK (scratch, default
/tmp/compare-lookup), REPS (3), NREC (24). Never run beside other work.
"""
import json, os, re, subprocess, sys, time
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEMO = ROOT + '/models/demo'; LP = os.environ.get('LORAPLEX', ROOT + '/build/loraplex')
LB = os.environ['LLAMA_BIN']; WORLD = os.environ['WORLD']
W = os.environ.get('WORK', '/tmp/compare-lookup'); os.makedirs(W, exist_ok=True)
REPS = int(os.environ.get('REPS', '3')); NREC = int(os.environ.get('NREC', '24'))
tasks = sys.argv[1:] or ['correct', 'style-formal', 'style-polite', 'style-jovial', 'style-terse', 'summary', 'reply', 'translate']
strip = re.compile(r' - draft candidate: token=\d+\n')

def llama(t, prompt, extra):
    r = subprocess.run([LB + '/llama-lookup', '-m', f'{W}/{t}.gguf', '-p', prompt, '-n', '64', '-t', '1', '-tb', '1',
                        '--temp', '0', '-c', '256',] + extra, capture_output=True, text=True)
    m = re.search(r'decoded\s+(\d+) tokens in\s+([\d.]+) seconds', r.stderr)
    out = strip.sub('', r.stdout)
    i = out.find(prompt)
    text = out[i + len(prompt):] if i >= 0 else out
    text = text.replace('</s>', '').strip()
    nd = re.search(r'n_drafted\s+=\s+(\d+)', r.stderr); na = re.search(r'n_accept\s+=\s+(\d+)', r.stderr)
    return int(m.group(1)), float(m.group(2)), text, int(na.group(1)) if na else 0

def ours(t, prompt, extra):
    r = subprocess.run([LP, 'run', '-m', f'{DEMO}/base.gguf', '--adapter', f'{DEMO}/adapters/{t}.lpa', '-p', prompt,
                        '-n', '64', '--temp', '0', '-t', '1', '-v'] + extra, capture_output=True, text=True)
    m = re.search(r'(\d+) tokens in ([\d.]+) ms \(', r.stderr.split('stream(s),')[-1])
    p = re.search(r'in (\d+) passes that produced', r.stderr)
    n = int(m.group(1))
    return n, float(m.group(2)) / 1e3, r.stdout.strip(), (n - int(p.group(1))) if p else 0

configs = [
    ('llama.cpp plain (lookup --draft 0)', llama, lambda t: ['--draft', '0']),
    ('llama.cpp lookup --draft 8', llama, lambda t: ['--draft', '8']),
    ('llama.cpp lookup --draft 8 + static cache', llama, lambda t: ['--draft', '8', '-lcs', f'{W}/{t}.lcs']),
    ('loraplex plain', ours, lambda t: []),
    ('loraplex lookup 3:8, costed', ours, lambda t: ['--lookup', '3:8', '--costed']),
    ('loraplex n-gram + lookup 3:8, costed', ours, lambda t: ['--speculate', f'{DEMO}/forecast/{t}.lpf', '--tree', '0', '--lookup', '3:8', '--costed']),
    ('loraplex n-gram + lookup 3:8', ours, lambda t: ['--speculate', f'{DEMO}/forecast/{t}.lpf', '--tree', '0', '--lookup', '3:8']),
]
res = {}
for t in tasks:
    if not os.path.exists(f'{W}/{t}.gguf'):
        subprocess.run([LP, 'adapter', 'merge', '--base', f'{DEMO}/base.gguf', '--adapter', f'{DEMO}/adapters/{t}.lpa', '-o', f'{W}/{t}.gguf'], check=True, capture_output=True)
    if not os.path.exists(f'{W}/{t}.lcs'):
        with open(f'{WORLD}/{t}.train.jsonl') as f, open(f'{W}/{t}.corpus.txt', 'w') as o:
            for i, line in enumerate(f):
                if i == 1000: break
                j = json.loads(line); o.write(j['prompt'] + j['completion'] + '\n')
        subprocess.run([LB + '/llama-lookup-create', '-m', f'{W}/{t}.gguf', '-f', f'{W}/{t}.corpus.txt', '-lcs', f'{W}/{t}.lcs', '-c', '0', '-t', '1'], check=True, capture_output=True)
    recs = [json.loads(l)['prompt'] for l in open(f'{DEMO}/eval/tasks/{t}.eval.jsonl')][:NREC]
    ref = [None] * len(recs)
    for name, fn, ex in configs[3:4] + configs[:3] + configs[4:]:
        tok = acc = same = 0; sec = 0.0
        for i, p in enumerate(recs):
            best = None
            for _ in range(REPS):
                n, s, text, a = fn(t, p, ex(t))
                if best is None or s < best[1]: best = (n, s, text, a)
            if ref[i] is None: ref[i] = best[2]
            same += best[2] == ref[i]; tok += best[0]; sec += best[1]; acc += best[3]
        res[(t, name)] = (tok, sec, same, acc)
        print(f'{t:13s} {name:42s} {tok:5d} tok {sec*1e3:8.2f} ms {tok/sec:9.1f} tok/s  same {same}/{len(recs)}  accepted {acc}', flush=True)
print()
print('task | ' + ' | '.join(n for n, _, _ in configs) + ' | ours best / llama best (time)')
for t in tasks:
    lp0 = res[(t, configs[0][0])][1]; our0 = res[(t, configs[3][0])][1]
    row = [t]
    for name, _, _ in configs:
        sec = res[(t, name)][1]
        row.append(f'{sec*1e3:.1f} ms ({(lp0 if name.startswith("llama") else our0)/sec:.2f}x)')
    lb = min(res[(t, n)][1] for n, _, _ in configs if n.startswith('llama'))
    ob = min(res[(t, n)][1] for n, _, _ in configs if n.startswith('loraplex'))
    row.append(f'{lb/ob:.2f}x')
    print(' | '.join(row))
