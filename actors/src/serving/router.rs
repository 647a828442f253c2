//! The router: brings requests in from the workload and spreads them over
//! ranks, by a pluggable [`RoutePolicy`].
//!
//! Disaggregated: a request goes to a prefill rank (`SubmitHandoffPrefill`);
//! when the prefill rank reports the source held, the router picks a decode
//! rank and forwards the held source (`ReserveDestination`). Aggregated: a
//! request goes to one rank (`Submit`). Every finished request (completed or
//! failed) comes back here and is recorded.

use std::collections::{BTreeMap, VecDeque};

use sim_core::{Actor, ActorId, Context, EventId, SimDuration, SimTime};

use crate::base::fxmap::FxHashMap;
use crate::base::units::Tokens;
use crate::models::model::FrontEnd;
use crate::requests::request::{FailReason, ReqId, Request};
use crate::requests::workload::{ArrivalMode, PrefixIds, RequestSource, RequestSpec, WorkloadError};
use crate::serving::msg::Msg;
use crate::stats::records::RecordStream;
use serde::{Deserialize, Serialize};

/// A routing policy.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Policy {
    /// Ranks in turn.
    #[default]
    RoundRobin,
    /// The rank with the fewest outstanding tokens (ties: lowest index).
    LeastOutstanding,
    /// The rank with the least cost, `kv_overlap_weight` times the prompt
    /// tokens its prefix cache likely lacks, plus its outstanding tokens:
    /// the hit scored against the load.
    KvAware,
}

pub use crate::requests::request::MAX_REQUEST_TOKENS;

/// The latest arrival a request may have, and the end of simulated time:
/// 2^62 ns (about 146 years). A run whose steps would pass it is stopped
/// there with an error, far from where the 64-bit clock would saturate.
pub const MAX_ARRIVAL: SimTime = SimTime::from_nanos(1 << 62);

/// Picks a rank for a request.
pub trait RoutePolicy {
    /// The index of the rank for `req`, given each rank's outstanding tokens
    /// (`u64::MAX` for a rank that is down; if chosen anyway, the next rank
    /// up takes the request).
    fn choose(&mut self, req: &Request, loads: &[u64]) -> usize;
    /// Told where `req` went (for policies that learn from it).
    fn routed(&mut self, _req: &Request, _rank: usize) {}
}

/// Ranks in turn.
#[derive(Debug, Default)]
pub struct RoundRobin {
    next: usize,
}

impl RoutePolicy for RoundRobin {
    fn choose(&mut self, _: &Request, loads: &[u64]) -> usize {
        // Ranks that are down (load u64::MAX) lose their turn.
        let n = loads.len();
        let i = (0..n).map(|k| (self.next + k) % n).find(|&i| loads[i] < u64::MAX).unwrap_or(self.next % n);
        self.next = i + 1;
        i
    }
}

/// The rank with the fewest outstanding tokens; ties go to the lowest index.
#[derive(Debug, Default)]
pub struct LeastOutstanding;

fn least_loaded(loads: &[u64], among: impl Iterator<Item = usize>) -> usize {
    among.min_by_key(|&i| (loads[i], i)).unwrap_or(0)
}

impl RoutePolicy for LeastOutstanding {
    fn choose(&mut self, _: &Request, loads: &[u64]) -> usize {
        least_loaded(loads, 0..loads.len())
    }
}

/// The rank whose prefix cache most likely holds the most leading blocks of
/// the prompt, then the least loaded.
///
/// The router cannot see the ranks' pools, so it keeps a shadow of what it
/// sent where: per rank, the prefix ids of the prompts it routed there, in
/// LRU order, capped at about what the rank's pool can cache. Like a KV-aware
/// router fed by KV events, it can be wrong after evictions it does not see.
#[derive(Debug)]
pub struct KvAware {
    shadows: Vec<Shadow>,
    /// Weight of an uncached prompt token against a token of load.
    weight: f64,
}

#[derive(Debug, Default)]
struct Shadow {
    ids: FxHashMap<u64, u64>,
    lru: BTreeMap<u64, u64>,
    tick: u64,
    /// Tokens the rank's pool can cache.
    capacity: Tokens,
}

