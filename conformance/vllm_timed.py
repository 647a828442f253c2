#!/usr/bin/env python3
"""vLLM 0.33.0's real scheduler driven in simulated time: the engine core's
loop (`v1/engine/core.py`), a simulated clock, and the step time a pdsim
`linear` step-time model gives. Prints one JSON line per request, in id
order: when it arrived, when its first token and its finish left the
engine core, how often it was preempted, and before which schedule call
it was added (`arrival_step`: the same requests as a step case, for
`pdsim steps`, follow the same calls).

Input (argv[1], JSON): a case as vllm_steps.py reads it (`max_num_seqs`,
`max_num_batched_tokens`, `num_blocks`, `block_size`, `prefix_caching`,
`cache_groups`, `async_scheduling`, `scheduler_reserve_full_isl`), whose
requests arrive at `arrival_ns` instead of `arrival_step`, and
`"step_time_ps": {"fixed", "per_token", "per_seq", "per_context_token"}`:
a step takes ceil((fixed + per_token x tokens + per_seq x seqs +
per_context_token x context) / 1000) ns, context being the tokens each
scheduled request has after the step (pdsim's `LinearStepTime`, whose
coefficients are these picoseconds).

The loop, as `EngineCoreProc.run_busy_loop` runs it: before each engine
step every request that has arrived by now is added (`_process_input_queue`);
with nothing to do the clock jumps to the next arrival. Synchronous
(`EngineCore.step`): schedule, execute for the step time, apply the
outputs at the step's end. Asynchronous (`EngineCore.step_with_batch_queue`,
a queue of two): schedule a batch and launch it (it executes once the one
before it is done: the device runs one batch at a time) without waiting
when the queue is not full; otherwise wait for the oldest batch to end
and apply its outputs then. Scheduling takes no simulated time. A token
or a finish is timed when `update_from_output` returns it in an
`EngineCoreOutput`: the moment the engine core hands it to the front end.
"""
import json
import os
import sys

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
os.environ.setdefault("PYTHONHASHSEED", "0")

from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.utils.hashing import sha256  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: E402
from vllm.v1.outputs import ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request  # noqa: E402

import vllm_steps  # noqa: E402

MAX_ITERATIONS = 50_000_000


def step_ns(sched, out, st):
    """The step time of a scheduled batch, from its shape right after
    schedule() (num_computed_tokens already counts the step's tokens)."""
    tokens = out.total_num_scheduled_tokens
    seqs = len(out.num_scheduled_tokens)
    context = sum(sched.requests[r].num_computed_tokens for r in out.num_scheduled_tokens)
    ps = st["fixed"] + st["per_token"] * tokens + st["per_seq"] * seqs + st["per_context_token"] * context
    return -(-ps // 1000)


class Run:
    def __init__(self, cfg):
        init_none_hash(sha256)
        self.sched, hash_bs = vllm_steps.build(cfg)
        self.hasher = get_request_block_hasher(hash_bs, sha256)
        self.pending = sorted(cfg["requests"], key=lambda r: (r["arrival_ns"], r["id"]))
        self.st = cfg["step_time_ps"]
        self.now = 0
        self.calls = 0
        self.rows = {r["id"]: dict(id=r["id"], arrival_ns=r["arrival_ns"], first_token_ns=None, finished_ns=None,
                                   preemptions=0) for r in cfg["requests"]}

    def add_arrivals(self):
        while self.pending and self.pending[0]["arrival_ns"] <= self.now:
            r = self.pending.pop(0)
            self.rows[r["id"]]["arrival_step"] = self.calls
            sp = SamplingParams(max_tokens=r["output"], ignore_eos=True)
            self.sched.add_request(Request(request_id=vllm_steps.vllm_id(r), prompt_token_ids=vllm_steps.tokens_of(r),
                                           sampling_params=sp, pooling_params=None, block_hasher=self.hasher,
                                           arrival_time=r["arrival_ns"] / 1e9, priority=r.get("priority", 0)))

    def idle(self):
        """Nothing to do: the clock jumps to the next arrival."""
        self.now = max(self.now, self.pending[0]["arrival_ns"])

    def idle_or_stuck(self):
        """Nothing could be scheduled and nothing executes: only an arrival
        can change that (vLLM would spin on empty schedules for ever)."""
        if self.pending:
            self.idle()
        elif self.sched.get_num_unfinished_requests():
            raise SystemExit("a waiting request can never be scheduled (it does not fit the pool)")

    def apply(self, out, req_ids, sampled):
        mro = ModelRunnerOutput(req_ids=req_ids, req_id_to_index={r: i for i, r in enumerate(req_ids)},
                                sampled_token_ids=sampled)
        for r in getattr(out, "preempted_req_ids", None) or []:
            self.rows[int(r)]["preemptions"] += 1
        outputs = self.sched.update_from_output(out, mro)
        for eco in outputs.values():
            for o in eco.outputs:
                row = self.rows[int(o.request_id)]
                if o.new_token_ids and row["first_token_ns"] is None:
                    row["first_token_ns"] = self.now
                if o.finish_reason is not None:
                    row["finished_ns"] = self.now

    def run_sync(self):
        for _ in range(MAX_ITERATIONS):
            if not self.pending and not self.sched.get_num_unfinished_requests() and not self.sched.has_requests():
                return
            self.add_arrivals()
            if not self.sched.has_requests():
                self.idle()
                continue
            out = self.sched.schedule()
            self.calls += 1
            req_ids, sampled = vllm_steps.sampled_of(self.sched, out)
            if out.total_num_scheduled_tokens > 0:
                self.now += step_ns(self.sched, out, self.st)
            else:
                # An empty step with work left waits for the next arrival
                # (vLLM spins; nothing changes until a request arrives),
                # unless it preempted: the next call admits again at once.
                self.apply(out, req_ids, sampled)
                if not getattr(out, "preempted_req_ids", None):
                    self.idle_or_stuck()
                continue
            self.apply(out, req_ids, sampled)
        raise SystemExit("no progress")

    def run_async(self):
        queue = []  # (end_ns, out, req_ids, sampled), oldest first
        device_free = 0
        for _ in range(MAX_ITERATIONS):
            if not self.pending and not self.sched.has_requests() and not queue:
                return
            self.add_arrivals()
            if self.sched.has_requests():
                out = self.sched.schedule()
                self.calls += 1
                req_ids, sampled = vllm_steps.sampled_of(self.sched, out)
                executed = out.total_num_scheduled_tokens > 0
                end = self.now
                if executed:
                    end = max(self.now, device_free) + step_ns(self.sched, out, self.st)
                    device_free = end
                queue.append((end, out, req_ids, sampled))
                if len(queue) < 2 and (executed or self.sched.has_requests()):
                    continue
            elif not queue:
                self.idle()
                continue
            end, out, req_ids, sampled = queue.pop(0)
            self.now = max(self.now, end)
            self.apply(out, req_ids, sampled)
            if out.total_num_scheduled_tokens == 0 and not queue and not getattr(out, "preempted_req_ids", None):
                # An empty schedule with nothing executing: vLLM spins on
                # empty schedules until something arrives.
                self.idle_or_stuck()
        raise SystemExit("no progress")

    def main(self, is_async):
        if is_async:
            self.run_async()
        else:
            self.run_sync()
        for k in sorted(self.rows):
            print(json.dumps(self.rows[k]), flush=False)
        sys.stdout.flush()


def main():
    cfg = json.load(open(sys.argv[1]))
    Run(cfg).main(vllm_steps.is_async(cfg))


if __name__ == "__main__":
    main()
