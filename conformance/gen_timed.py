#!/usr/bin/env python3
"""Seeded random timed cases: one pdsim scenario and the same deployment as
a vLLM case, for comparing per-request times (vllm_timed.py, timed.sh).

  gen_timed.py SEED COUNT OUT_DIR [--groups full|window|mamba|mixed|full2|full3|windows|window-mamba] [--async] [--options] [--priority]
               [--requests N]

writes, for K in 0..COUNT, OUT_DIR/timed-SEED-K.json (the case vllm_timed.py
reads), OUT_DIR/timed-SEED-K.toml (the scenario `pdsim run` reads) and
OUT_DIR/timed-SEED-K.trace.jsonl (its requests, a `timed_trace` trace):
N requests (default 400) arriving as a Poisson stream at a rate drawn
against the step time (from light load to a standing queue), prompts of
1 to 1,500 tokens, half of them sharing a prefix of one of five groups,
outputs of 1 to 200 tokens; a pool small enough to preempt in some cases;
a `linear` step time with fractional microseconds. Every draw comes from
one seeded stream: the same seed gives the same cases on every machine.
--options draws vLLM's scheduler options as gen_cases.py does (from a
stream of their own) into the case and the scenario's role; --priority,
vLLM's priority policy, with each request's priority in its trace row.

The two sides describe one deployment: the scenario's pool is the case's
`num_blocks` less vLLM's null block; its front end is zero (the vLLM side
times outputs as the engine core emits them); a trace row names the
prefix's full blocks with ids shared by the group (chunk_hash_size = the
block size), which is what vLLM's hashes of the case's tokens share.
"""
import json
import os
import random
import sys

from gen_cases import draw_options, draw_priorities


def groups_of(rng, kind, bs):
    if kind == "full":
        return [{"kind": "full_attention", "block_size_tokens": bs, "prefix_cacheable": True}]
    if kind == "window":
        return [
            {"kind": "full_attention", "block_size_tokens": bs, "prefix_cacheable": True},
            {"kind": "sliding_window", "block_size_tokens": bs,
             "window_tokens": rng.randint(1, 8) * bs + rng.choice([0, 1]), "prefix_cacheable": True},
        ]
    if kind == "mamba":
        return [
            {"kind": "full_attention", "block_size_tokens": bs, "prefix_cacheable": True},
            {"kind": "state", "block_size_tokens": bs, "prefix_cacheable": True},
            {"kind": "state", "block_size_tokens": bs, "prefix_cacheable": False},
        ]
    if kind in ("full2", "full3"):
        # Groups of one spec, as vLLM groups a model with more full-attention
        # layers than others.
        return [{"kind": "full_attention", "block_size_tokens": bs, "prefix_cacheable": True}] * int(kind[-1])
    if kind == "window-mamba":
        # A sliding window beside a Mamba state (and its tail ring) in one
        # model, one block size.
        return [
            {"kind": "full_attention", "block_size_tokens": bs, "prefix_cacheable": True},
            {"kind": "sliding_window", "block_size_tokens": bs,
             "window_tokens": rng.randint(1, 8) * bs + rng.choice([0, 1]), "prefix_cacheable": True},
            {"kind": "state", "block_size_tokens": bs, "prefix_cacheable": True},
            {"kind": "state", "block_size_tokens": bs, "prefix_cacheable": False},
        ]
    if kind == "windows":
        # One full-attention group beside two or three window groups of one
        # spec.
        w = rng.randint(1, 8) * bs + rng.choice([0, 1])
        return [{"kind": "full_attention", "block_size_tokens": bs, "prefix_cacheable": True}] + [
            {"kind": "sliding_window", "block_size_tokens": bs, "window_tokens": w, "prefix_cacheable": True}
        ] * rng.randint(2, 3)
    raise SystemExit(f"unknown --groups {kind}")


