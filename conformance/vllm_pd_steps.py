#!/usr/bin/env python3
"""vLLM 0.33.0's real v1 Scheduler as the DECODE side of a P/D deployment,
with the NIXL pull connector's real scheduler side, driven on CPU with fake
model outputs and a fake connector worker. Prints one JSON line per
schedule() call.

Input (argv[1], JSON): vllm_steps.py's case format ({"max_num_seqs",
"max_num_batched_tokens", "num_blocks" (vLLM's null block included),
"block_size", "prefix_caching", "requests": [{"id", "arrival_step",
"prompt", "output", "prefix_group"(opt), "prefix_tokens"(opt)}],
"cache_groups"(opt)}), plus "role": "decode" and, per request,
"load_steps": k (k >= 1, default 1). "cache_groups" maps to vLLM's specs
as vllm_steps.py maps them (a sliding window, a Mamba state in "align"
mode with prefix caching, a tail ring), the hybrid allocator on.

What is real and what is faked
------------------------------
* The Scheduler is built with a real KVTransferConfig(kv_connector=
  "NixlConnector", kv_role="kv_consumer"), so vLLM's own KVConnectorFactory
  creates the connector (NixlPullConnector, role SCHEDULER, whose
  connector_scheduler is a real NixlPullConnectorScheduler). NOTHING IS
  MONKEYPATCHED: on CPU the NIXL module imports fine ("NIXL is not
  available" is only logged; the scheduler side never touches the NIXL
  agent), the platform is vLLM's UnspecifiedPlatform, so the connector
  does not use a host buffer, and no handshake listener is started (that
  only happens in set_xfer_handshake_metadata, a worker-driven call).
  NIXL supports the hybrid allocator (SupportsHMA): with cache_groups it
  stays on, as on a GPU.
* Each request is added (Scheduler.add_request, which calls the
  connector's on_new_request) with the kv_transfer_params a real P/D proxy
  forwards from the prefill engine's response, i.e. what the P side's
  NixlPullConnectorScheduler.request_finished returns: do_remote_prefill=True,
  do_remote_decode=False, remote_block_ids (per group, the blocks of the
  T tokens the prefill computed, clipped as the connector's
  get_exchange_clipped_blocks clips them: a window group's last blocks, a
  Mamba group's state; the decode scheduler reads no id, only that there
  are some), remote_engine_id, remote_request_id, remote_host, remote_port,
  tp_size=1, dcp_size=1, pp_size=1, remote_num_tokens=T (the prompt, or
  with a Mamba group the prompt less the one token the decoder recomputes,
  `_get_remote_prefill_token_count`),
  remote_blocks_expiry_time=None, remote_registration_generation=0,
  transfer_mode="pull".
* The scheduler's waiting loop then does everything itself: the local
  prefix-cache hit, connector.get_num_new_matched_tokens (prompt - aligned
  local hit, async), allocate_slots(0 new tokens, external tokens,
  delay_cache_blocks=True, reserved_blocks = the in-flight reservations),
  connector.update_state_after_alloc, status WAITING_FOR_REMOTE_KVS,
  kv_holding_waiting; and after the load, _update_waiting_for_remote_kv
  (caches the blocks, num_computed_tokens = num_tokens - 1).
  A request preempted later recomputes locally: update_state_after_alloc
  cleared do_remote_prefill, so get_num_new_matched_tokens gives (0, False)
  and the request is never reserved twice. (The connector also packages
  heartbeats for the prefill engine by wall-clock time in
  build_connector_meta; nothing reads them here, and they do not touch
  scheduling.)
* The worker side is faked (no NIXL transfer): it reads the real
  NixlConnectorMetadata the scheduler built in schedule()
  (SchedulerOutput.kv_connector_metadata.reqs_to_recv) and, for each entry
  with awaiting_kvs=True (the connector's flag for "parked in
  WAITING_FOR_REMOTE_KVS, expects finished_recving"; a notify-only entry
  would not be reported, as the real worker does not), reports the request
  id in ModelRunnerOutput.kv_connector_output.finished_recving of the step
  load_steps - 1 after the allocating one.
* Model outputs are faked as in vllm_steps.py: every scheduled request that
  reaches the end of its known tokens samples one token (never EOS); it
  finishes at max_tokens = output.

Output line per schedule() call s (the first call is step 0):
  {"step": s, "batch": {"<id>": tokens, ...} (sorted by id),
   "order": [ids in scheduling order], "preempted": [ids],
   "finished_after": [ids that finished once the step's output was applied],
   "reserved": [ids the call allocated as async remote loads (parked in
                WAITING_FOR_REMOTE_KVS), in allocation order],
   "waiting": n (every unfinished request not running: Scheduler.waiting
              plus kv_holding_waiting, so reserved and landed-but-not-yet-
              scheduled loads included),
   "running": n}

Timing: a request with arrival_step s is added before call s. Reserved in
call r with load_steps k, it is reported in finished_recving of call
r + k - 1's model output, so it is ready (promoted by the scheduler's
_handle_blocked_waiting_request) from call r + k on; there it computes its
last prompt token (1 token, or more after a preemption) and samples.

"async_scheduling": true runs vLLM's AsyncScheduler with a batch queue of
two, as vllm_steps.py does (one line per batch, written when its outputs
are applied). The load is still reported in the model output of call
r + k - 1, which is applied after call r + k is made: the request is ready
from call r + k + 1 on. Two rules of the consumer's scheduler come into
play only here, both vLLM's own code: block frees are fenced behind the
batch in flight (`defer_block_free`), and a request the batch in flight
writes is not preempted (the running loop stops instead).
"""
import json
import os
import sys

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
os.environ.setdefault("PYTHONHASHSEED", "0")

