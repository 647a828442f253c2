//! The protocol's gates as a wired deployment keeps them: commands sent
//! straight to a rank, past the router, that its role does not accept are
//! refused with a reason, and the requests they carried are accounted for.

use sim_core::SimTime;

use super::config::{DeploymentSpec, FrontEndSpec, LinkSpec, RoleSpec, StepTimeSpec};
use super::sim::{self, Deployment, RankId, RunInput};
use crate::base::units::{Blocks, Bytes, Tokens};
use crate::models::model::{CacheGroupKind, CacheGroupSpec, ModelSpec, Role};
use crate::requests::request::{Command, FailReason, Outcome, Request};
use crate::requests::workload::{ArrivalMode, PrefixIds, RequestSpec};
use crate::serving::msg::Msg;
use crate::serving::ranks::{AggregatedRank, DecodeRank, PrefillRank};

/// A grouped model: one full-attention group and one Mamba-type state.
fn grouped() -> ModelSpec {
    let group = |name: &str, kind| CacheGroupSpec {
        name: name.into(),
        kind,
        block_size_tokens: Tokens::new(16),
        page_bytes: Bytes::new(4_096),
        transfer_bytes_per_block: Some(Bytes::new(4_096)),
        prefix_cacheable: Some(true),
        window_tokens: None,
        checkpoint_blocks: Some(Blocks::new(0)),
        heads: None,
    };
    ModelSpec {
        cache_groups: vec![group("full", CacheGroupKind::FullAttention), group("state", CacheGroupKind::State)],
        ..Default::default()
    }
}

fn role() -> RoleSpec {
    let step_time =
        StepTimeSpec::Linear { fixed_us: 1_000.0, per_token_us: 1.0, per_seq_us: 0.0, per_context_token_us: 0.0 };
    RoleSpec { num_blocks: Some(64), step_time, ..RoleSpec::default() }
}

fn spec(disaggregated: bool) -> DeploymentSpec {
    DeploymentSpec {
        vllm_version: Some("0.32.0".into()),
        prefill: disaggregated.then(role),
        decode: disaggregated.then(role),
        aggregated: (!disaggregated).then(role),
        link: LinkSpec::default(),
        router: Default::default(),
        faults: Default::default(),
        frontend: FrontEndSpec::none(),
        timeline_interval_ms: 10.0,
        check_invariants: true,
        hardware: None,
    }
}

fn input() -> RunInput {
    RunInput {
        seed: 1,
        source: Box::new(std::iter::empty()),
        arrivals: ArrivalMode::Open,
        max_requests: None,
        slo: Default::default(),
        until: None,
    }
}

fn lone_request(id: u64) -> Box<Request> {
    Box::new(Request::new(id, Tokens::new(100), Tokens::new(4), PrefixIds::none(), SimTime::ZERO))
}

/// Sends every handoff command to `to`: the source commands for request
/// 1, the destination commands for request 2.
fn send_all(b: &mut sim::Built<'_>, source_to: sim_core::ActorId, destination_to: sim_core::ActorId) {
    let t = SimTime::ZERO;
    b.sim.schedule(t, source_to, Msg::SubmitHandoffPrefill(lone_request(1))).unwrap();
    b.sim.schedule(t, source_to, Msg::ReleaseSource(1)).unwrap();
    b.sim.schedule(t, source_to, Msg::CancelSource(1, FailReason::DecodeAborted)).unwrap();
    b.sim.schedule(t, destination_to, Msg::ReserveDestination(lone_request(2))).unwrap();
    b.sim.schedule(t, destination_to, Msg::CancelDestination(2, FailReason::DecodeAborted)).unwrap();
    b.sim.run();
}

fn texts(refusals: &[FailReason]) -> Vec<String> {
    refusals.iter().map(|r| r.to_string()).collect()
}