def case(rng, kind, n):
    bs = rng.choice([8, 16, 16, 32])
    st = {"fixed": rng.randint(1_000_000_000, 8_000_000_000) + rng.randint(1, 999),
          "per_token": rng.randint(2_000_000, 40_000_000) + rng.randint(1, 999),
          "per_seq": rng.choice([0, rng.randint(1, 20_000_000)]),
          "per_context_token": rng.choice([0, rng.randint(1, 10_000)])}
    seqs = rng.choice([4, 8, 16, 32, 64])
    budget = max(seqs, rng.choice([256, 512, 1024, 2048]))
    mean_prompt = rng.choice([100, 300, 600])
    mean_output = rng.choice([20, 60, 120])
    # Arrivals: a mean gap of 0.05 to 1.5 decode steps per concurrent
    # sequence the rank could hold, from light to overloaded.
    gap_ns = st["fixed"] / 1000 * mean_output / seqs * rng.uniform(0.05, 1.5)
    t = 0.0
    reqs = []
    for i in range(n):
        prompt = max(1, min(1500, int(rng.expovariate(1 / mean_prompt))))
        r = {"id": i, "arrival_ns": int(t), "prompt": prompt,
             "output": max(1, min(200, int(rng.expovariate(1 / mean_output))))}
        if rng.random() < 0.5:
            r["prefix_group"] = rng.randint(0, 4)
            r["prefix_tokens"] = rng.randint(1, prompt)
        reqs.append(r)
        t += rng.expovariate(1 / gap_ns)
    need = max(-(-(r["prompt"] + r["output"]) // bs) for r in reqs)
    groups = groups_of(rng, kind, bs)
    # What vLLM's admission may count for one request besides its
    # full-attention blocks: a window group's, up to the whole sequence's
    # (its cap is the window and a step's tokens); its states.
    extra = {"full": 0, "window": need, "mamba": 8, "full2": need, "full3": 2 * need,
             "windows": (len(groups) - 1) * need, "window-mamba": need + 8}[kind]
    # From a pool that preempts often to one that never does.
    num_blocks = 1 + need + extra + rng.randint(0, rng.choice([need, 4 * need, 40 * need]))
    return {"max_num_seqs": seqs, "max_num_batched_tokens": budget, "num_blocks": num_blocks, "block_size": bs,
            "prefix_caching": rng.random() < 0.8, "cache_groups": groups, "step_time_ps": st, "requests": reqs}


# vLLM's scheduler options a case may give (`--options`), each also a
# field of the scenario's role of the same name.
OPTION_KEYS = ["scheduler_reserve_full_isl", "enable_chunked_prefill", "long_prefill_token_threshold",
               "long_prefill_token_threshold_adaptive", "max_num_active_seqs", "watermark", "max_model_len",
               "policy"]


def toml_value(v):
    if isinstance(v, str):
        return json.dumps(v)
    return str(v).lower() if isinstance(v, bool) else str(v)


def us(ps):
    """Picoseconds as an exact decimal of microseconds."""
    return f"{ps // 1_000_000}.{ps % 1_000_000:06d}"


def draw_pd(rng, c):
    """A 1P1D deployment of the case's rank (`--pd`): the prefill pool, and a
    link from one that takes longer than a step per read to one that
    takes microseconds, shared or first come first served."""
    need = max(-(-(r["prompt"] + 1) // c["block_size"]) for r in c["requests"])
    groups = len(c["cache_groups"])
    c["role"] = "pd"
    c["pd"] = {"prefill_num_blocks": 1 + groups * need + rng.randint(0, rng.choice([need, 4 * need, 40 * need])),
               "transfer_bytes_per_block": 4096,
               "link": {"latency_ns": rng.choice([0, 1_000, 20_000, 150_000]),
                        "bytes_per_s": rng.choice([20_000_000, 100_000_000, 500_000_000, 2_000_000_000,
                                                   25_000_000_000]),
                        "sharing": rng.choice(["processor_sharing", "fifo"])}}


def role_lines(c, num_blocks):
    st = c["step_time_ps"]
    return [f'num_blocks = {num_blocks - 1}',
            f'max_num_batched_tokens = {c["max_num_batched_tokens"]}', f'max_num_seqs = {c["max_num_seqs"]}',
            f'prefix_caching = {str(c["prefix_caching"]).lower()}',
            f'async_scheduling = {str(c.get("async_scheduling", False)).lower()}',
            *(f"{k} = {toml_value(c[k])}" for k in OPTION_KEYS if k in c),
            f'step_time = {{ kind = "linear", fixed_us = {us(st["fixed"])}, per_token_us = {us(st["per_token"])}, '
            f'per_seq_us = {us(st["per_seq"])}, per_context_token_us = {us(st["per_context_token"])} }}']


def scenario(name, c):
    lines = [f'name = "{name}"', 'vllm_version = "0.33.0"', "", "[model]", 'name = "timed"']
    for i, g in enumerate(c["cache_groups"]):
        lines += ["", "[[model.cache_groups]]", f'name = "group {i}"', f'kind = "{g["kind"]}"',
                  f'block_size_tokens = {g["block_size_tokens"]}', "page_bytes = 4096",
                  "transfer_bytes_per_block = 4096", f'prefix_cacheable = {str(g["prefix_cacheable"]).lower()}']
        if "window_tokens" in g:
            lines.append(f'window_tokens = {g["window_tokens"]}')
    if c.get("role") == "pd":
        link = c["pd"]["link"]
        lines += ["", "[prefill]", "count = 1", *role_lines(c, c["pd"]["prefill_num_blocks"]),
                  "", "[decode]", "count = 1", *role_lines(c, c["num_blocks"]),
                  "", "[link]", f'bandwidth_gb_s = {link["bytes_per_s"] / 1e9}',
                  f'latency_us = {link["latency_ns"] // 1000}.{link["latency_ns"] % 1000:03d}',
                  f'sharing = "{link["sharing"]}"']
    else:
        lines += ["", "[aggregated]", *role_lines(c, c["num_blocks"])]
    lines += ["", "[frontend]", "request_us = 0", "response_us = 0",
              "", "[workload]",
              f'trace = {{ format = "timed_trace", path = "{name}.trace.jsonl", chunk_hash_size = {c["block_size"]} }}',
              ""]
    return "\n".join(lines)


def trace_rows(c):
    bs = c["block_size"]
    for r in c["requests"]:
        ids = []
        if r.get("prefix_group") is not None:
            ids = [(r["prefix_group"] + 1) * 1_000_000 + j for j in range(r["prefix_tokens"] // bs)]
        ns = r["arrival_ns"]
        prio = f', "priority": {r["priority"]}' if "priority" in r else ""
        yield (f'{{"timestamp": {ns // 1_000_000_000}.{ns % 1_000_000_000:09d}, "input_length": {r["prompt"]}, '
               f'"output_length": {r["output"]}, "hash_ids": {json.dumps(ids)}{prio}}}')


def main():
    seed, count, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    kind = sys.argv[sys.argv.index("--groups") + 1] if "--groups" in sys.argv else "full"
    n = int(sys.argv[sys.argv.index("--requests") + 1]) if "--requests" in sys.argv else 400
    rng = random.Random(seed)
    os.makedirs(out, exist_ok=True)
    for k in range(count):
        c = case(rng, rng.choice(["window", "mamba"]) if kind == "mixed" else kind, n)
        if "--async" in sys.argv:
            c["async_scheduling"] = True
        if "--options" in sys.argv:
            # A stream of its own, so the case's other draws stay the same.
            draw_options(random.Random(f"{seed}-{k}-options"), c)
        if "--priority" in sys.argv:
            draw_priorities(random.Random(f"{seed}-{k}-priority"), c, tighten=False)
        if "--pd" in sys.argv:
            draw_pd(random.Random(f"{seed}-{k}-pd"), c)
        name = f"timed-{seed}-{k}"
        with open(os.path.join(out, name + ".json"), "w") as f:
            json.dump(c, f)
            f.write("\n")
        with open(os.path.join(out, name + ".toml"), "w") as f:
            f.write(scenario(name, c))
        with open(os.path.join(out, name + ".trace.jsonl"), "w") as f:
            f.write("\n".join(trace_rows(c)) + "\n")


if __name__ == "__main__":
    main()
