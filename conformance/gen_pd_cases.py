#!/usr/bin/env python3
"""Seeded random decode-side (P/D) cases for the conformance suite.

  gen_pd_cases.py SEED COUNT OUT_DIR [--groups full|window|mamba|window-mamba|full2|full3|windows] [--first-chunk] [--options]
               [--priority] [--async]

writes OUT_DIR/gen-pd-SEED-K.json for K in 0..COUNT: cases of
vllm_pd_steps.py ("role": "decode") with block sizes,
token budgets, max_num_seqs, pool sizes, prefix sharing, prompt and output
lengths, arrival steps and per-request load_steps (1..4), all drawn from one
seeded stream, so the same seed gives the same cases on every machine.
Pools are small enough that reservations wait for blocks and decodes are
preempted, but every request's prompt and output fit the pool alone.
--groups picks the cache groups: full (the default: one full-attention
group), window (full attention and a sliding window, as gen_cases.py
draws them), mamba (full attention, a Mamba state, a tail ring),
window-mamba (full attention, a sliding window, a Mamba state and a tail
ring), full2, full3 (two or three full-attention groups of one spec) or
windows (full attention beside two or three window groups of one spec); a
hybrid case takes the same draws as a full-attention one, then its
window and pool size. --first-chunk marks every case
`"scheduler_reserve_full_isl": false` (the same draws); --options draws
vLLM's scheduler options as gen_cases.py does; --priority, vLLM's
priority policy with per-request priorities; --async marks every case
`"async_scheduling": true` (vLLM's asynchronous engine loop).
"""
import json
import os
import random
import sys

from gen_cases import draw_options, draw_priorities, windows_groups


def case(rng, groups="full"):
    bs = rng.choice([4, 8, 16, 32])
    n = rng.randint(1, 10)
    max_len = rng.choice([32, 64, 128, 256])
    spread = rng.choice([0, 4, 12, 30])
    reqs = []
    for i in range(n):
        prompt = rng.randint(1, max_len)
        r = {"id": i, "arrival_step": rng.choice([0, 0, rng.randint(0, spread), rng.randint(0, spread)]),
             "prompt": prompt, "output": rng.randint(1, 40), "load_steps": rng.randint(1, 4)}
        if rng.random() < 0.5:
            r["prefix_group"] = rng.randint(0, 2)
            r["prefix_tokens"] = rng.randint(1, prompt)
        reqs.append(r)
    need = max(-(-(r["prompt"] + r["output"]) // bs) for r in reqs)
    total = sum(-(-(r["prompt"] + r["output"]) // bs) for r in reqs)
    seqs = rng.randint(1, 8)
    # A pool between "the largest request alone" and "everything at once";
    # mostly tight, so that loads wait for blocks and decodes preempt.
    spare = rng.choice([0, rng.randint(0, need), rng.randint(0, max(1, total - need))])
    # vLLM refuses a token budget below max_num_seqs.
    c = {"role": "decode", "max_num_seqs": seqs,
         "max_num_batched_tokens": max(seqs, rng.choice([bs, 2 * bs, 32, 64, 128, 512])),
         "num_blocks": 1 + need + spare, "block_size": bs,
         "prefix_caching": rng.random() < 0.7, "requests": reqs}
    if groups == "window":
        c["cache_groups"] = [
            {"kind": "full_attention", "block_size_tokens": bs, "prefix_cacheable": True},
            {"kind": "sliding_window", "block_size_tokens": bs,
             "window_tokens": rng.randint(1, 4) * bs + rng.choice([0, 1]), "prefix_cacheable": True},
        ]
        # Each group holds at most a request's whole sequence.
        c["num_blocks"] = 1 + 2 * need + spare
    elif groups == "mamba":
        c["cache_groups"] = [
            {"kind": "full_attention", "block_size_tokens": bs, "prefix_cacheable": True},
            {"kind": "state", "block_size_tokens": bs, "prefix_cacheable": True},
            {"kind": "state", "block_size_tokens": bs, "prefix_cacheable": False},
        ]
        # A few state blocks per request beside its full-attention ones.
        c["num_blocks"] = 1 + need + 8 + spare
    elif groups == "window-mamba":
        c["cache_groups"] = [
            {"kind": "full_attention", "block_size_tokens": bs, "prefix_cacheable": True},
            {"kind": "sliding_window", "block_size_tokens": bs,
             "window_tokens": rng.randint(1, 4) * bs + rng.choice([0, 1]), "prefix_cacheable": True},
            {"kind": "state", "block_size_tokens": bs, "prefix_cacheable": True},
            {"kind": "state", "block_size_tokens": bs, "prefix_cacheable": False},
        ]
        c["num_blocks"] = 1 + 2 * need + 8 + spare
    elif groups in ("full2", "full3"):
        k = int(groups[-1])
        c["cache_groups"] = [{"kind": "full_attention", "block_size_tokens": bs, "prefix_cacheable": True}] * k
        c["num_blocks"] = 1 + k * (need + spare)
    elif groups == "windows":
        c["cache_groups"] = windows_groups(rng, bs)
        c["num_blocks"] = 1 + len(c["cache_groups"]) * need + spare
    elif groups != "full":
        raise SystemExit(f"unknown --groups {groups}")
    return c


def main():
    seed, count, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    groups = sys.argv[sys.argv.index("--groups") + 1] if "--groups" in sys.argv else "full"
    rng = random.Random(seed)
    os.makedirs(out, exist_ok=True)
    for k in range(count):
        c = case(rng, groups)
        if "--first-chunk" in sys.argv:
            c["scheduler_reserve_full_isl"] = False
        if "--options" in sys.argv:
            draw_options(random.Random(f"{seed}-{k}-options"), c)
        if "--priority" in sys.argv:
            draw_priorities(random.Random(f"{seed}-{k}-priority"), c, tighten=False)
        if "--async" in sys.argv:
            c["async_scheduling"] = True
        with open(os.path.join(out, f"gen-pd-{seed}-{k}.json"), "w") as f:
            json.dump(c, f)
            f.write("\n")


if __name__ == "__main__":
    main()