/// `kv_aware`'s default weight of an uncached prompt token against a token
/// of outstanding load.
pub const DEFAULT_KV_OVERLAP_WEIGHT: f64 = 1.0;

impl KvAware {
    /// A policy over ranks that can each cache about `capacity` tokens of
    /// prompts (the shadow holds as many prefix ids as cover them, at the
    /// ids' own block size), weighing an uncached prompt token `weight`
    /// times a token of outstanding load.
    pub fn new(ranks: usize, capacity: Tokens, weight: f64) -> Self {
        KvAware { shadows: (0..ranks).map(|_| Shadow { capacity, ..Shadow::default() }).collect(), weight }
    }

    fn matched(&self, rank: usize, prefix: &PrefixIds) -> usize {
        let s = &self.shadows[rank];
        prefix.ids.iter().take_while(|id| s.ids.contains_key(id)).count()
    }
}

impl RoutePolicy for KvAware {
    /// The rank with the least `weight × (prompt − cached prefix tokens) +
    /// outstanding tokens`, as the KV routers people run score overlap
    /// against load (Dynamo's: overlap weight × prefill blocks + active
    /// blocks); ties go to the less loaded, then the lower index. Without
    /// the load term every request whose prompt shares a first block with
    /// earlier ones would go to one rank.
    ///
    /// Weight 1, a 1,000-token prompt: rank A caches 600 of it and has
    /// 2,000 tokens outstanding (cost 400 + 2,000 = 2,400), rank B caches
    /// nothing and has 500 (1,000 + 500 = 1,500): B.
    fn choose(&mut self, req: &Request, loads: &[u64]) -> usize {
        let prompt = req.prompt.get();
        let block = req.prefix.block_tokens.get();
        let mut best: Option<(f64, u64, usize)> = None;
        for (i, &load) in loads.iter().enumerate() {
            // A rank at u64::MAX load is down.
            if load == u64::MAX {
                continue;
            }
            let cached = (self.matched(i, &req.prefix) as u64).saturating_mul(block).min(prompt);
            let cost = self.weight * (prompt - cached) as f64 + load as f64;
            let better = best.is_none_or(|(c, l, _)| cost.total_cmp(&c).then(load.cmp(&l)).is_lt());
            if better {
                best = Some((cost, load, i));
            }
        }
        best.map_or(0, |(.., i)| i)
    }

    fn routed(&mut self, req: &Request, rank: usize) {
        let s = &mut self.shadows[rank];
        let most = (s.capacity.get() / req.prefix.block_tokens.get().max(1)).max(1);
        for &id in &req.prefix.ids {
            s.tick += 1;
            if let Some(old) = s.ids.insert(id, s.tick) {
                s.lru.remove(&old);
            }
            s.lru.insert(s.tick, id);
            while s.ids.len() as u64 > most {
                let (_, evict) = s.lru.pop_first().expect("non-empty");
                s.ids.remove(&evict);
            }
        }
    }
}

/// The policy a config names; `capacity` (tokens a rank can cache) sizes the
/// KV-aware shadows, `weight` is its overlap weight.
pub fn policy(p: Policy, ranks: usize, capacity: Tokens, weight: f64) -> Box<dyn RoutePolicy> {
    match p {
        Policy::RoundRobin => Box::new(RoundRobin::default()),
        Policy::LeastOutstanding => Box::new(LeastOutstanding),
        Policy::KvAware => Box::new(KvAware::new(ranks, capacity, weight)),
    }
}

/// Where the router sends requests.
pub enum Targets {
    /// Prefill ranks, then decode ranks.
    Disaggregated {
        /// Prefill ranks by index.
        prefill: Vec<ActorId>,
        /// Decode ranks by index.
        decode: Vec<ActorId>,
    },
    /// Ranks that serve requests whole.
    Aggregated(Vec<ActorId>),
}

