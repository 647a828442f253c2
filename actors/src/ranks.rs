//! The rank actors: PrefillRank (the source of handoffs), DecodeRank (the
//! destination) and AggregatedRank (no handoff, the baseline).
//!
//! Each wraps a [`Batcher`] and its [`KvPool`](crate::pool::KvPool). A rank
//! accepts only the commands of its side of the handoff (SPEC §5): a command
//! of the other side is refused, and the request it carries fails with the
//! refusal as its reason.

use std::collections::{BTreeSet, VecDeque};

use sim_core::rand::Rng;
use sim_core::{Actor, ActorId, Context, EventId, SimDuration, SimTime};

use crate::batcher::{Batcher, Finished, Seq};
use crate::fxmap::FxHashMap;
use crate::metrics::{Metric, Timeline};
use crate::model::{Model, Role};
use crate::msg::Msg;
use crate::pool::Alloc;
use crate::request::{Command, FailReason, Outcome, ReqId, Request};
use crate::rules;
use crate::units::Tokens;
use crate::workload::PrefixIds;

/// What every rank has.
pub struct RankCore {
    /// Index among the ranks of its role.
    pub index: u32,
    /// Its role.
    pub role: Role,
    router: ActorId,
    /// The scheduler and its pool.
    pub batcher: Batcher,
    /// Sampled use over time.
    pub timeline: Timeline,
    /// Commands it refused (with no request to fail, or with one).
    pub refusals: Vec<FailReason>,
    finished: Vec<Finished>,
    step_timer: Option<EventId>,
}

impl RankCore {
    /// A rank's common part.
    pub fn new(index: u32, role: Role, router: ActorId, batcher: Batcher, interval: SimDuration) -> Self {
        RankCore {
            index,
            role,
            router,
            batcher,
            timeline: Timeline::new(interval),
            refusals: Vec::new(),
            finished: Vec::new(),
            step_timer: None,
        }
    }

    /// Sends a finished (completed or failed) request back to the router.
    fn finish(&self, req: Box<Request>, ctx: &mut Context<'_, Msg>) {
        ctx.send(self.router, Msg::Finished(req)).expect("the router outlives the run");
    }

    /// Refuses a command of the other side; fails the request it carries.
    fn refuse(&mut self, msg: Msg, ctx: &mut Context<'_, Msg>) {
        let (command, req) = match msg {
            Msg::SubmitHandoffPrefill(r) => (Command::SubmitHandoffPrefill, Some(r)),
            Msg::ReserveDestination(r) => (Command::ReserveDestination, Some(r)),
            Msg::Submit(r) => (Command::Submit, Some(r)),
            Msg::ReleaseSource(_) => (Command::ReleaseSource, None),
            Msg::CancelSource(..) => (Command::CancelSource, None),
            Msg::CancelDestination(..) => (Command::CancelDestination, None),
            other => unreachable!("{other:?} is not a command"),
        };
        let reason = FailReason::Refused { role: self.role, command };
        self.refusals.push(reason);
        if let Some(mut req) = req {
            req.fail(reason, ctx.now());
            self.finish(req, ctx);
        }
    }

    /// The fewest blocks `req` must hold at once on this rank: a prefill
    /// rank's last step (with checkpoint blocks where the version takes
    /// them); a generating rank's first decode step or its last, whichever
    /// holds more. A lower bound, so a request above the budget can never
    /// fit; one that passes may still fail later if a chunked prefill's
    /// window blocks push it over (the batcher catches that).
    fn least_blocks(&self, req: &Request) -> u64 {
        let pool = &self.batcher.pool;
        match self.role {
            Role::Prefill => pool.blocks_needed(req.transferred_tokens, self.batcher.checkpoints()),
            Role::Decode | Role::Aggregated => {
                let last = req.prompt.saturating_add(req.output).saturating_sub(Tokens::new(1));
                pool.blocks_needed(req.prompt, false).max(pool.blocks_needed(last, false))
            }
        }
    }

    /// Fails a request that cannot fit in this rank's pool.
    fn fits(&self, req: &mut Request, now: SimTime) -> bool {
        let (needed, capacity) = (self.least_blocks(req), self.batcher.pool.num_blocks());
        if needed <= capacity {
            return true;
        }
        req.fail(FailReason::DoesNotFit { role: self.role, needed, capacity }, now);
        false
    }

