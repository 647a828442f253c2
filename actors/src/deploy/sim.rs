//! Builds a deployment from its spec, runs it on the engine, and collects
//! what happened: per-request records, the summary, per-rank and per-link
//! reports and timelines, and the conservation checks.

use std::sync::Arc;

use sim_core::{ActorId, SimDuration, SimTime, Simulation};

use crate::base::units::{Bandwidth, Tokens};
use crate::deploy::config::{DeploymentSpec, LinkTopology, RoleSpec, SloSpec};
use crate::deploy::validate;
use crate::models::arch::ModelArch;
use crate::models::hardware::Gpu;
use crate::models::model::{
    CacheGroup, CacheGroupKind, DEFAULT_LINEAR_BLOCK_SIZE, FrontEnd, Model, ModelSpec, RankRules, Role,
};
use crate::models::steptime::roofline::RankInputs;
use crate::models::steptime::{self, StepTimeModel};
use crate::models::tp::Reads;
use crate::requests::request::{FailReason, ReqId, Request};
use crate::requests::workload::{ArrivalMode, PrefixIds, RequestSource, RequestSpec, WorkloadError};
use crate::scheduler::{BatchPolicy, Limits, Mode, Scheduler, StepStats, VllmPolicy};
use crate::serving::link::{LinkStats, NixlLink};
use crate::serving::msg::Msg;
use crate::serving::ranks::{AggregatedRank, DecodeRank, Hold, PrefillRank, RankCore, SourceStats};
use crate::serving::router::{DEFAULT_KV_OVERLAP_WEIGHT, RoutePolicy, Router, Targets, policy};
use crate::stats::bench::TokenWindows;
use crate::stats::histogram::Histogram;
use crate::stats::records::{Digest, RecordStream, Totals};
use crate::stats::summary::Summary;
use crate::stats::timeline::{EntitySample, Sample, SampleLog, Sampling, Timeline, log_rows};
use crate::vllm::engine::EngineLoop;

pub use crate::deploy::validate::ConfigError;

/// The most ranks of one role (links per pair grow with the product).
pub const MAX_RANKS: u32 = 1024;

/// One role's checked settings.
#[derive(Clone, Debug)]
struct RolePlan {
    role: Role,
    spec: RoleSpec,
    rules: RankRules,
    groups: Vec<CacheGroup>,
    /// The rank's TP size.
    tp: u32,
    /// The pool's blocks (the spec's, or derived from GPU memory).
    num_blocks: u64,
}

/// A checked deployment, ready to run any number of times.
#[derive(Clone, Debug)]
pub struct Deployment {
    model: Model,
    spec: DeploymentSpec,
    roles: Vec<RolePlan>,
    bandwidth: Bandwidth,
    latency: SimDuration,
    hold: Option<SimDuration>,
    lease: Option<SimDuration>,
    crashes: Vec<(u32, SimTime)>,
    /// How a handoff reads between the prefill and decode TP sizes.
    reads: Option<Reads>,
    /// The model's layers, when it gives them (roofline step times).
    arch: Option<ModelArch>,
    /// The checked `[hardware]`.
    gpu: Option<Gpu>,
    /// The API server in front of the engines.
    front_end: FrontEnd,
    lazy_decoding: bool,
    keep_timelines: bool,
    plugins: Plugins,
}

/// Models and policies of the caller's own, by role.
#[derive(Clone, Default)]
struct Plugins {
    step_time: Vec<(Role, StepTimeFactory)>,
    route: Vec<(Role, PolicyFactory)>,
    batch: Vec<(Role, BatchPolicyFactory)>,
}

impl std::fmt::Debug for Plugins {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let step_time: Vec<Role> = self.step_time.iter().map(|(r, _)| *r).collect();
        let route: Vec<Role> = self.route.iter().map(|(r, _)| *r).collect();
        let batch: Vec<Role> = self.batch.iter().map(|(r, _)| *r).collect();
        f.debug_struct("Plugins").field("step_time", &step_time).field("route", &route).field("batch", &batch).finish()
    }
}

/// Makes a step-time model for one rank: see [`Deployment::set_step_time_model`].
pub type StepTimeFactory = Arc<dyn Fn() -> Box<dyn StepTimeModel> + Send + Sync>;

/// Makes a batching policy for one rank: see [`Deployment::set_batch_policy`].
pub type BatchPolicyFactory = Arc<dyn Fn() -> Box<dyn BatchPolicy> + Send + Sync>;

/// Makes a routing policy over a number of ranks: see [`Deployment::set_route_policy`].
pub type PolicyFactory = Arc<dyn Fn(usize) -> Box<dyn RoutePolicy> + Send + Sync>;

impl Deployment {
    /// Checks `spec` for `model`: the roles present, each rank's gates, the
    /// pairing of prefill and decode, and every number.
    pub fn build(model: &ModelSpec, spec: &DeploymentSpec) -> Result<Deployment, ConfigError> {
        let checked = validate::deployment(model, spec)?;
        let roles = checked
            .roles
            .into_iter()
            .map(|r| RolePlan {
                role: r.role,
                spec: r.spec,
                rules: r.rules,
                groups: r.groups,
                tp: r.tp,
                num_blocks: r.num_blocks,
            })
            .collect();
        Ok(Deployment {
            model: checked.model,
            spec: spec.clone(),
            roles,
            bandwidth: checked.bandwidth,
            latency: checked.latency,
            hold: checked.faults.hold,
            lease: checked.faults.lease,
            crashes: checked.faults.crashes,
            reads: checked.reads,
            arch: model.arch.clone(),
            gpu: checked.gpu,
            front_end: checked.front_end,
            lazy_decoding: true,
            keep_timelines: true,
            plugins: Plugins::default(),
        })
    }