/// The router actor.
pub struct Router {
    targets: Targets,
    first_policy: Box<dyn RoutePolicy>,
    decode_policy: Box<dyn RoutePolicy>,
    first_load: Vec<u64>,
    decode_load: Vec<u64>,
    source: Box<dyn RequestSource>,
    arrivals: ArrivalMode,
    limit: Option<u64>,
    next: Option<RequestSpec>,
    issued: u64,
    /// The decode rank of each held source routed and not yet finished,
    /// and when its reservation request reaches that rank (the proxy's hop).
    decode_of: FxHashMap<ReqId, (ActorId, SimTime)>,
    /// Decode ranks that went down, by index.
    decode_down: Vec<bool>,
    /// Crashes still to come (injected faults).
    crash_timers: Vec<EventId>,
    /// The decode loads a policy sees while a rank is down (scratch).
    seen_loads: Vec<u64>,
    /// Requests that completed or failed, taken in id order.
    pub(crate) records: RecordStream,
    /// Why the workload stopped early, if it did.
    pub error: Option<WorkloadError>,
    /// A live run's ended requests, copied as they end (in the order they
    /// end, not by id), for its caller; `None` keeps none.
    pub(crate) ended: Option<Vec<Request>>,
    /// The API server between the clients and the engines.
    front: FrontEnd,
    /// The messages that carry requests across it, with when each is due
    /// (those due by now are dropped as new ones go out): what a run cut
    /// short takes back from the event queue to account for them.
    in_transit: VecDeque<(SimTime, EventId)>,
}

/// A crossing of the API server that carries a request to an engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Leg {
    /// From the client to the first rank's engine core (`request`).
    In,
    /// From the prefill server's answer to the decode server's engine core
    /// (`response` then `request`).
    Hop,
}

impl Router {
    /// A router; `targets` may be filled in after the ranks exist.
    pub fn new(
        first_policy: Box<dyn RoutePolicy>,
        decode_policy: Box<dyn RoutePolicy>,
        source: Box<dyn RequestSource>,
        arrivals: ArrivalMode,
        limit: Option<u64>,
        front: FrontEnd,
    ) -> Self {
        Router {
            targets: Targets::Aggregated(Vec::new()),
            first_policy,
            decode_policy,
            first_load: Vec::new(),
            decode_load: Vec::new(),
            source,
            arrivals,
            limit,
            next: None,
            issued: 0,
            decode_of: FxHashMap::default(),
            decode_down: Vec::new(),
            crash_timers: Vec::new(),
            seen_loads: Vec::new(),
            records: RecordStream::new(),
            error: None,
            ended: None,
            front,
            in_transit: VecDeque::new(),
        }
    }

    /// Whether a request crossing the API server reaches its engine at `t`
    /// or later.
    pub(crate) fn crossing_past(&self, t: SimTime) -> bool {
        self.in_transit.iter().any(|&(due, _)| due >= t)
    }

    /// The events that may still carry requests across the API server (a
    /// run cut short takes them back; those delivered are gone).
    pub(crate) fn take_in_transit(&mut self) -> VecDeque<(SimTime, EventId)> {
        std::mem::take(&mut self.in_transit)
    }

    /// Sends `msg` (carrying a request) to `to` across `leg` of the API
    /// server: at once when the leg takes no time. Returns when it arrives.
    fn cross(&mut self, ctx: &mut Context<'_, Msg>, leg: Leg, to: ActorId, msg: Msg) -> SimTime {
        let delay = match leg {
            Leg::In => self.front.request,
            Leg::Hop => self.front.response.saturating_add(self.front.request),
        };
        let now = ctx.now();
        if delay == SimDuration::ZERO {
            ctx.send(to, msg).expect("ranks outlive the run");
            return now;
        }
        while self.in_transit.front().is_some_and(|&(due, _)| due < now) {
            self.in_transit.pop_front();
        }
        let id = ctx.send_after(delay, to, msg).expect("ranks outlive the run");
        let due = now.saturating_add(delay);
        self.in_transit.push_back((due, id));
        due
    }

