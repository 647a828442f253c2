#!/usr/bin/env python3
"""A 1P1D deployment of vLLM 0.33.0 in simulated time: two real schedulers
with vLLM's real NIXL connector (a prefill engine, `kv_producer`, and a
decode engine, `kv_consumer`), each under the synchronous engine core's
loop (`EngineCore.step`), the proxy between them, and pdsim's link model
for the reads. Prints one JSON line per request, in id order, as
vllm_timed.py does: when it arrived at the prefill engine, when its first
token and its finish left the DECODE engine core, and how often it was
preempted (both engines); and, to place a difference, when its prefill
finished (`prefill_done_ns`), when the decode engine reserved its blocks
(`reserved_ns`), when its read ended (`transfer_done_ns`) and when the
decode engine first scheduled it (`decode_started_ns`), as pdsim's
requests.csv has them.

Input (argv[1], JSON): a timed case (vllm_timed.py's format: requests at
`arrival_ns`, `step_time_ps`, the decode engine's scheduler fields) with
`"role": "pd"` and
  "pd": {"prefill_num_blocks": n,            (the prefill pool; the rest of
                                              its scheduler is the decode's)
         "transfer_bytes_per_block": b,      (every group)
         "link": {"latency_ns": l, "bytes_per_s": bw,
                  "sharing": "processor_sharing" | "fifo"}}

What is real: both schedulers, their KV cache managers and the NIXL
connector's scheduler side on both engines (the prefill engine's
`request_finished` holds a finished request's blocks and returns the
`kv_transfer_params` the proxy forwards: the decode request is added
with exactly those; the decode engine's waiting loop does the hit, the
connector's match, the allocation and parks the request in
WAITING_FOR_REMOTE_KVS). What is simulated:
* the proxy: a request goes to the prefill engine at its arrival with
  max_tokens 1 and `do_remote_decode`, and to the decode engine, with the
  prefill's `kv_transfer_params` and the client's max_tokens, when the
  prefill's finished output leaves the prefill engine core (no HTTP time:
  pdsim's front end is zero in these cases);
* the connector's worker side: a read of the blocks the decode scheduler
  listed in `reqs_to_recv` (`local_block_ids`, the blocks it allocated to
  be filled, times transfer_bytes_per_block) starts when the step that
  scheduled it executes, right after `schedule()`, on a link that is
  pdsim's NixlLink mirrored exactly (a latency, then processor sharing of
  the bandwidth with its virtual clock in units of 1/720,720 ns, or FIFO);
  a notify-only entry (a full local hit) frees the prefill's blocks at
  once. The decode worker reports a read in `finished_recving`, and the
  prefill worker the same request in `finished_sending` (the read's
  notification), when its engine next polls: at the end of the step in
  flight when the read ended, or at once when the engine is idle (an
  engine with requests spins on empty steps, each of which polls the
  connector; vLLM keeps an engine holding delayed frees spinning,
  `Scheduler.has_finished_requests`). Several reads polled together are
  reported in the order they ended (the worker's set has no order of its
  own).
* the engine core's loop per engine, as vllm_timed.py runs it
  synchronously: add what has arrived, schedule, execute for the step
  time, apply the outputs at the step's end; scheduling takes no time.
  Everything due at one instant is applied before either engine schedules
  at it (pdsim's end-of-instant rule).
* With "async_scheduling": true, both engines run the asynchronous loop,
  EngineCore.step_with_batch_queue with a queue of two batches, as
  vllm_timed.py runs it: a batch is scheduled while the one before it
  executes and executes after it; its outputs are applied once the engine
  blocks on it. The worker's reads of a batch start when that batch starts
  executing (its connector metadata is bound then), and a batch's outputs
  report the reads and notifications polled by the time they are applied.
  (vLLM's worker process may post a batch's reads while the batch before
  it still runs on the GPU, up to one step earlier; pdsim's decode rank
  starts them as modelled here, so this is a shared assumption of the
  comparison, not something it checks.) An engine whose empty batches
  change nothing stops spinning until new work or a read's end wakes it.
  The decode scheduler's own rules for two batches in flight (frees
  fenced behind the batch in flight, no preemption of a request it
  writes) are vLLM's code here.
"""
import collections
import json
import os
import sys

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
os.environ.setdefault("PYTHONHASHSEED", "0")

