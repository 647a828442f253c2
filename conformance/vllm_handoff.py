#!/usr/bin/env python3
"""Oracle B: the handoff payload computed by vLLM 0.33.0's OWN code.

Run with the venv of venv.sh (vllm==0.33.0 installed with --no-deps,
torch 2.14 importable on CPU; no GPU needed); handoff.sh drives it.

For one model (a list of pdsim-like cache groups), a prompt of N tokens and a
decode-side prefix cache holding the first K tokens, it drives the real
objects through the NIXL pull path:

  prefill (P) side
    * NixlBaseConnectorScheduler._get_remote_prefill_token_count -> T
      (same backoff as _truncate_request_for_prefill)
    * KVCacheManager.allocate_slots(T tokens), cache, then, as
      Scheduler._connector_finished does: remove_skipped_blocks(T),
      get_block_ids_for_computed_tokens(T)
    * NixlBaseConnectorScheduler.get_exchange_clipped_blocks -> remote_block_ids
  decode (D) side
    * a warm request fills D's prefix cache with the first K tokens
    * KVCacheManager.get_computed_blocks -> local hit
    * NixlPullConnectorScheduler.get_num_new_matched_tokens(req, aligned hit)
    * the scheduler's partial-tail rule (copied: 10 lines of Scheduler.schedule)
    * KVCacheManager.allocate_slots(0 new, local hit, external, delay_cache)
    * KVCacheBlocks.get_unhashed_block_ids_all_groups + get_exchange_clipped_blocks
      (NixlPullConnectorScheduler.update_state_after_alloc)
  decode worker
    * NixlBaseConnectorWorker._apply_prefix_caching(decode ids, prefill ids)
      -> per group, the remote blocks actually READ.

bytes(group) = blocks READ x transfer_bytes_per_block (pdsim's own byte rate
per block: vLLM's byte layout per block is not what is being checked here).

Group kinds -> vLLM specs:
  full_attention            FullAttentionSpec(block_size=B)
  sliding_window            SlidingWindowSpec(block_size=B, sliding_window=W)
  state, prefix_cacheable   MambaSpec(block_size=B, mamba_cache_mode="align"
                            when caching else "none", checkpoint blocks as given)
  state, not cacheable      CircularBufferSpec(block_size=B)   (the tail ring)
  convolution               not modelled: vLLM has no window-like conv spec in
                            NIXL (short conv is refused); reported as 'skip'.
"""
from __future__ import annotations

import itertools
import json
import logging
import os
import sys
from types import SimpleNamespace

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
os.environ.setdefault("PYTHONHASHSEED", "0")

import torch  # noqa: E402

from vllm.distributed.kv_transfer.kv_connector.v1.nixl.base_worker import (  # noqa: E402
    NixlBaseConnectorWorker,
)
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.pull_scheduler import (  # noqa: E402
    NixlPullConnectorScheduler,
)
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.utils import (  # noqa: E402
    get_representative_spec_type,
)
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.utils.hashing import sha256  # noqa: E402
from vllm.v1.core.kv_cache_manager import KVCacheManager  # noqa: E402
from vllm.v1.core.kv_cache_utils import (  # noqa: E402
    get_request_block_hasher,
    init_none_hash,
    resolve_kv_cache_block_sizes,
)
from vllm.v1.kv_cache_interface import (  # noqa: E402
    CircularBufferSpec,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    MambaSpec,
    SlidingWindowSpec,
)
from vllm.v1.request import Request  # noqa: E402

logging.disable(logging.WARNING)
init_none_hash(sha256)

MAX_MODEL_LEN = 1 << 22
NUM_BLOCKS = 200_000


def mamba_mode(caching):
    """align with prefix caching (vLLM's default switch), else none; the
    environment variable ORACLE_MAMBA_MODE overrides (e.g. "all" on 0.31)."""
    return os.environ.get("ORACLE_MAMBA_MODE") or ("align" if caching else "none")


class Unsupported(Exception):
    pass