from vllm.config import KVTransferConfig  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.pull_scheduler import (  # noqa: E402
    NixlPullConnectorScheduler,
)
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.utils.hashing import sha256  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: E402
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request, RequestStatus  # noqa: E402

import vllm_steps  # noqa: E402  (its scheduler set-up and token ids)
from vllm_steps import tokens_of, vllm_id  # noqa: E402

MAX_STEPS = 100_000


def build(cfg):
    """vllm_steps.py's scheduler, with the NIXL connector as a decode
    engine's; returns (scheduler, hash block size)."""
    if cfg.get("role") != "decode":
        raise SystemExit('vllm_pd_steps.py: a decode case ("role": "decode"); use vllm_steps.py otherwise')
    kt = KVTransferConfig(kv_connector="NixlConnector", kv_role="kv_consumer", engine_id="decode")
    sched, hash_bs = vllm_steps.build(cfg, kv_transfer_config=kt)
    assert sched.connector is not None
    assert isinstance(sched.connector.connector_scheduler, NixlPullConnectorScheduler), type(sched.connector)
    return sched, hash_bs


def remote_prefill_params(r, sched):
    """What a P/D proxy forwards to the decode engine: the prefill engine's
    NixlPullConnectorScheduler.request_finished result. The P side computed
    T tokens (every prompt token for full attention and windows; with a
    Mamba group one fewer, the same backoff as the decode side's
    _get_remote_prefill_token_count) and sends, per group, its blocks of
    those T tokens clipped by get_exchange_clipped_blocks (the P side runs
    the same model, so the decode connector's clipping is its). One
    full-attention group: cdiv(prompt, B) blocks, as before."""
    nixl = sched.connector.connector_scheduler
    t = nixl._get_remote_prefill_token_count(r["prompt"])
    first = 1 + 1000 * int(r["id"])
    ids = tuple(list(range(first, first + -(-t // g.kv_cache_spec.block_size)))
                for g in sched.kv_cache_config.kv_cache_groups)
    blocks = [list(b) for b in nixl.get_exchange_clipped_blocks(ids)]
    return dict(do_remote_prefill=True, do_remote_decode=False,
                remote_block_ids=blocks,
                remote_engine_id="prefill", remote_request_id=f"p-{r['id']}",
                remote_host="localhost", remote_port=5600, tp_size=1, dcp_size=1, pp_size=1,
                remote_num_tokens=t, remote_blocks_expiry_time=None,
                remote_registration_generation=0, transfer_mode="pull")


def add_arrivals(sched, hasher, pending, added, step):
    while pending and pending[0]["arrival_step"] <= step:
        r = pending.pop(0)
        sp = SamplingParams(max_tokens=r["output"], ignore_eos=True,
                            extra_args={"kv_transfer_params": remote_prefill_params(r, sched)})
        sched.add_request(Request(request_id=vllm_id(r), prompt_token_ids=tokens_of(r), sampling_params=sp,
                                  pooling_params=None, block_hasher=hasher, arrival_time=float(step),
                                  priority=r.get("priority", 0)))
        added.add(int(r["id"]))


def schedule(sched, step, load_steps, landing):
    """One schedule() call: (its output, the scheduled ids, the tokens each
    samples, the loads it parked). The fake worker notes when each parked
    load is reported: in the model output of call step + load_steps - 1."""
    out = sched.schedule()
    # The fake worker: the loads the scheduler parked (real connector metadata).
    meta = out.kv_connector_metadata
    reserved = [rid for rid, rm in meta.reqs_to_recv.items() if rm.awaiting_kvs]
    for rid in reserved:
        assert sched.requests[rid].status == RequestStatus.WAITING_FOR_REMOTE_KVS, rid
        landing.setdefault(step + load_steps[rid] - 1, []).append(rid)
    req_ids = list(out.num_scheduled_tokens)
    # A request samples unless its chunk ends inside its known tokens
    # (`Scheduler._update_after_schedule` sets `is_prefill_chunk`; under the
    # asynchronous loop the known tokens count the placeholders).
    sampled = [[] if sched.requests[rid].is_prefill_chunk else [5] for rid in req_ids]
    return out, req_ids, sampled, reserved


def apply(sched, step, out, req_ids, sampled, reserved, landing, added, done):
    """update_from_output for call `step`'s batch (with the loads its model
    output reports) and its log line."""
    landed = landing.pop(step, [])
    mro = ModelRunnerOutput(req_ids=req_ids, req_id_to_index={r: i for i, r in enumerate(req_ids)},
                            sampled_token_ids=sampled,
                            kv_connector_output=KVConnectorOutput(finished_recving=set(landed))
                            if landed else None)
    preempted = sorted(int(x) for x in getattr(out, "preempted_req_ids", None) or [])
    sched.update_from_output(out, mro)
    now_done = added - {int(x) for x in sched.requests} - done
    print(json.dumps(dict(step=step, batch={int(k): v for k, v in sorted(out.num_scheduled_tokens.items(),
                                                                         key=lambda kv: int(kv[0]))},
                          order=[int(k) for k in req_ids], preempted=preempted,
                          finished_after=sorted(now_done), reserved=[int(x) for x in reserved],
                          waiting=len(sched.waiting) + len(sched.kv_holding_waiting),
                          running=len(sched.running))), flush=True)
    done |= now_done


def main():
    cfg = json.load(open(sys.argv[1]))
    init_none_hash(sha256)
    sched, hash_bs = build(cfg)
    hasher = get_request_block_hasher(hash_bs, sha256)
    load_steps = {vllm_id(r): int(r.get("load_steps", 1)) for r in cfg["requests"]}
    assert all(k >= 1 for k in load_steps.values()), "load_steps must be at least 1"
    pending = sorted(cfg["requests"], key=lambda r: (r["arrival_step"], r["id"]))
    landing = {}  # call whose model output reports the load -> [req ids]
    if vllm_steps.is_async(cfg):
        return main_async(sched, hasher, pending, load_steps, landing)
    step = 0
    done = set()
    added = set()
    while pending or sched.get_num_unfinished_requests() or landing:
        add_arrivals(sched, hasher, pending, added, step)
        call = schedule(sched, step, load_steps, landing)
        apply(sched, step, *call, landing, added, done)
        step += 1
        if step > MAX_STEPS:
            raise SystemExit("no progress")


def main_async(sched, hasher, pending, load_steps, landing):
    """EngineCore.step_with_batch_queue with a queue of two batches, as
    vllm_steps.py drives the AsyncScheduler: new arrivals before each
    schedule() call; a batch's outputs (with the loads its model output
    reports) applied when the queue is full or nothing else can be
    scheduled. With the KV connector of a consumer and two batches in
    flight, vLLM's scheduler defers block frees (`defer_block_free`,
    `scheduler.py:188-195`) and will not preempt a request the batch in
    flight still writes (`scheduler.py:940-942`): both are vLLM's own code
    here. One line per batch, written when its outputs are applied."""
    queue = []  # (step, out, req_ids, sampled, reserved), oldest first
    step = 0
    done = set()
    added = set()
    while pending or sched.get_num_unfinished_requests() or queue or landing:
        add_arrivals(sched, hasher, pending, added, step)
        if sched.has_requests():
            call = schedule(sched, step, load_steps, landing)
            queue.append((step, *call))
            step += 1
            executed = call[0].total_num_scheduled_tokens > 0
            if len(queue) < 2 and (executed or sched.has_requests()):
                continue
        if not queue:
            # Nothing scheduled and nothing in flight: the next arrival's
            # step is the next schedule call.
            step = max(step, pending[0]["arrival_step"]) if pending else step
            continue
        s, *call = queue.pop(0)
        apply(sched, s, *call, landing, added, done)
        if step > MAX_STEPS:
            raise SystemExit("no progress")


if __name__ == "__main__":
    main()