    /// Ends a fast-forwarded run of decode steps at the step in progress,
    /// because something may change the batch.
    fn cut(&mut self, ctx: &mut Context<'_, Msg>) {
        if let Some(end) = self.batcher.cut(ctx.now()) {
            if let Some(t) = self.step_timer.take() {
                ctx.cancel(t);
            }
            self.step_timer = Some(ctx.schedule(end - ctx.now(), Msg::StepDone));
        }
    }

    /// Starts a step if none is in flight and there is work; fails the
    /// sequences that can never fit.
    fn kick(&mut self, ctx: &mut Context<'_, Msg>, started: fn(&mut Request) -> &mut Option<SimTime>) {
        let now = ctx.now();
        if let Some(dt) = self.batcher.plan_step(now, self.timeline.next_due()) {
            self.batcher.stamp_started(now, started);
            self.step_timer = Some(ctx.schedule(dt, Msg::StepDone));
        }
        while let Some((mut seq, needed)) = self.batcher.stuck.pop() {
            // It could not get the blocks of its next step with nothing else
            // holding any: report what that step needed.
            self.batcher.pool.release(&mut seq.alloc, &seq.req.prefix, seq.req.prompt);
            let capacity = self.batcher.pool.num_blocks();
            seq.req.fail(FailReason::DoesNotFit { role: self.role, needed, capacity }, now);
            self.finish(seq.req, ctx);
        }
    }

    /// Applies the step that just ended on a generating rank: frees the
    /// blocks of the requests that produced their last token and reports them.
    fn complete_step(&mut self, ctx: &mut Context<'_, Msg>) {
        let now = ctx.now();
        let mut done = std::mem::take(&mut self.finished);
        self.batcher.finish_step(now, &mut done);
        for Finished { mut seq, .. } in done.drain(..) {
            self.batcher.pool.release(&mut seq.alloc, &seq.req.prefix, seq.req.prompt);
            seq.req.outcome = Outcome::Completed;
            seq.req.t.finished = Some(now);
            self.finish(seq.req, ctx);
        }
        self.finished = done;
    }

    fn sample(&mut self, now: SimTime, extra: &[(Metric, u64)]) {
        if !self.timeline.due(now) {
            return;
        }
        self.batcher.settle();
        let pool = &self.batcher.pool;
        let tl = &mut self.timeline;
        tl.push(now, Metric::KvUsed, pool.used());
        tl.push(now, Metric::KvFree, pool.free());
        tl.push(now, Metric::KvCachedFree, pool.cached_free());
        for (g, &used) in pool.group_used().iter().enumerate() {
            tl.push(now, Metric::KvGroupUsed(g as u16), used);
        }
        tl.push(now, Metric::Waiting, self.batcher.waiting() as u64);
        tl.push(now, Metric::Running, self.batcher.running() as u64);
        for &(m, v) in extra {
            tl.push(now, m, v);
        }
    }
}

fn prefill_started(r: &mut Request) -> &mut Option<SimTime> {
    &mut r.t.prefill_started
}
fn decode_started(r: &mut Request) -> &mut Option<SimTime> {
    &mut r.t.decode_started
}

/// A source held for a handoff.
#[derive(Debug)]
struct Held {
    alloc: Alloc,
    prefix: PrefixIds,
    prompt: Tokens,
    since: SimTime,
}

/// Counters of a prefill rank's sources.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SourceStats {
    /// Sources held.
    pub held: u64,
    /// Released after their transfer.
    pub released: u64,
    /// Cancelled by the decode side.
    pub cancelled: u64,
    /// Expired with no answer.
    pub expired: u64,
    /// Release or cancel commands for sources it no longer held.
    pub stale: u64,
}

/// How a prefill rank holds a source the decode side has not answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hold {
    /// For at most this long (vLLM up to 0.32: 480 s).
    Fixed(SimDuration),
    /// Under a lease this long, renewed by the decode rank's heartbeats
    /// (vLLM 0.33: 30 s): it runs out only once they stop.
    Lease(SimDuration),
}