def make_specs(groups, caching=True):
    specs = []
    for g in groups:
        kind, b = g["kind"], g["block_size_tokens"]
        common = dict(block_size=b, num_kv_heads=1, head_size=1, dtype=torch.float16)
        if kind == "full_attention":
            specs.append(FullAttentionSpec(**common))
        elif kind == "sliding_window":
            specs.append(SlidingWindowSpec(**common, sliding_window=g["window_tokens"]))
        elif kind == "state" and g["prefix_cacheable"]:
            specs.append(MambaSpec(block_size=b, shapes=((1,),), dtypes=(torch.float16,),
                                   mamba_cache_mode=mamba_mode(caching),
                                   num_prefill_checkpoint_blocks=int(g.get("checkpoint_blocks", 0) or 0)))
        elif kind == "state":
            specs.append(CircularBufferSpec(**common))
        else:
            raise Unsupported(f"kind {kind}")
    return specs


def make_config(specs, num_blocks=NUM_BLOCKS):
    return KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec([f"layer{i}"], s) for i, s in enumerate(specs)],
    )


def fake_vllm_config(kv_cache_config, block_size, caching):
    """Just what NixlBaseConnectorScheduler.__init__ and
    resolve_kv_cache_block_sizes read."""
    kvt = SimpleNamespace(get_from_extra_config=lambda k, d: d, kv_buffer_device="cuda",
                          is_kv_producer=True)
    return SimpleNamespace(
        parallel_config=SimpleNamespace(tensor_parallel_size=1, decode_context_parallel_size=1,
                                        data_parallel_index=0, pipeline_parallel_size=1),
        cache_config=SimpleNamespace(block_size=block_size, enable_prefix_caching=caching,
                                     prefix_match_unit=None, mamba_cache_mode=mamba_mode(caching)),
        scheduler_config=SimpleNamespace(disable_hybrid_kv_cache_manager=False),
        kv_transfer_config=kvt,
        num_prefill_lookahead_tokens=0,
    )


class Side:
    """One engine (P or D): its KV cache manager and its NIXL scheduler."""

    def __init__(self, groups, caching=True, num_blocks=NUM_BLOCKS):
        self.specs = make_specs(groups, caching)
        self.cfg = make_config(self.specs, num_blocks)
        b0 = groups[0]["block_size_tokens"]
        vcfg = fake_vllm_config(self.cfg, b0, caching)
        self.sched_bs, self.hash_bs = resolve_kv_cache_block_sizes(self.cfg, vcfg)
        self.mgr = KVCacheManager(self.cfg, max_model_len=MAX_MODEL_LEN,
                                  scheduler_block_size=self.sched_bs, hash_block_size=self.hash_bs,
                                  enable_caching=caching)
        self.nixl = NixlPullConnectorScheduler(vcfg, "engine", self.cfg)
        self.hasher = get_request_block_hasher(self.hash_bs, sha256)
        self.ids = itertools.count()

    def request(self, tokens, params=None, max_tokens=1):
        sp = SamplingParams(max_tokens=max_tokens,
                            extra_args={"kv_transfer_params": params} if params else None)
        r = Request(request_id=f"r{next(self.ids)}", prompt_token_ids=list(tokens), sampling_params=sp,
                    pooling_params=None, block_hasher=self.hasher)
        return r


def worker_trim(groups_specs, has_mamba, decode_ids, prefill_ids):
    """NixlBaseConnectorWorker._apply_prefix_caching with the attributes it reads."""
    w = SimpleNamespace(_has_mamba=has_mamba,
                        _group_spec_types=tuple(get_representative_spec_type(s) for s in groups_specs))
    return NixlBaseConnectorWorker._apply_prefix_caching(w, decode_ids, prefill_ids, 1, 1)


