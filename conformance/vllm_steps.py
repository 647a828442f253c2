#!/usr/bin/env python3
"""vLLM 0.33.0's real v1 Scheduler, driven on CPU with fake model
outputs. Prints one JSON line per step: which requests, tokens per request,
preemptions, finished.

Input (argv[1], JSON): {"max_num_seqs", "max_num_batched_tokens", "num_blocks",
 "block_size", "prefix_caching", "requests": [{"id", "arrival_step", "prompt",
 "output", "prefix_group"(opt), "prefix_tokens"(opt)}], "cache_groups"(opt)}

"cache_groups" (optional): a hybrid model as a list of pdsim cache groups
({"name", "kind": full_attention|sliding_window|state, "block_size_tokens",
"window_tokens", "prefix_cacheable", "checkpoint_blocks"(opt), ...}), mapped to
vLLM specs as handoff_oracle.py does: FullAttentionSpec, SlidingWindowSpec,
MambaSpec (a prefix-cacheable state; mamba_cache_mode "align" with prefix
caching, else "none", as vLLM's MambaModelConfig sets it) and CircularBufferSpec
(a non-cacheable state, the tail ring). All groups share one pool of
num_blocks blocks with equal page sizes; the scheduler and hash block sizes
come from vLLM's resolve_kv_cache_block_sizes, as in EngineCore. Without
"cache_groups" the driver is unchanged (one full-attention group).

A request arriving at step s is added before the s-th schedule() call (the
first call is step 0). Every scheduled request that reaches the end of its
known tokens samples one token (never EOS); it finishes at max_tokens.

"scheduler_reserve_full_isl": false (optional; default true) admits a
waiting request when its first chunk fits rather than its whole sequence.
The other scheduler options a case may give (vLLM's defaults otherwise):
"enable_chunked_prefill", "long_prefill_token_threshold",
"long_prefill_token_threshold_adaptive", "max_num_active_seqs", "watermark",
"policy" ("fcfs" or "priority", with each request's "priority", default 0).

"async_scheduling": true (optional) runs vLLM's AsyncScheduler the way
EngineCore.step_with_batch_queue drives it (`v1/engine/core.py:708-822`)
with a batch queue of two (`config/vllm.py:588` max_concurrent_batches):
a batch is scheduled while the one before it executes, with output
placeholders for the tokens that batch will sample, and a batch's outputs
are applied (update_from_output) only when the queue is full or nothing is
left to schedule. One line per batch, written when its outputs are applied
(`step` is its schedule call; `finished_after` what its outputs finished).
"""
import json
import math
import os
import sys

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
os.environ.setdefault("PYTHONHASHSEED", "0")

import torch  # noqa: E402

from vllm.config import CacheConfig, DeviceConfig, ModelConfig, SchedulerConfig, VllmConfig  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.utils.hashing import sha256  # noqa: E402
from vllm.v1.core.kv_cache_utils import (  # noqa: E402
    get_request_block_hasher,
    init_none_hash,
    resolve_kv_cache_block_sizes,
)
from vllm.v1.core.sched.async_scheduler import AsyncScheduler  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.kv_cache_interface import (  # noqa: E402
    CircularBufferSpec,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    MambaSpec,
    SlidingWindowSpec,
)
from vllm.v1.outputs import ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def is_async(cfg):
    return bool(cfg.get("async_scheduling", False))


def scheduler_class(cfg):
    return AsyncScheduler if is_async(cfg) else Scheduler


# The scheduler options a case may give, with vLLM's defaults.
OPTIONS = {
    "scheduler_reserve_full_isl": True,
    "enable_chunked_prefill": True,
    "long_prefill_token_threshold": 0,
    "long_prefill_token_threshold_adaptive": False,
    "max_num_active_seqs": None,
    "watermark": 0.0,
    "policy": "fcfs",
}


def options(cfg):
    """The case's scheduler options as SchedulerConfig arguments."""
    return {k: cfg.get(k, d) for k, d in OPTIONS.items()}


def build(cfg, kv_transfer_config=None):
    """Returns (scheduler, hash_block_size). `kv_transfer_config`: a KV
    connector's (the decode side of P/D, vllm_pd_steps.py)."""
    if cfg.get("cache_groups"):
        return build_hybrid(cfg, kv_transfer_config)
    sc = SchedulerConfig(max_num_seqs=cfg["max_num_seqs"], max_num_batched_tokens=cfg["max_num_batched_tokens"],
                         max_model_len=cfg.get("max_model_len", 8192),
                         async_scheduling=is_async(cfg), is_encoder_decoder=False, **options(cfg))
    mc = ModelConfig(model=os.path.join(HERE, "tiny-llama"), skip_tokenizer_init=True, dtype="float16",
                     max_model_len=cfg.get("max_model_len", 8192))
    cc = CacheConfig(block_size=cfg["block_size"], enable_prefix_caching=cfg["prefix_caching"])
    vc = VllmConfig(scheduler_config=sc, model_config=mc, cache_config=cc, device_config=DeviceConfig("cpu"),
                    kv_transfer_config=kv_transfer_config)
    kvc = KVCacheConfig(num_blocks=cfg["num_blocks"], kv_cache_tensors=[],
                        kv_cache_groups=[KVCacheGroupSpec(["layer"], FullAttentionSpec(
                            block_size=cfg["block_size"], num_kv_heads=1, head_size=1, dtype=torch.float32))])
    cc.num_gpu_blocks = cfg["num_blocks"]
    return scheduler_class(cfg)(vllm_config=vc, kv_cache_config=kvc,
                                structured_output_manager=StructuredOutputManager(vc),
                                block_size=cfg["block_size"], log_stats=True), cfg["block_size"]