    /// Wires the ranks.
    pub fn set_targets(&mut self, targets: Targets) {
        let (first, decode) = match &targets {
            Targets::Disaggregated { prefill, decode } => (prefill.len(), decode.len()),
            Targets::Aggregated(r) => (r.len(), 0),
        };
        self.first_load = vec![0; first];
        self.decode_load = vec![0; decode];
        self.decode_down = vec![false; decode];
        self.targets = targets;
    }

    /// The timers of the decode-rank crashes to come.
    pub fn set_crash_timers(&mut self, timers: Vec<EventId>) {
        self.crash_timers = timers;
    }

    /// Once the workload is over and every request has ended, crashes still
    /// to come would affect nothing: they are dropped.
    fn drop_crashes_if_done(&mut self, ctx: &mut Context<'_, Msg>) {
        if !self.crash_timers.is_empty() && self.next.is_none() && self.records.ended() == self.issued {
            for t in self.crash_timers.drain(..) {
                ctx.cancel(t);
            }
        }
    }

    /// Requests issued so far.
    pub fn issued(&self) -> u64 {
        self.issued
    }

    /// Requests that completed or failed so far.
    pub fn ended(&self) -> u64 {
        self.records.ended()
    }

    /// Pulls the next request from the workload, unless the limit is reached.
    fn pull(&mut self) -> Result<Option<RequestSpec>, WorkloadError> {
        if self.limit.is_some_and(|l| self.issued >= l) {
            return Ok(None);
        }
        let spec = self.source.next_request()?;
        if let Some(s) = &spec {
            let (p, o) = (s.prompt.get(), s.output.get());
            if p == 0 || o == 0 || p.saturating_add(o) > MAX_REQUEST_TOKENS {
                return Err(WorkloadError(format!(
                    "request {}: {p} prompt and {o} output tokens; each must be at least 1 and together at most {MAX_REQUEST_TOKENS}",
                    self.issued + u64::from(self.next.is_some())
                )));
            }
            if matches!(self.arrivals, ArrivalMode::Open) && s.arrival > MAX_ARRIVAL {
                return Err(WorkloadError(format!(
                    "request {}: arrives at {:.0} s, past the end of simulated time (arrivals must come within {:.0} s)",
                    self.issued + u64::from(self.next.is_some()),
                    s.arrival.as_secs_f64(),
                    MAX_ARRIVAL.as_secs_f64()
                )));
            }
        }
        Ok(spec)
    }

    /// Reads the first request; returns when the first `Arrival` should fire.
    pub fn prime(&mut self) -> Result<Option<SimTime>, WorkloadError> {
        let expected = match (self.source.remaining_hint(), self.limit) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        // So that kept records never move while they grow (capped: a hint
        // is not a promise); made only once a record is kept, so a run
        // that streams its records reserves nothing.
        self.records.reserve(expected.unwrap_or(0).min(1 << 20) as usize);
        self.next = self.pull()?;
        Ok(self.next.as_ref().map(|s| match self.arrivals {
            ArrivalMode::Open => s.arrival,
            ArrivalMode::Closed { .. } => SimTime::ZERO,
        }))
    }

    fn issue(&mut self, spec: RequestSpec, ctx: &mut Context<'_, Msg>) {
        let now = ctx.now();
        let mut req = Box::new(Request::new(self.issued, spec.prompt, spec.output, spec.prefix, now));
        req.priority = spec.priority;
        self.issued += 1;
        let i = self.first_policy.choose(&req, &self.first_load);
        self.first_policy.routed(&req, i);
        req.prefill_rank = Some(i as u32);
        let (to, msg, load) = match &self.targets {
            Targets::Disaggregated { prefill, .. } => (prefill[i], Msg::SubmitHandoffPrefill as fn(_) -> _, req.prompt),
            Targets::Aggregated(ranks) => (ranks[i], Msg::Submit as fn(_) -> _, req.prompt + req.output),
        };
        self.first_load[i] += load.get();
        // The request reaches the engine core once through the API server.
        self.cross(ctx, Leg::In, to, msg(req));
    }

    /// Issues the pending request and reads the one after it.
    fn issue_next(&mut self, ctx: &mut Context<'_, Msg>) {
        let Some(spec) = self.next.take() else { return };
        self.issue(spec, ctx);
        match self.pull() {
            Ok(next) => self.next = next,
            Err(e) => {
                self.error = Some(e);
                ctx.stop();
            }
        }
    }

