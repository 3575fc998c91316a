#!/usr/bin/python3
"""Expert-cache policies replayed on synthetic K3 routing (92 MoE layers, 896
experts, top-16, layers visited in order every token): true resident hit
rate after the first token, for uniform routing (what upstream measured on
the real model) and a Zipf-skewed one.  The policies are the store's: LRU,
LFU with an LRU tie-break, LFU with an MRU tie-break (krun's default).
usage: cache_sim.py [STEPS]"""
import random, sys
NL, Ne, k = 92, 896, 16
def route(step, skew, rng, pop):
    # per layer: k distinct experts; skew: zipf-like popularity per layer
    out = []
    for L in range(NL):
        if skew == 0:
            out.append([(L, e) for e in rng.sample(range(Ne), k)])
        else:
            ws = pop[L]
            chosen = set()
            while len(chosen) < k:
                chosen.add(rng.choices(range(Ne), weights=ws)[0])
            out.append([(L, e) for e in chosen])
    return out
def run(policy, C, steps, skew, seed=1):
    rng = random.Random(seed)
    pop = [[1.0 / (i + 1) ** skew for i in rng.sample(range(Ne), Ne)] for _ in range(NL)] if skew else None
    cache = {}  # key -> (last_use)
    uses = {}
    tick = 0; hits = tot = 0
    for s in range(steps):
        for layer in route(s, skew, rng, pop):
            tick += 1
            for key in layer:
                uses[key] = uses.get(key, 0) + 1
            miss = [key for key in layer if key not in cache]
            for key in layer:
                if key in cache:
                    cache[key] = tick
                    if s > 0: hits += 1
            if s > 0: tot += len(layer)
            for key in miss:
                if len(cache) >= C:
                    cand = [c for c in cache if c not in layer]
                    if policy == 'lru': v = min(cand, key=lambda c: cache[c])
                    elif policy == 'lfu-lru': v = min(cand, key=lambda c: (uses[c], cache[c]))
                    elif policy == 'lfu-mru': v = min(cand, key=lambda c: (uses[c], -cache[c]))
                    del cache[v]
                cache[key] = tick
    return hits / tot
STEPS = int(sys.argv[1]) if len(sys.argv) > 1 else 12
for skew in (0, 1.0):
    for C in (40, 400, 1447):
        print('routing %-8s %5d slots: ' % ('uniform' if skew == 0 else 'zipf-1', C) + '  '.join('%s %.2f%%' % (p, 100 * run(p, C, STEPS, skew)) for p in ('lru', 'lfu-lru', 'lfu-mru')), flush=True)