impl Hold {
    /// When the lease on a source held at `held` runs out if the decode
    /// rank that accepted it at `accepted` goes silent at `silent`.
    ///
    /// The lease is granted for `L` when the source is held. The decode
    /// rank sends a heartbeat every L/6 after accepting, each moving the
    /// expiry to at least 2/3·L after it. With the last heartbeat at
    /// `h = accepted + j·L/6` (j ≥ 1, h ≤ silent), the lease runs out at
    /// `max(held + L, h + 2/3·L)`; with none, at `held + L`.
    pub fn lease_expiry(lease: SimDuration, held: SimTime, accepted: SimTime, silent: SimTime) -> SimTime {
        let grant = held.saturating_add(lease);
        let beat = lease.as_nanos() / 6;
        if beat == 0 || silent < accepted {
            return grant;
        }
        let j = (silent.as_nanos() - accepted.as_nanos()) / beat;
        if j == 0 {
            return grant;
        }
        let last = accepted.saturating_add(SimDuration::from_nanos(j * beat));
        grant.max(last.saturating_add(SimDuration::from_nanos(lease.as_nanos() / 3 * 2)))
    }
}

/// A prefill rank: computes the backed-off prompt, releases what vLLM
/// releases at completion, and holds the source until the decode side
/// releases or cancels it, or the hold expires.
pub struct PrefillRank {
    /// The common part.
    pub core: RankCore,
    model: Model,
    hold: Hold,
    held: FxHashMap<ReqId, Held>,
    /// Fixed holds: sources in the order they were held, so in the order
    /// they expire (every hold is as long); released ones are skipped when
    /// they come up.
    expiry: VecDeque<(SimTime, ReqId)>,
    /// Leases whose heartbeats stopped, by expiry.
    lapsing: BTreeSet<(SimTime, ReqId)>,
    /// The one timer for the oldest source's expiry.
    hold_timer: Option<EventId>,
    /// Source counters.
    pub sources: SourceStats,
}

impl PrefillRank {
    /// A prefill rank holding sources as `hold` says.
    pub fn new(core: RankCore, model: Model, hold: Hold) -> Self {
        PrefillRank {
            core,
            model,
            hold,
            held: FxHashMap::default(),
            expiry: VecDeque::new(),
            lapsing: BTreeSet::new(),
            hold_timer: None,
            sources: SourceStats::default(),
        }
    }

    /// Sources held now.
    pub fn held_sources(&self) -> usize {
        self.held.len()
    }

    /// Frees every held source (end-of-run accounting); returns how many.
    pub fn release_all_sources(&mut self) -> usize {
        let mut ids: Vec<ReqId> = self.held.keys().copied().collect();
        ids.sort_unstable();
        for id in &ids {
            let mut h = self.held.remove(id).expect("listed");
            self.core.batcher.pool.release(&mut h.alloc, &h.prefix, h.prompt);
        }
        ids.len()
    }

    fn drop_source(&mut self, id: ReqId, ctx: &mut Context<'_, Msg>) -> Option<Held> {
        let mut h = self.held.remove(&id)?;
        self.core.batcher.pool.release(&mut h.alloc, &h.prefix, h.prompt);
        if self.held.is_empty() {
            // Nothing left to expire: the timer would only keep the run alive.
            self.expiry.clear();
            self.lapsing.clear();
            if let Some(t) = self.hold_timer.take() {
                ctx.cancel(t);
            }
        }
        Some(h)
    }

    /// Expires every source held past its hold, then arms the timer for the
    /// oldest one left. One timer per rank instead of one per source: a
    /// released source costs nothing here until its entry comes up.
    fn check_holds(&mut self, ctx: &mut Context<'_, Msg>) {
        let now = ctx.now();
        if let Some(t) = self.hold_timer.take() {
            ctx.cancel(t);
        }
        loop {
            // The earlier of the next fixed hold and the next lapsing lease.
            let fixed = self.expiry.front().copied();
            let lapsing = self.lapsing.first().copied();
            let (at, id) = match (fixed, lapsing) {
                (Some(f), Some(l)) => f.min(l),
                (Some(e), None) | (None, Some(e)) => e,
                (None, None) => break,
            };
            if fixed == Some((at, id)) {
                self.expiry.pop_front();
            } else {
                self.lapsing.pop_first();
            }
            if !self.held.contains_key(&id) {
                continue;
            }
            if at > now {
                // Not yet: put it back and wake up then.
                if fixed == Some((at, id)) {
                    self.expiry.push_front((at, id));
                } else {
                    self.lapsing.insert((at, id));
                }
                self.hold_timer = Some(ctx.schedule(at - now, Msg::HoldCheck));
                return;
            }
            let mut h = self.held.remove(&id).expect("checked above");
            self.core.batcher.pool.release(&mut h.alloc, &h.prefix, h.prompt);
            self.sources.expired += 1;
            let reason = FailReason::SourceHoldExpired { held: now - h.since };
            ctx.send(self.core.router, Msg::SourceExpired(id, reason)).expect("the router outlives the run");
        }
        self.hold_timer = None;
    }

