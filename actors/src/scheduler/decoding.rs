//! The decoding set: decoding costs nothing per sequence per step.
//!
//! A sequence that has produced a token and goes on decoding joins the
//! rank's decoding set: from then on it computes one token and produces one
//! token every step, so its state is a function of the rank's step counter
//! (tokens = tokens at joining + steps since), kept without touching it. The
//! set keeps a heap of the steps at which members finish and a queue of the
//! steps at which a member's blocks change (once per block of tokens); the
//! step log ([`super::plan::StepLog`]) keeps the end time of every step since
//! the oldest member joined. A step costs O(1) plus the members that finish
//! or need a block in it; first-token, last-token and every inter-token gap
//! come out as if each step had been handled one by one (gaps go into the
//! histogram once per step, counted over the members, and a finishing
//! member's longest gap is read off the step log).

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use sim_core::SimDuration;

use super::Core;
use super::seqs::SeqKey;
use crate::base::units::Tokens;
#[cfg(doc)]
use crate::kv::Alloc;
use crate::vllm::engine::EngineLoop;

/// A member of the decoding set: the step count when it joined, and its
/// computed and generated tokens then.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Member {
    pub(super) join: u64,
    pub(super) computed: Tokens,
    pub(super) generated: Tokens,
    /// The first step whose gap (from the step before) is one of its
    /// inter-token gaps: the step after joining, or the one after that when
    /// it joined before its first token.
    first_gap: u64,
    /// [`DecodingSet::sq`] through step `first_gap − 1`: its squared gaps
    /// are what the sum has gained since (set at its first token when it
    /// joined before it).
    sq_base: u128,
    /// Where its holding's step started when it joined: no later step
    /// starts before it (a landed load's first step starts past its last
    /// prompt token, [`Alloc::step_start`]).
    floor: Tokens,
}

impl Member {
    /// Tokens a member holds the KV of through step `n` (at least its first
    /// step after joining).
    pub(super) fn tokens_at(self, n: u64) -> Tokens {
        self.computed + Tokens::new(n.max(self.join + 1) - self.join)
    }

    /// Where its step `n`, ending at `to` ([`Member::tokens_at`]), starts as
    /// the pool sees it: one token before its end, or, where the
    /// asynchronous loop frees skipped blocks from the start of the step
    /// before (`lagging`, [`Core::lags_skips`]), two, once it was in the
    /// step before: from its second step on, or its first if it joined
    /// after a step of its own ([`Core::may_join`]) rather than at its
    /// admission.
    /// Never before where its holding started when it joined.
    #[inline]
    pub(super) fn step_from(self, n: u64, to: Tokens, lagging: bool) -> Tokens {
        debug_assert_eq!(to, self.tokens_at(n));
        if !lagging {
            return to - Tokens::new(1);
        }
        let back = 1 + u64::from(n > self.join + 1 || self.first_gap == self.join + 1);
        to.saturating_sub(Tokens::new(back)).max(self.floor)
    }

    /// The first step at which it needs blocks its allocation, held the
    /// same up to `stable_to` tokens, does not have.
    pub(super) fn change_step(self, stable_to: Tokens) -> u64 {
        self.join.saturating_add(stable_to.get().saturating_sub(self.computed.get())).saturating_add(1)
    }
}

/// A heap entry: (step, sequence, membership).
pub(super) type Due = Reverse<(u64, SeqKey, u32)>;

/// The largest block for which [`Changes`] keeps a ring (a bucket a token
/// of the block).
const MAX_RING_BLOCK: u64 = 4096;

/// `n` mod `b` (a ring's bucket count): a mask where `b` is a power of two,
/// as block sizes nearly always are, rather than a division, which costs
/// tens of cycles at every step a ring looks at.
#[inline]
fn residue(n: u64, b: usize) -> usize {
    let b = b as u64;
    (if b.is_power_of_two() { n & (b - 1) } else { n % b }) as usize
}