def hybrid_specs(groups, caching, max_model_len):
    """pdsim cache groups -> vLLM specs, every page the same number of bytes
    (vLLM's hybrid allocator needs one page size across groups)."""
    is_mamba = [g["kind"] == "state" and g["prefix_cacheable"] for g in groups]
    mode = "align" if caching else "none"
    # Like vllm serve: without prefix caching a Mamba group's block spans the
    # whole model length (MambaModelConfig sets mamba_block_size=max_model_len).
    sizes = [g["block_size_tokens"] if not (m and not caching) else max_model_len
             for g, m in zip(groups, is_mamba)]
    page = 4 * math.lcm(*(b for b, m in zip(sizes, is_mamba) if not m), 1)  # float16 K+V bytes
    specs = []
    for g, b, m in zip(groups, sizes, is_mamba):
        common = dict(block_size=b, num_kv_heads=1, head_size=page // (4 * b), dtype=torch.float16)
        if g["kind"] == "full_attention":
            specs.append(FullAttentionSpec(**common))
        elif g["kind"] == "sliding_window":
            specs.append(SlidingWindowSpec(**common, sliding_window=g["window_tokens"]))
        elif m:
            specs.append(MambaSpec(block_size=b, shapes=((page // 2,),), dtypes=(torch.float16,),
                                   mamba_cache_mode=mode,
                                   num_prefill_checkpoint_blocks=int(g.get("checkpoint_blocks", 0) or 0)))
        elif g["kind"] == "state":
            specs.append(CircularBufferSpec(**common))
        else:
            raise ValueError(f"unsupported cache group kind {g['kind']!r}")
    assert len({s.page_size_bytes for s in specs}) == 1, [s.page_size_bytes for s in specs]
    return specs


def build_hybrid(cfg, kv_transfer_config=None):
    groups, caching = cfg["cache_groups"], cfg["prefix_caching"]
    max_model_len = cfg.get("max_model_len", 8192)
    specs = hybrid_specs(groups, caching, max_model_len)
    has_mamba = any(isinstance(s, MambaSpec) for s in specs)
    attn = [s.block_size for s in specs if not isinstance(s, MambaSpec)]
    mamba = [s.block_size for s in specs if isinstance(s, MambaSpec)]
    sc = SchedulerConfig(max_num_seqs=cfg["max_num_seqs"], max_num_batched_tokens=cfg["max_num_batched_tokens"],
                         max_model_len=max_model_len,
                         async_scheduling=is_async(cfg), is_encoder_decoder=False, **options(cfg))
    mc = ModelConfig(model=os.path.join(HERE, "tiny-llama"), skip_tokenizer_init=True, dtype="float16",
                     max_model_len=max_model_len)
    # What MambaModelConfig.verify_and_update_config does for a Mamba model:
    # prefix caching -> mamba_cache_mode "align", mamba_block_size = block size.
    cc_kw = dict(block_size=attn[0] if attn else mamba[0], enable_prefix_caching=caching)
    if has_mamba and caching:
        cc_kw.update(mamba_cache_mode="align", mamba_block_size=mamba[0])
    cc = CacheConfig(**cc_kw)
    vc = VllmConfig(scheduler_config=sc, model_config=mc, cache_config=cc, device_config=DeviceConfig("cpu"),
                    kv_transfer_config=kv_transfer_config)
    if kv_transfer_config is not None:
        # The hybrid allocator on, as on a GPU (NIXL supports it, SupportsHMA;
        # VllmConfig turns it off on a platform without hybrid KV caches). The
        # scheduler runs on the KVCacheConfig below either way; the connector
        # reads the flag to clip the block ids it exchanges.
        vc.scheduler_config.disable_hybrid_kv_cache_manager = False
    kvc = KVCacheConfig(num_blocks=cfg["num_blocks"], kv_cache_tensors=[],
                        kv_cache_groups=[KVCacheGroupSpec([f"layer{i}"], s)
                                         for i, s in enumerate(specs)])
    cc.num_gpu_blocks = cfg["num_blocks"]
    sched_bs, hash_bs = resolve_kv_cache_block_sizes(kvc, vc)
    sched = scheduler_class(cfg)(vllm_config=vc, kv_cache_config=kvc,
                                 structured_output_manager=StructuredOutputManager(vc),
                                 block_size=sched_bs, hash_block_size=hash_bs, log_stats=True)
    return sched, hash_bs


def tokens_of(r):
    """Prompt token ids: a shared prefix per prefix_group, then unique ids."""
    toks = []
    if r.get("prefix_group") is not None:
        toks = [10_000 + 1_000 * r["prefix_group"] + (i % 997) for i in range(r["prefix_tokens"])]
    uniq = [100_000 + 10_000 * r["id"] + i for i in range(r["prompt"] - len(toks))]
    return toks + uniq


def vllm_id(r):
    """A request's vLLM id. vLLM's priority queue breaks a tie of priority
    and arrival by comparing id strings; pdsim by number. Ids are
    zero-padded so that the two orders agree (int() reads them back)."""
    return f"{r['id']:09d}"


def add_arrivals(sched, hasher, pending, added, step):
    while pending and pending[0]["arrival_step"] <= step:
        r = pending.pop(0)
        sp = SamplingParams(max_tokens=r["output"], ignore_eos=True)
        sched.add_request(Request(request_id=vllm_id(r), prompt_token_ids=tokens_of(r), sampling_params=sp,
                                  pooling_params=None, block_hasher=hasher, arrival_time=float(step),
                                  priority=r.get("priority", 0)))
        added.add(int(r["id"]))


def sampled_of(sched, out):
    """The scheduled requests in order, and the token each samples (none for
    a prefill chunk), read right after schedule()."""
    req_ids = list(out.num_scheduled_tokens)
    # A request samples unless its chunk ends inside its known tokens
    # (`Scheduler._update_after_schedule` sets `is_prefill_chunk`).
    sampled = [[] if sched.requests[rid].is_prefill_chunk else [5] for rid in req_ids]
    return req_ids, sampled


def log_line(sched, step, out, req_ids, now_done):
    preempted = sorted(int(x) for x in getattr(out, "preempted_req_ids", None) or [])
    print(json.dumps(dict(step=step, batch={int(k): v for k, v in sorted(out.num_scheduled_tokens.items(),
                                                                         key=lambda kv: int(kv[0]))},
                          order=[int(k) for k in req_ids], preempted=preempted,
                          finished_after=sorted(now_done),
                          waiting=len(sched.waiting), running=len(sched.running))), flush=True)


def main():
    cfg = json.load(open(sys.argv[1]))
    init_none_hash(sha256)
    sched, hash_bs = build(cfg)
    hasher = get_request_block_hasher(hash_bs, sha256)
    pending = sorted(cfg["requests"], key=lambda r: (r["arrival_step"], r["id"]))
    if is_async(cfg):
        return main_async(sched, hasher, pending)
    step = 0
    done = set()
    added = set()
    while pending or sched.get_num_unfinished_requests():
        add_arrivals(sched, hasher, pending, added, step)
        out = sched.schedule()
        req_ids, sampled = sampled_of(sched, out)
        mro = ModelRunnerOutput(req_ids=req_ids, req_id_to_index={r: i for i, r in enumerate(req_ids)},
                                sampled_token_ids=sampled)
        sched.update_from_output(out, mro)
        now_done = added - {int(x) for x in sched.requests} - done
        log_line(sched, step, out, req_ids, now_done)
        done |= now_done
        step += 1
        if step > 100_000:
            raise SystemExit("no progress")


def main_async(sched, hasher, pending):
    """EngineCore.step_with_batch_queue with a queue of two batches: new
    arrivals before each schedule() call; a batch's outputs applied when the
    queue is full or nothing else can be scheduled."""
    queue = []  # (step, out, req_ids, sampled), oldest first
    step = 0
    done = set()
    added = set()
    while pending or sched.get_num_unfinished_requests() or queue:
        add_arrivals(sched, hasher, pending, added, step)
        if sched.has_requests():
            out = sched.schedule()
            req_ids, sampled = sampled_of(sched, out)
            queue.append((step, out, req_ids, sampled))
            step += 1
            executed = out.total_num_scheduled_tokens > 0
            if len(queue) < 2 and (executed or sched.has_requests()):
                continue
        if not queue:
            # Nothing scheduled and nothing in flight: the next arrival's
            # step is the next schedule call.
            step = max(step, pending[0]["arrival_step"]) if pending else step
            continue
        s, out, req_ids, sampled = queue.pop(0)
        mro = ModelRunnerOutput(req_ids=req_ids, req_id_to_index={r: i for i, r in enumerate(req_ids)},
                                sampled_token_ids=sampled)
        sched.update_from_output(out, mro)
        now_done = added - {int(x) for x in sched.requests} - done
        log_line(sched, s, out, req_ids, now_done)
        done |= now_done
        if step > 100_000:
            raise SystemExit("no progress")

if __name__ == "__main__":
    main()
