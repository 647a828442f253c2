//! The deployment checks of `actors::validate`, one family per test, through
//! `Deployment::build`: the field each names and its problem.

use actors::config::{CrashSpec, DecodeGrid, DeploymentSpec, LinkSpec, RoleSpec, SloSpec, StepTimeSpec};
use actors::model::{ModelSpec, Role};
use actors::sim::{ConfigError, Deployment, MAX_RANKS};
use actors::units::Tokens;
use actors::validate::{self, FieldError};

use super::model_fixtures::{fa, glm_spec, linear_spec, spec};

fn role() -> RoleSpec {
    RoleSpec {
        tp: Some(1),
        num_blocks: Some(100),
        step_time: StepTimeSpec::Linear {
            fixed_us: 1_000.0,
            per_token_us: 0.0,
            per_seq_us: 0.0,
            per_context_token_us: 0.0,
        },
        ..RoleSpec::default()
    }
}

fn pd() -> DeploymentSpec {
    DeploymentSpec {
        vllm_version: Some("0.32.0".into()),
        prefill: Some(role()),
        decode: Some(role()),
        aggregated: None,
        link: LinkSpec::default(),
        router: Default::default(),
        faults: Default::default(),
        frontend: Default::default(),
        timeline_interval_ms: 100.0,
        check_invariants: false,
        hardware: None,
    }
}

/// The field error `spec` is refused with, on a linear model.
fn refused(spec: &DeploymentSpec) -> FieldError {
    refused_for(&linear_spec(1_024), spec)
}

fn refused_for(model: &ModelSpec, spec: &DeploymentSpec) -> FieldError {
    match Deployment::build(model, spec) {
        Err(ConfigError::Field(e)) => e,
        Err(ConfigError::Gate(g)) => panic!("a gate, not a field: {g}"),
        Ok(_) => panic!("accepted"),
    }
}

fn is(e: FieldError, field: &str, problem: &str) {
    assert_eq!(e.field, field, "{e}");
    assert!(e.problem.contains(problem), "{e} lacks {problem:?}");
}

#[test]
fn valid_deployments_build() {
    assert!(Deployment::build(&linear_spec(1_024), &pd()).is_ok());
    assert!(Deployment::build(&glm_spec(), &pd()).is_ok());
    let agg = DeploymentSpec { prefill: None, decode: None, aggregated: Some(role()), ..pd() };
    assert!(Deployment::build(&linear_spec(1_024), &agg).is_ok());
}

#[test]
fn roles_make_a_topology() {
    is(refused(&DeploymentSpec { decode: None, ..pd() }), "decode", "missing table [decode]");
    is(refused(&DeploymentSpec { prefill: None, ..pd() }), "prefill", "missing table [prefill]");
    is(refused(&DeploymentSpec { prefill: None, decode: None, ..pd() }), "prefill", "an aggregated one");
    is(refused(&DeploymentSpec { aggregated: Some(role()), ..pd() }), "aggregated", "cannot be combined");
}

#[test]
fn role_fields_are_bounded() {
    let with = |f: fn(&mut RoleSpec)| {
        let mut d = pd();
        f(d.decode.as_mut().unwrap());
        d
    };
    is(refused(&with(|r| r.count = 0)), "decode.count", "must be from 1 to 1024, got 0");
    is(refused(&with(|r| r.count = MAX_RANKS + 1)), "decode.count", "got 1025");
    is(refused(&with(|r| r.tp = Some(0))), "decode.tp", "must be >= 1, got 0");
    is(refused(&with(|r| r.num_blocks = Some(0))), "decode.num_blocks", "must be >= 1, got 0");
    is(refused(&with(|r| r.max_num_batched_tokens = 0)), "decode.max_num_batched_tokens", "must be >= 1");
    is(refused(&with(|r| r.max_num_seqs = 0)), "decode.max_num_seqs", "must be >= 1");
    is(refused(&with(|r| r.block_size_tokens = Some(Tokens::ZERO))), "decode.block_size_tokens", "must be >= 1");
    is(refused(&with(|r| r.max_model_len = Some(Tokens::ZERO))), "decode.max_model_len", "must be >= 1");
    let grouped = with(|r| r.block_size_tokens = Some(Tokens::new(16)));
    is(refused_for(&glm_spec(), &grouped), "decode.block_size_tokens", "not allowed with a grouped model");
}