    /// Gives every rank of `role` a step-time model of the caller's own,
    /// made by `make` (once per rank), in place of the spec's `step_time`.
    /// The spec's model is still checked by [`Deployment::build`].
    pub fn set_step_time_model(
        &mut self,
        role: Role,
        make: impl Fn() -> Box<dyn StepTimeModel> + Send + Sync + 'static,
    ) {
        self.plugins.step_time.retain(|(r, _)| *r != role);
        self.plugins.step_time.push((role, Arc::new(make)));
    }

    /// Gives every rank of `role` a batching policy of the caller's own, made
    /// by `make` (once per rank), in place of vLLM's
    /// ([`VllmPolicy`]): it decides, step by
    /// step, what runs, what is admitted and what is preempted, through the
    /// operations of [`Step`](crate::scheduler::Step).
    pub fn set_batch_policy(&mut self, role: Role, make: impl Fn() -> Box<dyn BatchPolicy> + Send + Sync + 'static) {
        self.plugins.batch.retain(|(r, _)| *r != role);
        self.plugins.batch.push((role, Arc::new(make)));
    }

    /// Routes requests to the ranks of `role` with a policy of the caller's
    /// own, made by `make` from the number of ranks, in place of the spec's
    /// router policy. [`Role::Prefill`] or [`Role::Aggregated`] sets the
    /// policy that picks the first rank; [`Role::Decode`] the one that picks
    /// the decode rank.
    pub fn set_route_policy(
        &mut self,
        role: Role,
        make: impl Fn(usize) -> Box<dyn RoutePolicy> + Send + Sync + 'static,
    ) {
        let role = if role == Role::Aggregated { Role::Prefill } else { role };
        self.plugins.route.retain(|(r, _)| *r != role);
        self.plugins.route.push((role, Arc::new(make)));
    }

    fn route_policy(&self, role: Role) -> Option<&PolicyFactory> {
        let role = if role == Role::Aggregated { Role::Prefill } else { role };
        self.plugins.route.iter().find(|(r, _)| *r == role).map(|(_, f)| f)
    }

    /// Turns the ranks' decoding sets off (on by default): every step then
    /// handles every sequence one by one. Slower, and the reference that the
    /// decoding set is checked against.
    pub fn set_lazy_decoding(&mut self, on: bool) {
        self.lazy_decoding = on;
    }

    /// Whether runs keep the ranks' and links' timelines (on by default).
    /// Off, no row is stored: `RankReport::timeline` and
    /// `LinkReport::timeline` come back empty, and a long run does not hold
    /// them. Nothing else depends on it: the events, the records and every
    /// other number are the same either way.
    pub fn set_keep_timelines(&mut self, on: bool) {
        self.keep_timelines = on;
    }

    /// The validated model.
    pub fn model(&self) -> &Model {
        &self.model
    }

    /// The API server in front of the engines: the version's, or the
    /// scenario's `[frontend]`.
    pub fn front_end(&self) -> FrontEnd {
        self.front_end
    }

    /// The spec it was built from.
    pub fn spec(&self) -> &DeploymentSpec {
        &self.spec
    }

    /// Whether prefill and decode are separate ranks.
    pub fn is_disaggregated(&self) -> bool {
        self.roles.iter().any(|r| r.role == Role::Prefill)
    }

    /// The longest sequence the deployment serves (`max_model_len`, the
    /// smallest over its roles, as checked: the model's context limit when
    /// the scenario gives none and the model has layers); `None` when
    /// unlimited. A prompt of at least this many tokens fails at arrival.
    pub fn max_model_len(&self) -> Option<Tokens> {
        self.roles.iter().filter_map(|r| r.spec.max_model_len).min()
    }

    fn plan(&self, role: Role) -> Option<&RolePlan> {
        self.roles.iter().find(|r| r.role == role)
    }

    /// The common part of rank `index` of `plan`'s role: its scheduler in
    /// `mode`, its timeline, its `max_model_len`.
    /// A rank's core; `origin` starts its 1 s output-token windows (the
    /// run's first arrival).
    /// The common part of rank `index` of `plan`'s role: its scheduler
    /// (counting output tokens in 1 s windows from `origin`) and its
    /// timeline, stored as `sampling` says under the rank's report index
    /// `entity`.
    fn rank_core(&self, (index, entity): (u32, u32), plan: &RolePlan, mode: Mode, wiring: &Wiring) -> RankCore {
        let (router, origin, sampling) = (wiring.router, wiring.origin, &wiring.sampling);
        let timeline = sampling.timeline(entity);
        let mut scheduler = self.scheduler(plan, mode);
        scheduler.set_token_origin(origin, self.front_end.response);
        RankCore::new(index, plan.role, router, scheduler, plan.spec.max_model_len, timeline)
    }

    /// The KV pool blocks of a rank of `role` (the spec's `num_blocks`,
    /// or what GPU memory leaves); `None` when there is no such role.
    pub fn num_blocks(&self, role: Role) -> Option<u64> {
        self.plan(role).map(|p| p.num_blocks)
    }

    /// The step-time model a rank of `role` runs with (the plugged-in one,
    /// else the spec's), as a run builds it; `None` when the deployment
    /// has no such role.
    pub fn step_time_for(&self, role: Role) -> Option<Box<dyn StepTimeModel>> {
        self.plan(role).map(|p| self.step_time_model(p))
    }

