//! The rank actors: PrefillRank (the source of handoffs), DecodeRank (the
//! destination) and AggregatedRank (no handoff, the baseline).
//!
//! Each wraps a [`Scheduler`](crate::scheduler), which owns its KV pool, and
//! handles every message through one protocol (`handle_message`): cut a
//! planned run, refuse or handle, start a step, record its timeline. A
//! rank accepts only the commands of its side of the handoff
//! ([`Command::accepted_by`]): a command of the other side is refused, and
//! the request it carries fails with the refusal as its reason.

use std::collections::{BTreeSet, VecDeque};

use sim_core::rand::Rng;
use sim_core::{Actor, ActorId, Context, EventId, SimDuration, SimTime};

use crate::base::fxmap::FxHashMap;
use crate::base::units::{Bytes, Tokens};
use crate::models::model::{Model, Role};
use crate::requests::request::{Command, FailReason, Outcome, ReqId, Request};
use crate::scheduler::{Finished, PoolReport, Reservation, Scheduler, Source, StepStats};
use crate::serving::msg::Msg;
use crate::stats::timeline::{Metric, Timeline};
use crate::vllm::engine::EngineLoop;
use crate::vllm::handoff as rules;

/// What every rank has.
pub(crate) struct RankCore {
    /// Index among the ranks of its role.
    index: u32,
    role: Role,
    router: ActorId,
    /// The longest sequence it serves (`max_model_len`), if limited.
    max_model_len: Option<Tokens>,
    /// The scheduler, which owns the pool.
    sched: Scheduler,
    /// Its state over time, exactly (see [`crate::stats::timeline`]).
    timeline: Timeline,
    /// Commands it refused (with no request to fail, or with one).
    refusals: Vec<FailReason>,
    finished: Vec<Finished>,
    step_timer: Option<EventId>,
    /// A [`Msg::Kick`] waits for the end of the instant.
    kick_due: bool,
}

/// A rank's end-of-run parts, for its report.
pub(crate) struct RankParts {
    pub(crate) index: u32,
    pub(crate) stats: StepStats,
    pub(crate) pool: PoolReport,
    pub(crate) refusals: Vec<FailReason>,
    pub(crate) timeline: Timeline,
    /// Requests still in its queue, their blocks given back.
    #[expect(clippy::vec_box, reason = "requests travel boxed in messages; unboxing them to box again copies each")]
    pub(crate) unfinished: Vec<Box<Request>>,
    /// What is wrong with its pool, if anything.
    pub(crate) violation: Option<String>,
}

impl RankCore {
    /// Asks for a schedule call at the end of the instant (once).
    fn kick_at_end_of_instant(&mut self, ctx: &mut Context<'_, Msg>) {
        if !self.kick_due {
            self.kick_due = true;
            ctx.at_end_of_instant(Msg::Kick);
        }
    }

    /// A rank's common part.
    pub(crate) fn new(
        index: u32,
        role: Role,
        router: ActorId,
        mut sched: Scheduler,
        max_model_len: Option<Tokens>,
        timeline: Timeline,
    ) -> Self {
        // The counts inside runs of decode steps, only for a timeline that
        // stores them (nothing else depends on them).
        sched.set_step_counts(timeline.keeps());
        RankCore {
            index,
            role,
            max_model_len,
            router,
            sched,
            timeline,
            refusals: Vec::new(),
            finished: Vec::new(),
            step_timer: None,
            kick_due: false,
        }
    }

    /// Sends a finished (completed or failed) request back to the router.
    fn finish(&self, req: Box<Request>, ctx: &mut Context<'_, Msg>) {
        ctx.send(self.router, Msg::Finished(req)).expect("the router outlives the run");
    }

    /// Refuses a command of the other side; fails the request it carries.
    fn refuse(&mut self, command: Command, msg: Msg, ctx: &mut Context<'_, Msg>) {
        let reason = FailReason::Refused { role: self.role, command };
        self.refusals.push(reason);
        if let Some(mut req) = msg.into_request() {
            req.fail(reason, ctx.now());
            self.finish(req, ctx);
        }
    }

    /// Fails a request longer than the rank's `max_model_len`, or that
    /// cannot fit in its pool.
    fn fits(&self, req: &mut Request, now: SimTime) -> bool {
        if let Some(max) = self.max_model_len {
            // vLLM refuses a prompt that leaves no room for an output token
            // (`input_processor.py`: prompt >= max_model_len), and otherwise
            // stops the request at the limit (its `max_tokens` capped).
            if req.prompt >= max {
                req.fail(FailReason::ExceedsMaxModelLen { role: self.role, max_model_len: max.get() }, now);
                return false;
            }
            if self.role != Role::Prefill {
                req.output = req.output.min(max - req.prompt);
            }
        }
        let (needed, capacity) = self.sched.least_blocks(req);
        if needed <= capacity {
            return true;
        }
        req.fail(FailReason::DoesNotFit { role: self.role, needed, capacity }, now);
        false
    }