    fn on_finished(&mut self, req: Box<Request>) {
        let first = req.prefill_rank.map(|i| i as usize);
        match (&self.targets, first, req.decode_rank) {
            (Targets::Aggregated(_), Some(i), _) => self.first_load[i] -= (req.prompt + req.output).get(),
            (Targets::Disaggregated { .. }, _, Some(d)) => {
                self.decode_load[d as usize] -= (req.prompt + req.output).get()
            }
            (Targets::Disaggregated { .. }, Some(i), None) => self.first_load[i] -= req.prompt.get(),
            _ => {}
        }
        self.decode_of.remove(&req.id);
        self.record(req);
    }

    /// Keeps the record of an ended request (its prefix ids dropped), its
    /// output times and its end as the client sees them: one way out
    /// through the API server later.
    fn record(&mut self, mut req: Box<Request>) {
        req.prefix = PrefixIds::none();
        req.shift_to_client_time(self.front.response);
        if let Some(ended) = &mut self.ended {
            ended.push((*req).clone());
        }
        self.records.push(req);
    }

    /// After a request ended: a closed loop issues the next one, and
    /// crashes still to come are dropped once everything has ended.
    fn after_end(&mut self, ctx: &mut Context<'_, Msg>) {
        if matches!(self.arrivals, ArrivalMode::Closed { .. }) {
            // Its client sees the end one way out through the API server
            // later, and sends its next request then.
            match self.front.response {
                SimDuration::ZERO => self.issue_next(ctx),
                d => {
                    ctx.schedule(d, Msg::ClientNext);
                }
            }
        }
        self.drop_crashes_if_done(ctx);
    }
}