    /// What a roofline needs to know of a rank of `role` (its layers, GPU,
    /// TP size and pool groups), when the deployment gives the model's
    /// `arch` and a `[hardware]`: for fitting a roofline's factors to
    /// measured steps (`pdsim calibrate --kind roofline`).
    pub fn rank_inputs(&self, role: Role) -> Option<RankInputs<'_>> {
        self.plan(role).and_then(|plan| self.inputs(plan))
    }

    fn inputs<'a>(&'a self, plan: &'a RolePlan) -> Option<RankInputs<'a>> {
        match (&self.arch, &self.gpu) {
            (Some(arch), Some(gpu)) => Some(RankInputs { arch, gpu, tp: plan.tp, groups: &plan.groups }),
            _ => None,
        }
    }

    fn step_time_model(&self, plan: &RolePlan) -> Box<dyn StepTimeModel> {
        if let Some((_, make)) = self.plugins.step_time.iter().find(|(r, _)| *r == plan.role) {
            return make();
        }
        steptime::build(&plan.spec.step_time, self.inputs(plan)).expect("checked in build")
    }

    fn scheduler(&self, plan: &RolePlan, mode: Mode) -> Scheduler {
        let s = &plan.spec;
        let pool = (plan.groups.clone(), plan.num_blocks, s.prefix_caching);
        let model = self.step_time_model(plan);
        let policy = match self.plugins.batch.iter().find(|(r, _)| *r == plan.role) {
            Some((_, make)) => make(),
            None => Box::new(VllmPolicy),
        };
        // vLLM takes a Mamba-type group's prefill checkpoint blocks in "align"
        // mode only, which prefix caching turns on.
        let checkpoints = mode == Mode::PrefillOnly && s.prefix_caching;
        let limits = Limits { max_num_batched_tokens: s.max_num_batched_tokens, max_num_seqs: s.max_num_seqs as usize };
        let mut b = Scheduler::new(mode, limits, checkpoints, pool, model, policy);
        b.set_check_invariants(self.spec.check_invariants);
        b.set_kv_connector(plan.role == Role::Decode);
        b.set_lazy_decoding(self.lazy_decoding);
        let engine = if s.async_scheduling.unwrap_or(plan.rules.async_scheduling()) {
            EngineLoop::Async
        } else {
            EngineLoop::Sync
        };
        b.set_engine_loop(engine, true);
        b.set_options(s.scheduler_options(plan.num_blocks));
        b
    }
}

/// A rank's report.
#[derive(Clone, Debug)]
pub struct RankReport {
    /// E.g. `prefill0`.
    pub name: String,
    /// Its role.
    pub role: Role,
    /// Step counters.
    pub stats: StepStats,
    /// Pool budget.
    pub num_blocks: u64,
    /// Most blocks in use at once.
    pub peak_used_blocks: u64,
    /// Cached blocks evicted.
    pub evicted_blocks: u64,
    /// Names of the pool's groups, by index (for [`crate::stats::timeline::Metric::KvGroupUsed`]).
    pub groups: Vec<String>,
    /// Commands it refused, as text.
    pub refusals: Vec<String>,
    /// Source counters (prefill ranks).
    pub sources: Option<SourceStats>,
    /// Reservations not made at the first schedule call after their
    /// handoff arrived: they waited for blocks, or behind a request that
    /// did, or for a running slot (decode ranks).
    pub reservations_waited: u64,
    /// Sampled use over time.
    pub timeline: Timeline,
}

/// A link's report.
#[derive(Clone, Debug)]
pub struct LinkReport {
    /// E.g. `link-p0-d1`.
    pub name: String,
    /// Counters.
    pub stats: LinkStats,
    /// Sampled use over time.
    pub timeline: Timeline,
}

/// What a run produced.
#[derive(Clone, Debug)]
pub struct SimOutput {
    /// Every request that entered, by id.
    pub records: Vec<Request>,
    /// The summary.
    pub summary: Summary,
    /// Per rank, prefill (or aggregated) ranks first.
    pub ranks: Vec<RankReport>,
    /// Per link.
    pub links: Vec<LinkReport>,
    /// Engine events delivered.
    pub events: u64,
    /// When the last event happened.
    pub final_time: SimTime,
    /// The run was ended with events still due (a time limit, or a stop
    /// from `run_in_slices`'s callback): requests in flight then failed as
    /// unfinished.
    pub cut_short: bool,
    /// Broken conservation invariants (empty when all hold).
    pub violations: Vec<String>,
    /// FNV-1a digest of the per-request outcomes and times.
    pub digest: u64,
}

/// Why a run stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// The workload could not give a request.
    #[error(transparent)]
    Workload(#[from] WorkloadError),
    /// A step or a transfer would end past the end of simulated time
    /// ([`END_OF_TIME`]): the step times or the link are too slow for the
    /// requests by orders of magnitude.
    #[error(
        "{field}: the simulated clock would pass {:.3e} s (2^62 ns, the end of simulated time): \
         a {what} lasts longer than a run can hold",
        END_OF_TIME.as_secs_f64()
    )]
    PastEndOfTime {
        /// The scenario field that makes it (`decode.step_time`,
        /// `link.bandwidth_gb_s`, or `frontend.request_us`).
        field: String,
        /// What would end too late: a step, a transfer, or a request's way
        /// through the API server.
        what: &'static str,
    },
}

/// The end of simulated time: 2^62 ns (about 146 years), the latest arrival
/// ([`crate::serving::router::MAX_ARRIVAL`]) too. A run whose steps or
/// transfers would carry the clock past it stops there with
/// [`SimError::PastEndOfTime`], long before the clock (64 bits) could
/// saturate.
pub const END_OF_TIME: SimTime = crate::serving::router::MAX_ARRIVAL;

/// What to run a deployment on.
pub struct RunInput {
    /// The seed of every random stream.
    pub seed: u64,
    /// The requests.
    pub source: Box<dyn RequestSource>,
    /// Open or closed loop.
    pub arrivals: ArrivalMode,
    /// Stop issuing after this many requests.
    pub max_requests: Option<u64>,
    /// Bounds for goodput.
    pub slo: SloSpec,
    /// Stop the simulation at this time (requests still in flight fail as unfinished).
    pub until: Option<SimTime>,
}

/// A rank's actor, by role.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RankId {
    /// A [`PrefillRank`].
    Prefill(ActorId),
    /// A [`DecodeRank`].
    Decode(ActorId),
    /// An [`AggregatedRank`].
    Aggregated(ActorId),
}