    fn on_finished(&mut self, f: Finished, ctx: &mut Context<'_, Msg>) {
        let now = ctx.now();
        let Finished { seq, .. } = f;
        let Seq { mut req, mut alloc, computed, .. } = seq;
        // The source release of SPEC §4: keep in-window and running-state
        // blocks, free the rest (checkpoint blocks included). Shrinking
        // never falls short.
        self.core
            .batcher
            .pool
            .resize(&mut alloc, computed, computed, false)
            .expect("releasing blocks needs no free blocks");
        req.t.prefill_done = Some(now);
        req.transferred_tokens = computed;
        let prefix = if req.prefix.ids.is_empty() { PrefixIds::none() } else { req.prefix.clone() };
        let id = req.id;
        self.held.insert(id, Held { alloc, prefix, prompt: req.prompt, since: now });
        self.sources.held += 1;
        // SourceHeld first: an expiry, however short the hold, follows it.
        ctx.send(self.core.router, Msg::SourceHeld(req)).expect("the router outlives the run");
        // A lease is renewed for as long as the decode rank lives.
        if let Hold::Fixed(hold) = self.hold {
            self.expiry.push_back((now.saturating_add(hold), id));
            if self.hold_timer.is_none() {
                self.check_holds(ctx);
            }
        }
    }
}

impl Actor<Msg> for PrefillRank {
    fn handle(&mut self, msg: Msg, ctx: &mut Context<'_, Msg>) {
        let now = ctx.now();
        match msg {
            Msg::SubmitHandoffPrefill(mut req) => {
                req.t.prefill_queued = Some(now);
                let t = rules::transferred_tokens(&self.model, req.prompt);
                req.transferred_tokens = t;
                if self.core.fits(&mut req, now) {
                    self.core.batcher.enqueue(Seq::new(req, Alloc::default(), Tokens::ZERO, t, false));
                } else {
                    self.core.finish(req, ctx);
                }
            }
            Msg::ReleaseSource(id) => match self.drop_source(id, ctx) {
                Some(_) => self.sources.released += 1,
                None => self.sources.stale += 1,
            },
            Msg::CancelSource(id, _) => match self.drop_source(id, ctx) {
                Some(_) => self.sources.cancelled += 1,
                None => self.sources.stale += 1,
            },
            Msg::HoldCheck => {
                self.hold_timer = None;
                self.check_holds(ctx);
            }
            Msg::LeaseLost(id, at) => {
                if self.held.contains_key(&id) {
                    self.lapsing.insert((at.max(now), id));
                    self.check_holds(ctx);
                }
            }
            Msg::StepDone => {
                self.core.step_timer = None;
                let mut done = std::mem::take(&mut self.core.finished);
                self.core.batcher.finish_step(now, &mut done);
                for f in done.drain(..) {
                    self.on_finished(f, ctx);
                }
                self.core.finished = done;
            }
            m @ (Msg::ReserveDestination(_) | Msg::CancelDestination(..) | Msg::Submit(_)) => self.core.refuse(m, ctx),
            other => unreachable!("a prefill rank gets no {other:?}"),
        }
        self.core.kick(ctx, prefill_started);
        let held = self.held.len() as u64;
        self.core.sample(now, &[(Metric::HeldSources, held)]);
    }
}

/// A request whose destination is reserved and whose KV is on its way.
#[derive(Debug)]
struct InTransfer {
    req: Box<Request>,
    alloc: Alloc,
}

