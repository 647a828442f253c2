#!/usr/bin/env python3
"""The handoff payload: `pdsim transfer` against vLLM 0.33.0's own NIXL pull
path (vllm_handoff.py), on seeded random queries.

  handoff.py gen SEED MODELS QUERIES OUT_DIR
      writes OUT_DIR/models.json (the shipped fragments, then MODELS - 4
      random models) and OUT_DIR/queries.jsonl (QUERIES per model:
      {"model": i, "n": N, "k": K}), all from one seeded stream.
  handoff.py oracle-input OUT_DIR
      prints vllm_handoff.py's input lines for OUT_DIR's queries.
  handoff.py answers OUT_DIR VLLM_OUT
      joins vllm_handoff.py's output lines with the queries into
      OUT_DIR/answers.jsonl ({"model", "n", "k", "blocks", "full_hit"}).
  handoff.py compare PDSIM OUT_DIR
      runs `PDSIM transfer --json` on every answered query (one scenario
      file per model) and prints each disagreement, then
      `N/M queries agree`; exit 0 only when all do.

A model is {"name", "groups": [pdsim cache groups]} or {"name",
"linear": {"kv_bytes_per_token", "block_size"}}; vLLM sees a linear model
as one full-attention group of that block size.
"""
import json
import os
import random
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def toml_groups(path):
    """The cache groups of a shipped fragment (a tiny reader: the fragments
    hold only [model], name and [[model.cache_groups]] tables)."""
    groups, cur = [], None
    for line in open(path):
        line = line.split("#", 1)[0].strip()
        if line == "[[model.cache_groups]]":
            cur = {}
            groups.append(cur)
        elif "=" in line and cur is not None:
            key, val = (x.strip() for x in line.split("=", 1))
            cur[key] = json.loads(val)
    return groups


def shipped():
    models = []
    for name in ["glm-5.3-flash-tp4-fp8", "gpt-oss-like", "mamba2-hybrid-like"]:
        models.append({"name": name, "groups": toml_groups(os.path.join(ROOT, "scenarios/models", name + ".toml"))})
    # llama-3.1-8b-tp4: 32,768 bytes per token, blocks of 16 on its ranks.
    models.append({"name": "llama-3.1-8b-tp4", "linear": {"kv_bytes_per_token": 32768, "block_size": 16}})
    return models