impl RankId {
    /// The actor.
    #[cfg(test)]
    pub(crate) fn id(self) -> ActorId {
        match self {
            RankId::Prefill(a) | RankId::Decode(a) | RankId::Aggregated(a) => a,
        }
    }
}

/// A deployment wired on an engine, ready to run: for callers that want to
/// inject their own messages or drive the engine themselves.
pub struct Built<'d> {
    dep: &'d Deployment,
    /// The engine with every actor added and the first arrival scheduled.
    pub(crate) sim: Simulation<Msg>,
    /// The router.
    pub(crate) router: ActorId,
    /// Every rank, prefill (or aggregated) ranks first, in index order.
    pub(crate) ranks: Vec<RankId>,
    /// Every link, with its name.
    pub(crate) links: Vec<(String, ActorId)>,
    until: Option<SimTime>,
    /// Every timeline's samples as they are taken (none when timelines are
    /// not kept).
    log: Option<SampleLog>,
    sample_sink: Option<SampleSink>,
    /// A live run's injections so far ([`build_live`]); `None` otherwise.
    live: Option<Injected>,
}

/// What a live run has been given: the requests injected and the latest
/// arrival among them.
#[derive(Clone, Copy, Debug, Default)]
struct Injected {
    count: u64,
    last: SimTime,
}

/// A deployment's load at an instant, summed over its ranks (prefill and
/// decode ranks alike).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Load {
    /// Sequences in the ranks' running sets.
    pub running: u64,
    /// Sequences queued (work held back by the asynchronous loop included;
    /// handoffs waiting to land not).
    pub waiting: u64,
    /// KV blocks in use.
    pub kv_used_blocks: u64,
    /// KV blocks in all the pools.
    pub kv_blocks: u64,
}

/// Why a live run refused a request.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum InjectError {
    /// Not a live run ([`build_live`]).
    #[error("not a live run")]
    NotLive,
    /// Zero prompt or output tokens, or more than the most a request holds.
    #[error(
        "{prompt} prompt and {output} output tokens; each must be at least 1 and together at most {}",
        crate::serving::router::MAX_REQUEST_TOKENS
    )]
    Size {
        /// Prompt tokens.
        prompt: u64,
        /// Output tokens.
        output: u64,
    },
    /// Before the clock, before an earlier injection, or past the end of
    /// simulated time.
    #[error("an arrival at {at} ns is before the clock ({now} ns) or the last arrival, or past the end of time")]
    Time {
        /// The arrival asked for.
        at: u64,
        /// The clock then.
        now: u64,
    },
}

/// Takes timeline rows in slices: see [`Built::set_sample_sink`].
pub type SampleSink = Box<dyn FnMut(&[EntitySample])>;

/// How far a run has got, for progress displays.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Progress {
    /// The simulated clock.
    pub now: SimTime,
    /// Requests that entered.
    pub issued: u64,
    /// Requests that completed or failed.
    pub finished: u64,
}