/// A decode rank: reserves destination blocks (waiting in order when the
/// pool is full), pulls the KV over the link, releases the source, computes
/// the remaining prompt token and decodes.
pub struct DecodeRank {
    /// The common part.
    pub core: RankCore,
    model: Model,
    /// Prefill ranks, by index.
    prefill: Vec<ActorId>,
    /// The link to use for each prefill rank, by its index.
    links: Vec<ActorId>,
    abort_probability: f64,
    pending: VecDeque<Box<Request>>,
    transferring: FxHashMap<ReqId, InTransfer>,
    /// Reservations that had to wait for blocks.
    pub reservations_waited: u64,
    /// The prefill ranks' lease on the sources this rank accepted, if they
    /// hold under a lease.
    lease: Option<SimDuration>,
    /// When it crashed (it has stopped for good).
    pub crashed_at: Option<SimTime>,
}

impl DecodeRank {
    /// A decode rank wired to the prefill ranks and their links; `lease` is
    /// the sources' lease, which it renews while it lives.
    pub fn new(
        core: RankCore,
        model: Model,
        prefill: Vec<ActorId>,
        links: Vec<ActorId>,
        abort: f64,
        lease: Option<SimDuration>,
    ) -> Self {
        DecodeRank {
            core,
            model,
            prefill,
            links,
            abort_probability: abort,
            pending: VecDeque::new(),
            transferring: FxHashMap::default(),
            reservations_waited: 0,
            lease,
            crashed_at: None,
        }
    }

    /// The crash: every request here fails, its blocks go back, and the
    /// sources it had yet to release are left to lapse on the prefill
    /// ranks: under a fixed hold when it runs out (their hold timers run
    /// already), under a lease when its last heartbeat's renewal does.
    fn crash(&mut self, ctx: &mut Context<'_, Msg>) {
        let now = ctx.now();
        self.crashed_at = Some(now);
        if let Some(t) = self.core.step_timer.take() {
            ctx.cancel(t);
        }
        for mut req in self.drain_in_flight() {
            self.lapse(&req, ctx);
            req.fail(FailReason::DecodeCrashed, now);
            self.core.finish(req, ctx);
        }
        let mut seqs = self.core.batcher.drain();
        seqs.sort_unstable_by_key(|s| s.req.id);
        for mut seq in seqs {
            self.core.batcher.pool.release(&mut seq.alloc, &seq.req.prefix, seq.req.prompt);
            seq.req.fail(FailReason::DecodeCrashed, now);
            self.core.finish(seq.req, ctx);
        }
        ctx.send(self.core.router, Msg::RankDown(self.core.index)).expect("the router outlives the run");
    }

    /// Tells the prefill rank holding `req`'s source when its lease runs
    /// out, now that the heartbeats stop (nothing under a fixed hold).
    fn lapse(&self, req: &Request, ctx: &mut Context<'_, Msg>) {
        let Some(lease) = self.lease else { return };
        let now = ctx.now();
        let held = req.t.prefill_done.unwrap_or(now);
        let accepted = req.t.reserve_requested.unwrap_or(now);
        let at = Hold::lease_expiry(lease, held, accepted, now);
        ctx.send(self.source_of(req), Msg::LeaseLost(req.id, at)).expect("prefill ranks outlive the run");
    }

    /// Reservations waiting for blocks.
    pub fn pending_reservations(&self) -> usize {
        self.pending.len()
    }
    /// Transfers in flight to this rank.
    pub fn transferring(&self) -> usize {
        self.transferring.len()
    }

    fn source_of(&self, req: &Request) -> ActorId {
        self.prefill[req.prefill_rank.expect("a handoff names its prefill rank") as usize]
    }

    fn cancel_source(&self, req: &Request, reason: FailReason, ctx: &mut Context<'_, Msg>) {
        ctx.send(self.source_of(req), Msg::CancelSource(req.id, reason)).expect("prefill ranks outlive the run");
    }