    /// Ends a fast-forwarded run of decode steps at the step in progress,
    /// because something may change the batch.
    fn cut(&mut self, ctx: &mut Context<'_, Msg>) {
        if let Some(end) = self.sched.cut(ctx.now()) {
            if let Some(t) = self.step_timer.take() {
                ctx.cancel(t);
            }
            self.step_timer = Some(ctx.schedule(end - ctx.now(), Msg::StepDone));
        }
    }

    /// Starts a step if none is in flight and there is work; fails the
    /// sequences that can never fit. `outputs_due`: the role has outputs
    /// to apply after this call ([`Side::outputs_due`]), so an empty
    /// asynchronous call ends the kick ([`handle_message`] makes the next
    /// call once they are applied).
    fn kick(
        &mut self,
        ctx: &mut Context<'_, Msg>,
        started: fn(&mut Request) -> &mut Option<SimTime>,
        outputs_due: bool,
    ) {
        let now = ctx.now();
        if let Some(dt) = self.sched.start_step(now, SimTime::MAX, started, outputs_due) {
            self.step_timer = Some(ctx.schedule(dt, Msg::StepDone));
        }
        while let Some((mut req, needed)) = self.sched.take_stuck() {
            // It could not get the blocks of its next step with nothing else
            // holding any: report what that step needed.
            let capacity = self.sched.pool_report().num_blocks;
            req.fail(FailReason::DoesNotFit { role: self.role, needed, capacity }, now);
            self.finish(req, ctx);
        }
    }

    /// Sets every series of the timeline to the rank's state at `now` (the
    /// end of an instant it got messages at, or a crash). The pool is read
    /// (which settles the blocks a cut run left ahead) whether or not the
    /// timeline stores anything, so that nothing else depends on it.
    fn sample(&mut self, now: SimTime, extra: Extra) {
        // Steps of the run in flight that started by now first: the counts
        // read next leave out only the steps after now.
        self.write_steps(now);
        let busy = u64::from(self.step_timer.is_some());
        let remote = self.sched.remote_waiting() as u64;
        let c = self.sched.counts();
        let tl = &mut self.timeline;
        if !tl.keeps() {
            return;
        }
        tl.set(now, Metric::KvUsed, c.used);
        tl.set(now, Metric::KvFree, c.free);
        tl.set(now, Metric::KvCachedFree, c.cached_free);
        for (g, &used) in c.group_used.iter().enumerate() {
            tl.set(now, Metric::KvGroupUsed(g as u16), used);
        }
        tl.set(now, Metric::Waiting, c.waiting as u64);
        tl.set(now, Metric::Running, c.running as u64);
        for (m, v) in extra.series.into_iter().flatten() {
            tl.set(now, m, v);
        }
        tl.set(now, Metric::Requests, (c.waiting + c.running) as u64 + remote + extra.outside);
        tl.set(now, Metric::Busy, busy);
    }

    /// Writes the KV counts of the steps of the run in flight that started
    /// at or before `now`, at their starts (they are known to have run: a
    /// cut drops the steps it cancels first).
    fn write_steps(&mut self, now: SimTime) {
        let tl = &mut self.timeline;
        if !tl.keeps() {
            return;
        }
        self.sched.take_step_counts(now, |t, delta| {
            for (i, &d) in delta.iter().enumerate() {
                if d == 0 {
                    continue;
                }
                let m = match i {
                    0 => Metric::KvUsed,
                    1 => Metric::KvFree,
                    2 => Metric::KvCachedFree,
                    g => Metric::KvGroupUsed((g - 3) as u16),
                };
                let v = tl.last(m).expect("set at time zero").wrapping_add(d);
                tl.set(t, m, v);
            }
        });
    }

    /// The rank stopped for good at `now` (it crashed): the rest of its
    /// run will not happen; its last state.
    fn stopped(&mut self, now: SimTime, extra: Extra) {
        self.write_steps(now);
        self.sched.drop_step_counts();
        self.sample(now, extra);
    }

    /// The end of the run at `end`: the steps that started by then are
    /// written, the rest forgotten; a run in flight (cut off by a time
    /// limit) is cut at the step in progress, so that what it took or
    /// evicted for later steps, which never start, is given back first,
    /// and the steps before it, which ended, count.
    pub(crate) fn close_timeline(&mut self, end: SimTime) {
        self.write_steps(end);
        self.sched.drop_step_counts();
        self.sched.close(end);
    }

    /// Its timeline.
    pub(crate) fn timeline_mut(&mut self) -> &mut Timeline {
        &mut self.timeline
    }

