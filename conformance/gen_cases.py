#!/usr/bin/env python3
"""Seeded random cases for the conformance suite.

  gen_cases.py SEED COUNT OUT_DIR [--groups full|window|mamba|mixed|window-only|mamba-only|sizes|sizes4|full2|full3|windows|window-mamba] [--async]
               [--first-chunk] [--options] [--priority]

(window: full attention + a sliding window; mamba: full attention + a
Mamba state + a tail ring; mixed: either, drawn per case; window-only: a
sliding window alone; mamba-only: a Mamba state and a tail ring; sizes:
full attention beside a window of twice its block size (sizes4: four
times); full2, full3:
two or three full-attention groups; windows: full attention beside two or
three window groups of one spec; window-mamba: full attention, a sliding
window and a Mamba state in one model; --priority: vLLM's priority policy with
per-request priorities)

writes OUT_DIR/gen-SEED-K.json for K in 0..COUNT: block sizes, token
budgets, max_num_seqs, pool sizes (small enough to preempt), prefix
sharing, prompt and output lengths and arrival steps, all drawn from one
seeded stream, so the same seed gives the same cases on every machine.
A case always fits: every request's prompt and output fit the pool alone.
--async marks every case `"async_scheduling": true` (vLLM's asynchronous
engine loop; the draws are the same as without it). --first-chunk marks
every case `"scheduler_reserve_full_isl": false` (admission by the first
chunk; the same draws). --options draws vLLM's scheduler options into
every case (`draw_options`: long_prefill_token_threshold, its adaptive
form, watermark, max_num_active_seqs, enable_chunked_prefill = false),
from a stream of their own, so the other draws are the same.
"""
import json
import os
import random
import sys


def windows_groups(rng, bs):
    """One full-attention group beside two or three window groups of one
    spec (a window of 1 to 4 blocks, or one token more)."""
    w = rng.randint(1, 4) * bs + rng.choice([0, 1])
    k = rng.randint(2, 3)
    return [{"kind": "full_attention", "block_size_tokens": bs, "prefix_cacheable": True}] + [
        {"kind": "sliding_window", "block_size_tokens": bs, "window_tokens": w, "prefix_cacheable": True}
    ] * k