impl Built<'_> {
    /// Hands each request's record to `sink` as the request ends, in id
    /// order (records that end before an earlier request wait in a reorder
    /// buffer for it), instead of keeping them: the run's memory is then
    /// bounded by what is in flight, and `SimOutput::records` comes back
    /// empty. The summary and the digest are the same either way.
    pub fn set_record_sink(&mut self, sink: impl FnMut(&Request) + 'static) {
        self.sim.actor_mut::<Router>(self.router).expect("router").records.set_sink(Box::new(sink));
    }

    /// The percentiles of the summary's `bench` statistics (default
    /// [`crate::stats::bench::DEFAULT_PERCENTILES`]; each within 0..=100, see
    /// [`crate::stats::bench::check_percentiles`]).
    pub fn set_percentiles(&mut self, ps: &[f64]) {
        self.sim.actor_mut::<Router>(self.router).expect("router").records.set_percentiles(ps);
    }

    /// Keeps at most `limit` values of each latency statistic exactly,
    /// then folds them into a quantile sketch ([`crate::stats::sketch`]), so that
    /// the summary's memory stops growing with the requests; its
    /// percentiles are then within [`crate::stats::sketch::RELATIVE_ERROR`] of
    /// the exact ones (count, max and mean exact). `None`, the default,
    /// keeps every value. Call it before the run.
    pub fn set_exact_latency_limit(&mut self, limit: Option<usize>) {
        self.sim.actor_mut::<Router>(self.router).expect("router").records.set_exact_limit(limit);
    }

    /// Hands the timelines' samples to `sink` as the run goes, in slices,
    /// ordered by time, then entity (the ranks in report order, then the
    /// links), then the order the entity took them; the reports' timelines
    /// then come back empty. Nothing is handed over when the deployment
    /// keeps no timelines ([`Deployment::set_keep_timelines`]).
    pub fn set_sample_sink(&mut self, sink: impl FnMut(&[EntitySample]) + 'static) {
        self.sample_sink = Some(Box::new(sink));
    }

    /// The ranks and links, in report order (the entity indices of
    /// [`EntitySample`]): each name (`prefill0`, `link-p0-d0`) and, for a
    /// rank, its cache groups' names.
    pub fn entities(&self) -> Vec<(String, Vec<String>)> {
        let mut seen = [0u32; 3];
        let mut out = Vec::new();
        for rank in &self.ranks {
            let (role, k) = match rank {
                RankId::Prefill(_) => (Role::Prefill, 0),
                RankId::Decode(_) => (Role::Decode, 1),
                RankId::Aggregated(_) => (Role::Aggregated, 2),
            };
            let groups = self.dep.plan(role).map(|p| p.groups.iter().map(|g| g.name().to_string()).collect());
            out.push((format!("{}{}", role.as_str(), seen[k]), groups.unwrap_or_default()));
            seen[k] += 1;
        }
        out.extend(self.links.iter().map(|(name, _)| (name.clone(), Vec::new())));
        out
    }

    /// What carried the clock past [`END_OF_TIME`]: a rank whose step ends
    /// there (its role's `step_time`), else a transfer (the link).
    fn past_end_of_time(&mut self) -> SimError {
        let mut late = None;
        self.each_rank(|core| {
            if late.is_none() && core.step_end().is_some_and(|e| e >= END_OF_TIME) {
                late = Some(core.role());
            }
        });
        let router = self.sim.actor::<Router>(self.router).expect("router");
        match late {
            Some(role) => SimError::PastEndOfTime { field: format!("{role}.step_time"), what: "step" },
            None if router.crossing_past(END_OF_TIME) => {
                SimError::PastEndOfTime { field: "frontend.request_us".into(), what: "way through the API server" }
            }
            None => SimError::PastEndOfTime { field: "link.bandwidth_gb_s".into(), what: "transfer" },
        }
    }

    /// The rank cores, in report order.
    fn each_rank(&mut self, mut f: impl FnMut(&mut RankCore)) {
        for rank in &self.ranks {
            let core = match *rank {
                RankId::Prefill(id) => self.sim.actor_mut::<PrefillRank>(id).expect("prefill rank").core_mut(),
                RankId::Decode(id) => self.sim.actor_mut::<DecodeRank>(id).expect("decode rank").core_mut(),
                RankId::Aggregated(id) => self.sim.actor_mut::<AggregatedRank>(id).expect("aggregated rank").core_mut(),
            };
            f(core);
        }
    }

    /// Hands the rows of instants before `before` (all of them: `None`) to
    /// the sample sink, if there is one, in timeline.csv's order.
    ///
    /// Every timeline's open instant before `before` is committed first. A
    /// rank may still write rows older than the clock, for the steps of
    /// its run of decode steps in flight (see [`crate::stats::timeline`]): rows
    /// from the earliest such step on are held back for a later slice.
    fn flush_samples(&mut self, before: Option<SimTime>) {
        if self.log.is_none() {
            return;
        }
        let mut bound = before;
        self.each_rank(|core| {
            core.timeline_mut().commit_before(before);
            if let Some(h) = core.timeline_hold() {
                bound = Some(bound.map_or(h, |b| b.min(h)));
            }
        });
        for (_, id) in &self.links {
            self.sim.actor_mut::<NixlLink>(*id).expect("link").timeline.commit_before(before);
        }
        let (Some(log), Some(sink)) = (&self.log, &mut self.sample_sink) else { return };
        let mut rows = log_rows(log);
        // Each entity's rows are in time order, but a rank's rows of a
        // finished run come after other entities' later ones: sort (stable,
        // so each entity's own order stays), then take those before the
        // bound.
        rows.sort_by_key(|r| (r.sample.time, r.entity));
        let n = bound.map_or(rows.len(), |t| rows.partition_point(|r| r.sample.time < t));
        if n == 0 {
            return;
        }
        sink(&rows[..n]);
        rows.drain(..n);
    }

    /// A live run's next request arrives at `at` (no earlier than the
    /// clock or the previous arrival) with `prompt` and `output` tokens and
    /// no shared prefix; returns the id it gets (ids count injections from
    /// 0). It enters when the run reaches `at`, after the events already
    /// due then.
    pub fn inject(&mut self, at: SimTime, prompt: Tokens, output: Tokens) -> Result<ReqId, InjectError> {
        self.inject_with_priority(at, prompt, output, 0)
    }

    /// [`Self::inject`] with vLLM's request `priority` (lower first),
    /// which ranks under the priority policy follow.
    pub fn inject_with_priority(
        &mut self,
        at: SimTime,
        prompt: Tokens,
        output: Tokens,
        priority: i32,
    ) -> Result<ReqId, InjectError> {
        let now = self.sim.now();
        let live = self.live.as_mut().ok_or(InjectError::NotLive)?;
        let (p, o) = (prompt.get(), output.get());
        if p == 0 || o == 0 || p.saturating_add(o) > crate::serving::router::MAX_REQUEST_TOKENS {
            return Err(InjectError::Size { prompt: p, output: o });
        }
        if at < now || at < live.last || at > END_OF_TIME {
            return Err(InjectError::Time { at: at.as_nanos(), now: now.as_nanos() });
        }
        let spec = RequestSpec { arrival: at, prompt, output, prefix: PrefixIds::none(), priority };
        self.sim.schedule(at, self.router, Msg::Inject(Box::new(spec))).expect("checked");
        let id = live.count;
        live.count += 1;
        live.last = at;
        Ok(id)
    }

    /// Runs every event due by `t` (inclusive); the clock is then `t` (or
    /// where it was, if later).
    pub fn advance_to(&mut self, t: SimTime) {
        self.sim.run_until(t.min(END_OF_TIME));
        self.flush_samples(Some(self.sim.now()));
    }

    /// The simulated clock.
    pub fn now(&self) -> SimTime {
        self.sim.now()
    }

    /// When the next event is due, if any.
    pub fn next_event_time(&self) -> Option<SimTime> {
        self.sim.next_event_time()
    }

    /// Moves a live run's output tokens that came out since the last call
    /// to `out`, as (request, time): each request's in time order (ranks
    /// one after the other, so not in time order across ranks).
    pub fn take_tokens(&mut self, out: &mut Vec<(ReqId, SimTime)>) {
        self.each_rank(|core| core.take_tokens(out));
    }

    /// Moves a live run's requests that ended (completed or failed) since
    /// the last call to `out`, in the order they ended.
    pub fn take_ended(&mut self, out: &mut Vec<Request>) {
        let r = self.sim.actor_mut::<Router>(self.router).expect("router");
        if let Some(ended) = &mut r.ended {
            out.append(ended);
        }
    }

    /// The deployment's load now, summed over the ranks.
    pub fn load(&mut self) -> Load {
        let mut load = Load::default();
        self.each_rank(|core| {
            let (running, waiting, used, blocks) = core.load();
            load.running += running as u64;
            load.waiting += waiting as u64;
            load.kv_used_blocks += used;
            load.kv_blocks += blocks;
        });
        load
    }

    /// Ends a live run: runs the requests in flight to their end and
    /// collects the output, as [`Built::run`].
    pub fn end_live(self) -> Result<SimOutput, SimError> {
        self.run()
    }

    /// Runs to the end (or the time limit) and collects the output.
    pub fn run(self) -> Result<SimOutput, SimError> {
        self.run_in_slices(SimDuration::MAX, |_| true)
    }

    /// Runs in slices of `slice` simulated time, calling `on_slice` after
    /// each (the results are the same whatever the slice). A slice begins
    /// at the next event, so empty stretches of simulated time are skipped
    /// in one step. When `on_slice`
    /// returns `false` the run stops there, as at a time limit: requests in
    /// flight fail as unfinished.
    pub fn run_in_slices(
        mut self,
        slice: SimDuration,
        mut on_slice: impl FnMut(Progress) -> bool,
    ) -> Result<SimOutput, SimError> {
        let until = self.until.unwrap_or(SimTime::MAX).min(END_OF_TIME);
        loop {
            // A slice starts at the next event, not at the clock: simulated
            // time with nothing in it costs nothing to cross, so the number
            // of slices is bounded by the events as well as by the time.
            let from = self.sim.next_event_time().unwrap_or(self.sim.now()).max(self.sim.now());
            let limit = from.saturating_add(slice).min(until);
            let summary = self.sim.run_until(limit);
            self.flush_samples(Some(self.sim.now()));
            let r = self.sim.actor::<Router>(self.router).expect("router");
            let go_on = on_slice(Progress { now: self.sim.now(), issued: r.issued(), finished: r.ended() });
            if !go_on || summary.stop_reason != sim_core::StopReason::TimeLimit || limit == until {
                break;
            }
        }
        let cut_short = self.sim.pending() > 0;
        if cut_short
            && self.sim.next_event_time().is_some_and(|t| t >= END_OF_TIME)
            && self.until.is_none_or(|u| u > END_OF_TIME)
        {
            return Err(self.past_end_of_time());
        }
        let end = if cut_short { self.sim.now() } else { self.sim.last_delivery() };
        collect(self, end, cut_short)
    }
}

