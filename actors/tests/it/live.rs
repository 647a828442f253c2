//! A live run (`sim::build_live`): requests injected as they come give the
//! same records as a run of the same arrivals from a workload, and every
//! output token is handed out at the time its step ended.

use actors::config::{DeploymentSpec, FrontEndSpec, LinkSpec, LinkTopology, RoleSpec, Sharing, SloSpec, StepTimeSpec};
use actors::model::ModelSpec;
use actors::request::{Outcome, Request};
use actors::sim::{self, Deployment, RunInput};
use actors::units::Tokens;
use actors::workload::{ArrivalMode, PrefixIds, RequestSpec};
use sim_core::SimTime;

use super::model_fixtures::{glm_spec, linear_spec};

fn role(count: u32, num_blocks: u64, fixed_us: f64, per_token_us: f64) -> RoleSpec {
    let step_time = StepTimeSpec::Linear { fixed_us, per_token_us, per_seq_us: 20.0, per_context_token_us: 0.01 };
    RoleSpec { count, tp: Some(4), num_blocks: Some(num_blocks), step_time, ..RoleSpec::default() }
}

fn pd(prefill: RoleSpec, decode: RoleSpec) -> DeploymentSpec {
    DeploymentSpec {
        vllm_version: Some("0.32.0".into()),
        prefill: Some(prefill),
        decode: Some(decode),
        aggregated: None,
        link: LinkSpec {
            bandwidth_gb_s: 5.0,
            latency_us: 30.0,
            sharing: Sharing::ProcessorSharing,
            topology: LinkTopology::PerPair,
        },
        router: Default::default(),
        faults: Default::default(),
        frontend: FrontEndSpec::none(),
        timeline_interval_ms: 10.0,
        check_invariants: true,
        hardware: None,
    }
}

/// 60 requests of mixed sizes, arriving at odd nanoseconds (no arrival
/// falls on a step's end, where the order of equal-time events would tell
/// an injection from a workload's arrival).
fn arrivals() -> Vec<RequestSpec> {
    (0..60u64)
        .map(|i| RequestSpec {
            arrival: SimTime::from_nanos(i * 7_000_001 + (i % 3) * 13),
            prompt: Tokens::new(50 + (i * 97) % 900),
            output: Tokens::new(1 + (i * 31) % 120),
            prefix: PrefixIds::none(),
            priority: 0,
        })
        .collect()
}

fn replayed(dep: &Deployment, requests: &[RequestSpec]) -> Vec<Request> {
    let owned: Vec<RequestSpec> = requests.to_vec();
    let input = RunInput {
        seed: 7,
        source: Box::new(owned.into_iter()),
        arrivals: ArrivalMode::Open,
        max_requests: None,
        slo: SloSpec::default(),
        until: None,
    };
    let out = sim::run(dep, input).expect("runs");
    assert!(out.violations.is_empty(), "{:?}", out.violations);
    out.records
}

/// Injects each request once the run has reached its arrival (as `pdsim
/// serve` does), collecting the tokens and ended requests as they come.
fn live(dep: &Deployment, requests: &[RequestSpec]) -> (Vec<Request>, Vec<(u64, SimTime)>, Vec<Request>) {
    let mut run = sim::build_live(dep, 7, SloSpec::default());
    let (mut tokens, mut ended) = (Vec::new(), Vec::new());
    for (i, r) in requests.iter().enumerate() {
        run.advance_to(r.arrival);
        run.take_tokens(&mut tokens);
        // Every token handed out so far came out by the clock.
        assert!(tokens.iter().all(|&(_, at)| at <= run.now()));
        let id = run.inject(r.arrival, r.prompt, r.output).expect("a valid arrival");
        assert_eq!(id, i as u64);
    }
    while let Some(t) = run.next_event_time() {
        run.advance_to(t);
        run.take_tokens(&mut tokens);
        run.take_ended(&mut ended);
    }
    let out = run.end_live().expect("runs");
    assert!(out.violations.is_empty(), "{:?}", out.violations);
    (out.records, tokens, ended)
}

fn check(model: &ModelSpec, spec: &DeploymentSpec, preempts: bool) {
    let dep = Deployment::build(model, spec).expect("valid");
    let requests = arrivals();
    let expected = replayed(&dep, &requests);
    let (records, tokens, ended) = live(&dep, &requests);
    assert_eq!(records, expected, "the same records, to the nanosecond");
    assert_eq!(expected.iter().any(|r| r.preemptions > 0), preempts);
    assert_eq!(ended.len(), expected.len());
    for r in &expected {
        assert_eq!(r.outcome, Outcome::Completed);
        let mine: Vec<SimTime> = tokens.iter().filter(|&&(id, _)| id == r.id).map(|&(_, at)| at).collect();
        assert_eq!(mine.len() as u64, r.output.get(), "request {}: one token per output token", r.id);
        assert_eq!(mine.first().copied(), r.t.first_token);
        assert_eq!(mine.last().copied(), r.t.last_token);
        assert!(mine.windows(2).all(|w| w[0] < w[1]));
        let end = ended.iter().find(|e| e.id == r.id).expect("ended");
        assert_eq!(end.t.finished, r.t.finished);
    }
}

#[test]
fn a_live_pd_run_gives_the_records_of_its_arrivals() {
    // A decode pool of 120 blocks cannot hold every sequence at once:
    // handoffs wait for blocks.
    check(&glm_spec(), &pd(role(1, 4_000, 3_000.0, 20.0), role(1, 120, 8_000.0, 20.0)), false);
}

#[test]
fn a_live_aggregated_run_gives_the_records_of_its_arrivals() {
    let mut spec = pd(role(2, 150, 6_000.0, 25.0), role(1, 1, 1.0, 1.0));
    spec.aggregated = spec.prefill.take();
    spec.decode = None;
    // 150 blocks of 16 tokens for two ranks' sequences: some are preempted
    // and recomputed.
    check(&linear_spec(4_096), &spec, true);
}

/// Injections are checked: sizes, and arrivals before the clock.
#[test]
fn a_live_run_refuses_what_it_cannot_take() {
    let dep = Deployment::build(&linear_spec(4_096), &pd(role(1, 400, 3_000.0, 20.0), role(1, 400, 8_000.0, 20.0)))
        .expect("valid");
    let mut run = sim::build_live(&dep, 1, SloSpec::default());
    assert!(run.inject(SimTime::from_nanos(1_000_000), Tokens::new(0), Tokens::new(5)).is_err());
    run.advance_to(SimTime::from_nanos(10_000_000));
    assert!(run.inject(SimTime::from_nanos(5_000_000), Tokens::new(10), Tokens::new(5)).is_err(), "before the clock");
    assert_eq!(run.inject(SimTime::from_nanos(10_000_000), Tokens::new(10), Tokens::new(5)), Ok(0));
    // A run that is not live takes no injection.
    let input = RunInput {
        seed: 1,
        source: Box::new(std::iter::empty()),
        arrivals: ArrivalMode::Open,
        max_requests: None,
        slo: SloSpec::default(),
        until: None,
    };
    let mut not_live = sim::build(&dep, input).expect("builds");
    assert!(not_live.inject(SimTime::from_nanos(1_000_000), Tokens::new(10), Tokens::new(5)).is_err());
}