#[test]
fn linear_step_times_are_from_0_to_1e9_us() {
    let with = |fixed_us: f64, per_seq_us: f64| {
        let mut d = pd();
        d.prefill.as_mut().unwrap().step_time =
            StepTimeSpec::Linear { fixed_us, per_token_us: 0.0, per_seq_us, per_context_token_us: 0.0 };
        d
    };
    is(refused(&with(-5.0, 0.0)), "prefill.step_time.fixed_us", "must be >= 0, got -5");
    is(refused(&with(0.0, 2e9)), "prefill.step_time.per_seq_us", "must be at most 1e9 µs");
    is(refused(&with(f64::NAN, 0.0)), "prefill.step_time.fixed_us", "got NaN");
}

#[test]
fn table_step_times_need_increasing_whole_tokens() {
    let with = |points: Vec<[f64; 2]>, per_context_token_us: f64| {
        let mut d = pd();
        d.decode.as_mut().unwrap().step_time = StepTimeSpec::Table { points, per_context_token_us };
        d
    };
    is(refused(&with(vec![], 0.0)), "decode.step_time.points", "at least one");
    is(refused(&with(vec![[-1.0, 5.0]], 0.0)), "decode.step_time.points[0]", "tokens must be >= 0, got -1");
    is(refused(&with(vec![[1.0, 5.0], [8.0, -1.0]], 0.0)), "decode.step_time.points[1]", "time must be >= 0");
    is(refused(&with(vec![[1.0, 5.0], [8.0, 2e9]], 0.0)), "decode.step_time.points[1]", "at most 1e9");
    is(refused(&with(vec![[8.0, 5.0], [8.0, 6.0]], 0.0)), "decode.step_time.points[1]", "strictly increasing");
    // 1.2 and 1.4 increase, but the model keeps whole tokens.
    is(refused(&with(vec![[1.2, 5.0], [1.4, 6.0]], 0.0)), "decode.step_time.points[1]", "rounds to 1");
    is(refused(&with(vec![[1.0, 5.0]], -1.0)), "decode.step_time.per_context_token_us", "must be >= 0");
}

#[test]
fn table2d_step_times_need_increasing_axes_and_a_grid_of_their_shape() {
    let grid = |seqs: Vec<u64>, context: Vec<u64>, us: Vec<Vec<f64>>| DecodeGrid { seqs, context, us };
    let good = || grid(vec![1, 4], vec![512, 1024, 2048], vec![vec![5.0, 6.0, 7.0], vec![8.0, 9.0, 10.0]]);
    let with = |prefill: Vec<[f64; 2]>, self_ns: f64, cached_ns: f64, decode: DecodeGrid| {
        let mut d = pd();
        d.decode.as_mut().unwrap().step_time = StepTimeSpec::Table2d {
            prefill,
            prefill_self_pair_ns: self_ns,
            prefill_cached_pair_ns: cached_ns,
            decode,
            mixed: Default::default(),
        };
        d
    };
    let p = || vec![[1.0, 5.0], [8192.0, 200.0]];
    assert!(Deployment::build(&linear_spec(1_024), &with(p(), 0.778, 0.5, good())).is_ok());
    is(refused(&with(vec![], 0.0, 0.0, good())), "decode.step_time.prefill", "at least one");
    is(refused(&with(vec![[8.0, 5.0], [8.0, 6.0]], 0.0, 0.0, good())), "decode.step_time.prefill[1]", "strictly");
    is(refused(&with(p(), -1.0, 0.0, good())), "decode.step_time.prefill_self_pair_ns", "must be >= 0, got -1");
    is(refused(&with(p(), 0.0, f64::NAN, good())), "decode.step_time.prefill_cached_pair_ns", "got NaN");
    is(refused(&with(p(), 0.0, 2e6, good())), "decode.step_time.prefill_cached_pair_ns", "at most 1e6 ns");
    let mut g = good();
    g.seqs = vec![0, 4];
    is(refused(&with(p(), 0.0, 0.0, g)), "decode.step_time.decode.seqs[0]", "must be >= 1, got 0");
    let mut g = good();
    g.context = vec![512, 512, 2048];
    is(refused(&with(p(), 0.0, 0.0, g)), "decode.step_time.decode.context[1]", "strictly increasing");
    let mut g = good();
    g.context.clear();
    is(refused(&with(p(), 0.0, 0.0, g)), "decode.step_time.decode.context", "at least one value");
    let mut g = good();
    g.us.pop();
    is(refused(&with(p(), 0.0, 0.0, g)), "decode.step_time.decode.us", "has 1 rows, one per seqs value needs 2");
    let mut g = good();
    g.us[1].pop();
    is(refused(&with(p(), 0.0, 0.0, g)), "decode.step_time.decode.us[1]", "has 2 values");
    let mut g = good();
    g.us[1][2] = -3.0;
    is(refused(&with(p(), 0.0, 0.0, g)), "decode.step_time.decode.us[1][2]", "must be >= 0, got -3");
    let mut g = good();
    g.us[0][1] = f64::INFINITY;
    is(refused(&with(p(), 0.0, 0.0, g)), "decode.step_time.decode.us[0][1]", "at most 1e9");
}