    /// Reserves destinations in arrival order while the pool allows.
    fn try_reserve(&mut self, ctx: &mut Context<'_, Msg>) {
        let now = ctx.now();
        while let Some(req) = self.pending.front() {
            let pool = &mut self.core.batcher.pool;
            let prompt = req.prompt;
            // vLLM never serves the last prompt token from the cache.
            let hit = pool.lookup(&req.prefix, prompt, prompt.saturating_sub(Tokens::new(1)));
            let k = pool.hit_tokens(hit);
            let payload =
                rules::handoff_size(&self.model, prompt, k).expect("the prompt is >= 1 token and the hit below it");
            let t = payload.transferred_tokens;
            let n = prompt;
            let need = pool.blocks_after_hit(hit, n - Tokens::new(1), n, false);
            let most = pool.pin_and_take_need(hit, need);
            self.core.batcher.make_room(most);
            let pool = &mut self.core.batcher.pool;
            // All or nothing, as vLLM allocates: a reservation that waits
            // evicts nothing.
            if pool.can_pin_and_take(&req.prefix, prompt, hit, need).is_err() {
                break;
            }
            let mut alloc = Alloc::default();
            pool.pin(&mut alloc, &req.prefix, prompt, hit).expect("checked");
            // Reserve what the first decode step holds (the KV of all N
            // prompt tokens, as vLLM allocates for the whole prompt), which
            // covers the T tokens that land; the hit never reaches past
            // N − 1. A landed request then never waits for one more block.
            if pool.resize(&mut alloc, n - Tokens::new(1), n, false).is_err() {
                pool.release(&mut alloc, &req.prefix, prompt);
                break;
            }
            let mut req = self.pending.pop_front().expect("front exists");
            req.t.reserved = Some(now);
            req.decode_hit = k;
            req.transferred_tokens = t;
            req.transfer_bytes = payload.bytes;
            req.t.transfer_started = Some(now);
            if payload.moves_nothing {
                // A full hit: nothing to read, only the notification.
                req.t.transfer_done = Some(now);
                ctx.send(self.source_of(&req), Msg::ReleaseSource(req.id)).expect("prefill ranks outlive the run");
                self.start_decode(req, alloc);
            } else {
                let link = self.links[req.prefill_rank.expect("a handoff names its prefill rank") as usize];
                let msg = Msg::StartTransfer { id: req.id, bytes: payload.bytes, reply_to: ctx.me() };
                ctx.send(link, msg).expect("links outlive the run");
                self.transferring.insert(req.id, InTransfer { req, alloc });
            }
        }
    }

    /// The KV is here: queue the request to compute its last prompt token.
    fn start_decode(&mut self, req: Box<Request>, mut alloc: Alloc) {
        // The received blocks go into the decode rank's prefix cache, as vLLM
        // caches them when the transfer completes.
        let t = req.transferred_tokens;
        self.core.batcher.pool.register(&mut alloc, &req.prefix, req.prompt, t);
        // vLLM computes the last prompt token on the decode side: never
        // computed by a Mamba-type prefill, recomputed for its logits otherwise.
        let computed = req.prompt.saturating_sub(Tokens::new(1));
        self.core.batcher.enqueue(Seq::new(req, alloc, computed, Tokens::ZERO, true));
    }

    /// Takes out every request still waiting for a reservation or a
    /// transfer (their blocks returned), for the end-of-run accounting.
    pub fn drain_in_flight(&mut self) -> Vec<Box<Request>> {
        let mut out: Vec<Box<Request>> = self.pending.drain(..).collect();
        let mut ids: Vec<ReqId> = self.transferring.keys().copied().collect();
        ids.sort_unstable();
        for id in ids {
            let InTransfer { req, mut alloc } = self.transferring.remove(&id).expect("listed");
            self.core.batcher.pool.release(&mut alloc, &req.prefix, req.prompt);
            out.push(req);
        }
        out
    }

    fn fail_pending(&mut self, id: ReqId, reason: FailReason, ctx: &mut Context<'_, Msg>) -> bool {
        let Some(pos) = self.pending.iter().position(|r| r.id == id) else { return false };
        let mut req = self.pending.remove(pos).expect("position is valid");
        req.fail(reason, ctx.now());
        self.core.finish(req, ctx);
        true
    }
}