def payload(groups, n, k, caching=True):
    """Returns dict(T, hit, ext, blocks=[...], bytes=[...], total, full_hit)."""
    prompt = [1000 + (i % 50000) for i in range(n)]
    # a pool with room for two requests of n tokens in every group
    nblocks = 2 * sum(-(-n // g["block_size_tokens"]) + 4 for g in groups) + 16
    # ---------------- prefill side ----------------
    P = Side(groups, caching, nblocks)
    t = P.nixl._get_remote_prefill_token_count(n)  # same backoff the P side truncates by
    preq = P.request(prompt[:t], params={"do_remote_decode": True})
    blocks = P.mgr.allocate_slots(preq, t)
    assert blocks is not None
    preq.num_computed_tokens = t
    # Scheduler._connector_finished
    P.mgr.remove_skipped_blocks(preq.request_id, t, num_prompt_tokens=preq.num_prompt_tokens)
    p_ids = P.mgr.get_block_ids_for_computed_tokens(preq.request_id, t)
    remote_ids = P.nixl.get_exchange_clipped_blocks(p_ids)
    # ---------------- decode side ----------------
    D = Side(groups, caching, nblocks)
    kk = min(k, n - 1)
    # Fill D's prefix cache with the first kk' tokens: a request computing a
    # block-aligned prefix in one chunk (so a Mamba state lands on the boundary).
    kwarm = (kk // D.sched_bs) * D.sched_bs
    if caching and kwarm > 0:
        wreq = D.request(prompt[:kwarm] + [7])
        assert D.mgr.allocate_slots(wreq, kwarm) is not None
        wreq.num_computed_tokens = kwarm
        D.mgr.cache_blocks(wreq, kwarm)
        D.mgr.free(wreq)
    D.mgr.new_step_starts()  # the target is scheduled in a later step than the warm request
    dreq = D.request(prompt, params={"do_remote_prefill": True, "remote_block_ids": remote_ids,
                                      "remote_engine_id": "p", "remote_request_id": preq.request_id,
                                      "remote_host": "h", "remote_port": 1, "tp_size": 1}, max_tokens=16)
    D.nixl.on_new_request(dreq)
    new_computed, local, _ = D.mgr.get_computed_blocks(dreq)
    # Scheduler.schedule (waiting loop): present a block-aligned local hit
    partial_tail = local % D.sched_bs
    aligned = local - partial_tail
    ext, load_async = D.nixl.get_num_new_matched_tokens(dreq, aligned)
    if partial_tail and ext > partial_tail:
        new_computed = D.mgr.truncate_computed_blocks(new_computed, aligned)
        local, n_ext = aligned, ext
    elif partial_tail:
        n_ext, load_async = 0, False
    else:
        n_ext = ext
    res = dict(T=t, local_hit=local, external=n_ext, full_hit=(n_ext == 0))
    if n_ext == 0:
        # full local hit: notification only (update_state_after_alloc gives ()).
        res["blocks"] = [0] * len(groups)
    else:
        assert load_async
        nb = D.mgr.allocate_slots(dreq, 0, num_new_computed_tokens=local, new_computed_blocks=new_computed,
                                  num_external_computed_tokens=n_ext, delay_cache_blocks=True)
        assert nb is not None, "decode allocation failed"
        unhashed = D.mgr.get_blocks(dreq.request_id).get_unhashed_block_ids_all_groups()
        local_ids = D.nixl.get_exchange_clipped_blocks(unhashed)
        d_ids, r_ids = worker_trim(D.cfg.transfer_groups and [g.kv_cache_spec for g in D.cfg.transfer_groups],
                                   D.cfg.has_mamba_layers, local_ids, remote_ids)
        assert [len(x) for x in d_ids] == [len(x) for x in r_ids], (d_ids, r_ids)
        res["blocks"] = [len(x) for x in r_ids]
        res["remote_null_blocks_read"] = sum(1 for grp in r_ids for b in grp if b == 0)
    res["bytes"] = [b * g["transfer_bytes_per_block"] for b, g in zip(res["blocks"], groups)]
    res["total"] = sum(res["bytes"])
    return res


def main():
    """stdin: JSON lines {"groups": [...], "n": N, "k": K}; stdout: JSON lines."""
    for line in sys.stdin:
        q = json.loads(line)
        try:
            r = payload(q["groups"], q["n"], q["k"], q.get("caching", True))
        except Unsupported as e:
            r = {"skip": str(e)}
        except Exception as e:  # noqa: BLE001
            r = {"error": f"{type(e).__name__}: {e}"}
        print(json.dumps(r), flush=True)


if __name__ == "__main__":
    main()
