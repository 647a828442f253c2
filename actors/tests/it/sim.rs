//! The serving simulation end to end: exact timings, roles, backpressure,
//! link sharing, faults, preemption, determinism and conservation.

use actors::config::{
    CrashSpec, DecodeGrid, DeploymentSpec, FrontEndSpec, LinkSpec, LinkTopology, RoleSpec, Sharing, SloSpec,
    StepTimeSpec,
};
use actors::metrics::{Metric, Sample, Timeline};
use actors::model::{ModelSpec, Role};
use actors::request::{FailReason, Outcome, Request};
use actors::router::RoutePolicy;
use actors::sim::{self, Deployment, RunInput, SimOutput};
use actors::steptime::{BatchShape, StepTimeModel};
use actors::units::{Bytes, Tokens};
use actors::workload::{ArrivalMode, PrefixIds, RequestSpec};
use sim_core::rand::Rng;
use sim_core::{SimDuration, SimTime};

use super::model_fixtures::{fa, glm_spec, linear_spec, spec, state, window};

fn linear_step(fixed_us: f64, per_token_us: f64, per_context_token_us: f64) -> StepTimeSpec {
    StepTimeSpec::Linear { fixed_us, per_token_us, per_seq_us: 0.0, per_context_token_us }
}

fn role(count: u32, num_blocks: u64, step_time: StepTimeSpec) -> RoleSpec {
    RoleSpec { count, tp: Some(4), num_blocks: Some(num_blocks), step_time, ..RoleSpec::default() }
}

/// `d` with vLLM's synchronous or asynchronous loop on every role (window
/// models take a different path under each: the asynchronous loop frees
/// skipped blocks one step late, `Core::lags_skips`).
fn with_loop(mut d: DeploymentSpec, asynchronous: bool) -> DeploymentSpec {
    for r in [&mut d.prefill, &mut d.decode, &mut d.aggregated].into_iter().flatten() {
        r.async_scheduling = Some(asynchronous);
    }
    d
}