    /// Rows older than the clock may still come from this rank: from the
    /// start of the first step of its run in flight whose counts it has not
    /// written, if any.
    pub(crate) fn timeline_hold(&self) -> Option<SimTime> {
        if self.timeline.keeps() { self.sched.step_counts_from() } else { None }
    }

    /// Takes what the rank's report needs, giving back every block its
    /// queue still holds.
    pub(crate) fn take_parts(&mut self) -> RankParts {
        let unfinished = self.sched.drain();
        RankParts {
            index: self.index,
            stats: self.sched.stats(),
            pool: self.sched.pool_report(),
            refusals: std::mem::take(&mut self.refusals),
            timeline: std::mem::take(&mut self.timeline),
            unfinished,
            violation: self.sched.check().err(),
        }
    }

    /// The role it serves.
    pub(crate) fn role(&self) -> Role {
        self.role
    }

    /// When the step (or run of steps) in flight ends, if one is.
    pub(crate) fn step_end(&self) -> Option<SimTime> {
        self.sched.step_end()
    }

    /// Index among the ranks of its role.
    pub(crate) fn index(&self) -> u32 {
        self.index
    }

    /// Gaps between consecutive output tokens on this rank.
    pub(crate) fn itl(&self) -> &crate::stats::histogram::Histogram {
        self.sched.itl()
    }

    /// The output tokens of each 1 s window (the rank's are left empty).
    pub(crate) fn take_token_windows(&mut self) -> crate::stats::bench::TokenWindows {
        self.sched.take_token_windows()
    }

    /// Logs every output token for a live run: see
    /// [`Scheduler::set_token_log`].
    pub(crate) fn set_token_log(&mut self, on: bool) {
        self.sched.set_token_log(on);
    }

    /// Moves the output tokens logged since the last call to `out`.
    pub(crate) fn take_tokens(&mut self, out: &mut Vec<(ReqId, SimTime)>) {
        self.sched.take_tokens(out);
    }

    /// (running, waiting, KV blocks in use, KV blocks) now.
    pub(crate) fn load(&mut self) -> (usize, usize, u64, u64) {
        let c = self.sched.counts();
        let (running, waiting, used) = (c.running, c.waiting, c.used);
        (running, waiting, used, self.sched.pool_report().num_blocks)
    }
}

/// Whether a rank goes on with a message's protocol after its handler.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Flow {
    /// Start a step if there is work, then sample.
    Continue,
    /// The rank stopped (it crashed): nothing more.
    Stop,
}

/// What a role adds to the common timeline values.
struct Extra {
    /// Its own series.
    series: [Option<(Metric, u64)>; 2],
    /// Requests it holds outside its scheduler (a decode rank's transfers).
    outside: u64,
}