#[test]
fn the_link_has_a_positive_bandwidth_and_a_bounded_latency() {
    let with = |bandwidth_gb_s: f64, latency_us: f64| DeploymentSpec {
        link: LinkSpec { bandwidth_gb_s, latency_us, ..LinkSpec::default() },
        ..pd()
    };
    is(refused(&with(0.0, 0.0)), "link.bandwidth_gb_s", "must be > 0, got 0");
    is(refused(&with(1e-12, 0.0)), "link.bandwidth_gb_s", "rounds to 0 bytes per second");
    is(refused(&with(1e30, 0.0)), "link.bandwidth_gb_s", "does not fit");
    is(refused(&with(50.0, -1.0)), "link.latency_us", "must be >= 0, got -1");
    is(refused(&with(50.0, 1e300)), "link.latency_us", "must be at most 1e9 µs");
}

#[test]
fn faults_are_bounded_and_name_real_ranks() {
    let with = |f: fn(&mut DeploymentSpec)| {
        let mut d = pd();
        f(&mut d);
        d
    };
    is(refused(&with(|d| d.faults.decode_abort_probability = 1.5)), "faults.decode_abort_probability", "[0, 1]");
    is(refused(&with(|d| d.faults.source_hold_s = Some(0.0))), "faults.source_hold_s", "from 1e-9 to 1e7");
    is(refused(&with(|d| d.faults.source_lease_s = Some(1e-9))), "faults.source_lease_s", "from 1e-6 to 1e7");
    is(
        refused(&with(|d| {
            d.faults.source_hold_s = Some(10.0);
            d.faults.source_lease_s = Some(30.0);
        })),
        "faults.source_lease_s",
        "not both",
    );
    let crash = |rank, at_s| vec![CrashSpec { rank: 0, at_s: 1.0 }, CrashSpec { rank, at_s }];
    let mut d = pd();
    d.faults.decode_crashes = crash(1, 1.0);
    is(refused(&d), "faults.decode_crashes[1].rank", "decode ranks are 0..1, got 1");
    d.faults.decode_crashes = crash(0, -1.0);
    is(refused(&d), "faults.decode_crashes[1].at_s", "must be from 0 to 1e6 seconds, got -1");
    let mut agg = DeploymentSpec { prefill: None, decode: None, aggregated: Some(role()), ..pd() };
    agg.faults.decode_crashes = crash(0, 1.0);
    is(refused(&agg), "faults.decode_crashes[0].rank", "there are no decode ranks");
}

#[test]
fn the_timeline_interval_is_bounded() {
    for ms in [0.0, -1.0, 1e10, f64::INFINITY] {
        is(refused(&DeploymentSpec { timeline_interval_ms: ms, ..pd() }), "timeline_interval_ms", "1e-6 to 1e9 ms");
    }
}

#[test]
fn byte_counts_fit_64_bits_and_groups_are_few() {
    let mut d = pd();
    d.decode.as_mut().unwrap().num_blocks = Some(u64::MAX);
    is(refused(&d), "decode.num_blocks", "overflow 64 bits");
    is(refused_for(&linear_spec(u64::MAX / 8), &pd()), "model.kv_bytes_per_token", "overflows 64 bits");
    let many = spec((0..17).map(|i| fa(&format!("g{i}"), 16, 1_024)).collect());
    let agg = DeploymentSpec { prefill: None, decode: None, aggregated: Some(role()), ..pd() };
    is(refused_for(&many, &agg), "model.cache_groups", "17 groups; pdsim supports at most 16");
}

