//! The sequences of one rank: each request the scheduler holds, its blocks
//! and its progress, in a slotmap addressed by generational keys, with the
//! waiting queue and the running list in order.

use std::collections::VecDeque;

use sim_core::SimTime;
use slotmap::{SlotMap, new_key_type};

use super::Mode;
use super::decoding::Member;
#[cfg(doc)]
use super::step::Step;
use crate::base::units::Tokens;
use crate::kv::Alloc;
use crate::requests::request::{ReqId, Request};

new_key_type! {
    /// A sequence's key. Keys order by slot, and a freed slot is reused last
    /// in, first out, so the order of keys (the tie-break of the decoding
    /// set's heaps) is the same on every machine.
    pub(crate) struct SeqKey;
}

/// A sequence in a rank.
#[derive(Debug)]
pub(crate) struct Seq {
    /// The request.
    pub(super) req: Box<Request>,
    /// When it reached this rank's server: vLLM's `Request.arrival_time` on
    /// this instance, which its priority policy orders by. The client's
    /// send time on an aggregated or prefill rank; on a decode rank, when
    /// its `ReserveDestination` reaches the rank (the proxy hands the
    /// request to the decode instance after its prefill), not when the
    /// client sent it.
    pub(super) arrived: SimTime,
    /// Its KV blocks.
    pub(super) alloc: Alloc,
    /// Tokens whose KV is computed.
    pub(super) computed: Tokens,
    /// Tokens a prefill-only sequence computes (T).
    pub(super) prefill_target: Tokens,
    /// Whether the prefix cache was consulted (at first admission, or at a
    /// decode rank's reservation; again after a preemption).
    pub(super) looked_up: bool,
    /// When its last output token came out.
    pub(super) last_token: Option<SimTime>,
    /// Tokens it computes in the current step (after the step, those it
    /// computed in it).
    pub(super) step_tokens: Tokens,
    /// The step it last computed in ([`super::plan`]'s step numbers;
    /// `u64::MAX` before its first).
    pub(super) stepped: u64,
    /// Its prefill went on past that step (it sampled nothing): vLLM keeps
    /// it among the prefills in flight (`_inflight_prefills`) until a step
    /// that is not a prefill chunk is scheduled for it.
    pub(super) prefilling: bool,
    /// Where that step started (its computed tokens before it): kept apart
    /// from `step_tokens`, which a plan that is retried one by one has
    /// already overwritten (`Step::schedule_running`).
    pub(super) stepped_from: Tokens,
    /// While it is in the decoding set: when it joined and its counts then.
    pub(super) member: Option<Member>,
    /// Bumped when it leaves the decoding set, so that heap entries of an
    /// earlier membership are skipped.
    pub(super) membership: u32,
    /// A decode rank's handoff waiting for its destination blocks (a
    /// remote load): admitting it reserves them, and it leaves the
    /// scheduler until the KV lands.
    pub(super) remote: bool,
    /// For a remote load: the first schedule call that could reserve it.
    pub(super) first_call: u64,
    /// For a landed handoff: its reservation's number (landed handoffs
    /// wait in reservation order under FCFS).
    pub(super) reservation: u64,
    /// For a landed handoff not yet scheduled: what it counts among the
    /// prefills in flight (`Core::load_short`).
    pub(super) load_short: u64,
    /// For a landed handoff: its KV's blocks are not in the prefix cache
    /// yet; the first schedule call whose admission reaches it caches them
    /// (vLLM's `_update_waiting_for_remote_kv`, when its waiting loop
    /// peeks the request), so landed handoffs are cached in queue order,
    /// not in the order their reads ended.
    pub(super) uncached: bool,
    /// It finished in the step being finished ([`Seqs::take_finished`]).
    pub(super) finished: bool,
    /// Where its last prefix-cache lookup found a shared prefix that a state
    /// group has not cached yet (vLLM's `request.shared_prefix_boundary`;
    /// zero for none): its prefill chunks stop there in "align" mode.
    pub(super) junction: Tokens,
    /// Its admission's number: running sequences are in this order.
    pub(super) admitted: u64,
    /// The KV its last step computed includes the token the step before it
    /// sampled, which the asynchronous loop scheduled as a placeholder: vLLM
    /// caches a block only once its tokens are known (`allocate_slots`
    /// caches through `min(computed, request.num_tokens)`), so the block of
    /// that token is not cached ([`Seq::hashable`]).
    pub(super) placeholder: bool,
}