/// When members' blocks change: a step at a time, in step order.
///
/// Any pool keeps a heap of (first step whose blocks the member does not
/// hold yet, key, membership), stale entries included (the holding is the
/// truth; an entry whose step the member holds already is skipped). With
/// full attention of one block size B only, a member needs a block in every
/// group exactly every B steps, at the steps ≡ `1 + join − computed`
/// (mod B), so it sits in the ring's bucket of that residue from joining to
/// leaving: no entry per change, and `next` the first step not looked at
/// since the holdings last moved back (none while the set is empty).
pub(super) enum Changes {
    Heap(BinaryHeap<Due>),
    Ring { buckets: Vec<Vec<(SeqKey, u32)>>, next: u64 },
}

impl Default for Changes {
    fn default() -> Self {
        Changes::Heap(BinaryHeap::new())
    }
}

impl Changes {
    /// The queue for a pool whose groups are all full attention of `block`
    /// tokens (a ring), or any other pool (`None`: a heap).
    pub(super) fn new(block: Option<Tokens>) -> Self {
        match block {
            Some(b) if b.get() <= MAX_RING_BLOCK => {
                Changes::Ring { buckets: vec![Vec::new(); b.get() as usize], next: u64::MAX }
            }
            _ => Changes::default(),
        }
    }

    /// The bucket of a member (ring only).
    fn bucket(buckets: &[Vec<(SeqKey, u32)>], m: &Member) -> usize {
        let b = buckets.len();
        residue(residue(m.join, b) as u64 + 1 + b as u64 - residue(m.computed.get(), b) as u64, b)
    }

    /// A member joins, its first change due at step `first`.
    pub(super) fn join(&mut self, first: u64, key: SeqKey, g: u32, m: &Member) {
        match self {
            Changes::Heap(h) => h.push(Reverse((first, key, g))),
            Changes::Ring { buckets, next } => {
                let i = Self::bucket(buckets, m);
                buckets[i].push((key, g));
                *next = (*next).min(first);
            }
        }
    }

    /// A member leaves (a heap forgets its entries when they come up).
    pub(super) fn leave(&mut self, key: SeqKey, g: u32, m: &Member) {
        if let Changes::Ring { buckets, .. } = self {
            let i = Self::bucket(buckets, m);
            let bucket = &mut buckets[i];
            let at = bucket.iter().position(|&e| e == (key, g)).expect("a member is in its bucket");
            bucket.swap_remove(at);
        }
    }

    /// Whether a step's entries may name a member twice (a heap keeps
    /// every entry pushed; a ring's bucket holds each member once).
    pub(super) fn may_repeat(&self) -> bool {
        matches!(self, Changes::Heap(_))
    }

    /// A member's next change is due at step `n` (after a change, a give
    /// back, or a step that could not be taken).
    pub(super) fn push(&mut self, n: u64, key: SeqKey, g: u32) {
        match self {
            Changes::Heap(h) => h.push(Reverse((n, key, g))),
            Changes::Ring { next, .. } => *next = (*next).min(n),
        }
    }

    /// The first step through `e` that may have changes due.
    pub(super) fn next_due(&mut self, e: u64) -> Option<u64> {
        match self {
            Changes::Heap(h) => h.peek().map(|&Reverse((n, ..))| n).filter(|&n| n <= e),
            Changes::Ring { buckets, next } => {
                if *next > e {
                    return None;
                }
                // The bucket of step `next`, moved along with it.
                let mut i = residue(*next, buckets.len());
                while *next <= e {
                    if !buckets[i].is_empty() {
                        return Some(*next);
                    }
                    *next += 1;
                    i = if i + 1 == buckets.len() { 0 } else { i + 1 };
                }
                None
            }
        }
    }