def random_model(rng, i):
    base = rng.choice([4, 8, 16, 32, 64, 528, 2176])
    shape = rng.choice(["fa", "fa+window", "fa+mamba", "fa+mamba+ring", "fa+window+mamba", "window", "mamba",
                        "window+mamba", "linear"])
    if shape == "linear":
        return {"name": f"random-{i}", "linear": {"kv_bytes_per_token": rng.randint(1, 4096), "block_size": base}}
    groups = []

    def g(kind, b, cacheable=True, **kw):
        groups.append(dict(name=f"{kind} {len(groups)}", kind=kind, block_size_tokens=b, page_bytes=100_000,
                           transfer_bytes_per_block=rng.randint(1, 100_000), prefix_cacheable=cacheable, **kw))

    mult = lambda: base * rng.choice([1, 1, 2, 4])  # noqa: E731
    if "fa" in shape:
        g("full_attention", base)
    if "window" in shape:
        for _ in range(rng.randint(1, 2)):
            b = mult()
            g("sliding_window", b, window_tokens=rng.randint(1, 6) * b + rng.choice([0, 0, 1, b // 2]))
    if "mamba" in shape:
        b = mult()
        for _ in range(rng.randint(1, 3)):
            kw = {"checkpoint_blocks": 1} if rng.random() < 0.5 else {}
            g("state", b, **kw)
    if "ring" in shape:
        g("state", base, cacheable=False)
    return {"name": f"random-{i}", "groups": groups}


def block_sizes(m):
    return [m["linear"]["block_size"]] if "linear" in m else [g["block_size_tokens"] for g in m["groups"]]


def query(rng, m):
    bs = block_sizes(m)
    big = max(bs)
    n = rng.choice([rng.randint(1, 4 * big), rng.randint(1, 40 * big), rng.choice(bs) * rng.randint(1, 20) +
                    rng.choice([-1, 0, 1])])
    n = max(1, n)
    k = rng.choice([0, n, n - 1, rng.randint(0, n), min(n, rng.choice(bs) * rng.randint(0, 20)),
                    min(n, big * rng.randint(0, 10) + rng.choice([0, 1]))])
    return n, max(0, k)


def gen(seed, n_models, per_model, out):
    rng = random.Random(seed)
    models = shipped()
    while len(models) < n_models:
        models.append(random_model(rng, len(models)))
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "models.json"), "w") as f:
        json.dump(models, f, indent=1)
        f.write("\n")
    with open(os.path.join(out, "queries.jsonl"), "w") as f:
        for i, m in enumerate(models):
            for _ in range(per_model):
                n, k = query(rng, m)
                f.write(json.dumps({"model": i, "n": n, "k": k}) + "\n")


def load(out):
    models = json.load(open(os.path.join(out, "models.json")))
    queries = [json.loads(line) for line in open(os.path.join(out, "queries.jsonl")) if line.strip()]
    return models, queries


def oracle_groups(m):
    if "linear" in m:
        lin = m["linear"]
        b = lin["block_size"]
        return [dict(kind="full_attention", block_size_tokens=b, transfer_bytes_per_block=b * lin["kv_bytes_per_token"],
                     prefix_cacheable=True)]
    return m["groups"]


def oracle_input(out):
    models, queries = load(out)
    for q in queries:
        print(json.dumps({"groups": oracle_groups(models[q["model"]]), "n": q["n"], "k": q["k"]}))


def answers(out, vllm_out):
    _, queries = load(out)
    lines = [json.loads(line) for line in open(vllm_out) if line.strip()]
    assert len(lines) == len(queries), (len(lines), len(queries))
    with open(os.path.join(out, "answers.jsonl"), "w") as f:
        for q, r in zip(queries, lines):
            if "blocks" not in r:
                raise SystemExit(f"vLLM could not answer {q}: {r}")
            f.write(json.dumps({**q, "blocks": r["blocks"], "full_hit": r["full_hit"]}) + "\n")


SCENARIO = """name = "handoff-{i}"
vllm_version = "0.33.0"
{model}
[prefill]
count = 1
num_blocks = 1000000
max_num_batched_tokens = 8192
max_num_seqs = 256
{block}step_time = {{ kind = "linear", fixed_us = 1000.0, per_token_us = 1.0 }}

[decode]
count = 1
num_blocks = 1000000
max_num_batched_tokens = 8192
max_num_seqs = 256
{block}step_time = {{ kind = "linear", fixed_us = 1000.0, per_token_us = 1.0 }}

[link]
bandwidth_gb_s = 50.0
latency_us = 0.0

[workload]
requests = 1
arrival = {{ kind = "poisson", rate_per_s = 1.0 }}
prompt_tokens = {{ kind = "fixed", value = 100 }}
output_tokens = {{ kind = "fixed", value = 10 }}
"""


def scenario_text(i, m):
    if "linear" in m:
        model = f"[model]\nname = \"{m['name']}\"\nkv_bytes_per_token = {m['linear']['kv_bytes_per_token']}\n"
        block = f"block_size_tokens = {m['linear']['block_size']}\n"
    else:
        model = f"[model]\nname = \"{m['name']}\"\n"
        for g in m["groups"]:
            model += "\n[[model.cache_groups]]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in g.items())
        block = ""
    return SCENARIO.format(i=i, model=model, block=block)


def compare(pdsim, out):
    models = json.load(open(os.path.join(out, "models.json")))
    answered = [json.loads(line) for line in open(os.path.join(out, "answers.jsonl")) if line.strip()]
    bad = 0
    with tempfile.TemporaryDirectory() as tmp:
        files = {}
        for a in answered:
            i = a["model"]
            if i not in files:
                files[i] = os.path.join(tmp, f"model-{i}.toml")
                with open(files[i], "w") as f:
                    f.write(scenario_text(i, models[i]))
            run = subprocess.run([pdsim, "transfer", files[i], "--prompt-tokens", str(a["n"]),
                                  "--decode-cached-tokens", str(a["k"]), "--json"], capture_output=True, text=True)
            if run.returncode != 0:
                bad += 1
                print(f"{models[i]['name']} N={a['n']} K={a['k']}: pdsim failed: {run.stderr.strip()}")
                continue
            v = json.loads(run.stdout)
            ours = [v["blocks"]] if "linear" in models[i] else [g["blocks"] for g in v["groups"]]
            if ours != a["blocks"] or v["full_decode_hit"] != a["full_hit"]:
                bad += 1
                print(f"{models[i]['name']} N={a['n']} K={a['k']}: pdsim {ours} (full hit {v['full_decode_hit']}), "
                      f"vLLM {a['blocks']} (full hit {a['full_hit']})")
    print(f"{len(answered) - bad}/{len(answered)} queries agree")
    return 0 if bad == 0 else 1


def main():
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "gen":
        gen(int(args[0]), int(args[1]), int(args[2]), args[3])
    elif cmd == "oracle-input":
        oracle_input(args[0])
    elif cmd == "answers":
        answers(args[0], args[1])
    elif cmd == "compare":
        sys.exit(compare(args[0], args[1]))
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main()