impl Seq {
    /// A sequence for `req`, with `computed` tokens of KV already present in `alloc`.
    pub(super) fn new(
        req: Box<Request>,
        arrived: SimTime,
        alloc: Alloc,
        computed: Tokens,
        prefill_target: Tokens,
        looked_up: bool,
    ) -> Self {
        Seq {
            req,
            arrived,
            alloc,
            computed,
            prefill_target,
            looked_up,
            last_token: None,
            step_tokens: Tokens::ZERO,
            stepped: u64::MAX,
            prefilling: false,
            stepped_from: Tokens::ZERO,
            member: None,
            membership: 0,
            remote: false,
            first_call: 0,
            reservation: 0,
            load_short: 0,
            uncached: false,
            finished: false,
            junction: Tokens::ZERO,
            admitted: 0,
            placeholder: false,
        }
    }

    /// Tokens of its KV whose blocks vLLM has cached (hashed) by now: all it
    /// computed, but the last token if it was a placeholder when its step
    /// was scheduled ([`Seq::placeholder`]) and that step is still in
    /// flight (`in_flight`, [`Core::in_flight`](super::Core::in_flight)):
    /// once its output is applied, vLLM's update caches through every
    /// token processed (`scheduler.py:2406-2415`). What a preemption
    /// leaves in the prefix cache (a finish leaves all it computed: its
    /// last output is applied first).
    pub(super) fn hashable(&self, in_flight: bool) -> Tokens {
        self.computed.saturating_sub(Tokens::new(u64::from(self.placeholder && in_flight)))
    }

    /// Its place in vLLM's priority queues (`Request.__lt__`): priority,
    /// then arrival, then request id (numbers here, where vLLM compares id
    /// strings; its ids are unique strings, so only the order of requests
    /// arriving at the same instant can differ).
    pub(super) fn priority_key(&self) -> (i32, SimTime, ReqId) {
        (self.req.priority, self.arrived, self.req.id)
    }

    /// Tokens it must have computed before its next output (or hand-off).
    pub(super) fn goal(&self, mode: Mode) -> Tokens {
        match mode {
            Mode::PrefillOnly => self.prefill_target,
            Mode::Generate => self.req.prompt + self.req.generated,
        }
    }
}

/// Every sequence of a rank, and the order the scheduler visits them in.
///
/// The waiting queue is vLLM's two: the sequences that hold blocks already
/// (a decode rank's landed handoffs, vLLM's `kv_holding_waiting`), in the
/// order they were reserved, always ahead of the others (`waiting`: preempted
/// ones at its front, new ones at its back), as vLLM drains the first
/// before it looks at the second. Under vLLM's priority policy
/// ([`Seqs::set_priority_order`]) each of the two is in priority order
/// instead ([`Seq::priority_key`]), as vLLM's heaps pop them.
#[derive(Default)]
pub(super) struct Seqs {
    map: SlotMap<SeqKey, Seq>,
    /// Waiting to be admitted, in queue order: `holding` sequences that hold
    /// blocks, then the rest.
    pub(super) waiting: VecDeque<SeqKey>,
    /// Admitted, in admission order.
    pub(super) running: Vec<SeqKey>,
    /// Waiting sequences that hold blocks already: the first `holding` of
    /// `waiting`.
    holding: usize,
    /// Waiting remote loads (a decode rank's handoffs before their
    /// reservation).
    remote: usize,
    /// Admissions so far (`Seq::admitted`).
    admissions: u64,
    /// The queues are in priority order (vLLM's priority policy).
    by_priority: bool,
}

impl Seqs {
    /// Keeps the waiting queues in priority order from now on (set before
    /// any sequence arrives).
    pub(super) fn set_priority_order(&mut self, on: bool) {
        debug_assert!(self.waiting.is_empty());
        self.by_priority = on;
    }

    /// Where `key` goes among the waiting sequences `range` (one of the two
    /// queues): under the priority policy, after every sequence that vLLM's
    /// heap pops before it; else at the end.
    fn place(&self, key: SeqKey, range: std::ops::Range<usize>) -> usize {
        if !self.by_priority {
            return range.end;
        }
        let mine = self.map[key].priority_key();
        let slice_at = |i: usize| self.map[self.waiting[range.start + i]].priority_key();
        // (Each queue is sorted: every insertion is placed.)
        let (mut lo, mut hi) = (0, range.len());
        while lo < hi {
            let mid = (lo + hi) / 2;
            if slice_at(mid) < mine { lo = mid + 1 } else { hi = mid }
        }
        range.start + lo
    }

    /// Appends the admitted `key` to the running sequences.
    pub(super) fn admit(&mut self, key: SeqKey) {
        self.admissions += 1;
        self.map[key].admitted = self.admissions;
        self.running.push(key);
    }

    /// Adds `seq`, which holds no blocks, at the back of the waiting queue
    /// (under the priority policy, in its place).
    pub(super) fn enqueue(&mut self, seq: Seq) {
        debug_assert!(seq.alloc.is_empty());
        self.remote += usize::from(seq.remote);
        let key = self.map.insert(seq);
        let at = self.place(key, self.holding..self.waiting.len());
        self.waiting.insert(at, key);
    }