    /// The entries due at step `n` (the first due): the heap's come off it
    /// (in key order) into `taken`, which is returned; the ring's stay, and
    /// its bucket is returned as it is (no copy a step).
    pub(super) fn take_step<'a>(&'a mut self, n: u64, taken: &'a mut Vec<(SeqKey, u32)>) -> &'a [(SeqKey, u32)] {
        taken.clear();
        match self {
            Changes::Heap(h) => {
                while let Some(&Reverse((m, key, g))) = h.peek() {
                    if m != n {
                        break;
                    }
                    h.pop();
                    taken.push((key, g));
                }
                taken
            }
            Changes::Ring { buckets, .. } => &buckets[residue(n, buckets.len())],
        }
    }

    /// Every change due at step `n` is made (the ring looks at the next).
    pub(super) fn done(&mut self, n: u64) {
        if let Changes::Ring { next, .. } = self {
            *next = n + 1;
        }
    }

    /// Forgets every entry (the set emptied).
    pub(super) fn clear(&mut self) {
        match self {
            Changes::Heap(h) => h.clear(),
            Changes::Ring { buckets, next } => {
                buckets.iter_mut().for_each(Vec::clear);
                *next = u64::MAX;
            }
        }
    }
}

/// The members and what is due for them.
#[derive(Default)]
pub(super) struct DecodingSet {
    /// Members.
    pub(super) count: u64,
    /// Σ over members of (computed at joining − step at joining): a member's
    /// context after step n is its term + n.
    ctx: i128,
    /// (step of its last token, key, membership) per member.
    finishes: BinaryHeap<Due>,
    /// When members' blocks change.
    pub(super) changes: Changes,
    /// Members that joined before their first token, in the run in flight.
    pub(super) fresh: Vec<SeqKey>,
    /// (step, gap before it) with gaps strictly decreasing: the longest gap
    /// of any suffix of steps is the first entry inside it.
    gaps: Vec<(u64, SimDuration)>,
    /// Σ of every step's squared gap (ns²) so far, wrapping: a member's
    /// sum of squared gaps is a difference of two of its values.
    sq: u128,
    /// `sq` through the first step of the run in flight.
    sq_first: u128,
}

impl DecodingSet {
    /// An empty set for a pool whose groups are all full attention of
    /// `block` tokens, if they are.
    pub(super) fn new(block: Option<Tokens>) -> Self {
        DecodingSet { changes: Changes::new(block), ..DecodingSet::default() }
    }

    /// Context after step `n` summed over the members.
    pub(super) fn context(&self, n: u64) -> u64 {
        u64::try_from(self.ctx + i128::from(self.count) * i128::from(n)).expect("context is positive")
    }

    /// Notes the gap before step `n` (the first of its run: `first`), for
    /// the longest gaps and the sums of squared gaps of members.
    pub(super) fn note_gap(&mut self, n: u64, gap: SimDuration, first: bool) {
        while self.gaps.last().is_some_and(|&(_, g)| g <= gap) {
            self.gaps.pop();
        }
        self.gaps.push((n, gap));
        let g = u128::from(gap.as_nanos());
        self.sq = self.sq.wrapping_add(g.wrapping_mul(g));
        if first {
            self.sq_first = self.sq;
        }
    }
}

impl Core {
    /// Puts the running sequence `key` into the decoding set: after it
    /// produced a token (`has_token`), or before its first token when its
    /// first step is a decode step.
    pub(super) fn join(&mut self, key: SeqKey, has_token: bool) {
        let step = self.log.step;
        let lagging = self.lags_skips();
        let seq = self.seqs.get_mut(key);
        let first_gap = if has_token { step + 1 } else { step + 2 };
        // (Before its first token, the base is set with the token.)
        let sq_base = self.dec.sq;
        let floor = seq.alloc.step_start();
        let m = Member { join: step, computed: seq.computed, generated: seq.req.generated, first_gap, sq_base, floor };
        if !has_token {
            self.dec.fresh.push(key);
        }
        seq.member = Some(m);
        self.dec.count += 1;
        self.dec.ctx += i128::from(m.computed.get()) - i128::from(step);
        let g = seq.membership;
        let last = step + (seq.req.output - seq.req.generated).get();
        self.dec.finishes.push(Reverse((last, key, g)));
        let stable_to = seq.alloc.stable_to(u64::from(lagging));
        let change = if stable_to > m.computed { m.change_step(stable_to) } else { step + 1 };
        self.dec.changes.join(change, key, g, &m);
    }