def case(rng, groups):
    bs = rng.choice([4, 8, 16, 32])
    n = rng.randint(1, 8)
    max_len = rng.choice([64, 128, 256])
    reqs = []
    for i in range(n):
        prompt = rng.randint(1, max_len)
        r = {"id": i, "arrival_step": rng.choice([0, 0, 0, rng.randint(0, 12)]), "prompt": prompt,
             "output": rng.randint(1, 40)}
        if rng.random() < 0.5:
            r["prefix_group"] = rng.randint(0, 2)
            r["prefix_tokens"] = rng.randint(1, prompt)
        reqs.append(r)
    need = max(-(-(r["prompt"] + r["output"]) // bs) for r in reqs)
    seqs = rng.randint(1, 8)
    # vLLM refuses a token budget below max_num_seqs.
    c = {"max_num_seqs": seqs, "max_num_batched_tokens": max(seqs, rng.choice([bs, 2 * bs, 32, 64, 128, 512])),
         "num_blocks": 1 + need + rng.randint(0, 3 * need), "block_size": bs,
         "prefix_caching": rng.random() < 0.7, "requests": reqs}
    kind = rng.choice(["window", "mamba"]) if groups == "mixed" else groups
    if kind == "window":
        c["cache_groups"] = [
            {"kind": "full_attention", "block_size_tokens": bs, "prefix_cacheable": True},
            {"kind": "sliding_window", "block_size_tokens": bs, "window_tokens": rng.randint(1, 4) * bs + rng.choice([0, 1]),
             "prefix_cacheable": True},
        ]
        c["num_blocks"] = 1 + 2 * need + rng.randint(0, 3 * need)
    elif kind == "mamba":
        c["cache_groups"] = [
            {"kind": "full_attention", "block_size_tokens": bs, "prefix_cacheable": True},
            {"kind": "state", "block_size_tokens": bs, "prefix_cacheable": True},
            {"kind": "state", "block_size_tokens": bs, "prefix_cacheable": False},
        ]
        c["num_blocks"] = 1 + need + 8 + rng.randint(0, 3 * need)
    elif kind == "window-mamba":
        # Full attention, a sliding window and a Mamba state (with its tail
        # ring) in one model.
        c["cache_groups"] = [
            {"kind": "full_attention", "block_size_tokens": bs, "prefix_cacheable": True},
            {"kind": "sliding_window", "block_size_tokens": bs, "window_tokens": rng.randint(1, 4) * bs + rng.choice([0, 1]),
             "prefix_cacheable": True},
            {"kind": "state", "block_size_tokens": bs, "prefix_cacheable": True},
            {"kind": "state", "block_size_tokens": bs, "prefix_cacheable": False},
        ]
        c["num_blocks"] = 1 + 2 * need + 8 + rng.randint(0, 3 * need)
    elif kind == "window-only":
        # No full-attention group: vLLM's sliding-window manager hits alone.
        c["cache_groups"] = [
            {"kind": "sliding_window", "block_size_tokens": bs, "window_tokens": rng.randint(1, 4) * bs + rng.choice([0, 1]),
             "prefix_cacheable": True},
        ]
    elif kind == "mamba-only":
        c["cache_groups"] = [
            {"kind": "state", "block_size_tokens": bs, "prefix_cacheable": True},
            {"kind": "state", "block_size_tokens": bs, "prefix_cacheable": False},
        ]
        c["num_blocks"] = 1 + 8 + rng.randint(0, need)
    elif kind in ("sizes", "sizes4"):
        # Full attention beside a window group of twice (four times) its
        # block size: hits aligned to the lcm.
        f = 4 if kind == "sizes4" else 2
        c["cache_groups"] = [
            {"kind": "full_attention", "block_size_tokens": bs, "prefix_cacheable": True},
            {"kind": "sliding_window", "block_size_tokens": f * bs, "window_tokens": rng.randint(1, 3) * f * bs,
             "prefix_cacheable": True},
        ]
        c["num_blocks"] = 1 + 2 * need + rng.randint(0, 3 * need)
    elif kind in ("full2", "full3"):
        # Groups of one spec: vLLM groups a model's layers into groups of
        # equal size, so a model can have several full-attention groups.
        c["cache_groups"] = [
            {"kind": "full_attention", "block_size_tokens": bs, "prefix_cacheable": True}
        ] * int(kind[-1])
        c["num_blocks"] = 1 + int(kind[-1]) * need + rng.randint(0, 3 * need)
    elif kind == "windows":
        c["cache_groups"] = windows_groups(rng, bs)
        c["num_blocks"] = 1 + len(c["cache_groups"]) * need + rng.randint(0, 3 * need)
    elif kind != "full":
        raise SystemExit(f"unknown --groups {groups}")
    return c


def draw_options(rng, c):
    """Draws vLLM scheduler options into case `c` (--options): the
    long-prefill threshold (adaptive or not), the watermark,
    max_num_active_seqs, and chunked prefill off (which vLLM allows only
    with a token budget of at least max_model_len, so the budget grows to
    one past the longest request and max_model_len is set to it)."""
    if rng.random() < 0.3:
        c["enable_chunked_prefill"] = False
        longest = max(r["prompt"] + r["output"] for r in c["requests"])
        c["max_num_batched_tokens"] = max(c["max_num_batched_tokens"], longest + 1)
        c["max_model_len"] = c["max_num_batched_tokens"]
    if rng.random() < 0.6:
        bs = c["block_size"]
        t = rng.choice([1, 3, bs, 2 * bs, rng.randint(1, 64)])
        c["long_prefill_token_threshold"] = min(t, c.get("max_model_len", 8192))
        if rng.random() < 0.4:
            c["long_prefill_token_threshold_adaptive"] = True
    if rng.random() < 0.4:
        c["watermark"] = rng.choice([0.01, 0.05, 0.1, 0.2, 0.3])
    if rng.random() < 0.4:
        c["max_num_active_seqs"] = rng.randint(1, c["max_num_seqs"])


def draw_priorities(rng, c, tighten=True):
    """vLLM's priority policy (--priority): each request a priority of a
    few levels (lower first; ties common, so arrival and id order them)."""
    c["policy"] = "priority"
    levels = rng.choice([[0], [0, 1], [0, 1, 2], [-1, 0, 5]])
    for r in c["requests"]:
        r["priority"] = rng.choice(levels)
    if tighten and "cache_groups" not in c and rng.random() < 0.7:
        # A tighter pool (full attention): the policy shows in preemptions.
        bs = c["block_size"]
        need = max(-(-(r["prompt"] + r["output"]) // bs) for r in c["requests"])
        c["num_blocks"] = 1 + need + rng.randint(0, need)


def main():
    seed, count, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    groups = sys.argv[sys.argv.index("--groups") + 1] if "--groups" in sys.argv else "full"
    rng = random.Random(seed)
    os.makedirs(out, exist_ok=True)
    for k in range(count):
        c = case(rng, groups)
        if "--async" in sys.argv:
            c["async_scheduling"] = True
        if "--first-chunk" in sys.argv:
            c["scheduler_reserve_full_isl"] = False
        if "--options" in sys.argv:
            # A stream of its own, so the case's other draws stay the same.
            draw_options(random.Random(f"{seed}-{k}-options"), c)
        if "--priority" in sys.argv:
            draw_priorities(random.Random(f"{seed}-{k}-priority"), c)
        with open(os.path.join(out, f"gen-{seed}-{k}.json"), "w") as f:
            json.dump(c, f)
            f.write("\n")


if __name__ == "__main__":
    main()