from vllm.config import KVTransferConfig  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.utils.hashing import sha256  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: E402
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request, RequestStatus  # noqa: E402

import vllm_steps  # noqa: E402
from gen_timed import OPTION_KEYS  # noqa: E402  (the scheduler options a case may give)
from vllm_timed import step_ns  # noqa: E402

MAX_INSTANTS = 50_000_000
SCALE = 720_720  # the link's work units per solo nanosecond: lcm(1..16), as pdsim's


class Link:
    """pdsim's NixlLink (actors/src/serving/link.rs), the same integers."""

    def __init__(self, cfg):
        self.latency = int(cfg["latency_ns"])
        self.bps = int(cfg["bytes_per_s"])
        self.fifo = cfg.get("sharing", "processor_sharing") == "fifo"
        self.vw = 0
        self.last = 0
        self.active = []  # [(tag, order, rid)], kept sorted
        self.queue = collections.deque()  # FIFO: (rid, solo) waiting for the wire
        self.in_latency = []  # [(ready_at, seq, rid, solo)]
        self.order = 0
        self.seq = 0
        self.wake_at = None
        self.solo = {}

    def start(self, rid, nbytes, now, done):
        solo = -(-nbytes * 1_000_000_000 // self.bps)
        if self.latency > 0:
            self.seq += 1
            self.in_latency.append((now + self.latency, self.seq, rid, solo))
        else:
            self.advance(now)
            self.enter_wire(rid, solo)
            self.complete_due(now, done)

    def next_time(self):
        times = [t for t, _, _, _ in self.in_latency]
        if self.wake_at is not None:
            times.append(self.wake_at)
        return min(times) if times else None

    def advance(self, now):
        if self.active:
            self.vw += (now - self.last) * SCALE // len(self.active)
        self.last = now

    def enter_wire(self, rid, solo):
        if not self.fifo or not self.active:
            self.activate(rid, solo)
        else:
            self.queue.append((rid, solo))

    def activate(self, rid, solo):
        self.order += 1
        self.active.append((self.vw + solo * SCALE, self.order, rid))
        self.active.sort()

    def complete_due(self, now, done):
        self.advance(now)
        while self.active and self.active[0][0] <= self.vw:
            _, _, rid = self.active.pop(0)
            done.append(rid)
            if self.fifo and self.queue:
                self.activate(*self.queue.popleft())
        if not self.active:
            self.vw = 0
        self.wake_at = None
        if self.active:
            tag = self.active[0][0]
            self.wake_at = now + -(-(tag - self.vw) * len(self.active) // SCALE)

    def process(self, now, done):
        """The link's events at `now`, in pdsim's order (the latency timers
        in the order they were set; the wake)."""
        ready = sorted(e for e in self.in_latency if e[0] == now)
        self.in_latency = [e for e in self.in_latency if e[0] != now]
        for _, _, rid, solo in ready:
            self.advance(now)
            self.enter_wire(rid, solo)
            self.complete_due(now, done)
        if self.wake_at == now:
            self.complete_due(now, done)


class Engine:
    def __init__(self, sched, hasher, st, is_async):
        self.sched = sched
        self.hasher = hasher
        self.st = st
        self.is_async = is_async
        self.inbox = []  # Requests to add at its next loop iteration
        self.executing = None  # synchronous: (end_ns, out, req_ids, sampled)
        # Asynchronous: the batch queue, oldest first, (end_ns, out, req_ids,
        # sampled); when the device is next free; the end the engine blocks
        # on (None: not blocked).
        self.queue = []
        self.device_free = 0
        self.blocked_until = None
        self.polled = []  # request ids whose transfer ended, for the next poll
        self.dirty = False
        self.calls = 0

    def idle(self):
        if self.is_async:
            return self.blocked_until is None
        return self.executing is None

    def wakes_at(self):
        return self.blocked_until if self.is_async else (self.executing[0] if self.executing else None)


class Run:
    def __init__(self, cfg):
        init_none_hash(sha256)
        pd = cfg["pd"]
        pcfg = dict(cfg, num_blocks=pd["prefill_num_blocks"])
        pkt = KVTransferConfig(kv_connector="NixlConnector", kv_role="kv_producer", engine_id="prefill")
        dkt = KVTransferConfig(kv_connector="NixlConnector", kv_role="kv_consumer", engine_id="decode")
        psched, hash_bs = vllm_steps.build(pcfg, kv_transfer_config=pkt)
        dsched, _ = vllm_steps.build(cfg, kv_transfer_config=dkt)
        hasher = get_request_block_hasher(hash_bs, sha256)
        st = cfg["step_time_ps"]
        is_async = vllm_steps.is_async(cfg)
        self.p = Engine(psched, hasher, st, is_async)
        self.d = Engine(dsched, hasher, st, is_async)
        self.link = Link(pd["link"])
        self.bytes_per_block = int(pd["transfer_bytes_per_block"])
        self.pending = collections.deque(sorted(cfg["requests"], key=lambda r: (r["arrival_ns"], r["id"])))
        self.reqs = {vllm_steps.vllm_id(r): r for r in cfg["requests"]}
        self.rows = {r["id"]: dict(id=r["id"], arrival_ns=r["arrival_ns"], first_token_ns=None, finished_ns=None,
                                   preemptions=0, prefill_done_ns=None, reserved_ns=None, transfer_done_ns=None,
                                   decode_started_ns=None) for r in cfg["requests"]}
        self.done = 0
        # Asynchronous loop: (time, schedule output) of the decode batches
        # queued behind the one executing, whose reads start when they do.
        self.reads_due = collections.deque()
        # Per decode request: the decode engine's call it was added before,
        # and how many calls its load took (a step case for
        # vllm_pd_steps.py and `pdsim steps`: step_case()).
        self.steps = {}
        self.cfg = cfg

    def to_prefill(self, r):
        sp = SamplingParams(max_tokens=1, ignore_eos=True, extra_args={"kv_transfer_params": dict(
            do_remote_decode=True, do_remote_prefill=False, remote_engine_id=None, remote_block_ids=None,
            remote_host=None, remote_port=None)})
        self.p.inbox.append(Request(request_id=vllm_steps.vllm_id(r), prompt_token_ids=vllm_steps.tokens_of(r),
                                    sampling_params=sp, pooling_params=None, block_hasher=self.p.hasher,
                                    arrival_time=r["arrival_ns"] / 1e9, priority=r.get("priority", 0)))
        self.p.dirty = True

    def to_decode(self, rid, params, now):
        r = self.reqs[rid]
        sp = SamplingParams(max_tokens=r["output"], ignore_eos=True, extra_args={"kv_transfer_params": params})
        self.d.inbox.append(Request(request_id=rid, prompt_token_ids=vllm_steps.tokens_of(r), sampling_params=sp,
                                    pooling_params=None, block_hasher=self.d.hasher, arrival_time=now / 1e9,
                                    priority=r.get("priority", 0)))
        self.d.dirty = True

    def transfers_ended(self, rids):
        """The reads that ended: the decode worker and the prefill worker
        each report them at their engine's next poll."""
        for rid in rids:
            self.rows[int(rid)]["transfer_done_ns"] = self.now
            self.d.polled.append(rid)
            self.p.polled.append(rid)
            self.d.dirty = self.p.dirty = True

    def apply(self, e, now, out, req_ids, sampled):
        polled, e.polled = e.polled, []
        if e is self.d:
            for rid in polled:
                st = self.steps[rid]
                st.setdefault("load_steps", e.calls - st["reserved"])
        kv = None
        if polled:
            # Ordered as they ended (a dict keeps insertion order; the
            # worker's own set would give its hash order).
            ids = dict.fromkeys(polled)
            kv = KVConnectorOutput(finished_recving=ids) if e is self.d else KVConnectorOutput(finished_sending=ids)
        mro = ModelRunnerOutput(req_ids=req_ids, req_id_to_index={r: i for i, r in enumerate(req_ids)},
                                sampled_token_ids=sampled, kv_connector_output=kv)
        for r in getattr(out, "preempted_req_ids", None) or []:
            self.rows[int(r)]["preemptions"] += 1
        outputs = e.sched.update_from_output(out, mro)
        changed = bool(polled)
        for eco in outputs.values():
            for o in eco.outputs:
                if o.finish_reason is None:
                    if e is self.d and o.new_token_ids and self.rows[int(o.request_id)]["first_token_ns"] is None:
                        self.rows[int(o.request_id)]["first_token_ns"] = now
                    continue
                changed = True
                row = self.rows[int(o.request_id)]
                if e is self.p:
                    row["prefill_done_ns"] = now
                    if o.kv_transfer_params is None:
                        raise SystemExit(f"request {o.request_id}: the prefill engine returned no kv_transfer_params")
                    self.to_decode(o.request_id, o.kv_transfer_params, now)
                else:
                    if row["first_token_ns"] is None:
                        row["first_token_ns"] = now
                    row["finished_ns"] = now
                    self.done += 1
        return changed

    def schedule_async(self, e, now):
        """One schedule() call of the asynchronous loop: the batch joins the
        queue, executing after the one before it (an empty batch takes no
        time). Returns whether it executes (computes tokens)."""
        self.add_inbox(e)
        out = e.sched.schedule()
        e.calls += 1
        req_ids, sampled = vllm_steps.sampled_of(e.sched, out)
        # The batch executes once the one before it has: its reads start
        # then, and so does it.
        start = end = max(now, e.device_free)
        if e is self.d:
            if start == now:
                self.start_reads(out, now)
            else:
                self.reads_due.append((start, out))
            for rid in req_ids:
                if self.rows[int(rid)]["decode_started_ns"] is None:
                    self.rows[int(rid)]["decode_started_ns"] = start
        executed = out.total_num_scheduled_tokens > 0
        if executed:
            end += step_ns(e.sched, out, e.st)
            e.device_free = end
        e.queue.append((end, out, req_ids, sampled))
        return executed

    def iterate_async(self, e, now):
        """EngineCore.step_with_batch_queue, call after call, on an engine
        that is not blocked at `now`: woken because the batch it blocked on
        ended (its outputs are applied first), or by new work. A batch's
        worker polls the connector when it executes: its outputs report
        every read ended by the time they are applied. An engine whose
        empty batches change nothing stops spinning (vLLM spins on; nothing
        changes until new work or a read's end wakes it, and the spin that
        sees it is then the next call)."""
        if e.blocked_until is not None:
            e.blocked_until = None
            _, out, req_ids, sampled = e.queue.pop(0)
            self.apply(e, now, out, req_ids, sampled)
        while True:
            e.dirty = False
            if e.sched.has_requests() or e.inbox:
                executed = self.schedule_async(e, now)
                if len(e.queue) < 2 and (executed or e.sched.has_requests()):
                    continue
            if not e.queue:
                return
            end, out, req_ids, sampled = e.queue[0]
            if end > now:
                e.blocked_until = end
                return
            e.queue.pop(0)
            changed = self.apply(e, now, out, req_ids, sampled)
            quiet = out.total_num_scheduled_tokens == 0 and not changed and not self.acted(out)
            if quiet and all(b[1].total_num_scheduled_tokens == 0 and not self.acted(b[1]) for b in e.queue) \
                    and not e.inbox and not e.dirty:
                return

    @staticmethod
    def acted(out):
        """Whether a schedule call preempted or reserved something."""
        meta = out.kv_connector_metadata
        return bool(getattr(out, "preempted_req_ids", None)) or \
            bool(meta is not None and getattr(meta, "reqs_to_recv", None))

    def add_inbox(self, e):
        for req in e.inbox:
            if e is self.d:
                self.steps[req.request_id] = dict(arrival_step=e.calls)
            e.sched.add_request(req)
        e.inbox = []

    def iterate(self, e, now):
        """One pass of the engine core's loop on an idle engine at `now`."""
        if e.is_async:
            return self.iterate_async(e, now)
        self.add_inbox(e)
        e.dirty = False
        if not e.sched.has_requests():
            return
        out = e.sched.schedule()
        e.calls += 1
        if e is self.d:
            self.start_reads(out, now)
        req_ids, sampled = vllm_steps.sampled_of(e.sched, out)
        if e is self.d:
            for rid in req_ids:
                if self.rows[int(rid)]["decode_started_ns"] is None:
                    self.rows[int(rid)]["decode_started_ns"] = now
        if out.total_num_scheduled_tokens > 0:
            e.executing = (now + step_ns(e.sched, out, e.st), out, req_ids, sampled)
        else:
            changed = self.apply(e, now, out, req_ids, sampled)
            if changed or getattr(out, "preempted_req_ids", None) or out.kv_connector_metadata is not None and \
                    getattr(out.kv_connector_metadata, "reqs_to_recv", None):
                # An empty step that polled, finished, preempted or reserved
                # something: the engine spins on at once (a spin after one
                # that changed nothing would schedule the same nothing).
                e.dirty = True

    def start_reads(self, out, now):
        meta = out.kv_connector_metadata
        ended = []
        for rid, rm in meta.reqs_to_recv.items():
            self.rows[int(rid)]["reserved_ns"] = now
            self.steps[rid]["reserved"] = self.d.calls - 1
            if rm.awaiting_kvs:
                assert self.d.sched.requests[rid].status == RequestStatus.WAITING_FOR_REMOTE_KVS, rid
                nbytes = sum(len(g) for g in rm.local_block_ids) * self.bytes_per_block
                self.link.start(rid, nbytes, now, ended)
            else:
                # A full local hit: only the notification, which frees the
                # prefill's blocks.
                self.p.polled.append(rid)
                self.p.dirty = True
        self.transfers_ended(ended)

    def run(self):
        now = self.now = 0
        for _ in range(MAX_INSTANTS):
            # Everything due at `now`, then the loop iterations, until the
            # instant is quiet.
            while True:
                while self.pending and self.pending[0]["arrival_ns"] <= now:
                    self.to_prefill(self.pending.popleft())
                while self.reads_due and self.reads_due[0][0] <= now:
                    self.start_reads(self.reads_due.popleft()[1], now)
                ended = []
                self.link.process(now, ended)
                self.transfers_ended(ended)
                for e in (self.p, self.d):
                    if e.is_async:
                        if e.blocked_until == now:
                            # Its batch ended: the loop goes on (outputs first).
                            self.iterate_async(e, now)
                    elif e.executing is not None and e.executing[0] == now:
                        _, out, req_ids, sampled = e.executing
                        e.executing = None
                        self.apply(e, now, out, req_ids, sampled)
                        e.dirty = True
                ready = [e for e in (self.p, self.d) if e.idle() and e.dirty]
                if not ready:
                    break
                for e in ready:
                    self.iterate(e, now)
            times = [e.wakes_at() for e in (self.p, self.d) if e.wakes_at() is not None]
            if self.pending:
                times.append(self.pending[0]["arrival_ns"])
            if self.reads_due:
                times.append(self.reads_due[0][0])
            lt = self.link.next_time()
            if lt is not None:
                times.append(lt)
            if not times:
                if self.done < len(self.rows):
                    raise SystemExit(f"{len(self.rows) - self.done} requests can never be scheduled")
                return
            now = self.now = min(times)
        raise SystemExit("no progress")

    def main(self):
        self.run()
        for k in sorted(self.rows):
            print(json.dumps(self.rows[k]), flush=False)
        sys.stdout.flush()


    def step_case(self):
        """The decode engine's calls as a decode step case: the same
        requests added before the same calls, each load reported by the
        same call, so that a timed case that differs can be compared step
        by step (run.sh)."""
        keep = ("max_num_seqs", "max_num_batched_tokens", "num_blocks", "block_size", "prefix_caching",
                "cache_groups", *OPTION_KEYS)
        case = {k: self.cfg[k] for k in keep if k in self.cfg}
        case["role"] = "decode"
        reqs = []
        for r in self.cfg["requests"]:
            st = self.steps[vllm_steps.vllm_id(r)]
            q = {k: r[k] for k in ("id", "prompt", "output", "prefix_group", "prefix_tokens", "priority") if k in r}
            q["arrival_step"] = st["arrival_step"]
            q["load_steps"] = st.get("load_steps", 1)
            reqs.append(q)
        case["requests"] = reqs
        return case


def main():
    cfg = json.load(open(sys.argv[1]))
    run = Run(cfg)
    run.main()
    if len(sys.argv) > 2:
        if vllm_steps.is_async(cfg):
            raise SystemExit("vllm_pd_timed.py: a step case of the synchronous loop only")
        # vllm_pd_timed.py CASE.json STEP_CASE.json: also write the decode
        # engine's calls as a step case.
        with open(sys.argv[2], "w") as f:
            json.dump(run.step_case(), f)
            f.write("\n")


if __name__ == "__main__":
    main()