    /// Takes `key` out of the decoding set, bringing its counts, its last
    /// token and its longest gap up to the current step.
    pub(super) fn leave(&mut self, key: SeqKey) {
        let step = self.log.step;
        let last = self.log.end(step);
        let seq = self.seqs.get_mut(key);
        let m = seq.member.take().expect("member");
        self.dec.changes.leave(key, seq.membership, &m);
        let d = step - m.join;
        seq.computed = m.computed + Tokens::new(d);
        seq.req.generated = m.generated + Tokens::new(d);
        if d > 0 {
            // Its last step was the current one, of one token (for where its
            // next one starts, `Step::schedule_running`).
            (seq.stepped, seq.stepped_from) = (step, seq.computed - Tokens::new(1));
            seq.last_token = Some(last);
            seq.req.t.last_token = Some(last);
            // Its last step computed the token its step before sampled,
            // unless that step was its first in the set and it joined before
            // its first token (`first_gap` two steps past its join).
            seq.placeholder = self.engine == EngineLoop::Async && (d >= 2 || m.first_gap == m.join + 1);
            // The longest gap among steps first_gap..=step.
            let gaps = &self.dec.gaps;
            let i = gaps.partition_point(|&(n, _)| n < m.first_gap);
            if let Some(&(_, longest)) = gaps.get(i) {
                seq.req.max_itl = seq.req.max_itl.max(longest);
            }
            if step >= m.first_gap {
                seq.req.itl_sq_sum = seq.req.itl_sq_sum.saturating_add(self.dec.sq.wrapping_sub(m.sq_base));
            }
        }
        self.dec.count -= 1;
        self.dec.ctx -= i128::from(m.computed.get()) - i128::from(m.join);
        seq.membership = seq.membership.wrapping_add(1);
    }

    /// Brings every member of the decoding set up to date and empties it.
    pub(super) fn materialize_all(&mut self) {
        if self.dec.count == 0 {
            return;
        }
        // One by one, every sequence's blocks must be the stepping ones.
        self.settle();
        for i in 0..self.seqs.running.len() {
            let key = self.seqs.running[i];
            if self.seqs.contains(key) && self.seqs.get(key).member.is_some() {
                self.leave(key);
            }
        }
        self.dec.finishes.clear();
        self.dec.changes.clear();
    }

    /// The step of the next member's last token.
    pub(super) fn next_finish(&mut self) -> Option<u64> {
        while let Some(&Reverse((f, key, g))) = self.dec.finishes.peek() {
            if self.seqs.member(key, g).is_some() {
                return Some(f);
            }
            self.dec.finishes.pop();
        }
        None
    }

    /// After a run of steps `before + 1 ..= step`: the first tokens of the
    /// members that joined before theirs.
    pub(super) fn first_tokens_of_fresh(&mut self, before: u64) {
        let first_end = self.log.end(before + 1);
        let sq_first = self.dec.sq_first;
        for key in std::mem::take(&mut self.dec.fresh) {
            let seq = self.seqs.get_mut(key);
            seq.req.t.first_token.get_or_insert(first_end);
            if let Some(m) = seq.member.as_mut() {
                m.sq_base = sq_first;
            }
        }
    }

    /// Takes out the members whose last token came out by the current step
    /// (to the step's finished sequences); returns whether there were any.
    pub(super) fn pop_finished_members(&mut self) -> bool {
        let mut any = false;
        while let Some(f) = self.next_finish() {
            if f > self.log.step {
                break;
            }
            let Reverse((_, key, _)) = self.dec.finishes.pop().expect("peeked");
            self.leave(key);
            any = true;
            // Taken out with the step's other finished sequences, in running order.
            self.seqs.get_mut(key).finished = true;
        }
        any
    }
}