impl Actor<Msg> for Router {
    fn handle(&mut self, msg: Msg, ctx: &mut Context<'_, Msg>) {
        match msg {
            Msg::Arrival => match self.arrivals {
                ArrivalMode::Open => {
                    self.issue_next(ctx);
                    if let Some(at) = self.next.as_ref().map(|s| s.arrival) {
                        let delay = at.saturating_since(ctx.now());
                        ctx.schedule(delay, Msg::Arrival);
                    }
                }
                ArrivalMode::Closed { concurrency } => {
                    // At most one pass per request the workload has: the
                    // cost is min(concurrency, requests), not concurrency.
                    for _ in 0..concurrency {
                        if self.next.is_none() {
                            break;
                        }
                        self.issue_next(ctx);
                    }
                }
            },
            Msg::Inject(spec) => self.issue(*spec, ctx),
            Msg::ClientNext => self.issue_next(ctx),
            Msg::SourceHeld(mut req) => {
                let p = req.prefill_rank.expect("a held source names its prefill rank") as usize;
                self.first_load[p] -= req.prompt.get();
                let Targets::Disaggregated { prefill, decode } = &self.targets else {
                    unreachable!("only disaggregated deployments hold sources")
                };
                // A rank that is down looks fully loaded to the policy, and
                // passes its turn to the next one up if chosen all the same
                // (round robin does not look at loads).
                let n = decode.len();
                let chosen = if self.decode_down.iter().any(|&d| d) {
                    let loads = &mut self.seen_loads;
                    loads.clear();
                    loads.extend((0..n).map(|d| if self.decode_down[d] { u64::MAX } else { self.decode_load[d] }));
                    self.decode_policy.choose(&req, loads)
                } else {
                    self.decode_policy.choose(&req, &self.decode_load)
                };
                assert!(chosen < n, "a routing policy chose decode rank {chosen} of {n}");
                let Some(d) = (0..n).map(|k| (chosen + k) % n).find(|&d| !self.decode_down[d]) else {
                    let reason = FailReason::NoDecodeRank;
                    ctx.send(prefill[p], Msg::CancelSource(req.id, reason)).expect("ranks outlive the run");
                    req.fail(reason, ctx.now());
                    self.record(req);
                    self.after_end(ctx);
                    return;
                };
                self.decode_policy.routed(&req, d);
                let to = decode[d];
                req.decode_rank = Some(d as u32);
                self.decode_load[d] += (req.prompt + req.output).get();
                let id = req.id;
                // The proxy has the prefill server's answer one way out of
                // its API server later, and the decode server's engine core
                // has the request one way in through its own.
                let due = self.cross(ctx, Leg::Hop, to, Msg::ReserveDestination(req));
                self.decode_of.insert(id, (to, due));
            }
            Msg::SourceExpired(id, reason) => {
                // A source that lapses while its request crosses the hop is
                // cancelled when the request reaches the decode rank (after
                // it, at that instant), not before.
                if let Some(&(d, due)) = self.decode_of.get(&id) {
                    let cancel = Msg::CancelDestination(id, reason);
                    match due.saturating_since(ctx.now()) {
                        SimDuration::ZERO => ctx.send(d, cancel),
                        wait => ctx.send_after(wait, d, cancel),
                    }
                    .expect("ranks outlive the run");
                }
            }
            Msg::RankDown(d) => self.decode_down[d as usize] = true,
            Msg::CrashDecode(d) => {
                let Targets::Disaggregated { decode, .. } = &self.targets else {
                    unreachable!("crashes are checked to name decode ranks")
                };
                ctx.send(decode[d as usize], Msg::Crash).expect("ranks outlive the run");
            }
            Msg::Finished(req) => {
                self.on_finished(req);
                self.after_end(ctx);
            }
            other => unreachable!("the router gets no {other:?}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_ids(block_tokens: u64, ids: &[u64]) -> Request {
        let prefix = PrefixIds { block_tokens: Tokens::new(block_tokens), ids: ids.to_vec() };
        let prompt = Tokens::new(block_tokens * ids.len() as u64);
        Request::new(0, prompt, Tokens::new(1), prefix, SimTime::ZERO)
    }

    /// A rank that is down (load `u64::MAX`) is never the least loaded, and
    /// its cache does not attract requests.
    #[test]
    fn policies_pass_over_ranks_that_are_down() {
        let req = with_ids(16, &[1, 2]);
        assert_eq!(LeastOutstanding.choose(&req, &[u64::MAX, 5, 3]), 2);
        // Round robin over three ranks with rank 1 down: 0, 2, 0, 2.
        let mut rr = RoundRobin::default();
        let turns: Vec<usize> = (0..4).map(|_| rr.choose(&req, &[0, u64::MAX, 0])).collect();
        assert_eq!(turns, [0, 2, 0, 2]);
        let mut kv = KvAware::new(3, Tokens::new(1_000), DEFAULT_KV_OVERLAP_WEIGHT);
        kv.routed(&req, 0);
        assert_eq!(kv.choose(&req, &[0, 5, 3]), 0, "rank 0 holds the prefix");
        assert_eq!(kv.choose(&req, &[u64::MAX, 5, 3]), 2, "rank 0 is down");
    }

    /// A rank caching 64 tokens holds four 16-token ids in the shadow (the
    /// oldest go first), but only one 512-token id.
    #[test]
    fn the_shadow_holds_the_tokens_a_rank_caches() {
        let mut kv = KvAware::new(1, Tokens::new(64), DEFAULT_KV_OVERLAP_WEIGHT);
        kv.routed(&with_ids(16, &[1, 2, 3, 4]), 0);
        assert_eq!(kv.matched(0, &with_ids(16, &[1, 2, 3, 4]).prefix), 4);
        kv.routed(&with_ids(16, &[5, 6]), 0);
        assert_eq!(kv.matched(0, &with_ids(16, &[3, 4, 5, 6]).prefix), 4, "3, 4, 5 and 6 stay");
        assert_eq!(kv.matched(0, &with_ids(16, &[1, 2]).prefix), 0, "1 and 2 are evicted");
        kv.routed(&with_ids(512, &[7, 8]), 0);
        assert_eq!(kv.matched(0, &with_ids(512, &[8]).prefix), 1);
        assert_eq!(kv.matched(0, &with_ids(512, &[7]).prefix), 0);
    }
}