/// What a role adds to the common rank. Every rank handles a message
/// through [`handle_message`], which runs the same protocol for every role,
/// so a new message or role cannot forget a step of it.
trait Side {
    /// The role.
    const ROLE: Role;
    /// The stamp of a request's first step here.
    fn started(r: &mut Request) -> &mut Option<SimTime>;
    /// The common part.
    fn core(&mut self) -> &mut RankCore;
    /// Whether the rank is down for good: messages then go to
    /// [`Side::while_down`] and nothing else runs.
    fn down(&self) -> bool {
        false
    }
    /// A message to a rank that is down.
    fn while_down(&mut self, _msg: Msg, _ctx: &mut Context<'_, Msg>) {}
    /// A command this role accepts, or one of its own timers.
    fn on_message(&mut self, msg: Msg, ctx: &mut Context<'_, Msg>) -> Flow;
    /// A sequence that finished in the step that just ended.
    fn on_finished(&mut self, f: Finished, ctx: &mut Context<'_, Msg>);
    /// After a schedule call (at the end of an instant): what the call
    /// leaves to the role (a decode rank's reserved loads start their
    /// transfers).
    fn after_schedule(&mut self, ctx: &mut Context<'_, Msg>);
    /// After a step's outputs are applied (its finished sequences handed
    /// to [`Side::on_finished`]): what the role's worker reports at the
    /// step's end (a prefill rank's polled source notifications).
    fn after_step(&mut self, _ctx: &mut Context<'_, Msg>) {}
    /// Whether [`Side::after_schedule`] has outputs to apply that vLLM
    /// applies before its next schedule call (the asynchronous loop's
    /// polled notifications): an empty call then does not go on to the
    /// next by itself; [`handle_message`] makes that call once
    /// `after_schedule` has applied them.
    fn outputs_due(&self) -> bool {
        false
    }
    /// The role's own timeline values.
    fn extra(&self) -> Extra;
}

/// The timeline's first values, at time zero.
fn first_sample<S: Side>(rank: &mut S) {
    let extra = rank.extra();
    rank.core().sample(SimTime::ZERO, extra);
}

/// The protocol of every rank, for every message:
/// 1. a rank that is down only drops (or fails) what comes;
/// 2. anything but the end of the step in flight (or the end of the
///    instant) may change the batch or read the pool, so a planned run of
///    decode steps is cut at the step in progress first;
/// 3. the step's end is applied, a command the role does not accept is
///    refused (by [`Command::accepted_by`]), anything else goes to the role;
/// 4. at the end of the instant ([`Msg::Kick`], once per instant), with
///    everything that arrived at it in the queue (as vLLM has every request
///    that arrived before its next `schedule()` call), a step starts if
///    there is work (a decode rank's schedule call also reserves remote
///    loads), the role does what the call leaves to it, and the timeline
///    gets the rank's state (the KV counts of the steps inside a run of
///    decode steps are written once they have run: at every message, after
///    the cut, those that started by then).
fn handle_message<S: Side>(rank: &mut S, msg: Msg, ctx: &mut Context<'_, Msg>) {
    if rank.down() {
        rank.while_down(msg, ctx);
        return;
    }
    let now = ctx.now();
    if !matches!(msg, Msg::StepDone | Msg::Kick) {
        rank.core().cut(ctx);
    }
    rank.core().write_steps(now);
    match msg {
        Msg::Kick => {
            rank.core().kick_due = false;
            let outputs_due = rank.outputs_due();
            rank.core().kick(ctx, S::started, outputs_due);
            // With the asynchronous engine loop, what finished in the step
            // that just ended leaves after this schedule call.
            let core = rank.core();
            let mut done = std::mem::take(&mut core.finished);
            core.sched.take_released(&mut done);
            for f in done.drain(..) {
                rank.on_finished(f, ctx);
            }
            rank.core().finished = done;
            rank.after_schedule(ctx);
            if outputs_due && rank.core().step_timer.is_none() {
                // The call planned nothing and left the next to the role,
                // whose outputs are now applied: that call comes at once.
                rank.core().kick_at_end_of_instant(ctx);
            }
            let extra = rank.extra();
            rank.core().sample(now, extra);
            return;
        }
        Msg::StepDone => {
            let core = rank.core();
            // A chunk of a run of decode steps ended: the run goes on, unless
            // something else is due at this instant (a message now, after
            // the step's end, must reach the next step's plan, as stepping
            // one event at a time would have it).
            if !ctx.more_now()
                && let Some(end) = core.sched.extend()
            {
                core.step_timer = Some(ctx.schedule(end - now, Msg::StepDone));
                return;
            }
            core.step_timer = None;
            let mut done = std::mem::take(&mut core.finished);
            core.sched.finish_step(now, &mut done);
            for f in done.drain(..) {
                rank.on_finished(f, ctx);
            }
            rank.core().finished = done;
            rank.after_step(ctx);
        }
        msg => match msg.command() {
            Some(command) if !command.accepted_by(S::ROLE) => rank.core().refuse(command, msg, ctx),
            _ => {
                if rank.on_message(msg, ctx) == Flow::Stop {
                    let extra = rank.extra();
                    rank.core().stopped(now, extra);
                    return;
                }
            }
        },
    }
    rank.core().kick_at_end_of_instant(ctx);
}

/// A source held for a handoff.
#[derive(Debug)]
struct Held {
    source: Source,
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
pub(crate) enum Hold {
    /// For at most this long, whatever the decode rank does (an explicit
    /// choice: `faults.source_hold_s`).
    Fixed(SimDuration),
    /// Under a lease this long, renewed by the decode rank's heartbeats
    /// (vLLM 0.31.0 to 0.33.0: 30 s, the default): it runs out only once
    /// they stop.
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
    pub(crate) fn lease_expiry(lease: SimDuration, held: SimTime, accepted: SimTime, silent: SimTime) -> SimTime {
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
pub(crate) struct PrefillRank {
    core: RankCore,
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
    /// Release (true) and cancel (false) notifications that came during
    /// the step in flight, in order: vLLM's prefill worker reports them
    /// (`finished_sending`) when it polls the connector at the step's end,
    /// and the scheduler frees those sources after the step's own frees.
    polled: Vec<(ReqId, bool)>,
    /// Notifications polled at the end of the step that just ended, freed
    /// after the next schedule call (the asynchronous loop).
    polled_due: Vec<(ReqId, bool)>,
    sources: SourceStats,
}

impl PrefillRank {
    /// A prefill rank holding sources as `hold` says.
    pub(crate) fn new(core: RankCore, model: Model, hold: Hold) -> Self {
        let mut rank = PrefillRank {
            core,
            model,
            hold,
            held: FxHashMap::default(),
            expiry: VecDeque::new(),
            lapsing: BTreeSet::new(),
            hold_timer: None,
            polled: Vec::new(),
            polled_due: Vec::new(),
            sources: SourceStats::default(),
        };
        first_sample(&mut rank);
        rank
    }

    /// Commands it refused.
    #[cfg(test)]
    pub(crate) fn refusals(&self) -> &[FailReason] {
        &self.core.refusals
    }

    /// Source counters.
    pub(crate) fn sources(&self) -> SourceStats {
        self.sources
    }

    /// Frees every held source (end-of-run accounting); returns how many.
    pub(crate) fn release_all_sources(&mut self) -> usize {
        self.polled.clear();
        self.polled_due.clear();
        let mut ids: Vec<ReqId> = self.held.keys().copied().collect();
        ids.sort_unstable();
        for id in &ids {
            let h = self.held.remove(id).expect("listed");
            self.core.sched.release_source(h.source);
        }
        ids.len()
    }

    /// The common part, for the end-of-run accounting.
    pub(crate) fn core_mut(&mut self) -> &mut RankCore {
        &mut self.core
    }

    fn drop_source(&mut self, id: ReqId, ctx: &mut Context<'_, Msg>) -> bool {
        let Some(h) = self.held.remove(&id) else { return false };
        self.core.sched.release_source(h.source);
        if self.held.is_empty() {
            // Nothing left to expire: the timer would only keep the run alive.
            self.expiry.clear();
            self.lapsing.clear();
            if let Some(t) = self.hold_timer.take() {
                ctx.cancel(t);
            }
        }
        true
    }

    /// Frees the sources whose notifications are in `list` (`polled`, or
    /// `polled_due`), in the order they came, and empties it.
    fn free_notified(&mut self, list: fn(&mut Self) -> &mut Vec<(ReqId, bool)>, ctx: &mut Context<'_, Msg>) {
        let mut taken = std::mem::take(list(self));
        for (id, released) in taken.drain(..) {
            self.notified(id, released, ctx);
        }
        *list(self) = taken;
    }

    /// The decode side released (`released`) or cancelled a source: it is
    /// freed.
    fn notified(&mut self, id: ReqId, released: bool, ctx: &mut Context<'_, Msg>) {
        match (self.drop_source(id, ctx), released) {
            (true, true) => self.sources.released += 1,
            (true, false) => self.sources.cancelled += 1,
            (false, _) => self.sources.stale += 1,
        }
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
            let h = self.held.remove(&id).expect("checked above");
            self.core.sched.release_source(h.source);
            self.sources.expired += 1;
            let reason = FailReason::SourceHoldExpired { held: now - h.since };
            ctx.send(self.core.router, Msg::SourceExpired(id, reason)).expect("the router outlives the run");
        }
        self.hold_timer = None;
    }
}

impl Side for PrefillRank {
    const ROLE: Role = Role::Prefill;

    fn started(r: &mut Request) -> &mut Option<SimTime> {
        &mut r.t.prefill_started
    }

    fn core(&mut self) -> &mut RankCore {
        &mut self.core
    }

    fn on_message(&mut self, msg: Msg, ctx: &mut Context<'_, Msg>) -> Flow {
        let now = ctx.now();
        match msg {
            Msg::SubmitHandoffPrefill(mut req) => {
                req.t.prefill_queued = Some(now);
                let t = rules::transferred_tokens(&self.model, req.prompt);
                req.transferred_tokens = t;
                if self.core.fits(&mut req, now) {
                    self.core.sched.enqueue(req, t, ctx.now());
                } else {
                    self.core.finish(req, ctx);
                }
            }
            // The decode side's notification: freed at once when no step
            // is in flight (vLLM's idle engine spins on empty steps, each
            // polling its connector), else at the step's end.
            Msg::ReleaseSource(id) if self.core.step_timer.is_some() => self.polled.push((id, true)),
            Msg::CancelSource(id, _) if self.core.step_timer.is_some() => self.polled.push((id, false)),
            Msg::ReleaseSource(id) => self.notified(id, true, ctx),
            Msg::CancelSource(id, _) => self.notified(id, false, ctx),
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
            other => unreachable!("a prefill rank gets no {other:?}"),
        }
        Flow::Continue
    }

    /// The prefill is done: the scheduler applied the source release of
    /// the prefill side ([`rules::source_release`], applied per group by
    /// [`rules::group_release`]); hold the source.
    fn on_finished(&mut self, f: Finished, ctx: &mut Context<'_, Msg>) {
        let now = ctx.now();
        let Finished::Prefilled { mut req, source } = f else {
            unreachable!("a prefill rank's sequences end with their prefill")
        };
        req.t.prefill_done = Some(now);
        let id = req.id;
        self.held.insert(id, Held { source, since: now });
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

    /// With the asynchronous loop, the notifications polled at the end of
    /// the step that just ended: vLLM applies that step's outputs (its
    /// `finished_sending` among them) after the schedule call made while
    /// it ran, which is this plan ([`crate::vllm::engine`]), and before
    /// the call after it: an empty plan then ends the kick
    /// ([`Side::outputs_due`]), and the next call, at the kick
    /// [`handle_message`] queues after this, sees the blocks freed.
    fn after_schedule(&mut self, ctx: &mut Context<'_, Msg>) {
        if !self.polled_due.is_empty() {
            self.free_notified(|r| &mut r.polled_due, ctx);
        }
    }

    /// Polled notifications wait for the schedule call in progress.
    fn outputs_due(&self) -> bool {
        !self.polled_due.is_empty()
    }

    /// The notifications polled at the step's end: with the synchronous
    /// loop applied now, before the next schedule call; with the
    /// asynchronous one after it ([`Side::after_schedule`]).
    fn after_step(&mut self, ctx: &mut Context<'_, Msg>) {
        match self.core.sched.engine_loop() {
            EngineLoop::Sync => self.free_notified(|r| &mut r.polled, ctx),
            EngineLoop::Async => self.polled_due.append(&mut self.polled),
        }
    }

    fn extra(&self) -> Extra {
        Extra { series: [Some((Metric::HeldSources, self.held.len() as u64)), None], outside: 0 }
    }
}

impl Actor<Msg> for PrefillRank {
    fn handle(&mut self, msg: Msg, ctx: &mut Context<'_, Msg>) {
        handle_message(self, msg, ctx);
    }
}

/// A request whose destination is reserved and whose KV is on its way.
#[derive(Debug)]
struct InTransfer {
    req: Box<Request>,
    reservation: Reservation,
}

/// A decode rank: queues each handoff as a remote load, which its schedule
/// calls reserve destination blocks for as vLLM's decode scheduler does
/// (in its waiting loop), pulls the KV over the link from the schedule
/// call that reserved, releases the source, computes the remaining prompt
/// token and decodes.
pub(crate) struct DecodeRank {
    core: RankCore,
    model: Model,
    /// Prefill ranks, by index.
    prefill: Vec<ActorId>,
    /// The link to use for each prefill rank, by its index.
    links: Vec<ActorId>,
    abort_probability: f64,
    transferring: FxHashMap<ReqId, InTransfer>,
    /// Scratch: the loads a schedule call reserved.
    reserved: Vec<(Box<Request>, Tokens, Reservation)>,
    /// Scratch for the handoffs computed here, not loaded (reused).
    computed_locally: Vec<(ReqId, Option<u32>)>,
    /// Decode ranks (TP ranks) reading from one prefill TP rank: a link
    /// carries that many times one decode rank's bytes (`tp::Reads`).
    readers: u32,
    /// The prefill ranks' lease on the sources this rank accepted, if they
    /// hold under a lease.
    lease: Option<SimDuration>,
    crashed_at: Option<SimTime>,
}

impl DecodeRank {
    /// A decode rank wired to the prefill ranks and their links; `lease` is
    /// the sources' lease, which it renews while it lives.
    pub(crate) fn new(
        core: RankCore,
        model: Model,
        prefill: Vec<ActorId>,
        links: Vec<ActorId>,
        abort: f64,
        lease: Option<SimDuration>,
        readers: u32,
    ) -> Self {
        let mut rank = DecodeRank {
            readers,
            core,
            model,
            prefill,
            links,
            abort_probability: abort,
            transferring: FxHashMap::default(),
            reserved: Vec::new(),
            computed_locally: Vec::new(),
            lease,
            crashed_at: None,
        };
        first_sample(&mut rank);
        rank
    }

    /// Commands it refused.
    #[cfg(test)]
    pub(crate) fn refusals(&self) -> &[FailReason] {
        &self.core.refusals
    }

    /// Reservations not made at the first schedule call after their
    /// handoff arrived (they waited for blocks, or behind a request that
    /// did).
    pub(crate) fn reservations_waited(&self) -> u64 {
        self.core.sched.reservations_waited()
    }

    /// The common part, for the end-of-run accounting.
    pub(crate) fn core_mut(&mut self) -> &mut RankCore {
        &mut self.core
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
        self.core.sched.crashed(now);
        // Sources of handoffs that have not landed are still held (a remote
        // load waiting for its reservation had its heartbeats too).
        let mut reqs = self.drain_in_flight();
        reqs.extend(self.core.sched.drain());
        reqs.sort_unstable_by_key(|r| r.id);
        for mut req in reqs {
            if req.t.transfer_done.is_none() {
                self.lapse(&req, ctx);
            }
            req.fail(FailReason::DecodeCrashed, now);
            self.core.finish(req, ctx);
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

    fn source_of(&self, req: &Request) -> ActorId {
        self.prefill[req.prefill_rank.expect("a handoff names its prefill rank") as usize]
    }

    fn cancel_source(&self, req: &Request, reason: FailReason, ctx: &mut Context<'_, Msg>) {
        ctx.send(self.source_of(req), Msg::CancelSource(req.id, reason)).expect("prefill ranks outlive the run");
    }

    /// Starts the transfers of the loads the last schedule call reserved,
    /// in the order it reserved them (vLLM's worker starts the reads of the
    /// step that allocated them).
    fn start_transfers(&mut self, ctx: &mut Context<'_, Msg>) {
        let now = ctx.now();
        // Handoffs computed here: their sources go back unread.
        let mut local = std::mem::take(&mut self.computed_locally);
        self.core.sched.take_computed_locally(&mut local);
        for (id, prefill_rank) in local.drain(..) {
            let source = self.prefill[prefill_rank.expect("a handoff names its prefill rank") as usize];
            ctx.send(source, Msg::ReleaseSource(id)).expect("prefill ranks outlive the run");
        }
        self.computed_locally = local;
        let mut reserved = std::mem::take(&mut self.reserved);
        loop {
            self.core.sched.take_reserved(&mut reserved);
            if reserved.is_empty() {
                break;
            }
            let mut landed = false;
            for (mut req, k, reservation) in reserved.drain(..) {
                let payload = rules::handoff_size_split(&self.model, req.prompt, k, reservation.window_hit())
                    .expect("the prompt is >= 1 token and the hit below it");
                req.t.reserved = Some(now);
                req.decode_hit = k;
                req.transferred_tokens = payload.transferred_tokens;
                req.transfer_bytes = payload.bytes;
                req.t.transfer_started = Some(now);
                if payload.moves_nothing {
                    // A full hit: nothing to read, only the notification.
                    req.t.transfer_done = Some(now);
                    let source = self.source_of(&req);
                    ctx.send(source, Msg::ReleaseSource(req.id)).expect("prefill ranks outlive the run");
                    self.core.sched.enqueue_landed(req, reservation, ctx.now());
                    landed = true;
                } else {
                    let link = self.links[req.prefill_rank.expect("a handoff names its prefill rank") as usize];
                    let bytes = Bytes::new(payload.bytes.get().saturating_mul(u64::from(self.readers)));
                    let msg = Msg::StartTransfer { id: req.id, bytes, reply_to: ctx.me() };
                    ctx.send(link, msg).expect("links outlive the run");
                    self.transferring.insert(req.id, InTransfer { req, reservation });
                }
            }
            if !landed {
                break;
            }
            // vLLM schedules a full hit in the call that found it (there is
            // nothing to load); here it runs in a step planned at once if
            // none is in flight (else at the next call: a departure), whose
            // own reservations start here too.
            self.core.kick(ctx, Self::started, false);
        }
        self.reserved = reserved;
    }

    /// Takes out every request whose transfer is in flight (its blocks
    /// returned), for the end-of-run accounting; the ones waiting for a
    /// reservation are in the scheduler.
    #[expect(clippy::vec_box, reason = "requests travel boxed in messages; unboxing them to box again copies each")]
    pub(crate) fn drain_in_flight(&mut self) -> Vec<Box<Request>> {
        let mut out: Vec<Box<Request>> = Vec::new();
        let mut ids: Vec<ReqId> = self.transferring.keys().copied().collect();
        ids.sort_unstable();
        for id in ids {
            let InTransfer { req, reservation } = self.transferring.remove(&id).expect("listed");
            self.core.sched.cancel_reservation(reservation);
            out.push(req);
        }
        out
    }

    fn fail_pending(&mut self, id: ReqId, reason: FailReason, ctx: &mut Context<'_, Msg>) -> bool {
        let Some(mut req) = self.core.sched.cancel_waiting(id) else { return false };
        req.fail(reason, ctx.now());
        self.core.finish(req, ctx);
        true
    }
}

impl Side for DecodeRank {
    const ROLE: Role = Role::Decode;

    fn started(r: &mut Request) -> &mut Option<SimTime> {
        &mut r.t.decode_started
    }

    fn core(&mut self) -> &mut RankCore {
        &mut self.core
    }

    fn down(&self) -> bool {
        self.crashed_at.is_some()
    }

    /// Down: a handoff sent before the router knew fails at once, with no
    /// heartbeat ever sent; everything else is lost.
    fn while_down(&mut self, msg: Msg, ctx: &mut Context<'_, Msg>) {
        if let Msg::ReserveDestination(mut req) = msg {
            let now = ctx.now();
            req.t.reserve_requested = Some(now);
            self.lapse(&req, ctx);
            req.fail(FailReason::DecodeCrashed, now);
            self.core.finish(req, ctx);
        }
    }

    fn on_message(&mut self, msg: Msg, ctx: &mut Context<'_, Msg>) -> Flow {
        let now = ctx.now();
        match msg {
            Msg::Crash => {
                self.crash(ctx);
                return Flow::Stop;
            }
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
                    // Reserved by the next schedule call, if the pool allows.
                    self.core.sched.enqueue_remote(req, ctx.now());
                }
            }
            Msg::TransferCompleted(id) => {
                // A transfer whose destination was cancelled meanwhile is dropped.
                if let Some(InTransfer { mut req, reservation }) = self.transferring.remove(&id) {
                    req.t.transfer_done = Some(now);
                    ctx.send(self.source_of(&req), Msg::ReleaseSource(id)).expect("prefill ranks outlive the run");
                    self.core.sched.enqueue_landed(req, reservation, ctx.now());
                }
            }
            Msg::CancelDestination(id, reason) => {
                if let Some(InTransfer { mut req, reservation }) = self.transferring.remove(&id) {
                    self.core.sched.cancel_reservation(reservation);
                    req.fail(reason, now);
                    self.core.finish(req, ctx);
                } else {
                    self.fail_pending(id, reason, ctx);
                }
            }
            other => unreachable!("a decode rank gets no {other:?}"),
        }
        Flow::Continue
    }

    fn on_finished(&mut self, f: Finished, ctx: &mut Context<'_, Msg>) {
        complete(&self.core, f, ctx);
    }

    /// The loads the schedule call reserved start their transfers.
    fn after_schedule(&mut self, ctx: &mut Context<'_, Msg>) {
        self.start_transfers(ctx);
    }

    fn extra(&self) -> Extra {
        Extra {
            series: [
                Some((Metric::PendingReservations, self.core.sched.remote_waiting() as u64)),
                Some((Metric::Transferring, self.transferring.len() as u64)),
            ],
            outside: self.transferring.len() as u64,
        }
    }
}

impl Actor<Msg> for DecodeRank {
    fn handle(&mut self, msg: Msg, ctx: &mut Context<'_, Msg>) {
        handle_message(self, msg, ctx);
    }
}

/// A generating sequence produced its last token: report it completed.
fn complete(core: &RankCore, f: Finished, ctx: &mut Context<'_, Msg>) {
    let Finished::Completed(mut req) = f else { unreachable!("a generating rank's sequences end with their output") };
    req.outcome = Outcome::Completed;
    req.t.finished = Some(ctx.now());
    core.finish(req, ctx);
}

/// A rank that prefills and decodes with no handoff: the baseline. It
/// refuses every handoff command.
pub(crate) struct AggregatedRank {
    core: RankCore,
}

impl AggregatedRank {
    /// An aggregated rank.
    pub(crate) fn new(core: RankCore) -> Self {
        let mut rank = AggregatedRank { core };
        first_sample(&mut rank);
        rank
    }

    /// Commands it refused.
    #[cfg(test)]
    pub(crate) fn refusals(&self) -> &[FailReason] {
        &self.core.refusals
    }

    /// The common part, for the end-of-run accounting.
    pub(crate) fn core_mut(&mut self) -> &mut RankCore {
        &mut self.core
    }
}

impl Side for AggregatedRank {
    const ROLE: Role = Role::Aggregated;

    fn started(r: &mut Request) -> &mut Option<SimTime> {
        &mut r.t.prefill_started
    }

    fn core(&mut self) -> &mut RankCore {
        &mut self.core
    }

    fn on_message(&mut self, msg: Msg, ctx: &mut Context<'_, Msg>) -> Flow {
        let now = ctx.now();
        match msg {
            Msg::Submit(mut req) => {
                req.t.prefill_queued = Some(now);
                if self.core.fits(&mut req, now) {
                    self.core.sched.enqueue(req, Tokens::ZERO, ctx.now());
                } else {
                    self.core.finish(req, ctx);
                }
            }
            other => unreachable!("an aggregated rank gets no {other:?}"),
        }
        Flow::Continue
    }

    fn on_finished(&mut self, f: Finished, ctx: &mut Context<'_, Msg>) {
        complete(&self.core, f, ctx);
    }

    fn after_schedule(&mut self, _ctx: &mut Context<'_, Msg>) {}

    fn extra(&self) -> Extra {
        Extra { series: [None, None], outside: 0 }
    }
}

impl Actor<Msg> for AggregatedRank {
    fn handle(&mut self, msg: Msg, ctx: &mut Context<'_, Msg>) {
        handle_message(self, msg, ctx);
    }
}