#[test]
fn ranks_refuse_the_other_sides_commands() {
    let dep = Deployment::build(&grouped(), &spec(true)).unwrap();
    let mut b = sim::build(&dep, input()).unwrap();
    let (p, d) = (b.ranks[0].id(), b.ranks[1].id());
    // The prefill rank gets the destination commands, the decode rank the source ones.
    send_all(&mut b, d, p);
    assert_eq!(
        texts(b.sim.actor::<DecodeRank>(d).unwrap().refusals()),
        [
            "decode rank refused source command SubmitHandoffPrefill: it accepts only destination commands",
            "decode rank refused source command ReleaseSource: it accepts only destination commands",
            "decode rank refused source command CancelSource: it accepts only destination commands",
        ]
    );
    assert_eq!(
        texts(b.sim.actor::<PrefillRank>(p).unwrap().refusals()),
        [
            "prefill rank refused destination command ReserveDestination: it accepts only source commands",
            "prefill rank refused destination command CancelDestination: it accepts only source commands",
        ]
    );
    // The requests those commands carried failed with the refusal as their reason.
    let out = b.run().unwrap();
    // The commands went straight to the ranks, past the router, so it saw
    // no request enter; every other check holds (pools, sources, links).
    assert_eq!(out.violations, ["0 requests entered, 2 accounted for"]);
    let failed = out.records.iter().filter(|r| matches!(r.outcome, Outcome::Failed(_))).count();
    assert_eq!(failed, 2);
    assert!(matches!(
        out.records[0].outcome,
        Outcome::Failed(FailReason::Refused { role: Role::Decode, command: Command::SubmitHandoffPrefill })
    ));
}

#[test]
fn an_aggregated_grouped_rank_refuses_every_handoff_command() {
    let dep = Deployment::build(&grouped(), &spec(false)).unwrap();
    let mut b = sim::build(&dep, input()).unwrap();
    let RankId::Aggregated(a) = b.ranks[0] else { panic!("an aggregated rank") };
    send_all(&mut b, a, a);
    let expect =
        |side: &str, cmd: &str| format!("aggregated rank refused {side} command {cmd}: it accepts no handoff commands");
    assert_eq!(
        texts(b.sim.actor::<AggregatedRank>(a).unwrap().refusals()),
        [
            expect("source", "SubmitHandoffPrefill"),
            expect("source", "ReleaseSource"),
            expect("source", "CancelSource"),
            expect("destination", "ReserveDestination"),
            expect("destination", "CancelDestination"),
        ]
    );
    let out = b.run().unwrap();
    // Injected past the router, as above: only the entry count is off.
    assert_eq!(out.violations, ["0 requests entered, 2 accounted for"]);
}

#[test]
fn a_source_released_during_a_prefill_step_is_freed_at_the_steps_end() {
    // vLLM's prefill worker reports the decode side's notification
    // (`finished_sending`) when it polls the connector at the end of the
    // step in flight, and the scheduler frees the source then. Request 1
    // is prefilled in [0, 2.099 ms]; request 2 arrives at 2.099 ms and is
    // prefilled in [2.099, 4.198 ms]. Request 1's read ends mid-step (a
    // 200 us latency: at 2.2997 ms), so its source is held until 4.198 ms,
    // not freed when the release comes.
    let mut s = spec(true);
    s.link.latency_us = 200.0;
    let dep = Deployment::build(&grouped(), &s).unwrap();
    let at = |us: u64| SimTime::from_nanos(us * 1_000);
    let reqs = [0, 2_099].map(|t| RequestSpec {
        arrival: at(t),
        prompt: Tokens::new(100),
        output: Tokens::new(4),
        prefix: PrefixIds::none(),
        priority: 0,
    });
    let mut b = sim::build(&dep, RunInput { source: Box::new(reqs.into_iter()), ..input() }).unwrap();
    let p = b.ranks[0].id();
    b.sim.run_until(at(3_000));
    let sources = b.sim.actor::<PrefillRank>(p).unwrap().sources();
    assert_eq!((sources.held, sources.released), (1, 0), "released by the decode rank, not yet freed");
    b.sim.run_until(at(4_199));
    let sources = b.sim.actor::<PrefillRank>(p).unwrap().sources();
    assert_eq!((sources.held, sources.released), (2, 1), "freed at the step's end; request 2 held");
    let out = b.run().unwrap();
    assert!(out.violations.is_empty(), "{:?}", out.violations);
}