impl Actor<Msg> for DecodeRank {
    fn handle(&mut self, msg: Msg, ctx: &mut Context<'_, Msg>) {
        let now = ctx.now();
        if self.crashed_at.is_some() {
            // Down: a handoff sent before the router knew fails at once,
            // with no heartbeat ever sent; everything else is lost.
            if let Msg::ReserveDestination(mut req) = msg {
                req.t.reserve_requested = Some(now);
                self.lapse(&req, ctx);
                req.fail(FailReason::DecodeCrashed, now);
                self.core.finish(req, ctx);
            }
            return;
        }
        if matches!(msg, Msg::Crash) {
            self.core.cut(ctx);
            self.crash(ctx);
            return;
        }
        if !matches!(msg, Msg::StepDone) {
            // Everything else may touch the pool or the batch: end a planned
            // run of decode steps at the step in progress first.
            self.core.cut(ctx);
        }
        match msg {
            Msg::ReserveDestination(mut req) => {
                req.t.reserve_requested = Some(now);
                if self.abort_probability > 0.0 && ctx.rng().random_bool(self.abort_probability) {
                    self.cancel_source(&req, FailReason::DecodeAborted, ctx);
                    req.fail(FailReason::DecodeAborted, now);
                    self.core.finish(req, ctx);
                } else if !self.core.fits(&mut req, now) {
                    let reason = match req.outcome {
                        Outcome::Failed(r) => r,
                        _ => unreachable!("fits() failed the request"),
                    };
                    self.cancel_source(&req, reason, ctx);
                    self.core.finish(req, ctx);
                } else {
                    let id = req.id;
                    self.pending.push_back(req);
                    self.try_reserve(ctx);
                    if self.pending.back().is_some_and(|r| r.id == id) {
                        self.reservations_waited += 1;
                    }
                }
            }
            Msg::TransferCompleted(id) => {
                // A transfer whose destination was cancelled meanwhile is dropped.
                if let Some(InTransfer { mut req, alloc }) = self.transferring.remove(&id) {
                    req.t.transfer_done = Some(now);
                    ctx.send(self.source_of(&req), Msg::ReleaseSource(id)).expect("prefill ranks outlive the run");
                    self.start_decode(req, alloc);
                }
            }
            Msg::CancelDestination(id, reason) => {
                if let Some(InTransfer { mut req, mut alloc }) = self.transferring.remove(&id) {
                    self.core.batcher.pool.release(&mut alloc, &req.prefix, req.prompt);
                    req.fail(reason, now);
                    self.core.finish(req, ctx);
                } else {
                    self.fail_pending(id, reason, ctx);
                }
            }
            Msg::StepDone => {
                self.core.step_timer = None;
                self.core.complete_step(ctx)
            }
            m @ (Msg::SubmitHandoffPrefill(_) | Msg::ReleaseSource(_) | Msg::CancelSource(..) | Msg::Submit(_)) => {
                self.core.refuse(m, ctx)
            }
            other => unreachable!("a decode rank gets no {other:?}"),
        }
        self.try_reserve(ctx);
        self.core.batcher.blocked_outside = !self.pending.is_empty();
        self.core.kick(ctx, decode_started);
        let extra = [
            (Metric::PendingReservations, self.pending.len() as u64),
            (Metric::Transferring, self.transferring.len() as u64),
        ];
        self.core.sample(now, &extra);
    }
}

/// A rank that prefills and decodes with no handoff: the baseline. It
/// refuses every handoff command.
pub struct AggregatedRank {
    /// The common part.
    pub core: RankCore,
}

impl Actor<Msg> for AggregatedRank {
    fn handle(&mut self, msg: Msg, ctx: &mut Context<'_, Msg>) {
        let now = ctx.now();
        if !matches!(msg, Msg::StepDone) {
            // As on a decode rank: anything else may touch the batch or be
            // followed by a timeline sample, so a planned run ends at the
            // step in progress first.
            self.core.cut(ctx);
        }
        match msg {
            Msg::Submit(mut req) => {
                req.t.prefill_queued = Some(now);
                if self.core.fits(&mut req, now) {
                    self.core.batcher.enqueue(Seq::new(req, Alloc::default(), Tokens::ZERO, Tokens::ZERO, false));
                } else {
                    self.core.finish(req, ctx);
                }
            }
            Msg::StepDone => {
                self.core.step_timer = None;
                self.core.complete_step(ctx)
            }
            m @ (Msg::SubmitHandoffPrefill(_)
            | Msg::ReleaseSource(_)
            | Msg::CancelSource(..)
            | Msg::ReserveDestination(_)
            | Msg::CancelDestination(..)) => self.core.refuse(m, ctx),
            other => unreachable!("an aggregated rank gets no {other:?}"),
        }
        self.core.kick(ctx, prefill_started);
        self.core.sample(now, &[]);
    }
}