fn pd(prefill: RoleSpec, decode: RoleSpec, bandwidth_gb_s: f64) -> DeploymentSpec {
    DeploymentSpec {
        vllm_version: Some("0.32.0".into()),
        prefill: Some(prefill),
        decode: Some(decode),
        aggregated: None,
        link: LinkSpec {
            bandwidth_gb_s,
            latency_us: 0.0,
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

fn req(at_ns: u64, prompt: u64, output: u64) -> RequestSpec {
    RequestSpec {
        arrival: SimTime::from_nanos(at_ns),
        prompt: Tokens::new(prompt),
        output: Tokens::new(output),
        prefix: PrefixIds::none(),
        priority: 0,
    }
}

fn input(requests: Vec<RequestSpec>) -> RunInput {
    RunInput {
        seed: 1,
        source: Box::new(requests.into_iter()),
        arrivals: ArrivalMode::Open,
        max_requests: None,
        slo: SloSpec::default(),
        until: None,
    }
}

fn run(model: &ModelSpec, spec: &DeploymentSpec, requests: Vec<RequestSpec>) -> SimOutput {
    let dep = Deployment::build(model, spec).expect("valid deployment");
    let out = sim::run(&dep, input(requests)).expect("runs");
    assert_eq!(out.violations, Vec::<String>::new(), "conservation invariants");
    out
}

#[test]
fn one_glm_request_is_timed_to_the_nanosecond() {
    // Prefill: 5 ms + 30 µs per token. Decode: 10 ms + 0.01 µs per context token.
    let spec = pd(role(1, 64, linear_step(5_000.0, 30.0, 0.0)), role(1, 64, linear_step(10_000.0, 0.0, 0.01)), 1.0);
    let out = run(&glm_spec(), &spec, vec![req(0, 1_000, 2)]);
    let r = &out.records[0];
    assert_eq!(r.outcome, Outcome::Completed);
    // The Mamba-type model backs off one token: T = 999.
    assert_eq!(r.transferred_tokens, Tokens::new(999));
    // Prefill step of 999 tokens: 5,000 + 999 × 30 = 34,970 µs.
    let prefill = 34_970_000;
    // Payload: 13,045,120 × cdiv(999, 2,176) + 36,927,488 = 49,972,608 bytes;
    // at 1 GB/s that is 49,972,608 ns.
    assert_eq!(r.transfer_bytes, Bytes::new(49_972_608));
    let transfer = 49_972_608;
    assert_eq!((r.t.transfer_done.unwrap() - r.t.transfer_started.unwrap()).as_nanos(), transfer);
    // First decode step: 1 token with 1,000 tokens of context: 10,000 + 10 µs.
    let first_decode = 10_010_000;
    assert_eq!(r.ttft().unwrap().as_nanos(), prefill + transfer + first_decode);
    // Second token: context 1,001: 10,000 + 10.01 µs.
    assert_eq!(r.e2e().unwrap().as_nanos(), prefill + transfer + first_decode + 10_010_010);
    assert_eq!(r.tpot().unwrap().as_nanos(), 10_010_010);
    // The source was released and every block returned.
    let p = out.ranks.iter().find(|k| k.role == Role::Prefill).unwrap();
    assert_eq!(p.sources.unwrap().released, 1);
}

/// The decode rank reserves a handoff's blocks in a schedule call, as
/// vLLM's decode scheduler allocates a remote load in its waiting loop.
///
/// Linear model, B = 16; 10 ms decode steps. A (160 tokens, 50 out) lands
/// and decodes; B (160 tokens, 5 out) arrives 15 ms later, so its prefill
/// ends while A's decode step is in flight: B is reserved (and its transfer
/// starts) at the end of that step, the schedule call after its arrival,
/// not at once. With `max_num_seqs = 1`, A's running slot stops the
/// waiting loop, so B is reserved only once A has finished (a remote load
/// itself takes no running slot and no tokens).
#[test]
fn the_decode_rank_reserves_handoffs_in_its_schedule_calls() {
    let model = linear_spec(32_768);
    for max_seqs in [256, 1] {
        let mut decode = role(1, 1_000, linear_step(10_000.0, 0.0, 0.0));
        decode.max_num_seqs = max_seqs;
        // The synchronous loop's timing (the asynchronous one's is tested
        // apart): a schedule call at the end of each step.
        decode.async_scheduling = Some(false);
        let mut spec = pd(role(1, 1_000, linear_step(2_000.0, 1.0, 0.0)), decode, 100.0);
        spec.vllm_version = None;
        let out = run(&model, &spec, vec![req(0, 160, 50), req(15_000_000, 160, 5)]);
        assert_eq!(out.violations, Vec::<String>::new());
        let (a, b) = (&out.records[0], &out.records[1]);
        assert!(a.outcome == Outcome::Completed && b.outcome == Outcome::Completed);
        // A finds the decode rank idle: reserved by the call at its arrival.
        assert_eq!(a.t.reserved, a.t.reserve_requested);
        let requested = b.t.reserve_requested.unwrap();
        let step = SimDuration::from_millis(10);
        let reserved = b.t.reserved.unwrap();
        assert_eq!(b.t.transfer_started, b.t.reserved);
        if max_seqs == 256 {
            // A's first token ends the step that started when A landed; B's
            // request comes during A's second step, which ends 10 ms later.
            let second = a.t.first_token.unwrap().saturating_add(step);
            assert!(a.t.first_token.unwrap() < requested && requested < second);
            assert_eq!(reserved, second, "reserved at the end of the step in flight");
        } else {
            assert_eq!(Some(reserved), a.t.finished, "A's running slot keeps B's load waiting");
        }
        let d = out.ranks.iter().find(|k| k.role == Role::Decode).unwrap();
        assert_eq!(d.reservations_waited, u64::from(max_seqs == 1));
    }
}

/// `max_model_len`, as vLLM 0.33.0 applies it: a prompt that leaves no
/// room for an output token is refused (`input_processor.py`: prompt >=
/// max_model_len), and a request whose output would run past the limit is
/// stopped there (`sched/utils.py`). A decode rank of 1,024: 1,000 + 25
/// completes with 24 output tokens (1,000 + 24 = 1,024); a 1,024-token
/// prompt is refused and its source cancelled; 1,000 + 10 is untouched. A
/// prefill rank of 1,000 (a handoff's prefill asks for one token): a
/// 1,000-token prompt is refused there, 999 passes.
/// vLLM's asynchronous engine loop (its default) schedules a step while
/// the one before it executes, so a request that arrives during a step is
/// first scheduled two steps later; with the synchronous loop, one.
///
/// One aggregated rank, 10 ms steps whatever their batch. A (32 prompt
/// tokens, 10 out) arrives at 0 on an idle rank: its prefill is the step
/// 0..10 ms either way, its first token at 10 ms, one more every 10 ms, the
/// last at 100 ms. B (32 tokens, 2 out) arrives at 15 ms, during A's decode
/// step 10..20. Synchronous: scheduled at 20 ms into the step 20..30, first
/// token at 30 (TTFT 15 ms), done at 40. Asynchronous: the step 20..30 was
/// scheduled at 10 ms, before B came, so B is scheduled at 20 ms into the
/// step 30..40: first token at 40 (TTFT 25 ms, 2.5 steps), done at 50.
#[test]
fn the_async_loop_schedules_a_request_two_steps_after_it_arrives() {
    let model = linear_spec(32_768);
    for (engine, ttft_b, e2e_b) in [(Some(false), 15, 25), (Some(true), 25, 35), (None, 25, 35)] {
        let mut spec =
            pd(role(1, 1_000, linear_step(10_000.0, 0.0, 0.0)), role(1, 1_000, linear_step(1.0, 0.0, 0.0)), 1.0);
        spec.aggregated = spec.prefill.take();
        spec.decode = None;
        spec.vllm_version = None;
        spec.aggregated.as_mut().unwrap().async_scheduling = engine;
        let out = run(&model, &spec, vec![req(0, 32, 10), req(15_000_000, 32, 2)]);
        let (a, b) = (&out.records[0], &out.records[1]);
        let ms = |d: Option<SimDuration>| d.unwrap().as_nanos() / 1_000_000;
        assert_eq!((ms(a.ttft()), ms(a.e2e())), (10, 100), "{engine:?}: A");
        assert_eq!((ms(b.ttft()), ms(b.e2e())), (ttft_b, e2e_b), "{engine:?}: B");
    }
}

#[test]
fn max_model_len_refuses_full_prompts_and_caps_outputs() {
    let model = linear_spec(32_768);
    let mut spec =
        pd(role(1, 10_000, linear_step(2_000.0, 1.0, 0.0)), role(1, 10_000, linear_step(5_000.0, 0.0, 0.0)), 50.0);
    spec.vllm_version = None;
    spec.decode.as_mut().unwrap().max_model_len = Some(Tokens::new(1_024));
    let out = run(&model, &spec, vec![req(0, 1_000, 25), req(0, 1_024, 5), req(0, 1_000, 10)]);
    assert_eq!(out.violations, Vec::<String>::new());
    let r = &out.records;
    let refused = Outcome::Failed(FailReason::ExceedsMaxModelLen { role: Role::Decode, max_model_len: 1_024 });
    assert_eq!((r[0].outcome, r[1].outcome, r[2].outcome), (Outcome::Completed, refused, Outcome::Completed));
    assert_eq!((r[0].generated, r[2].generated), (Tokens::new(24), Tokens::new(10)));
    assert_eq!(refused_reason(&r[1]), "decode rank refused the request: its prompt reaches max_model_len 1024");
    let p = out.ranks.iter().find(|k| k.role == Role::Prefill).unwrap().sources.unwrap();
    assert_eq!((p.held, p.released, p.cancelled), (3, 2, 1));

    spec.decode.as_mut().unwrap().max_model_len = None;
    spec.prefill.as_mut().unwrap().max_model_len = Some(Tokens::new(1_000));
    let out = run(&model, &spec, vec![req(0, 1_000, 5), req(0, 999, 5)]);
    let refused = Outcome::Failed(FailReason::ExceedsMaxModelLen { role: Role::Prefill, max_model_len: 1_000 });
    assert_eq!((out.records[0].outcome, out.records[1].outcome), (refused, Outcome::Completed));
    assert_eq!(out.records[0].t.prefill_started, None, "refused at arrival");
    assert_eq!(out.records[1].generated, Tokens::new(5), "the prefill rank caps nothing");
}

fn refused_reason(r: &actors::request::Request) -> String {
    match r.outcome {
        Outcome::Failed(reason) => reason.to_string(),
        other => panic!("not failed: {other:?}"),
    }
}

#[test]
fn a_full_decode_pool_makes_the_second_reservation_wait() {
    // Linear model, B = 16. Each request: N = 1,000, output 50: its
    // reservation takes cdiv(1000, 16) = 63 blocks and it grows to
    // cdiv(1049, 16) = 66. A 100-block decode pool holds one at a time.
    let model = linear_spec(32_768);
    let mut spec =
        pd(role(1, 10_000, linear_step(2_000.0, 10.0, 0.0)), role(1, 100, linear_step(5_000.0, 0.0, 0.0)), 50.0);
    spec.vllm_version = None;
    let out = run(&model, &spec, vec![req(0, 1_000, 50), req(0, 1_000, 50)]);
    let (a, b) = (&out.records[0], &out.records[1]);
    assert_eq!((a.outcome, b.outcome), (Outcome::Completed, Outcome::Completed));
    // Both arrive at t = 0, so both are in the first prefill step (as
    // vLLM has every request that arrived in its queue before the next
    // schedule call). The first reserves as soon as its prefill ends.
    assert_eq!(a.t.reserved, a.t.prefill_done);
    assert_eq!(b.t.prefill_done, a.t.prefill_done);
    // The second waits until the first completes and frees its 66 blocks.
    assert_eq!(b.t.reserved, a.t.finished);
    // The prefill step: 2,000 + 10 × 2,000 = 22,000 µs, so both prefills end
    // at 22 ms. a's transfer: 63 whole blocks, 1,008 × 32,768 bytes at 50
    // GB/s = 660,602.88 → 660,603 ns; then 50 decode steps of 5 ms. a ends
    // at 22 + 0.660603 + 250 = 272.660603 ms, and b waited from 22 ms until
    // then.
    assert_eq!(a.t.finished, Some(SimTime::from_nanos(272_660_603)));
    let wait = b.t.transfer_started.unwrap() - b.t.prefill_done.unwrap();
    assert_eq!(wait, SimDuration::from_nanos(272_660_603 - 22_000_000));
    assert_eq!(out.summary.transfer_wait_ms.max, wait.as_millis_f64());
    let d = out.ranks.iter().find(|k| k.role == Role::Decode).unwrap();
    assert_eq!(d.reservations_waited, 1);
}

/// Poisson arrivals at `rate` per second, prompts uniform in 500..4,000,
/// outputs uniform in 10..100, drawn from the run's seed.
fn poisson(seed: u64, n: usize, rate: f64) -> Vec<RequestSpec> {
    let mut rng = sim_core::rng::stream_for(seed, "test-workload");
    let mut t = 0.0f64;
    (0..n)
        .map(|_| {
            t += -(1.0 - rng.random::<f64>()).ln() / rate;
            RequestSpec {
                arrival: SimTime::from_nanos((t * 1e9) as u64),
                prompt: Tokens::new(rng.random_range(500..4_000)),
                output: Tokens::new(rng.random_range(10..100)),
                prefix: PrefixIds::none(),
                priority: 0,
            }
        })
        .collect()
}

fn glm_2p2d() -> DeploymentSpec {
    pd(role(2, 400, linear_step(4_000.0, 25.0, 0.0)), role(2, 400, linear_step(8_000.0, 5.0, 0.002)), 25.0)
}

#[test]
fn a_thousand_poisson_requests_on_2p2d_are_deterministic() {
    let spec = glm_2p2d();
    let a = run(&glm_spec(), &spec, poisson(7, 1_000, 20.0));
    let b = run(&glm_spec(), &spec, poisson(7, 1_000, 20.0));
    assert_eq!(a.records.len(), 1_000);
    assert_eq!(a.summary.completed, 1_000);
    assert_eq!(a.digest, b.digest);
    assert_eq!(a.events, b.events);
    let c = run(&glm_spec(), &spec, poisson(8, 1_000, 20.0));
    assert_ne!(a.digest, c.digest);
    // Both prefill and both decode ranks served requests.
    for rank in &a.ranks {
        assert!(rank.stats.steps > 0, "{} ran no step", rank.name);
    }
}

#[test]
fn a_small_decode_pool_preempts_and_still_completes_everything() {
    // 40 decode blocks of 16 tokens = 640 tokens; requests of 200 + 150
    // tokens need up to 22 blocks each, so a handful admitted together run
    // out as they grow and the newest are preempted and recomputed.
    let model = linear_spec(1_024);
    let mut spec =
        pd(role(1, 10_000, linear_step(1_000.0, 1.0, 0.0)), role(1, 40, linear_step(1_000.0, 1.0, 0.0)), 100.0);
    spec.vllm_version = None;
    let requests = (0..6).map(|i| req(i * 100_000, 200, 150)).collect();
    let out = run(&model, &spec, requests);
    assert_eq!(out.summary.failure_reasons, Default::default());
    assert_eq!(out.summary.completed, 6);
    assert!(out.summary.preemptions > 0, "expected preemptions");
    for r in &out.records {
        assert_eq!(r.generated, Tokens::new(150));
    }
}

#[test]
fn aborted_handoffs_and_expired_holds_fail_with_their_reasons() {
    let model = linear_spec(32_768);
    let mut spec =
        pd(role(1, 10_000, linear_step(2_000.0, 10.0, 0.0)), role(1, 100, linear_step(5_000.0, 0.0, 0.0)), 50.0);
    spec.vllm_version = None;
    spec.faults.decode_abort_probability = 1.0;
    let out = run(&model, &spec, vec![req(0, 1_000, 50), req(0, 1_000, 50)]);
    assert_eq!(out.summary.failed, 2);
    assert_eq!(
        out.summary.failure_reasons.keys().collect::<Vec<_>>(),
        ["decode rank aborted the handoff; source cancelled"]
    );
    let p = out.ranks.iter().find(|k| k.role == Role::Prefill).unwrap();
    assert_eq!(p.sources.unwrap().cancelled, 2);

    // A 10 ms hold with the second reservation waiting ~250 ms: its source expires.
    spec.faults.decode_abort_probability = 0.0;
    spec.faults.source_hold_s = Some(0.010);
    let out = run(&model, &spec, vec![req(0, 1_000, 50), req(0, 1_000, 50)]);
    assert_eq!(out.records[0].outcome, Outcome::Completed);
    let Outcome::Failed(reason) = out.records[1].outcome else { panic!("the second fails") };
    assert_eq!(reason.to_string(), "source hold expired after 10ms without a release from the decode rank");
    assert_eq!(out.ranks[0].sources.unwrap().expired, 1);
}

#[test]
fn a_request_larger_than_the_pool_fails_instead_of_stalling() {
    let model = linear_spec(1_024);
    let mut spec =
        pd(role(1, 10, linear_step(1_000.0, 1.0, 0.0)), role(1, 1_000, linear_step(1_000.0, 1.0, 0.0)), 10.0);
    spec.vllm_version = None;
    // 10 blocks of 16 tokens hold 160 tokens; a 1,000-token prompt needs 63.
    let out = run(&model, &spec, vec![req(0, 1_000, 5), req(0, 100, 5)]);
    let Outcome::Failed(reason) = out.records[0].outcome else { panic!("the large one fails") };
    assert_eq!(reason.to_string(), "prefill rank cannot fit the request: needs 63 blocks, pool has 10");
    assert_eq!(out.records[1].outcome, Outcome::Completed);
}

/// The decoding set and runs of steps must give, to the nanosecond, what
/// handling every sequence at every step gives, under memory pressure too
/// (reservations waiting, preemptions, evictions of cached prefixes), with
/// the timelines kept or not (nothing depends on them: the same records and
/// the same events). Arrivals fall on random nanoseconds, so none ties with
/// a step end.
#[test]
fn the_decoding_set_matches_stepping_every_sequence() {
    let mut requests = poisson(3, 300, 40.0);
    for (i, r) in requests.iter_mut().enumerate() {
        r.output = Tokens::new(1 + (i as u64 * 37) % 300);
    }
    let glm = glm_2p2d();
    let mut agg = pd(role(2, 4_000, linear_step(6_000.0, 30.0, 0.001)), role(1, 1, linear_step(1.0, 1.0, 0.0)), 1.0);
    agg.aggregated = agg.prefill.take();
    agg.decode = None;
    // A linear model with 16-token blocks, prompts sharing prefixes, and a
    // decode pool of 600 blocks (9,600 tokens) for ~8 prompts of up to
    // 4,000 tokens in flight: reservations wait and decodes are preempted.
    let mut tight =
        pd(role(1, 20_000, linear_step(2_000.0, 20.0, 0.0)), role(1, 600, linear_step(6_000.0, 10.0, 0.001)), 20.0);
    tight.vllm_version = None;
    let mut shared = requests.clone();
    for (i, r) in shared.iter_mut().enumerate() {
        r.prefix = ids(i as u64 % 3, 20, i as u64, r.prompt.get().div_ceil(16) as usize);
    }
    // Busy but not saturated: 5 requests a second into a 2,000-block decode
    // pool, so reservations now and then wait while runs hold blocks ahead.
    let mut busy =
        pd(role(1, 20_000, linear_step(2_000.0, 5.0, 0.0)), role(1, 2_000, linear_step(6_000.0, 10.0, 0.001)), 20.0);
    busy.vllm_version = None;
    let mut busy_requests = poisson(11, 300, 5.0);
    for (i, r) in busy_requests.iter_mut().enumerate() {
        r.output = Tokens::new(20 + (i as u64 * 53) % 400);
        // Only the shared blocks are named, so freed blocks go back to plain
        // free blocks and runs take blocks ahead.
        r.prefix = ids(i as u64 % 5, 30, i as u64, 30.min(r.prompt.get().div_ceil(16) as usize));
    }
    // Window models under pressure: a window group's holding goes up and
    // down within a stretch of decode steps (W = 128, B = 16 holds 9 blocks
    // but 8 at a block boundary), so blocks a run takes ahead can be fewer
    // than stepping holds on the way. W = 100 changes at other tokens.
    let window_model = |w| spec(vec![fa("full attention", 16, 4_096), window("sliding window", w, 16, 4_096)]);
    let windowed = |asynchronous| {
        with_loop(
            pd(role(1, 20_000, linear_step(2_000.0, 20.0, 0.0)), role(1, 600, linear_step(6_000.0, 10.0, 0.001)), 20.0),
            asynchronous,
        )
    };
    // A step time that prices prefill and decode apart: a landed handoff's
    // last prompt token is a prefill in its first step and a decode after,
    // in a run as stepping one by one.
    let table2d = StepTimeSpec::Table2d {
        prefill: vec![[1.0, 3_000.0], [8_192.0, 200_000.0]],
        prefill_self_pair_ns: 0.5,
        prefill_cached_pair_ns: 0.2,
        decode: DecodeGrid {
            seqs: vec![1, 256],
            context: vec![512, 8_192],
            us: vec![vec![2_000.0, 2_500.0], vec![8_000.0, 30_000.0]],
        },
        mixed: Default::default(),
    };
    let mut glm_table2d = glm_2p2d();
    for r in [&mut glm_table2d.prefill, &mut glm_table2d.decode].into_iter().flatten() {
        r.step_time = table2d.clone();
    }
    let mut agg_table2d = agg.clone();
    agg_table2d.aggregated.as_mut().unwrap().step_time = table2d;
    // Every prompt block named (as a trace's hash ids name them) in a pool
    // the cache soon fills: decode steps evict cached blocks, in runs ahead
    // of their time, and arrivals cut runs (those evictions undone).
    let mut named = requests.clone();
    for (i, r) in named.iter_mut().enumerate() {
        let n = r.prompt.get().div_ceil(16) as usize;
        r.prefix = ids(i as u64 % 7, n / 2, i as u64, n);
    }
    let mut full_cache =
        pd(role(1, 3_000, linear_step(6_000.0, 30.0, 0.001)), role(1, 1, linear_step(1.0, 1.0, 0.0)), 1.0);
    full_cache.aggregated = full_cache.prefill.take();
    (full_cache.decode, full_cache.vllm_version) = (None, None);
    let cases = [
        (glm_spec(), glm, requests.clone()),
        (glm_spec(), agg, requests.clone()),
        (glm_spec(), glm_table2d, requests.clone()),
        (glm_spec(), agg_table2d, requests.clone()),
        (linear_spec(4_096), tight, shared.clone()),
        (linear_spec(4_096), busy, busy_requests),
        (window_model(128), windowed(false), shared.clone()),
        (window_model(100), windowed(false), shared.clone()),
        (window_model(128), windowed(true), shared.clone()),
        (window_model(100), windowed(true), shared),
        (linear_spec(4_096), full_cache, named),
    ];
    for (case, (model, spec, requests)) in cases.into_iter().enumerate() {
        let mut runs_of = Vec::new();
        for keep in [true, false] {
            let mut dep = Deployment::build(&model, &spec).unwrap();
            dep.set_keep_timelines(keep);
            let fast = sim::run(&dep, input(requests.clone())).unwrap();
            dep.set_lazy_decoding(false);
            let slow = sim::run(&dep, input(requests.clone())).unwrap();
            assert_eq!(fast.violations, Vec::<String>::new());
            assert_eq!(fast.summary.completed, 300, "case {case}: {:?}", fast.summary.failure_reasons);
            // The first record that differs, not all 300 of them.
            if let Some(i) = (0..fast.records.len()).find(|&i| fast.records.get(i) != slow.records.get(i)) {
                assert_eq!(fast.records.get(i), slow.records.get(i), "case {case}, timelines {keep}, request {i}");
            }
            assert_eq!(fast.records.len(), slow.records.len());
            assert_eq!(fast.digest, slow.digest);
            assert_eq!(fast.summary.itl_ms, slow.summary.itl_ms);
            // The timelines too, row for row: the counts a run of decode
            // steps writes at its steps' starts are the ones stepping has.
            let timelines = |o: &SimOutput| -> Vec<Timeline> {
                o.ranks.iter().map(|r| r.timeline.clone()).chain(o.links.iter().map(|l| l.timeline.clone())).collect()
            };
            for (e, (a, b)) in timelines(&fast).iter().zip(&timelines(&slow)).enumerate() {
                if let Some(i) = (0..a.samples.len()).find(|&i| a.samples.get(i) != b.samples.get(i)) {
                    assert_eq!(a.samples.get(i), b.samples.get(i), "case {case}, entity {e}, row {i}");
                }
                assert_eq!(a.samples.len(), b.samples.len(), "case {case}, entity {e}");
            }
            if keep {
                assert_exact_timelines(&fast);
            }
            // The vLLM-bench statistics too: each request's squared gaps and
            // the output tokens per 1 s window, from runs of steps as from
            // single steps.
            assert_eq!(fast.summary.bench, slow.summary.bench, "case {case}");
            // The pools' evictions and peaks, counted as stepping counts them.
            let pools =
                |o: &SimOutput| o.ranks.iter().map(|r| (r.evicted_blocks, r.peak_used_blocks)).collect::<Vec<_>>();
            assert_eq!(pools(&fast), pools(&slow), "case {case}");
            let runs = |o: &SimOutput| o.ranks.iter().map(|r| (r.stats.steps, r.stats.runs)).collect::<Vec<_>>();
            // Steps alike, fewer events for them.
            let (f, s) = (runs(&fast), runs(&slow));
            assert_eq!(f.iter().map(|r| r.0).collect::<Vec<_>>(), s.iter().map(|r| r.0).collect::<Vec<_>>());
            let (fast_runs, steps): (u64, u64) = f.iter().fold((0, 0), |a, r| (a.0 + r.1, a.1 + r.0));
            assert!(fast_runs < steps, "{f:?}");
            assert!(fast.events < slow.events);
            if case == 8 {
                // With the cache full, runs evict ahead rather than stop at
                // every block boundary: 2,453 events against stepping's
                // 4,654 (4,304 when a run stopped before any eviction).
                assert!(fast.events * 3 < slow.events * 2, "{} events, stepping {}", fast.events, slow.events);
                assert!(fast.ranks.iter().map(|r| r.evicted_blocks).sum::<u64>() > 10_000, "the cache fills");
            }
            if matches!(case, 4 | 6 | 7) {
                assert!(fast.summary.preemptions > 0, "the tight case preempts");
                assert!(fast.summary.transfer_wait_ms.max > 0.0, "the tight case makes reservations wait");
            }
            assert_eq!(fast.ranks.iter().all(|r| r.timeline.samples.is_empty()), !keep);
            runs_of.push((fast.digest, fast.events, f));
        }
        assert_eq!(runs_of[0], runs_of[1], "case {case}: the timeline changes nothing");
    }
}

/// The rows of one series of a timeline.
fn series(tl: &Timeline, metric: Metric) -> Vec<(u64, u64)> {
    tl.samples.iter().filter(|s| s.metric == metric).map(|s| (s.time.as_nanos(), s.value)).collect()
}

/// The value of a series at `t` (its last row at or before it).
fn at(rows: &[(u64, u64)], t: u64) -> u64 {
    match rows.partition_point(|&(time, _)| time <= t) {
        0 => panic!("no row at or before {t}"),
        i => rows[i - 1].1,
    }
}

/// The integral of a series over [0, end), in value × ns.
fn integral(rows: &[(u64, u64)], end: u64) -> u128 {
    let mut total = 0u128;
    for (i, &(t, v)) in rows.iter().enumerate() {
        let next = rows.get(i + 1).map_or(end, |r| r.0).min(end);
        total += u128::from(v) * u128::from(next.saturating_sub(t));
    }
    total
}

/// Checks that a run's timelines are the exact step functions of its state:
/// every series starts at time zero, has one row per change (never two at
/// one instant, never a row that changes nothing); the ranks' `requests`
/// add up, at every instant any of them changed, to the requests that had
/// arrived and not ended then (from the records); each rank's and link's
/// `busy` integrates to its busy time; no `kv_used_blocks` exceeds the peak.
/// (A run cut short by a time limit: up to the limit, and its steps in
/// flight then count as busy on the timeline only.)
fn assert_exact_timelines(out: &SimOutput) {
    let end = out.final_time.as_nanos();
    let all = out.ranks.iter().map(|r| (&r.name, &r.timeline)).chain(out.links.iter().map(|l| (&l.name, &l.timeline)));
    for (name, tl) in all {
        let mut last: std::collections::BTreeMap<Metric, Sample> = Default::default();
        for s in &tl.samples {
            if let Some(prev) = last.insert(s.metric, *s) {
                assert!(prev.time < s.time, "{name}: two rows of {:?} at {}", s.metric, s.time);
                assert_ne!(prev.value, s.value, "{name}: a row of {:?} at {} changes nothing", s.metric, s.time);
            } else {
                assert_eq!(s.time, SimTime::ZERO, "{name}: {:?} starts at time zero", s.metric);
            }
        }
    }
    let mut arrivals: Vec<u64> = out.records.iter().map(|r| r.t.arrival.as_nanos()).collect();
    let mut ends: Vec<u64> = out.records.iter().map(|r| r.t.finished.map_or(end, |f| f.as_nanos())).collect();
    arrivals.sort_unstable();
    ends.sort_unstable();
    let in_system = |t: u64| (arrivals.partition_point(|&a| a <= t) - ends.partition_point(|&f| f <= t)) as u64;
    let requests: Vec<Vec<(u64, u64)>> = out.ranks.iter().map(|r| series(&r.timeline, Metric::Requests)).collect();
    let mut times: Vec<u64> = requests.iter().flatten().map(|r| r.0).collect();
    times.sort_unstable();
    times.dedup();
    for t in times.into_iter().filter(|&t| !out.cut_short || t < end) {
        let held: u64 = requests.iter().map(|rows| at(rows, t)).sum();
        assert_eq!(held, in_system(t), "requests in the system at {t} ns");
    }
    for r in &out.ranks {
        let busy = integral(&series(&r.timeline, Metric::Busy), end);
        let exact = u128::from(r.stats.busy.as_nanos());
        assert!(busy == exact || out.cut_short && busy > exact, "{}: busy {busy} ns, exactly {exact}", r.name);
        let kv = series(&r.timeline, Metric::KvUsed);
        assert!(kv.iter().all(|&(_, v)| v <= r.peak_used_blocks), "{}: above the peak", r.name);
    }
    for l in &out.links {
        let busy = integral(&series(&l.timeline, Metric::Busy), end);
        assert_eq!(busy, u128::from(l.stats.busy.as_nanos()), "{}: busy time", l.name);
    }
}

/// Prefix ids of 16-token blocks: `shared` ids from `group`, then ids unique to `me`.
fn ids(group: u64, shared: usize, me: u64, total: usize) -> PrefixIds {
    let ids = (0..total)
        .map(|j| if j < shared { 1_000 * group + j as u64 } else { 1_000_000 * (me + 1) + j as u64 })
        .collect();
    PrefixIds { block_tokens: Tokens::new(16), ids }
}

fn prefixed(at_ns: u64, prompt: u64, output: u64, prefix: PrefixIds) -> RequestSpec {
    RequestSpec { prefix, ..req(at_ns, prompt, output) }
}

#[test]
fn prefix_hits_shrink_the_prefill_and_the_transfer() {
    // Linear model, B = 16, 2,048 bytes a token. A: 160 tokens (10 blocks).
    // B, after A is done, shares A's first 8 blocks (128 tokens).
    let model = linear_spec(2_048);
    let mut spec =
        pd(role(1, 1_000, linear_step(1_000.0, 10.0, 0.0)), role(1, 1_000, linear_step(1_000.0, 0.0, 0.0)), 1.0);
    spec.vllm_version = None;
    let a = prefixed(0, 160, 4, ids(7, 10, 0, 10));
    let b = prefixed(1_000_000_000, 160, 4, ids(7, 8, 1, 10));
    let out = run(&model, &spec, vec![a, b]);
    let (a, b) = (&out.records[0], &out.records[1]);
    assert_eq!((a.prefill_hit, a.decode_hit), (Tokens::ZERO, Tokens::ZERO));
    assert_eq!(a.transfer_bytes, Bytes::new(160 * 2_048));
    // B's prefill finds 8 blocks and computes 32 tokens: 1,000 + 10 × 32 µs.
    assert_eq!(b.prefill_hit, Tokens::new(128));
    assert_eq!(b.t.prefill_done.unwrap() - b.t.prefill_started.unwrap(), SimDuration::from_micros(1_320));
    // Its decode rank cached A's transferred blocks: only 160 − 128 tokens move.
    assert_eq!(b.decode_hit, Tokens::new(128));
    assert_eq!(b.transfer_bytes, Bytes::new(32 * 2_048));
    assert_eq!(out.summary.prefill_hit_tokens, 128);
    assert_eq!(out.summary.decode_hit_tokens, 128);
}

#[test]
fn a_full_decode_hit_moves_nothing() {
    // A Mamba-type model: FA B = 16 plus one Mamba state. N = 161, so T = 160
    // = 10 whole blocks, and a repeat of the prompt finds all 10 cached on
    // the decode rank (the cache never covers the last prompt token, 161):
    // vLLM then reads nothing, not even the state.
    use super::model_fixtures::{fa, spec as model_spec, state};
    let model = model_spec(vec![fa("fa", 16, 4_096), state("mamba", 16, 4_096, 1_000, true)]);
    let spec = pd(role(1, 1_000, linear_step(1_000.0, 10.0, 0.0)), role(1, 1_000, linear_step(1_000.0, 0.0, 0.0)), 1.0);
    let same = || ids(3, 11, 0, 11);
    let out = run(&model, &spec, vec![prefixed(0, 161, 2, same()), prefixed(1_000_000_000, 161, 2, same())]);
    let (a, b) = (&out.records[0], &out.records[1]);
    assert_eq!(a.transfer_bytes, Bytes::new(10 * 4_096 + 1_000));
    assert_eq!(b.decode_hit, Tokens::new(160));
    assert_eq!(b.transfer_bytes, Bytes::ZERO);
    assert_eq!(b.t.transfer_started, b.t.transfer_done);
    assert_eq!(b.outcome, Outcome::Completed);
    let p = out.ranks.iter().find(|k| k.role == Role::Prefill).unwrap();
    assert_eq!(p.sources.unwrap().released, 2);
    assert_eq!(out.links[0].stats.transfers, 1, "the full hit never reached the link");
}

#[test]
fn kv_aware_routing_keeps_a_prefix_group_on_one_rank() {
    // Two prefill ranks; requests alternate between two prefix groups that
    // share 480 of 512 tokens. Round robin sends each group to both ranks
    // (and keeps missing); KV-aware sends each group where it was cached.
    use actors::config::Policy;
    let model = linear_spec(2_048);
    let requests: Vec<RequestSpec> = (0..12u64)
        .map(|i| {
            let group = [0, 0, 1, 1][(i % 4) as usize];
            prefixed(i * 100_000_000, 512, 2, ids(group, 30, i, 32))
        })
        .collect();
    let mut hits = Vec::new();
    for policy in [Policy::RoundRobin, Policy::KvAware] {
        let mut spec =
            pd(role(2, 1_000, linear_step(1_000.0, 10.0, 0.0)), role(1, 1_000, linear_step(1_000.0, 0.0, 0.0)), 10.0);
        spec.vllm_version = None;
        spec.router.prefill_policy = policy;
        let out = run(&model, &spec, requests.clone());
        hits.push(out.summary.prefill_hit_tokens);
    }
    // KV-aware: every request after its group's first hits 30 blocks = 480
    // tokens: 10 × 480. Round robin: the first request of each (group, rank)
    // pair misses: 4 misses, 8 hits.
    assert_eq!(hits, [8 * 480, 10 * 480]);
}

/// KV-aware routing scores overlap against load, so a prefix every prompt
/// shares cannot pull all of them to one rank. A Mooncake-like workload:
/// every prompt starts with one shared block (a system prompt), then its
/// session's 16 blocks, then 26 blocks of its own (688 tokens); 30
/// sessions, Poisson 300 requests/s over four prefill ranks of 300 blocks
/// (a few prompts each), so one rank alone would be far past capacity.
/// KV-aware's mean TTFT stays within 1.5x of least-outstanding's, and it
/// hits more prompt tokens than round robin (it keeps sessions where they
/// are cached). Measured: round robin 45.7 ms and 11,456 hit tokens, least
/// outstanding 39.4 ms and 24,400, KV-aware 30.8 ms and 36,368; with the
/// load term off (an overlap weight of 10^12) KV-aware sends everything to
/// one rank: 2,034 ms.
#[test]
fn kv_aware_routing_spreads_a_shared_first_block() {
    use actors::config::Policy;
    let model = linear_spec(2_048);
    let mut requests = poisson(11, 400, 300.0);
    for (i, r) in requests.iter_mut().enumerate() {
        let session = ((i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 40) % 30;
        let mut ids: Vec<u64> = vec![42];
        ids.extend((0..16).map(|j| 1_000 * (session + 1) + j));
        ids.extend((0..26).map(|j| 1_000_000 * (i as u64 + 1) + j));
        r.prefix = PrefixIds { block_tokens: Tokens::new(16), ids };
        r.prompt = Tokens::new(43 * 16);
        r.output = Tokens::new(4);
    }
    let mut got = Vec::new();
    for policy in [Policy::RoundRobin, Policy::LeastOutstanding, Policy::KvAware] {
        let mut spec =
            pd(role(4, 300, linear_step(1_000.0, 20.0, 0.0)), role(1, 20_000, linear_step(2_000.0, 0.0, 0.0)), 50.0);
        spec.vllm_version = None;
        spec.router.prefill_policy = policy;
        let out = run(&model, &spec, requests.clone());
        assert_eq!(out.summary.completed, 400, "{policy:?}");
        got.push((out.summary.ttft_ms.mean, out.summary.prefill_hit_tokens));
    }
    let [(_, rr_hits), (lo_ttft, _), (kv_ttft, kv_hits)] = got[..] else { unreachable!() };
    assert!(kv_ttft <= 1.5 * lo_ttft, "TTFT mean: kv_aware {kv_ttft} ms, least_outstanding {lo_ttft} ms");
    assert!(kv_hits > rr_hits, "hit tokens: kv_aware {kv_hits}, round robin {rr_hits}");
}

#[test]
fn a_time_limit_ends_the_run_with_every_request_accounted_for() {
    let spec = glm_2p2d();
    let dep = Deployment::build(&glm_spec(), &spec).unwrap();
    let mut run_input = input(poisson(5, 200, 20.0));
    run_input.until = Some(SimTime::from_nanos(4_000_000_000));
    let out = sim::run(&dep, run_input).unwrap();
    assert_eq!(out.violations, Vec::<String>::new());
    assert_eq!(out.final_time, SimTime::from_nanos(4_000_000_000));
    let unfinished = out.summary.failure_reasons.get("still in flight when the simulation ended").copied().unwrap_or(0);
    assert!(unfinished > 0, "{:?}", out.summary.failure_reasons);
    assert_eq!(out.summary.completed + out.summary.failed, out.records.len() as u64);
    assert!(out.records.len() < 200, "requests arriving after the limit never entered");
    assert_exact_timelines(&out);
}

/// A time limit that falls while requests cross the API server (on their
/// way in, and on the proxy's hop from prefill to decode) ends them as
/// unfinished like the others: every request that entered is accounted
/// for. One 1,000-token GLM request at 0 with 5 ms each way: a limit at
/// 2 ms finds it on its way in; one at 45 ms, on the hop (its prefill of
/// 5 + 999 × 0.03 = 34.97 ms ends at 39.97 ms, its hop 10 ms long).
#[test]
fn a_time_limit_while_requests_cross_the_front_end_accounts_for_them() {
    let mut spec = pd(role(1, 64, linear_step(5_000.0, 30.0, 0.0)), role(1, 64, linear_step(10_000.0, 0.0, 0.01)), 1.0);
    spec.frontend = FrontEndSpec { request_us: Some(5_000.0), response_us: Some(5_000.0) };
    let dep = Deployment::build(&glm_spec(), &spec).unwrap();
    for (limit_ms, queued) in [(2, false), (45, true)] {
        let mut run_input = input(vec![req(0, 1_000, 2)]);
        run_input.until = Some(SimTime::ZERO + SimDuration::from_millis(limit_ms));
        let out = sim::run(&dep, run_input).unwrap();
        assert_eq!(out.violations, Vec::<String>::new(), "limit {limit_ms} ms");
        assert_eq!(out.records.len(), 1, "limit {limit_ms} ms");
        let r = &out.records[0];
        assert_eq!(r.outcome, Outcome::Failed(FailReason::Unfinished), "limit {limit_ms} ms");
        assert_eq!(r.t.prefill_queued.is_some(), queued, "limit {limit_ms} ms");
        assert_eq!(r.t.reserve_requested, None, "limit {limit_ms} ms");
        // Its client learns of the end one way out after the cut.
        assert_eq!(r.t.finished, Some(SimTime::ZERO + SimDuration::from_millis(limit_ms + 5)), "limit {limit_ms} ms");
    }
}

#[test]
fn a_time_limit_counts_only_the_evictions_of_steps_that_started() {
    // Prompts named in whole in 700-block pools the cache fills: runs in
    // flight at the limit have evicted ahead for steps after it, which
    // stepping never starts.
    let mut requests = poisson(7, 200, 60.0);
    for (i, r) in requests.iter_mut().enumerate() {
        r.output = Tokens::new(1 + (i as u64 * 37) % 300);
        let n = r.prompt.get().div_ceil(16) as usize;
        r.prefix = ids(i as u64 % 3, n / 2, i as u64, n);
    }
    let step = linear_step(6_000.0, 10.0, 0.001);
    let mut d = pd(role(1, 20_000, linear_step(2_000.0, 20.0, 0.0)), role(1, 700, step.clone()), 20.0);
    d.aggregated = Some(role(2, 700, step));
    (d.prefill, d.decode, d.vllm_version) = (None, None, None);
    let mut dep = Deployment::build(&linear_spec(4_096), &d).unwrap();
    let mut evicted = 0;
    for k in 0..12u64 {
        let limited = || {
            let mut run_input = input(requests.clone());
            run_input.until = Some(SimTime::from_nanos(1_500_000_000 + k * 777_000));
            run_input
        };
        dep.set_lazy_decoding(true);
        let fast = sim::run(&dep, limited()).unwrap();
        dep.set_lazy_decoding(false);
        let slow = sim::run(&dep, limited()).unwrap();
        let pools = |o: &SimOutput| o.ranks.iter().map(|r| r.evicted_blocks).collect::<Vec<_>>();
        assert_eq!(pools(&fast), pools(&slow), "limit {k}");
        evicted += pools(&fast).iter().sum::<u64>();
        // The requests still decoding at the limit have the tokens of the
        // steps that ended by then, and the ranks count those steps.
        if let Some(i) = (0..fast.records.len()).find(|&i| fast.records.get(i) != slow.records.get(i)) {
            assert_eq!(fast.records.get(i), slow.records.get(i), "limit {k}, request {i}");
        }
        assert_eq!(fast.digest, slow.digest, "limit {k}");
        let steps = |o: &SimOutput| {
            o.ranks.iter().map(|r| (r.stats.steps, r.stats.busy, r.stats.output_tokens)).collect::<Vec<_>>()
        };
        assert_eq!(steps(&fast), steps(&slow), "limit {k}");
    }
    assert!(evicted > 1_000, "the caches fill: {evicted}");
}

#[test]
fn a_crash_counts_the_steps_that_ended_before_it() {
    // Decode runs in flight when decode0 crashes: the tokens of their steps
    // that ended by then are the requests' (they fail with them), and the
    // rank counts those steps, as stepping one event at a time does.
    let requests = poisson(11, 120, 30.0);
    let mut differed = 0;
    for k in 0..8u64 {
        let mut d = pd(
            role(1, 20_000, linear_step(2_000.0, 20.0, 0.0)),
            role(2, 3_000, linear_step(6_000.0, 10.0, 0.001)),
            20.0,
        );
        d.vllm_version = None;
        d.faults.decode_crashes = vec![CrashSpec { rank: 0, at_s: 1.0 + k as f64 * 0.3137 }];
        let mut dep = Deployment::build(&linear_spec(4_096), &d).unwrap();
        dep.set_lazy_decoding(true);
        let fast = sim::run(&dep, input(requests.clone())).unwrap();
        dep.set_lazy_decoding(false);
        let slow = sim::run(&dep, input(requests.clone())).unwrap();
        if let Some(i) = (0..fast.records.len()).find(|&i| fast.records.get(i) != slow.records.get(i)) {
            assert_eq!(fast.records.get(i), slow.records.get(i), "crash {k}, request {i}");
        }
        assert_eq!(fast.digest, slow.digest, "crash {k}");
        let steps = |o: &SimOutput| {
            o.ranks.iter().map(|r| (r.stats.steps, r.stats.busy, r.stats.output_tokens)).collect::<Vec<_>>()
        };
        assert_eq!(steps(&fast), steps(&slow), "crash {k}");
        let crashed = |o: &SimOutput| {
            o.records
                .iter()
                .filter(|r| r.outcome == Outcome::Failed(FailReason::DecodeCrashed) && r.generated.get() > 1)
                .count()
        };
        differed += crashed(&fast);
    }
    assert!(differed > 20, "requests were decoding at the crashes: {differed}");
}

mod conservation {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

        /// Random small deployments under pressure (small pools, faults,
        /// short holds): every request ends completed or failed with a
        /// reason, no source is left held, pools balance after every step
        /// (check_invariants), and links deliver what they were given.
        #[test]
        fn every_request_is_accounted_for(
            p_count in 1u32..3, d_count in 1u32..3, p_blocks in 40u64..200, d_blocks in 40u64..200,
            n in 1usize..40, seed in 0u64..1_000, abort in prop_oneof![Just(0.0), Just(0.2)],
            hold in prop_oneof![Just(None), Just(Some(0.05))], fifo in any::<bool>(),
        ) {
            let model = linear_spec(1_024);
            let mut spec = pd(
                role(p_count, p_blocks, linear_step(1_000.0, 5.0, 0.0)),
                role(d_count, d_blocks, linear_step(2_000.0, 1.0, 0.001)),
                5.0,
            );
            spec.vllm_version = None;
            spec.faults.decode_abort_probability = abort;
            spec.faults.source_hold_s = hold;
            if fifo {
                spec.link.sharing = Sharing::Fifo;
                spec.link.topology = LinkTopology::Shared;
            }
            let mut rng = sim_core::rng::stream_for(seed, "prop");
            let requests: Vec<RequestSpec> = (0..n as u64)
                .map(|i| req(i * rng.random_range(0..20_000_000), rng.random_range(1..1_500), rng.random_range(1..200)))
                .collect::<Vec<_>>();
            let mut requests = requests;
            requests.sort_by_key(|r| r.arrival);
            let dep = Deployment::build(&model, &spec).unwrap();
            let out = sim::run(&dep, input(requests)).unwrap();
            prop_assert_eq!(out.violations.clone(), Vec::<String>::new());
            prop_assert_eq!(out.records.len(), n);
            prop_assert_eq!(out.summary.completed + out.summary.failed, n as u64);
            for r in &out.records {
                prop_assert!(r.outcome != Outcome::InFlight);
                if r.outcome == Outcome::Completed {
                    prop_assert_eq!(r.generated, r.output);
                    prop_assert!(r.t.first_token.unwrap() <= r.t.finished.unwrap());
                }
            }
            // Exact timelines under faults, FIFO links and short holds.
            assert_exact_timelines(&out);
        }
    }
}

#[test]
fn a_landed_handoff_never_waits_for_one_more_block() {
    // Mamba-type model, FA B = 16: N = 529, so T = 528 = 33 whole blocks and
    // the first decode step (token 529) needs a 34th. Reserving only what
    // lands (33 + 1 state = 34 blocks) let two requests fill a 68-block pool
    // and then wait forever for their 35th block each. The reservation holds
    // what the first decode step holds (35), so the second waits its turn.
    use super::model_fixtures::{fa, spec as model_spec, state};
    let model = model_spec(vec![fa("fa", 16, 4_096), state("mamba", 16, 4_096, 1_000, true)]);
    let spec = pd(role(1, 1_000, linear_step(1_000.0, 1.0, 0.0)), role(1, 68, linear_step(1_000.0, 1.0, 0.0)), 1.0);
    let out = run(&model, &spec, vec![req(0, 529, 4), req(0, 529, 4)]);
    assert_eq!(out.summary.completed, 2, "{:?}", out.summary.failure_reasons);
    let d = out.ranks.iter().find(|k| k.role == Role::Decode).unwrap();
    assert_eq!(d.reservations_waited, 1);
}

#[test]
fn window_groups_fit_by_their_in_window_blocks() {
    // FA B = 16 plus a 128-token window (B = 16). A 2,000-token prompt with
    // 10 output tokens peaks at cdiv(2,009, 16) = 126 FA blocks plus at most
    // cdiv(127, 16) + 1 = 9 window blocks: it fits a 200-block decode pool,
    // though counting every window block (126 + 126) would refuse it.
    use super::model_fixtures::{fa, spec as model_spec, window};
    let model = model_spec(vec![fa("fa", 16, 4_096), window("swa", 128, 16, 4_096)]);
    let spec = pd(role(1, 1_000, linear_step(1_000.0, 1.0, 0.0)), role(1, 200, linear_step(1_000.0, 1.0, 0.0)), 10.0);
    let out = run(&model, &spec, vec![req(0, 2_000, 10)]);
    assert_eq!(out.summary.completed, 1, "{:?}", out.summary.failure_reasons);
}

#[test]
fn absurd_inputs_are_refused_not_panics() {
    // Bytes of a full pool that overflow 64 bits.
    let huge = linear_spec(u64::MAX / 8);
    let mut spec = pd(role(1, 100, linear_step(1.0, 1.0, 0.0)), role(1, 100, linear_step(1.0, 1.0, 0.0)), 1.0);
    spec.vllm_version = None;
    let err = Deployment::build(&huge, &spec).unwrap_err().to_string();
    assert!(err.contains("kv_bytes_per_token") || err.contains("num_blocks"), "{err}");
    // A request whose lengths would overflow the counts stops the run with
    // a workload error naming it.
    let dep = Deployment::build(&linear_spec(1_024), &spec).unwrap();
    let err = match sim::run(&dep, input(vec![req(0, 100, 5), req(1, 100, u64::MAX)])) {
        Err(e) => e.to_string(),
        Ok(_) => panic!("an output of 2^64 - 1 tokens is refused"),
    };
    assert!(err.starts_with("request 1:"), "{err}");
    // Too many ranks, a latency past 1,000 s.
    let mut many = spec.clone();
    many.decode.as_mut().unwrap().count = 100_000;
    assert!(Deployment::build(&linear_spec(1_024), &many).unwrap_err().to_string().starts_with("decode.count:"));
    let mut slow = spec.clone();
    slow.link.latency_us = 1e300;
    assert!(Deployment::build(&linear_spec(1_024), &slow).unwrap_err().to_string().starts_with("link.latency_us:"));
}

#[test]
fn blocks_a_run_holds_ahead_go_to_a_reservation_that_needs_them() {
    // Linear model, B = 16, a 27-block decode pool. A (160 tokens, 200 out)
    // reserves 10 blocks and decodes in one long run, taking ahead the 13
    // blocks its 200 steps will need (cdiv(359, 16) = 23 in all). B (160
    // tokens, 1 out) lands halfway: stepping one event at a time, A then
    // holds about 17 blocks and B's 10 fit at once; the blocks A holds
    // ahead must be given back for B, not make it wait.
    let model = linear_spec(1_024);
    let mut spec =
        pd(role(1, 1_000, linear_step(1_000.0, 1.0, 0.0)), role(1, 27, linear_step(5_000.0, 0.0, 0.0)), 100.0);
    spec.vllm_version = None;
    // The synchronous loop: B is reserved by the call at the end of the
    // step in flight.
    spec.decode.as_mut().unwrap().async_scheduling = Some(false);
    let requests = vec![req(0, 160, 200), req(500_000_123, 160, 1)];
    let mut dep = Deployment::build(&model, &spec).unwrap();
    let fast = sim::run(&dep, input(requests.clone())).unwrap();
    dep.set_lazy_decoding(false);
    let slow = sim::run(&dep, input(requests)).unwrap();
    assert_eq!(fast.records, slow.records);
    let b = &fast.records[1];
    // B is reserved by the decode rank's next schedule call, at the end of
    // A's 5 ms decode step in progress, as vLLM's decode scheduler
    // allocates a remote load in its waiting loop.
    let wait = b.t.reserved.unwrap() - b.t.prefill_done.unwrap();
    assert!(wait > SimDuration::ZERO && wait < SimDuration::from_millis(5), "B waited {wait:?}");
    assert!(b.t.finished < fast.records[0].t.finished, "B is done before A");
}

/// Window groups under pressure, over seeds, pool sizes, windows (aligned
/// to the block, not, and shorter than the prompts' chunks) and both
/// topologies: the decoding set and its runs give exactly what stepping
/// every sequence gives. A window group's holding shrinks as well as grows
/// during decoding, which the runs must order as stepping does.
#[test]
fn window_models_match_stepping_under_pressure() {
    let mut preemptions = 0;
    for seed in [3u64, 8] {
        for pool in [450u64, 900] {
            for w in [128u64, 40] {
                for (aggregated, asynchronous) in [(false, false), (true, false), (false, true), (true, true)] {
                    let mut requests = poisson(seed, 200, 40.0);
                    for (i, r) in requests.iter_mut().enumerate() {
                        r.output = Tokens::new(1 + (i as u64 * 37) % 300);
                        r.prefix = ids(i as u64 % 3, 20, i as u64, r.prompt.get().div_ceil(16) as usize);
                    }
                    let model = spec(vec![fa("full attention", 16, 4_096), window("sliding window", w, 16, 4_096)]);
                    let step = linear_step(6_000.0, 10.0, 0.001);
                    let mut d = pd(role(1, 20_000, linear_step(2_000.0, 20.0, 0.0)), role(1, pool, step.clone()), 20.0);
                    if aggregated {
                        d.aggregated = Some(role(1, pool, step));
                        (d.prefill, d.decode) = (None, None);
                    }
                    let d = with_loop(d, asynchronous);
                    let mut dep = Deployment::build(&model, &d).unwrap();
                    let fast = sim::run(&dep, input(requests.clone())).unwrap();
                    dep.set_lazy_decoding(false);
                    let slow = sim::run(&dep, input(requests)).unwrap();
                    let case = (seed, pool, w, aggregated, asynchronous);
                    if let Some(i) = (0..fast.records.len()).find(|&i| fast.records.get(i) != slow.records.get(i)) {
                        assert_eq!(fast.records.get(i), slow.records.get(i), "{case:?}, request {i}");
                    }
                    assert_eq!(fast.records.len(), slow.records.len());
                    assert_eq!(fast.summary.itl_ms, slow.summary.itl_ms, "{case:?}");
                    assert_eq!(fast.summary.bench, slow.summary.bench, "{case:?}");
                    assert_eq!(fast.violations, Vec::<String>::new(), "{case:?}");
                    // Some prompts exceed the 450-block pools; most fit.
                    assert!(fast.summary.completed >= 150, "{case:?}: {:?}", fast.summary.failure_reasons);
                    assert!(fast.events < slow.events, "{case:?}: runs save events");
                    preemptions += fast.summary.preemptions;
                }
            }
        }
    }
    assert!(preemptions > 50, "the pools are tight: {preemptions} preemptions");
}

/// The asynchronous loop frees window blocks through what is processed,
/// one step behind (`Core::lags_skips`): on both roles of a P/D
/// deployment under pressure, landed loads included (their first step
/// starts past their last prompt token, and the next one's processed
/// start must not fall back below it), every request completes or fails
/// with a reason and the pool keeps its counts after every step.
#[test]
fn window_models_under_the_asynchronous_loop_keep_their_pools() {
    let mut preemptions = 0;
    for (seed, pool, w) in [(3u64, 300u64, 128u64), (8, 500, 40), (5, 700, 33)] {
        let mut requests = poisson(seed, 200, 40.0);
        for (i, r) in requests.iter_mut().enumerate() {
            r.output = Tokens::new(1 + (i as u64 * 37) % 300);
        }
        let model = spec(vec![fa("full attention", 16, 4_096), window("sliding window", w, 16, 4_096)]);
        // (Prompts of up to 4,000 tokens: the prefill pool fits any; the
        // decode pool is the tight one.)
        let mut d = pd(
            role(1, 20_000, linear_step(2_000.0, 20.0, 0.0)),
            role(1, pool, linear_step(6_000.0, 10.0, 0.001)),
            20.0,
        );
        d.vllm_version = Some("0.33.0".into());
        // (`pd` checks the pools' counts after every step.)
        let mut dep = Deployment::build(&model, &d).unwrap();
        let out = sim::run(&dep, input(requests.clone())).unwrap();
        // The decoding set's runs follow the lag: what stepping every
        // sequence one by one gives, to the pools' peaks.
        dep.set_lazy_decoding(false);
        let slow = sim::run(&dep, input(requests)).unwrap();
        if let Some(i) = (0..out.records.len()).find(|&i| out.records.get(i) != slow.records.get(i)) {
            assert_eq!(out.records.get(i), slow.records.get(i), "{seed}, request {i}");
        }
        let pools = |o: &SimOutput| o.ranks.iter().map(|r| (r.evicted_blocks, r.peak_used_blocks)).collect::<Vec<_>>();
        assert_eq!(pools(&out), pools(&slow), "{seed}");
        assert_eq!(out.digest, slow.digest, "{seed}");
        assert!(out.events < slow.events, "{seed}: runs save events");
        assert_eq!(out.violations, Vec::<String>::new(), "{seed}");
        assert_eq!(out.summary.completed + out.summary.failed, 200, "{seed}");
        assert!(out.summary.completed >= 150, "{seed}: {:?}", out.summary.failure_reasons);
        preemptions += out.summary.preemptions;
    }
    assert!(preemptions > 20, "the pools are tight: {preemptions} preemptions");
}

/// A constant step time, whatever the batch.
struct Constant(SimDuration);

impl StepTimeModel for Constant {
    fn step_time(&self, _: &BatchShape) -> SimDuration {
        self.0
    }
}

/// Always the last rank.
struct Last;

impl RoutePolicy for Last {
    fn choose(&mut self, _: &Request, loads: &[u64]) -> usize {
        loads.len() - 1
    }
}

/// A step-time model and a routing policy of the caller's own replace the
/// scenario's. Aggregated, a 100-token prompt with 3 output tokens takes
/// three steps (the prefill gives the first token, two decode steps the
/// rest), each 7 ms: 21 ms end to end, whatever the spec's linear model
/// says. Disaggregated over two prefill and two decode ranks, a policy that
/// picks the last rank sends everything to prefill1 and decode1.
#[test]
fn step_time_models_and_route_policies_plug_in() {
    let mut spec = pd(role(1, 64, linear_step(1_000.0, 1.0, 0.0)), role(1, 64, linear_step(1.0, 1.0, 0.0)), 1.0);
    spec.aggregated = spec.prefill.take();
    spec.decode = None;
    let mut dep = Deployment::build(&glm_spec(), &spec).unwrap();
    dep.set_step_time_model(Role::Aggregated, || Box::new(Constant(SimDuration::from_millis(7))));
    let out = sim::run(&dep, input(vec![req(0, 100, 3)])).unwrap();
    let t = &out.records[0].t;
    assert_eq!(t.finished, Some(SimTime::ZERO.saturating_add(SimDuration::from_millis(21))));

    let spec = pd(role(2, 400, linear_step(1_000.0, 1.0, 0.0)), role(2, 400, linear_step(1_000.0, 1.0, 0.0)), 10.0);
    let mut dep = Deployment::build(&glm_spec(), &spec).unwrap();
    dep.set_route_policy(Role::Prefill, |_| Box::new(Last));
    dep.set_route_policy(Role::Decode, |_| Box::new(Last));
    let out = sim::run(&dep, input(poisson(4, 20, 50.0))).unwrap();
    assert_eq!(out.violations, Vec::<String>::new());
    assert!(out.records.iter().all(|r| (r.prefill_rank, r.decode_rank) == (Some(1), Some(1))));
}

/// A decode rank that crashes leaves the sources it had yet to release on
/// the prefill rank until their hold runs out: a fixed hold counts from the
/// source's hold, a lease from the last heartbeat.
///
/// Linear model, B = 16; one prefill rank, two decode ranks of 100 blocks
/// (a 1,000-token reservation takes 63) and 50 ms steps. Three requests
/// arrive together: A prefills in the first step, B and C in the second
/// (C's source is held at s = 7 ms); round robin sends A
/// (550 output tokens, 27.5 s of decoding) to decode0, B to decode1, C to
/// decode0, where C's reservation waits behind A. decode0 crashes at 20 s: A (decoding) and C (waiting) fail. C's source stays
/// held: under a 100 s hold until s + 100 s; under a 30 s lease, heartbeats
/// came every 5 s from s, the last at s + 15 s (20 − s = 19.99 s holds three
/// beats), so the lease lapses at max(s + 30, s + 15 + 20) = s + 35 s. Two
/// requests after the crash go to decode1, round robin's turn for decode0
/// included.
#[test]
fn a_crashed_decode_rank_leaves_its_sources_to_lapse() {
    let model = linear_spec(32_768);
    let requests = || {
        let late = |s: u64| req(s * 1_000_000_000, 1_000, 10);
        vec![req(0, 1_000, 550), req(0, 1_000, 10), req(0, 1_000, 10), late(25), late(26)]
    };
    for lease in [false, true] {
        let mut spec =
            pd(role(1, 10_000, linear_step(2_000.0, 1.0, 0.0)), role(2, 100, linear_step(50_000.0, 0.0, 0.0)), 50.0);
        spec.vllm_version = None;
        spec.faults.decode_crashes = vec![CrashSpec { rank: 0, at_s: 20.0 }];
        if lease {
            spec.faults.source_lease_s = Some(30.0);
        } else {
            spec.faults.source_hold_s = Some(100.0);
        }
        let out = run(&model, &spec, requests());
        assert_eq!(out.violations, Vec::<String>::new());
        let r = &out.records;
        let crashed = Outcome::Failed(FailReason::DecodeCrashed);
        let at = SimTime::ZERO.saturating_add(SimDuration::from_secs(20));
        assert_eq!((r[0].outcome, r[0].t.finished), (crashed, Some(at)), "A was decoding");
        assert_eq!((r[2].outcome, r[2].t.finished), (crashed, Some(at)), "C was waiting");
        assert_eq!(r[2].t.reserved, None);
        assert!([1, 3, 4].iter().all(|&i| r[i].outcome == Outcome::Completed));
        // Round robin's turn for E is decode0's; decode1 takes it.
        assert_eq!((r[3].decode_rank, r[4].decode_rank), (Some(1), Some(1)), "after the crash, work goes to decode1");
        let s = r[2].t.prefill_done.unwrap();
        let lapse = if lease { SimDuration::from_secs(35) } else { SimDuration::from_secs(100) };
        // Nothing else runs that late: the run ends when the source lapses.
        assert_eq!(out.final_time, s.saturating_add(lapse), "lease {lease}");
        let p = out.ranks.iter().find(|k| k.role == Role::Prefill).unwrap().sources.unwrap();
        // A, B, D and E were released after their transfers; C lapsed.
        assert_eq!((p.held, p.released, p.expired), (5, 4, 1));
        // decode0's timeline: empty and idle from the crash on.
        assert_exact_timelines(&out);
        let d0 = &out.ranks.iter().find(|k| k.name == "decode0").unwrap().timeline;
        for m in [Metric::Requests, Metric::Running, Metric::Busy, Metric::KvUsed] {
            assert_eq!(series(d0, m).last(), Some(&(at.as_nanos(), 0)), "{m:?}");
        }
    }
}

/// The default hold of every vLLM release pdsim knows is vLLM's 30 s lease
/// (`kv_lease_duration`): the setting of the test above with no hold given
/// and each version named. decode0 crashes at 20 s; C's source (held at s,
/// accepted by decode0 at once) had heartbeats every 30/6 = 5 s until the
/// crash, the last at s + 15 s, so it lapses at max(s + 30, s + 15 + 20) =
/// s + 35 s: 20 s after the last heartbeat.
///
/// And a decode rank that is alive but backed up never lets a source
/// lapse: without the crash and with 100 ms decode steps, A decodes its 550
/// tokens for 55 s, growing to cdiv(1,550, 16) = 97 of decode0's 100
/// blocks, while C's reservation (63 blocks) waits behind it; 55 s > 30 s,
/// and C still completes.
#[test]
fn every_release_holds_sources_under_a_30_s_lease() {
    let model = linear_spec(32_768);
    for version in ["0.31.0", "0.32.0", "0.33.0"] {
        for crash in [true, false] {
            // Without the crash, 100 ms decode steps: A decodes for 55 s.
            let step_us = if crash { 50_000.0 } else { 100_000.0 };
            let mut spec =
                pd(role(1, 10_000, linear_step(2_000.0, 1.0, 0.0)), role(2, 100, linear_step(step_us, 0.0, 0.0)), 50.0);
            spec.vllm_version = Some(version.into());
            if crash {
                spec.faults.decode_crashes = vec![CrashSpec { rank: 0, at_s: 20.0 }];
            }
            let out = run(&model, &spec, vec![req(0, 1_000, 550), req(0, 1_000, 10), req(0, 1_000, 10)]);
            assert_eq!(out.violations, Vec::<String>::new());
            let r = &out.records;
            let p = out.ranks.iter().find(|k| k.role == Role::Prefill).unwrap().sources.unwrap();
            let s = r[2].t.prefill_done.unwrap();
            if crash {
                assert_eq!(r[2].outcome, Outcome::Failed(FailReason::DecodeCrashed), "{version}");
                assert_eq!(out.final_time, s.saturating_add(SimDuration::from_secs(35)), "{version}");
                assert_eq!((p.held, p.released, p.expired), (3, 2, 1), "{version}");
            } else {
                assert!(r.iter().all(|x| x.outcome == Outcome::Completed), "{version}");
                let waited = r[2].t.reserved.unwrap().saturating_since(s);
                assert!(waited > SimDuration::from_secs(45), "{version}: C waited {waited:?} for its reservation");
                assert_eq!((p.held, p.released, p.expired), (3, 3, 0), "{version}");
            }
        }
    }
}

/// With every decode rank down, a request whose prefill ends fails at once
/// and its source is cancelled.
#[test]
fn with_every_decode_rank_down_sources_are_cancelled() {
    let model = linear_spec(32_768);
    let mut spec =
        pd(role(1, 10_000, linear_step(2_000.0, 1.0, 0.0)), role(2, 100, linear_step(5_000.0, 0.0, 0.0)), 50.0);
    spec.vllm_version = None;
    spec.faults.decode_crashes = vec![CrashSpec { rank: 0, at_s: 1.0 }, CrashSpec { rank: 1, at_s: 2.0 }];
    let out = run(&model, &spec, vec![req(0, 100, 5), req(3_000_000_000, 100, 5)]);
    assert_eq!(out.violations, Vec::<String>::new());
    assert_eq!(out.records[0].outcome, Outcome::Completed);
    assert_eq!(out.records[1].outcome, Outcome::Failed(FailReason::NoDecodeRank));
    let p = out.ranks.iter().find(|k| k.role == Role::Prefill).unwrap().sources.unwrap();
    assert_eq!((p.held, p.released, p.cancelled), (2, 1, 1));
}

/// A crash due after every request has ended is dropped: it would affect
/// nothing, and would only stretch the run (and thin every utilisation).
#[test]
fn a_crash_after_the_workload_does_not_stretch_the_run() {
    let model = linear_spec(32_768);
    let mut spec =
        pd(role(1, 10_000, linear_step(2_000.0, 1.0, 0.0)), role(1, 100, linear_step(5_000.0, 0.0, 0.0)), 50.0);
    spec.vllm_version = None;
    spec.faults.decode_crashes = vec![CrashSpec { rank: 0, at_s: 1_000.0 }];
    let out = run(&model, &spec, vec![req(0, 100, 5)]);
    assert_eq!(out.records[0].outcome, Outcome::Completed);
    assert_eq!(Some(out.final_time), out.records[0].t.finished);
}

/// Seeded whole runs with caches that fill (prompts named in part, in
/// whole or not at all, shared by 2 to 6 groups), aggregated and P/D, pools
/// of 700 to 6,000 blocks, arrivals from 5 to 60 a second: the decoding
/// set's runs, which evict ahead of their steps and undo that when cut,
/// give what stepping one sequence at a time gives, timelines included.
#[test]
fn runs_that_evict_ahead_match_stepping() {
    for seed in 0..16u64 {
        let mut requests = poisson(100 + seed, 200, [5.0, 20.0, 60.0][seed as usize % 3]);
        for (i, r) in requests.iter_mut().enumerate() {
            r.output = Tokens::new(1 + (i as u64 * 37 + seed) % [50, 300, 700][(seed / 3) as usize % 3]);
            let n = r.prompt.get().div_ceil(16) as usize;
            let shared = match seed % 4 {
                0 => n / 2,
                1 => n,
                2 => 3,
                _ => 0,
            }
            .min(n);
            let named = if seed % 8 == 7 { shared } else { n };
            r.prefix = ids(i as u64 % (2 + seed % 5), shared, i as u64, named);
        }
        let pool = [700u64, 1_500, 3_000, 6_000][(seed / 2) as usize % 4];
        let step = linear_step(6_000.0, 10.0, 0.001);
        let mut d = pd(role(1, 20_000, linear_step(2_000.0, 20.0, 0.0)), role(1, pool, step.clone()), 20.0);
        d.vllm_version = None;
        if seed % 2 == 0 {
            d.aggregated = Some(role(1 + (seed % 3) as u32 / 2, pool, step));
            (d.prefill, d.decode) = (None, None);
        }
        let model = if seed % 6 == 5 {
            d.vllm_version = Some("0.33.0".into());
            d = with_loop(d, seed % 12 == 11);
            spec(vec![fa("full attention", 16, 4_096), window("sliding window", 128, 16, 4_096)])
        } else {
            linear_spec(4_096)
        };
        let mut dep = Deployment::build(&model, &d).unwrap();
        dep.set_keep_timelines(true);
        let fast = sim::run(&dep, input(requests.clone())).unwrap();
        dep.set_lazy_decoding(false);
        let slow = sim::run(&dep, input(requests)).unwrap();
        if let Some(i) = (0..fast.records.len()).find(|&i| fast.records.get(i) != slow.records.get(i)) {
            assert_eq!(fast.records.get(i), slow.records.get(i), "seed {seed}, request {i}");
        }
        assert_eq!((fast.digest, fast.records.len()), (slow.digest, slow.records.len()), "seed {seed}");
        assert_eq!(fast.violations, Vec::<String>::new());
        let pools = |o: &SimOutput| o.ranks.iter().map(|r| (r.evicted_blocks, r.peak_used_blocks)).collect::<Vec<_>>();
        assert_eq!(pools(&fast), pools(&slow), "seed {seed}");
        for (e, (a, b)) in fast.ranks.iter().zip(&slow.ranks).enumerate() {
            let (a, b) = (&a.timeline.samples, &b.timeline.samples);
            if let Some(i) = (0..a.len()).find(|&i| a.get(i) != b.get(i)) {
                assert_eq!(a.get(i), b.get(i), "seed {seed}, rank {e}, row {i}");
            }
            assert_eq!(a.len(), b.len(), "seed {seed}, rank {e}");
        }
        assert!(fast.events < slow.events, "seed {seed}");
    }
}

/// A GLM-like model (state groups with checkpoint blocks, align mode) on
/// aggregated ranks: a step where some members give state blocks back and
/// others take new ones peaks, as stepping one by one notes it, at the
/// largest count after each member's change in running order, not at the
/// count after all of them.
#[test]
fn state_models_peak_where_stepping_peaks() {
    let mut tried = 0;
    for seed in 0..40u64 {
        let mut requests = poisson(300 + seed, 150, [5.0, 20.0, 60.0][seed as usize % 3]);
        for (i, r) in requests.iter_mut().enumerate() {
            r.output = Tokens::new(1 + (i as u64 * 37 + seed) % [50, 300, 700][(seed / 3) as usize % 3]);
            if seed % 2 == 1 {
                let n = r.prompt.get().div_ceil(16) as usize;
                r.prefix = ids(i as u64 % 3, n / 2, i as u64, n);
            }
        }
        let step = linear_step(6_000.0, 10.0, 0.001);
        let mut d = pd(role(1, 20_000, linear_step(2_000.0, 20.0, 0.0)), role(1, 500, step.clone()), 20.0);
        d.aggregated = Some(role(2, [500, 800, 1500][seed as usize % 3], step));
        (d.prefill, d.decode) = (None, None);
        for version in [None, Some("0.33.0")] {
            d.vllm_version = version.map(Into::into);
            let mut dep = Deployment::build(&glm_spec(), &d).unwrap();
            let fast = sim::run(&dep, input(requests.clone())).unwrap();
            dep.set_lazy_decoding(false);
            let slow = sim::run(&dep, input(requests.clone())).unwrap();
            assert_eq!(fast.digest, slow.digest, "seed {seed}, {version:?}");
            let pools =
                |o: &SimOutput| o.ranks.iter().map(|r| (r.evicted_blocks, r.peak_used_blocks)).collect::<Vec<_>>();
            assert_eq!(pools(&fast), pools(&slow), "seed {seed}, {version:?}");
            tried += 1;
        }
    }
    assert_eq!(tried, 80);
}

/// The API server's front end: a request reaches its engine core
/// `request_us` after it arrives, every output reaches its client
/// `response_us` after the engine made it, and in P/D the proxy's hop
/// from the prefill server to the decode server crosses one of each.
///
/// The GLM request of `one_glm_request_is_timed_to_the_nanosecond` with 1 ms
/// in and 2 ms out: queued at 1 ms; the decode rank asked to reserve 3 ms
/// after the prefill's end; the first token 1 + 3 + 2 = 6 ms later than
/// with no front end; the gap between the two tokens unchanged.
#[test]
fn the_front_end_adds_its_way_in_its_way_out_and_the_proxys_hop() {
    let bare = pd(role(1, 64, linear_step(5_000.0, 30.0, 0.0)), role(1, 64, linear_step(10_000.0, 0.0, 0.01)), 1.0);
    let with = DeploymentSpec {
        frontend: FrontEndSpec { request_us: Some(1_000.0), response_us: Some(2_000.0) },
        ..bare.clone()
    };
    let (a, b) = (run(&glm_spec(), &bare, vec![req(0, 1_000, 2)]), run(&glm_spec(), &with, vec![req(0, 1_000, 2)]));
    let (a, b) = (&a.records[0].t, &b.records[0].t);
    let ms = |n: u64| SimDuration::from_millis(n);
    assert_eq!(b.arrival, SimTime::ZERO);
    assert_eq!(b.prefill_queued, Some(SimTime::ZERO + ms(1)));
    assert_eq!(b.prefill_done, Some(a.prefill_done.unwrap() + ms(1)));
    assert_eq!(b.reserve_requested, Some(b.prefill_done.unwrap() + ms(3)));
    for (x, y) in [(a.first_token, b.first_token), (a.last_token, b.last_token), (a.finished, b.finished)] {
        assert_eq!(y.unwrap() - x.unwrap(), ms(6));
    }
    assert_eq!(b.last_token.unwrap() - b.first_token.unwrap(), a.last_token.unwrap() - a.first_token.unwrap());
}

/// A source whose fixed hold runs out while its request crosses the
/// proxy's hop fails the request when it reaches the decode rank: the
/// cancel never overtakes the reservation. The GLM request with 5 ms each
/// way (a 10 ms hop) and a 5 ms hold.
#[test]
fn a_source_that_lapses_during_the_hop_fails_its_request() {
    let mut spec = pd(role(1, 64, linear_step(5_000.0, 30.0, 0.0)), role(1, 64, linear_step(10_000.0, 0.0, 0.01)), 1.0);
    spec.frontend = FrontEndSpec { request_us: Some(5_000.0), response_us: Some(5_000.0) };
    spec.faults.source_hold_s = Some(0.005);
    let out = run(&glm_spec(), &spec, vec![req(0, 1_000, 2)]);
    let Outcome::Failed(reason) = out.records[0].outcome else { panic!("{:?}", out.records[0]) };
    assert_eq!(reason.to_string(), "source hold expired after 5ms without a release from the decode rank");
    let sources = out.ranks[0].sources.unwrap();
    assert_eq!((sources.expired, sources.released, sources.stale), (1, 0, 0));
}

/// A request that arrives within its way through the API server of the end
/// of simulated time (2^62 ns) would reach its engine after it: the run
/// stops there with an error that names the front end.
#[test]
fn an_arrival_at_the_end_of_time_names_the_front_end() {
    let mut spec = pd(role(1, 64, linear_step(5_000.0, 30.0, 0.0)), role(1, 64, linear_step(10_000.0, 0.0, 0.01)), 1.0);
    spec.frontend = FrontEndSpec { request_us: Some(1_000.0), response_us: Some(0.0) };
    let dep = Deployment::build(&glm_spec(), &spec).unwrap();
    let e = sim::run(&dep, input(vec![req((1 << 62) - 10, 100, 2)])).unwrap_err();
    assert!(e.to_string().starts_with("frontend.request_us: the simulated clock would pass"), "{e}");
}

/// A closed-loop client sends its next request when it sees the last one
/// end, one way out through the API server after the engine ended it; the
/// output tokens are counted in 1 s windows at the client's time too.
#[test]
fn a_closed_loop_client_waits_for_the_way_out() {
    let spec = DeploymentSpec {
        prefill: None,
        decode: None,
        aggregated: Some(role(1, 1_000, linear_step(10_000.0, 0.0, 0.0))),
        frontend: FrontEndSpec { request_us: Some(0.0), response_us: Some(1_982_000.0) },
        ..pd(RoleSpec::default(), RoleSpec::default(), 1.0)
    };
    let dep = Deployment::build(&linear_spec(32_768), &spec).unwrap();
    let closed = RunInput { arrivals: ArrivalMode::Closed { concurrency: 1 }, ..input(vec![req(0, 100, 2); 2]) };
    let out = sim::run(&dep, closed).unwrap();
    let (first, second) = (&out.records[0].t, &out.records[1].t);
    let ms = |n: u64| SimTime::ZERO + SimDuration::from_millis(n);
    // Two 10 ms steps: the engine ends the first request at 20 ms, its
    // client sees it 1,982 ms later and sends the second then.
    assert_eq!((first.first_token, first.finished), (Some(ms(1_992)), Some(ms(2_002))));
    assert_eq!(second.arrival, ms(2_002));
    assert_eq!((second.first_token, second.finished), (Some(ms(3_994)), Some(ms(4_004))));
    // The engine made the first request's two tokens in the first second
    // (10 and 20 ms) and the second's in the third (2,012 and 2,022 ms);
    // their clients got them at 1,992, 2,002, 3,994 and 4,004 ms: one in
    // each of four 1 s windows.
    assert_eq!(out.summary.bench.max_output_tokens_per_s, 1.0);
}

/// `scheduler_reserve_full_isl = false` admits a waiting request when its
/// first chunk fits, not only when its whole prompt does.
///
/// B = 16, 24 blocks, a token budget of 64: A (160 tokens, 40 out, 10
/// blocks and growing) runs; B (240 tokens, 15 blocks) arrives at 5 ms,
/// when 13 blocks are free. By default B waits until A has finished; with
/// the option off its first chunk of 64 tokens (4 blocks) starts at once.
#[test]
fn admission_by_the_first_chunk_starts_a_prompt_the_pool_cannot_yet_hold() {
    let run_with = |full_isl: Option<bool>| {
        let mut r = role(1, 24, linear_step(10_000.0, 0.0, 0.0));
        r.max_num_batched_tokens = 64;
        r.scheduler_reserve_full_isl = full_isl;
        let spec = DeploymentSpec {
            prefill: None,
            decode: None,
            aggregated: Some(r),
            ..pd(role(1, 1, linear_step(1.0, 0.0, 0.0)), role(1, 1, linear_step(1.0, 0.0, 0.0)), 1.0)
        };
        let out = run(&linear_spec(32_768), &spec, vec![req(0, 160, 40), req(5_000_000, 240, 2)]);
        assert!(out.records.iter().all(|r| r.outcome == Outcome::Completed), "{:?}", out.records);
        (out.records[0].t, out.records[1].t)
    };
    let (a, b) = run_with(None);
    assert_eq!(run_with(Some(true)), (a, b), "true is the default");
    assert!(b.prefill_started.unwrap() >= a.last_token.unwrap(), "{b:?} {a:?}");
    let (a2, b2) = run_with(Some(false));
    assert!(b2.prefill_started.unwrap() < a2.last_token.unwrap(), "{b2:?} {a2:?}");
}

/// `n` Poisson arrivals from stream `stream` whose rate, output lengths and
/// shared prefixes (three groups of 20 blocks, five of half the prompt, or
/// none) `seed` picks.
fn generated_load(stream: u64, n: usize, seed: u64) -> Vec<RequestSpec> {
    let mut requests = poisson(stream, n, [10.0, 40.0, 80.0][(seed % 3) as usize]);
    for (i, r) in requests.iter_mut().enumerate() {
        r.output = Tokens::new(1 + (i as u64 * 37 + seed) % [50, 300, 700][((seed / 3) % 3) as usize]);
        let nb = r.prompt.get().div_ceil(16) as usize;
        match seed % 4 {
            0 => r.prefix = ids(i as u64 % 3, 20.min(nb), i as u64, nb),
            1 => r.prefix = ids(i as u64 % 5, nb / 2, i as u64, nb),
            _ => {}
        }
    }
    requests
}

/// Runs `requests` on `dep` with the decoding set and stepping every
/// sequence one by one, and checks that both give the same records,
/// digest, pool counts and timelines (row by row, so a failure names the
/// first one that differs), the set in no more events; returns the set's run.
fn fast_matches_stepping(dep: &mut Deployment, requests: Vec<RequestSpec>, case: &str) -> SimOutput {
    dep.set_keep_timelines(true);
    dep.set_lazy_decoding(true);
    let fast = sim::run(dep, input(requests.clone())).unwrap();
    dep.set_lazy_decoding(false);
    let slow = sim::run(dep, input(requests)).unwrap();
    if let Some(i) = (0..fast.records.len()).find(|&i| fast.records.get(i) != slow.records.get(i)) {
        assert_eq!(fast.records.get(i), slow.records.get(i), "{case}, request {i}");
    }
    assert_eq!(fast.digest, slow.digest, "{case}");
    assert_eq!(fast.violations, Vec::<String>::new(), "{case}");
    let pools = |o: &SimOutput| o.ranks.iter().map(|r| (r.evicted_blocks, r.peak_used_blocks)).collect::<Vec<_>>();
    assert_eq!(pools(&fast), pools(&slow), "{case}");
    for (e, (a, b)) in fast.ranks.iter().zip(&slow.ranks).enumerate() {
        let (a, b) = (&a.timeline.samples, &b.timeline.samples);
        if let Some(i) = (0..a.len()).find(|&i| a.get(i) != b.get(i)) {
            assert_eq!(a.get(i), b.get(i), "{case}, rank {e}, row {i}");
        }
    }
    assert!(fast.events <= slow.events, "{case}");
    fast
}

/// Window models under the asynchronous loop, generated: window sizes
/// across and off the block size, window blocks of one and two
/// full-attention blocks, a window-only model, tight to roomy pools, shared
/// prefixes or none, aggregated and on the decode side. The decoding set
/// (whose steps start where the step before started) gives what stepping
/// every sequence gives, preemptions included. Seed 62 is a plan the set
/// tries, then retries one by one: the retry starts each sequence's step
/// where its step that just ended started, not where the abandoned plan
/// put it.
#[test]
fn window_models_under_the_asynchronous_loop_agree_with_stepping_across_loads() {
    let mut preemptions = 0;
    for seed in 56..69u64 {
        let w = [17u64, 33, 40, 100, 128, 257][(seed % 6) as usize];
        let wb = if seed % 5 == 4 { 32 } else { 16 };
        let pool = [250u64, 400, 700, 1_500][((seed / 6) % 4) as usize];
        let aggregated = seed % 2 == 0;
        let requests = generated_load(seed, 150, seed);
        let groups = if seed % 7 == 6 {
            vec![window("sliding window", w, wb, 4_096)]
        } else {
            vec![fa("full attention", 16, 4_096), window("sliding window", w, wb, 4_096)]
        };
        let model = spec(groups);
        let step = linear_step(6_000.0, 10.0, 0.001);
        let mut d = pd(role(1, 20_000, linear_step(2_000.0, 20.0, 0.0)), role(1, pool, step.clone()), 20.0);
        d.vllm_version = Some("0.33.0".into());
        if aggregated {
            d.aggregated = Some(role(1, pool, step));
            (d.prefill, d.decode) = (None, None);
        }
        let d = with_loop(d, true);
        let mut dep = Deployment::build(&model, &d).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        let fast = fast_matches_stepping(&mut dep, requests, &format!("seed {seed}"));
        preemptions += fast.summary.preemptions;
    }
    // The loads reach the pools' limits (the cases are worth comparing).
    assert!(preemptions > 20, "{preemptions} preemptions");
}

/// Mamba hybrids (align mode), generated: a state block of one or two
/// full-attention blocks, with the tail ring or without, chunked prompts
/// (small token budgets), shared prefixes or none, tight to roomy pools,
/// aggregated and on the decode side, under both engine loops. Under the
/// asynchronous one a request whose step before is in flight still holds
/// the state block that step started from (three state blocks in a chunk's
/// step). The decoding set gives what stepping every sequence gives. Seeds
/// 25, 43 and 169 have steps the set must leave to stepping one by one: a
/// prompt still being computed ahead of members in running order, whose
/// chunk the budget binds (vLLM gives it the members' tokens too) or whose
/// blocks preempt a member that had taken its own.
#[test]
fn mamba_models_agree_with_stepping_across_loads() {
    let mut preemptions = 0;
    for seed in (16..32u64).chain([43, 169]) {
        for asynchronous in [true, false] {
            let sb = if seed % 3 == 2 { 32 } else { 16 };
            let pool = [150u64, 300, 600, 1_500][((seed / 4) % 4) as usize];
            let aggregated = seed % 2 == 0;
            let requests = generated_load(500 + seed, 120, seed);
            let mut groups = vec![fa("full attention", 16, 4_096), state("mamba", sb, 4_096, 4_096, true)];
            if seed % 5 == 3 {
                groups.push(state("tail ring", sb, 4_096, 4_096, false));
            }
            let step = linear_step(6_000.0, 10.0, 0.001);
            let mut decode = role(1, pool, step.clone());
            decode.max_num_batched_tokens = [64, 256, 2_048][((seed / 2) % 3) as usize];
            let mut d = pd(role(1, 20_000, linear_step(2_000.0, 20.0, 0.0)), decode.clone(), 20.0);
            d.vllm_version = Some("0.33.0".into());
            if aggregated {
                d.aggregated = Some(decode);
                (d.prefill, d.decode) = (None, None);
            }
            let d = with_loop(d, asynchronous);
            let case = format!("seed {seed}, asynchronous {asynchronous}");
            let mut dep = Deployment::build(&spec(groups), &d).unwrap_or_else(|e| panic!("{case}: {e}"));
            let fast = fast_matches_stepping(&mut dep, requests, &case);
            preemptions += fast.summary.preemptions;
        }
    }
    // The loads reach the pools' limits (the cases are worth comparing).
    assert!(preemptions > 100, "{preemptions} preemptions");
}

/// vLLM's scheduler options, generated: the long-prefill threshold (fixed
/// or adaptive; a capped chunk leaves budget over, so a sequence admitted
/// after it may decode while it still prefills), the watermark,
/// `max_num_active_seqs` and chunked prefill off, on full-attention, window
/// and Mamba models, aggregated and on both sides of P/D, under both
/// engine loops. The decoding set gives what stepping every sequence gives.
#[test]
fn scheduler_options_agree_with_stepping_across_loads() {
    let mut preemptions = 0;
    for seed in 0..18u64 {
        let asynchronous = seed % 2 == 0;
        let groups = match seed % 3 {
            0 => vec![fa("full attention", 16, 4_096)],
            1 => vec![fa("full attention", 16, 4_096), window("sliding window", 100, 16, 4_096)],
            _ => vec![fa("full attention", 16, 4_096), state("mamba", 16, 4_096, 4_096, true)],
        };
        let pool = [200u64, 400, 900][((seed / 3) % 3) as usize];
        let step = linear_step(6_000.0, 10.0, 0.001);
        let mut r = role(1, pool, step);
        r.max_num_batched_tokens = [256, 2_048][((seed / 2) % 2) as usize];
        r.long_prefill_token_threshold = [Some(64), Some(300), None, Some(1_000)][(seed % 4) as usize];
        r.long_prefill_token_threshold_adaptive = (seed % 5 == 1).then_some(true);
        r.watermark = (seed % 3 != 2).then_some([0.01, 0.1][(seed % 2) as usize]);
        r.max_num_active_seqs = (seed % 4 == 1).then_some(12);
        if seed % 6 == 5 {
            r.enable_chunked_prefill = Some(false);
            r.max_num_batched_tokens = 8_192;
            r.max_model_len = Some(Tokens::new(8_192));
        }
        let mut d = pd(r.clone(), r.clone(), 20.0);
        d.vllm_version = Some("0.33.0".into());
        if seed % 4 < 2 {
            d.aggregated = Some(r);
            (d.prefill, d.decode) = (None, None);
        }
        let d = with_loop(d, asynchronous);
        let case = format!("seed {seed}");
        let mut dep = Deployment::build(&spec(groups), &d).unwrap_or_else(|e| panic!("{case}: {e}"));
        let fast = fast_matches_stepping(&mut dep, generated_load(700 + seed, 120, seed), &case);
        preemptions += fast.summary.preemptions;
    }
    // The loads reach the pools' limits (the cases are worth comparing).
    assert!(preemptions > 50, "{preemptions} preemptions");
}
