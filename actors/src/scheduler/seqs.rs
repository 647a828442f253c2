//! The sequences of one rank: each request the scheduler holds, its blocks
//! and its progress, in a slotmap addressed by generational keys, with the
//! waiting queue and the running list in order.

use std::collections::VecDeque;

use sim_core::SimTime;
use slotmap::{SlotMap, new_key_type};

use super::Mode;
use super::decoding::Member;
use super::pool::Alloc;
use crate::request::Request;
use crate::units::Tokens;

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
    /// Tokens it computes in the current step.
    pub(super) step_tokens: Tokens,
    /// While it is in the decoding set: when it joined and its counts then.
    pub(super) member: Option<Member>,
    /// Bumped when it leaves the decoding set, so that heap entries of an
    /// earlier membership are skipped.
    pub(super) membership: u32,
}

impl Seq {
    /// A sequence for `req`, with `computed` tokens of KV already present in `alloc`.
    pub(super) fn new(
        req: Box<Request>,
        alloc: Alloc,
        computed: Tokens,
        prefill_target: Tokens,
        looked_up: bool,
    ) -> Self {
        Seq {
            req,
            alloc,
            computed,
            prefill_target,
            looked_up,
            last_token: None,
            step_tokens: Tokens::ZERO,
            member: None,
            membership: 0,
        }
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
#[derive(Default)]
pub(super) struct Seqs {
    map: SlotMap<SeqKey, Seq>,
    /// Waiting to be admitted, in queue order (preempted ones at the front).
    pub(super) waiting: VecDeque<SeqKey>,
    /// Admitted, in admission order.
    pub(super) running: Vec<SeqKey>,
    /// Waiting sequences that hold blocks already (a decode rank's landed
    /// handoffs).
    holding: usize,
}

impl Seqs {
    /// Adds `seq` at the back of the waiting queue.
    pub(super) fn enqueue(&mut self, seq: Seq) {
        self.holding += usize::from(!seq.alloc.is_empty());
        let key = self.map.insert(seq);
        self.waiting.push_back(key);
    }

    /// Takes the waiting sequence at `wi` out of the queue; `held`: it held
    /// blocks while it waited (read before an admission allocates).
    pub(super) fn unqueue(&mut self, wi: usize, held: bool) -> SeqKey {
        self.holding -= usize::from(held);
        self.waiting.remove(wi).expect("a waiting index")
    }

    /// Whether any waiting sequence holds blocks already.
    pub(super) fn any_waiting_holds_blocks(&self) -> bool {
        self.holding > 0
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

    /// Drops the keys of finished sequences from the running list.
    pub(super) fn retain_running(&mut self) {
        let map = &self.map;
        self.running.retain(|&k| map.contains_key(k));
    }

    /// Takes every sequence out, in slot order.
    pub(super) fn drain(&mut self) -> Vec<Seq> {
        self.waiting.clear();
        self.holding = 0;
        self.running.clear();
        self.map.drain().map(|(_, s)| s).collect()
    }
}