#[test]
fn model_gates_keep_their_own_error() {
    let d = DeploymentSpec { vllm_version: None, ..pd() };
    match Deployment::build(&glm_spec(), &d) {
        Err(ConfigError::Gate(g)) => assert_eq!((g.role, g.field()), (Role::Prefill, "vllm_version")),
        other => panic!("expected the version gate, got {other:?}"),
    }
}

#[test]
fn slo_bounds_are_positive() {
    assert_eq!(validate::slo(&SloSpec::default()), Ok(()));
    let e = validate::slo(&SloSpec { tpot_ms: Some(0.0), ..SloSpec::default() }).unwrap_err().under("slo");
    assert_eq!(e.to_string(), "slo.tpot_ms: must be > 0, got 0");
}

/// Heterogeneous TP: the sizes must divide one another, and the model must
/// say at which TP size its bytes are given, with the heads to derive
/// others; a group whose heads cannot be sharded is named.
#[test]
fn tp_sizes_the_model_cannot_be_sharded_to_are_refused() {
    let with_tp = |p: u32, d: u32| {
        let mut s = pd();
        s.prefill.as_mut().unwrap().tp = Some(p);
        s.decode.as_mut().unwrap().tp = Some(d);
        s
    };
    // No reference tp: equal sizes only (the bytes are the ranks' own).
    assert!(Deployment::build(&linear_spec(1_024), &with_tp(4, 4)).is_ok());
    is(refused(&with_tp(4, 8)), "decode.tp", "8 differs from prefill.tp 4: heterogeneous TP needs the model's tp");
    // With one: sizes that divide one another, and the heads to derive them.
    let mut llama = linear_spec(32_768);
    llama.tp = Some(4);
    llama.kv_heads = Some(8);
    is(refused_for(&llama, &with_tp(4, 6)), "decode.tp", "6 and prefill.tp 4 must divide one another");
    assert!(Deployment::build(&llama, &with_tp(4, 8)).is_ok());
    assert!(Deployment::build(&llama, &with_tp(8, 2)).is_ok());
    // 8 KV heads at TP 16: replicated (16 % 8 = 0); at TP 3 neither divides.
    assert!(Deployment::build(&llama, &with_tp(16, 16)).is_ok());
    llama.kv_heads = None;
    is(refused_for(&llama, &with_tp(4, 8)), "model.kv_heads", "missing: needed to derive the bytes at tp 8 from tp 4");
    let mut glm = glm_spec();
    glm.tp = Some(4);
    is(refused_for(&glm, &with_tp(4, 8)), "model.cache_groups[0].heads", "missing");
    for g in &mut glm.cache_groups {
        g.heads = Some(if g.prefix_cacheable == Some(true) && g.kind == actors::model::CacheGroupKind::State {
            64
        } else {
            1
        });
    }
    assert!(Deployment::build(&glm, &with_tp(4, 8)).is_ok());
    // Zero TP sizes and heads are refused, naming the field.
    let mut zero = glm.clone();
    zero.tp = Some(0);
    is(refused_for(&zero, &pd()), "model.tp", "must be >= 1");
    let mut zero = glm.clone();
    zero.cache_groups[1].heads = Some(0);
    is(refused_for(&zero, &pd()), "model.cache_groups[1].heads", "must be >= 1");
    // A Mamba-type state of 64 heads does not split across 128 ranks.
    is(refused_for(&glm, &with_tp(4, 128)), "model.cache_groups[2].heads", "64 heads cannot be split across tp 128");
}

#[test]
fn the_kv_overlap_weight_is_a_finite_number_at_least_0() {
    let mut s = pd();
    s.router.kv_overlap_weight = Some(-1.0);
    is(refused(&s), "router.kv_overlap_weight", "must be a finite number >= 0, got -1");
    s.router.kv_overlap_weight = Some(f64::NAN);
    is(refused(&s), "router.kv_overlap_weight", "got NaN");
    s.router.kv_overlap_weight = Some(0.0);
    assert!(Deployment::build(&linear_spec(1_024), &s).is_ok());
}