/// Runs `dep` on `input`.
pub fn run(dep: &Deployment, input: RunInput) -> Result<SimOutput, SimError> {
    build(dep, input)?.run()
}

/// What every actor of a run is wired to: the router, the origin of the
/// output-token windows, and where timelines send their rows.
struct Wiring {
    router: ActorId,
    origin: SimTime,
    sampling: Sampling,
}

/// Wires `dep` for `input` on a fresh engine without running it.
pub fn build(dep: &Deployment, input: RunInput) -> Result<Built<'_>, SimError> {
    let mut sim: Simulation<Msg> = Simulation::new(input.seed);
    let spec = &dep.spec;
    let first_role = if dep.is_disaggregated() { Role::Prefill } else { Role::Aggregated };
    let first = dep.plan(first_role).expect("built");
    // Tokens a rank's pool caches, about: a cached token block takes one
    // block in every full-attention group.
    let capacity = |p: &RolePlan| {
        let fa = p.groups.iter().filter(|g| g.kind() == CacheGroupKind::FullAttention);
        let b = fa.clone().next().map_or(16, |g| g.block_size().get());
        let per_token_block = (fa.count() as u64).max(1);
        Tokens::new(p.num_blocks.saturating_mul(b) / per_token_block)
    };
    let weight = spec.router.kv_overlap_weight.unwrap_or(DEFAULT_KV_OVERLAP_WEIGHT);
    let first_policy = match dep.route_policy(first_role) {
        Some(make) => make(first.spec.count as usize),
        None => policy(spec.router.prefill_policy, first.spec.count as usize, capacity(first), weight),
    };
    let decode_policy = match (dep.plan(Role::Decode), dep.route_policy(Role::Decode)) {
        (Some(d), Some(make)) => make(d.spec.count as usize),
        (Some(d), None) => policy(spec.router.decode_policy, d.spec.count as usize, capacity(d), weight),
        (None, _) => policy(spec.router.decode_policy, 1, Tokens::new(1), weight),
    };
    let mut router =
        Router::new(first_policy, decode_policy, input.source, input.arrivals, input.max_requests, dep.front_end);
    router.records.set_slo(input.slo);
    let first_arrival = router.prime()?;
    // Output tokens are counted in 1 s windows from the first arrival.
    let origin = first_arrival.unwrap_or(SimTime::ZERO);
    // Every timeline keeps its samples in the run's log, or none is kept.
    let log: Option<SampleLog> = dep.keep_timelines.then(SampleLog::default);
    let sampling = match &log {
        Some(log) => Sampling::Log(Arc::clone(log)),
        None => Sampling::Discard,
    };
    let router = sim.add_actor("router", router).expect("fresh simulation");
    let wiring = Wiring { router, origin, sampling };

    let mut ranks = Vec::new();
    let mut link_ids = Vec::new();
    if dep.is_disaggregated() {
        let p = dep.plan(Role::Prefill).expect("disaggregated");
        let d = dep.plan(Role::Decode).expect("disaggregated");
        let hold = match (dep.lease, dep.hold) {
            (Some(lease), _) => Hold::Lease(lease),
            (None, Some(h)) => Hold::Fixed(h),
            (None, None) => Hold::Lease(p.rules.source_lease()),
        };
        let mut prefill = Vec::new();
        for i in 0..p.spec.count {
            let core = dep.rank_core((i, i), p, Mode::PrefillOnly, &wiring);
            let id =
                sim.add_actor(&format!("prefill{i}"), PrefillRank::new(core, dep.model.clone(), hold)).expect("unique");
            prefill.push(id);
            ranks.push(RankId::Prefill(id));
        }
        let mut add_link = |sim: &mut Simulation<Msg>, name: String| {
            // Links come after every rank in report order.
            let entity = p.spec.count + d.spec.count + link_ids.len() as u32;
            let timeline = wiring.sampling.timeline(entity);
            let link = NixlLink::new(dep.latency, dep.bandwidth, spec.link.sharing, timeline);
            let id = sim.add_actor(&name, link).expect("unique");
            link_ids.push((name, id));
            id
        };
        let shared = match spec.link.topology {
            LinkTopology::Shared => Some(add_link(&mut sim, "link".to_string())),
            LinkTopology::PerPair => None,
        };
        let mut decode = Vec::new();
        for j in 0..d.spec.count {
            let links: Vec<ActorId> = (0..p.spec.count)
                .map(|i| shared.unwrap_or_else(|| add_link(&mut sim, format!("link-p{i}-d{j}"))))
                .collect();
            let core = dep.rank_core((j, p.spec.count + j), d, Mode::Generate, &wiring);
            let abort = spec.faults.decode_abort_probability;
            // The decode rank renews what the prefill ranks hold under a lease.
            let lease = match hold {
                Hold::Lease(l) => Some(l),
                Hold::Fixed(_) => None,
            };
            // A linear model's handoff moves whole blocks of the decode rank's size.
            let block = d.spec.block_size_tokens.unwrap_or(DEFAULT_LINEAR_BLOCK_SIZE);
            let model = dep.model.clone().with_block_size(block);
            // A link carries the busiest NIC's bytes: a prefill rank sends
            // what each of its readers takes (`tp`).
            let readers = dep.reads.map_or(1, |r| r.readers);
            let rank = DecodeRank::new(core, model, prefill.clone(), links, abort, lease, readers);
            let id = sim.add_actor(&format!("decode{j}"), rank).expect("unique");
            decode.push(id);
            ranks.push(RankId::Decode(id));
        }
        sim.actor_mut::<Router>(router).expect("router").set_targets(Targets::Disaggregated { prefill, decode });
        // Crashes go through the router, which drops the ones still to come
        // once every request has ended: a fault after the workload would
        // only stretch the run.
        if first_arrival.is_some() {
            let timers = dep.crashes.iter().map(|&(j, at)| sim.schedule(at, router, Msg::CrashDecode(j)));
            let timers = timers.collect::<Result<Vec<_>, _>>().expect("the router exists");
            sim.actor_mut::<Router>(router).expect("router").set_crash_timers(timers);
        }
    } else {
        let a = dep.plan(Role::Aggregated).expect("aggregated");
        let mut all = Vec::new();
        for i in 0..a.spec.count {
            let core = dep.rank_core((i, i), a, Mode::Generate, &wiring);
            let id = sim.add_actor(&format!("aggregated{i}"), AggregatedRank::new(core)).expect("unique");
            all.push(id);
            ranks.push(RankId::Aggregated(id));
        }
        sim.actor_mut::<Router>(router).expect("router").set_targets(Targets::Aggregated(all));
    }

    if let Some(at) = first_arrival {
        sim.schedule(at, router, Msg::Arrival).expect("router exists");
    }
    Ok(Built { dep, sim, router, ranks, links: link_ids, until: input.until, log, sample_sink: None, live: None })
}