    /// Adds `seq`, which holds its blocks, among the other such sequences
    /// in reservation order (under the priority policy, in priority order),
    /// ahead of every other waiting one.
    pub(super) fn enqueue_holding(&mut self, seq: Seq) {
        debug_assert!(!seq.alloc.is_empty() && !seq.remote);
        let no = seq.reservation;
        let key = self.map.insert(seq);
        let at = match self.by_priority {
            true => self.place(key, 0..self.holding),
            false => (0..self.holding).find(|&i| self.map[self.waiting[i]].reservation > no).unwrap_or(self.holding),
        };
        self.waiting.insert(at, key);
        self.holding += 1;
    }

    /// Puts a preempted sequence (it holds nothing now) at the front of the
    /// waiting sequences that hold no blocks (under the priority policy, in
    /// its place).
    pub(super) fn requeue_preempted(&mut self, key: SeqKey) {
        let at = match self.by_priority {
            true => self.place(key, self.holding..self.waiting.len()),
            false => self.holding,
        };
        self.waiting.insert(at, key);
    }

    /// The running index of the sequence vLLM's priority policy preempts:
    /// the largest (priority, arrival), the first in running order among
    /// equals (`max(self.running, key=...)`).
    pub(super) fn lowest_priority_running(&self) -> usize {
        let key = |i: usize| {
            let s = &self.map[self.running[i]];
            (s.req.priority, s.arrived)
        };
        let mut best = 0;
        for i in 1..self.running.len() {
            if key(i) > key(best) {
                best = i;
            }
        }
        best
    }

    /// Takes the waiting sequence at `wi` out of the queue; `held`: it held
    /// blocks while it waited (read before an admission allocates).
    pub(super) fn unqueue(&mut self, wi: usize, held: bool) -> SeqKey {
        self.holding -= usize::from(held);
        let key = self.waiting.remove(wi).expect("a waiting index");
        self.remote -= usize::from(self.map[key].remote);
        key
    }

    /// Makes the waiting sequence `key` a remote load or not (a decode
    /// rank's handoff it computes itself, [`Step::admit`]).
    pub(super) fn set_remote(&mut self, key: SeqKey, remote: bool) {
        let seq = &mut self.map[key];
        if seq.remote != remote {
            seq.remote = remote;
            if remote { self.remote += 1 } else { self.remote -= 1 }
        }
    }

    /// Waiting remote loads.
    pub(super) fn remote_waiting(&self) -> usize {
        self.remote
    }

    /// The live sequence `key` (a key of a running or waiting sequence).
    pub(super) fn get(&self, key: SeqKey) -> &Seq {
        &self.map[key]
    }

    /// The live sequence `key`, mutably.
    pub(super) fn get_mut(&mut self, key: SeqKey) -> &mut Seq {
        &mut self.map[key]
    }

    /// The sequence `key` if it is still held and in the decoding set under
    /// `membership` (heap entries of ended memberships give `None`).
    pub(super) fn member(&self, key: SeqKey, membership: u32) -> Option<&Seq> {
        self.map.get(key).filter(|s| s.membership == membership && s.member.is_some())
    }

    /// Mutable [`Seqs::member`].
    pub(super) fn member_mut(&mut self, key: SeqKey, membership: u32) -> Option<&mut Seq> {
        self.map.get_mut(key).filter(|s| s.membership == membership && s.member.is_some())
    }

    /// Whether `key` is still held.
    pub(super) fn contains(&self, key: SeqKey) -> bool {
        self.map.contains_key(key)
    }

    /// Takes the sequence out (it finished, or can never fit).
    pub(super) fn remove(&mut self, key: SeqKey) -> Seq {
        self.map.remove(key).expect("removed once")
    }

    /// Takes the running sequences marked `finished` out, in running
    /// (admission) order, onto `out`. Stepping one by one finishes a step's
    /// sequences in that order, and so must the decoding set, whose members
    /// come due in key order: the order frees their blocks (and so the
    /// prefix cache's eviction order) and frees their slots (and so the
    /// keys later sequences get).
    pub(super) fn take_finished(&mut self, out: &mut Vec<Seq>) {
        let map = &mut self.map;
        self.running.retain(|&k| {
            if map[k].finished {
                out.push(map.remove(k).expect("a running key"));
                false
            } else {
                true
            }
        });
    }

    /// Takes every sequence out, in slot order.
    pub(super) fn drain(&mut self) -> Vec<Seq> {
        self.waiting.clear();
        self.holding = 0;
        self.remote = 0;
        self.running.clear();
        self.map.drain().map(|(_, s)| s).collect()
    }
}
