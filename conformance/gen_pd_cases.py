#!/usr/bin/env python3
"""Seeded random decode-side (P/D) cases for the conformance suite.

  gen_pd_cases.py SEED COUNT OUT_DIR

writes OUT_DIR/gen-pd-SEED-K.json for K in 0..COUNT: cases of
vllm_pd_steps.py ("role": "decode", full attention only) with block sizes,
token budgets, max_num_seqs, pool sizes, prefix sharing, prompt and output
lengths, arrival steps and per-request load_steps (1..4), all drawn from one
seeded stream, so the same seed gives the same cases on every machine.
Pools are small enough that reservations wait for blocks and decodes are
preempted, but every request's prompt and output fit the pool alone.
"""
import json
import os
import random
import sys


def case(rng):
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
    return {"role": "decode", "max_num_seqs": seqs,
            "max_num_batched_tokens": max(seqs, rng.choice([bs, 2 * bs, 32, 64, 128, 512])),
            "num_blocks": 1 + need + spare, "block_size": bs,
            "prefix_caching": rng.random() < 0.7, "requests": reqs}


def main():
    seed, count, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    rng = random.Random(seed)
    os.makedirs(out, exist_ok=True)
    for k in range(count):
        with open(os.path.join(out, f"gen-pd-{seed}-{k}.json"), "w") as f:
            json.dump(case(rng), f)
            f.write("\n")


if __name__ == "__main__":
    main()