/// Wires `dep` for a live run: no workload; the caller brings requests in
/// as they come ([`Built::inject`]), runs the engine up to each instant it
/// reaches ([`Built::advance_to`]), and reads each output token as it
/// comes out ([`Built::take_tokens`]) and each request as it ends
/// ([`Built::take_ended`]). Given the same arrivals, a live run makes the
/// same records as [`build`] with a workload of them (the ranks step every
/// sequence one by one, [`Deployment::set_lazy_decoding`] off, so that each
/// step hands out its tokens as it ends; tested to give the same records).
/// Output tokens are counted in 1 s windows from time 0, and
/// `decode_crashes` are not injected.
///
/// ```
/// use actors::config::SloSpec;
/// use actors::sim::{Deployment, build_live};
/// use actors::units::Tokens;
/// use sim_core::SimTime;
///
/// fn three_tokens(dep: &Deployment) -> Vec<SimTime> {
///     let mut live = build_live(dep, 1, SloSpec::default());
///     let id = live.inject(SimTime::from_nanos(5_000_000), Tokens::new(100), Tokens::new(3)).unwrap();
///     live.advance_to(SimTime::from_nanos(10_000_000_000));
///     let mut tokens = Vec::new();
///     live.take_tokens(&mut tokens);
///     tokens.into_iter().filter(|&(r, _)| r == id).map(|(_, at)| at).collect()
/// }
/// ```
pub fn build_live(dep: &Deployment, seed: u64, slo: SloSpec) -> Built<'_> {
    let source: Box<dyn RequestSource> = Box::new(std::iter::empty::<RequestSpec>());
    let input = RunInput { seed, source, arrivals: ArrivalMode::Open, max_requests: None, slo, until: None };
    let mut built = build(dep, input).expect("an empty workload gives no error");
    built.each_rank(|core| core.set_token_log(true));
    built.sim.actor_mut::<Router>(built.router).expect("router").ended = Some(Vec::new());
    built.live = Some(Injected::default());
    built
}

fn collect(built: Built<'_>, final_time: SimTime, cut_short: bool) -> Result<SimOutput, SimError> {
    let mut built = built;
    // The steps of runs cut off by a time limit that started by its end.
    built.each_rank(|core| core.close_timeline(final_time));
    built.flush_samples(None);
    let Built { dep, mut sim, router, ranks, links, log, .. } = built;
    // Without a sink, the samples go back to their timelines.
    let mut logged: Vec<Vec<Sample>> = Vec::new();
    if let Some(log) = log {
        for r in log_rows(&log).drain(..) {
            let e = r.entity as usize;
            if e >= logged.len() {
                logged.resize_with(e + 1, Vec::new);
            }
            logged[e].push(r.sample);
        }
    }
    let mut logged = logged.into_iter();
    let events = sim.events_delivered();
    let r = sim.actor_mut::<Router>(router).expect("router");
    if let Some(e) = r.error.take() {
        return Err(SimError::Workload(e));
    }
    let issued = r.issued();
    let in_transit = r.take_in_transit();
    let mut stream = std::mem::replace(&mut r.records, RecordStream::new());
    // Requests cut off while crossing the API server to an engine: their
    // messages, taken back from the event queue.
    let mut crossing = Vec::new();
    for (_, id) in in_transit {
        match sim.take(id) {
            Some(Msg::Submit(req) | Msg::SubmitHandoffPrefill(req) | Msg::ReserveDestination(req)) => {
                crossing.push(req)
            }
            Some(other) => unreachable!("only requests cross the API server, not {other:?}"),
            None => {}
        }
    }
    let mut violations = Vec::new();
    let mut itl = Histogram::default();
    let mut tokens: Vec<TokenWindows> = Vec::new();
    let mut reports = Vec::new();
    let mut unfinished: Vec<Box<Request>> = crossing;
    let group_names = |p: &RolePlan| p.groups.iter().map(|g| g.name().to_string()).collect::<Vec<_>>();
    for rank in ranks {
        let (core, sources, waited, name_role) = match rank {
            RankId::Prefill(id) => {
                let pr = sim.actor_mut::<PrefillRank>(id).expect("prefill rank");
                // A run stopped at a time limit leaves sources held for
                // requests in flight; a run that ended by itself must not.
                let held = pr.release_all_sources();
                let s = pr.sources();
                let core = pr.core_mut();
                if held > 0 && !cut_short {
                    violations.push(format!("prefill{}: {held} sources still held", core.index()));
                }
                (core, Some(s), 0, Role::Prefill)
            }
            RankId::Decode(id) => {
                let dr = sim.actor_mut::<DecodeRank>(id).expect("decode rank");
                let w = dr.reservations_waited();
                unfinished.extend(dr.drain_in_flight());
                (dr.core_mut(), None, w, Role::Decode)
            }
            RankId::Aggregated(id) => {
                let ar = sim.actor_mut::<AggregatedRank>(id).expect("aggregated rank");
                (ar.core_mut(), None, 0, Role::Aggregated)
            }
        };
        itl.merge(core.itl());
        tokens.push(core.take_token_windows());
        let parts = core.take_parts();
        let name = format!("{}{}", name_role.as_str(), parts.index);
        unfinished.extend(parts.unfinished);
        if let Some(e) = parts.violation {
            violations.push(format!("{name}: {e}"));
        }
        let plan = dep.plan(name_role).expect("role exists");
        reports.push(RankReport {
            name,
            role: name_role,
            stats: parts.stats,
            num_blocks: parts.pool.num_blocks,
            peak_used_blocks: parts.pool.peak_used,
            evicted_blocks: parts.pool.evicted_blocks,
            groups: group_names(plan),
            refusals: parts.refusals.iter().map(|r| r.to_string()).collect(),
            sources,
            reservations_waited: waited,
            timeline: with_logged(parts.timeline, logged.next()),
        });
    }
    if !cut_short && !unfinished.is_empty() {
        violations.push(format!("{} requests were still in flight when the run ended by itself", unfinished.len()));
    }
    for mut req in unfinished {
        req.fail(FailReason::Unfinished, final_time);
        // As the router records every other request: at its client's time.
        req.shift_to_client_time(dep.front_end.response);
        stream.push(req);
    }
    let mut link_reports = Vec::new();
    let (mut sent, mut received) = (0u64, 0u64);
    for (name, id) in links {
        let l = sim.actor_mut::<NixlLink>(id).expect("link");
        l.close();
        sent += l.stats.bytes_started;
        // Transfers cut off by a time limit count as neither lost nor received.
        received += l.stats.bytes_completed + l.bytes_in_flight();
        let timeline = with_logged(std::mem::take(&mut l.timeline), logged.next());
        link_reports.push(LinkReport { name, stats: l.stats, timeline });
    }
    let peak_tokens = TokenWindows::peak(&tokens.iter().collect::<Vec<_>>());
    drop(tokens);
    let Totals { records, summary, digest, count, priced, out_of_order } = stream.finish(&itl, peak_tokens);
    if count != issued {
        violations.push(format!("{issued} requests entered, {count} accounted for"));
    } else if out_of_order > 0 {
        violations.push(format!("{out_of_order} request ids missing or repeated"));
    }
    // A request's bytes are one decode TP rank's; a link carries them for
    // each decode rank that reads from one prefill rank.
    let priced = priced.saturating_mul(dep.reads.map_or(1, |r| u64::from(r.readers)));
    if sent != received || sent != priced {
        violations.push(format!(
            "links were given {sent} bytes and delivered or hold {received}; requests were priced {priced}"
        ));
    }
    Ok(SimOutput {
        records,
        summary,
        ranks: reports,
        links: link_reports,
        events,
        final_time,
        cut_short,
        violations,
        digest,
    })
}

/// A timeline with its logged samples put back (they come after any of its
/// own, of which a logging timeline has none).
fn with_logged(mut timeline: Timeline, logged: Option<Vec<Sample>>) -> Timeline {
    timeline.detach();
    if let Some(mut l) = logged {
        if timeline.samples.is_empty() {
            timeline.samples = l;
        } else {
            timeline.samples.append(&mut l);
        }
    }
    timeline
}

/// A 64-bit digest of every request's outcome, counts and times: each
/// value is folded in as a whole word (multiply-rotate, then a final
/// splitmix64 mix), so equal records give equal digests on every machine.
pub fn digest(records: &[Request]) -> u64 {
    let mut d = Digest::default();
    for r in records {
        d.add(r);
    }
    d.value()
}
