//! The scenario loader as a library: includes and their override rule,
//! resolution of trace paths, the embedded default, overrides for sweeps,
//! and the parts of an error.

use actors::config::Policy;
use actors::model::Role;
use pdsim::scenario::{self, DEFAULT_SCENARIO_LABEL};
use pdsim::workload::ArrivalSpec;

use crate::common::{base_scenario, base_with_line, fixture, scenario_file, scratch};

#[test]
fn default_is_embedded_and_equals_the_file() {
    let embedded = scenario::load_default().unwrap();
    let file = scenario::load(scenario_file("default.toml")).unwrap();
    assert_eq!(embedded.source(), DEFAULT_SCENARIO_LABEL);
    assert_eq!(embedded.to_toml().unwrap(), file.to_toml().unwrap());
    assert_eq!(embedded.name(), Some("default"));
    // default.toml → llama-3.1-8b-1p1d.toml → the llama-3.1-8b preset on
    // the h200 preset.
    assert_eq!(embedded.model().name(), Some("llama-3.1-8b"));
    assert_eq!(embedded.model_origin(), Some("preset llama-3.1-8b"));
    assert_eq!(embedded.deployment().hardware.as_ref().unwrap().gpu.as_deref(), Some("h200"));
    assert_eq!(embedded.workload().requests(), Some(2000));
    assert!(!embedded.model().is_mamba_type());
    assert_eq!(embedded.vllm_version(Role::Decode), None);
}

#[test]
fn an_including_file_replaces_whole_top_level_tables() {
    // Include the 1P1D scenario and replace [decode] only: the new [decode]
    // has no max_num_seqs, so it gets the default (256) even though the
    // included one set it too; [prefill] and the rest are inherited.
    let path = scenario_file("glm-5.3-flash-1p1d.toml");
    let text = format!(
        "include = [{:?}]\nseed = 7\n\n[decode]\ncount = 3\nnum_blocks = 500\nmax_num_batched_tokens = 1024\n\
         step_time = {{ kind = \"linear\", fixed_us = 1.0 }}\n",
        path.to_str().unwrap()
    );
    let s = scenario::load(scratch("override-decode.toml", &text)).unwrap();
    let d = s.deployment();
    assert_eq!(s.seed(), 7);
    assert_eq!(d.decode.as_ref().unwrap().count, 3);
    assert_eq!(d.decode.as_ref().unwrap().num_blocks, Some(500));
    assert_eq!(d.decode.as_ref().unwrap().max_num_seqs, 256);
    assert_eq!(d.decode.as_ref().unwrap().tp, None, "tp = 4 of the included [decode] is not merged");
    assert_eq!(d.prefill.as_ref().unwrap().num_blocks, Some(3066));
    assert_eq!(s.name(), Some("glm-5.3-flash-1p1d"));
}

#[test]
fn a_later_include_replaces_an_earlier_one() {
    let a = scratch("inc-a.toml", "seed = 11\n[router]\nprefill_policy = \"kv_aware\"\n");
    let b = scratch("inc-b.toml", "seed = 22\n");
    let text = base_with_line(
        2,
        &format!(
            "include = [{:?}, {:?}, {:?}]",
            scenario_file("models/glm-5.3-flash-tp4-fp8.toml").to_str().unwrap(),
            a.to_str().unwrap(),
            b.to_str().unwrap()
        ),
    );
    let s = scenario::load(scratch("inc-both.toml", &text)).unwrap();
    assert_eq!(s.seed(), 22);
    assert_eq!(s.deployment().router.prefill_policy, Policy::KvAware);
}

#[test]
fn a_single_include_may_be_a_string() {
    let text = base_with_line(
        2,
        &format!("include = {:?}", scenario_file("models/glm-5.3-flash-tp4-fp8.toml").to_str().unwrap()),
    );
    assert!(scenario::load(scratch("inc-string.toml", &text)).is_ok());
}

#[test]
fn trace_paths_resolve_against_the_file_that_names_them() {
    let s = scenario::load(fixture("trace-mooncake-skip.toml")).unwrap();
    let trace = s.workload().trace.as_ref().unwrap();
    assert!(trace.path.ends_with("tests/fixtures/traces/mooncake-truncated.jsonl"), "{}", trace.path.display());
    assert!(trace.path.is_file());
    // A trace workload with no arrival replays its timestamps.
    assert_eq!(s.workload().arrival, None);
    assert_eq!(s.workload().requests(), None);
}

#[test]
fn missing_trace_file_is_an_error_at_the_path_field() {
    let text = base_scenario().replace(
        "requests = 10\narrival = { kind = \"poisson\", rate_per_s = 4.0 }\nprompt_tokens = { kind = \"fixed\", value = 100 }\noutput_tokens = { kind = \"fixed\", value = 10 }\n",
        "trace = { format = \"azure\", path = \"no-such-trace.csv\" }\n",
    );
    let err = scenario::load(scratch("missing-trace.toml", &text)).unwrap_err();
    assert_eq!(err.line(), Some(14));
    assert_eq!(err.field(), Some("workload.trace.path"));
    assert!(err.message().contains("cannot open"), "{err}");
    assert!(err.message().contains("no-such-trace.csv"), "{err}");
    // A header without the needed column.
    let text = base_scenario().replace(
        "requests = 10\narrival = { kind = \"poisson\", rate_per_s = 4.0 }\nprompt_tokens = { kind = \"fixed\", value = 100 }\noutput_tokens = { kind = \"fixed\", value = 10 }\n",
        &format!("trace = {{ format = \"azure\", path = {:?} }}\n", fixture("traces/azure-noheader.csv").to_str().unwrap()),
    );
    let err = scenario::load(scratch("bad-header.toml", &text)).unwrap_err();
    assert!(err.message().contains("azure-noheader.csv:1: azure header lacks column `ContextTokens`"), "{err}");
}

#[test]
fn error_parts_are_available() {
    let path = scratch("parts.toml", &base_with_line(15, "arrival = { kind = \"gamma\", rate_per_s = 2.0, cv = -1 }"));
    let err = scenario::load(&path).unwrap_err();
    assert_eq!(err.file(), path.to_str().unwrap());
    assert_eq!(err.line(), Some(15));
    assert_eq!(err.field(), Some("workload.arrival.cv"));
    assert_eq!(err.message(), "must be > 0, got -1");
    assert_eq!(err.to_string(), format!("{}:15: workload.arrival.cv: must be > 0, got -1", path.display()));
}

#[test]
fn overrides_make_sweep_points() {
    let s = scenario::load(scenario_file("glm-5.3-flash-1p1d.toml")).unwrap();
    let t = s
        .with_overrides(&[
            ("decode.count", toml::Value::Integer(3)),
            ("link.bandwidth_gb_s", toml::Value::Float(25.0)),
            ("workload.arrival.rate_per_s", toml::Value::Float(6.5)),
            ("seed", toml::Value::Integer(9)),
        ])
        .unwrap();
    assert_eq!(t.deployment().decode.as_ref().unwrap().count, 3);
    assert_eq!(t.deployment().link.bandwidth_gb_s, 25.0);
    assert_eq!(t.workload().arrival, Some(ArrivalSpec::Poisson { rate_per_s: 6.5 }));
    assert_eq!(t.seed(), 9);
    assert_eq!(t.model(), s.model());
    // Every check runs again; the error names the overrides.
    let err = s.with_overrides(&[("link.bandwidth_gb_s", toml::Value::Float(-1.0))]).unwrap_err();
    assert_eq!(err.field(), Some("link.bandwidth_gb_s"));
    assert!(err.file().contains("with link.bandwidth_gb_s = -1.0"), "{err}");
    let err = s.with_overrides(&[("seed.x", toml::Value::Integer(1))]).unwrap_err();
    assert!(err.message().contains("not a table"), "{err}");
    let err = s.with_overrides(&[("decode.cuont", toml::Value::Integer(1))]).unwrap_err();
    assert!(err.message().contains("unknown field `cuont`"), "{err}");
}

#[test]
fn resolved_scenarios_serialize_to_json() {
    let s = scenario::load(scenario_file("mamba2-hybrid-1p1d.toml")).unwrap();
    let v = serde_json::to_value(&s).unwrap();
    // The pool is sized from GPU memory: no num_blocks in the file.
    assert!(v["prefill"]["num_blocks"].is_null(), "{}", v["prefill"]);
    assert_eq!(v["model"]["cache_groups"].as_array().unwrap().len(), 7);
    assert_eq!(v["model"]["arch"]["mamba"]["count"], 24);
    assert_eq!(v["hardware"]["gpu"], "h100-sxm");
    assert_eq!(v["workload"]["arrival"]["kind"], "poisson");
    assert_eq!(v["seed"], 1);
}

/// The shipped pressure scenario pushed past what its decode pool serves
/// (7 requests a second): with seed 1, a preempted 10,292-token recompute
/// at the head of the decode queue once fitted its first 8,192-token chunk
/// but not its second, while 13 landed requests held the rest of the pool
/// and waited behind it for the token budget, and taking it straight back
/// after each preemption repeated for ever. With vLLM's whole-sequence
/// admission a recompute is admitted only once all of it fits, so that
/// loop cannot start. The run is capped at 3,000 simulated seconds (about
/// 2,600 would do), so a return of a loop fails here instead of hanging.
#[test]
fn a_recompute_that_cannot_finish_does_not_starve_the_queue_behind_it() {
    let s = scenario::load(scenario_file("glm-5.3-flash-2p1d-pressure.toml"))
        .unwrap()
        .with_overrides(&[("workload.arrival.rate_per_s", toml::Value::Float(7.0))])
        .unwrap();
    let dep = actors::sim::Deployment::build(s.model_spec(), s.deployment()).unwrap();
    let workload = s.workload();
    let input = actors::sim::RunInput {
        seed: 1,
        source: Box::new(workload.source(1, Some(1_200)).unwrap()),
        arrivals: workload.arrival_mode(),
        max_requests: Some(1_200),
        slo: s.slo().clone(),
        until: Some(sim_core::SimTime::ZERO.saturating_add(sim_core::SimDuration::from_secs(3_000))),
    };
    let out = actors::sim::run(&dep, input).unwrap();
    assert_eq!(out.violations, Vec::<String>::new());
    assert_eq!(out.summary.completed, 1_200, "{:?}", out.summary.failure_reasons);
    assert!(out.summary.preemptions > 0, "the decode pool is under pressure");
}

/// The two decode-side livelocks (each used to run for ever): outputs of
/// 100,000 tokens on the shipped pressure scenario, and a 40-block decode
/// pool with a 0.5 s source hold. Both end by themselves now, every request
/// accounted for: the first with all 19 completed (each fits the pool
/// alone; they take turns), the second with the requests whose source hold
/// ran out while the tiny pool was busy failed with that reason.
#[test]
fn the_decode_livelocks_end() {
    // Both engine loops: the asynchronous one holds a finished request's
    // blocks one schedule call longer, which in a 40-block pool lets fewer
    // through (409 of the tiny pool's requests complete, against 910).
    let runs = [("livelock-long-outputs.toml", 19), ("livelock-tiny-pool.toml", 2_990)];
    for ((file, n), sync) in runs.into_iter().flat_map(|r| [(r, true), (r, false)]) {
        let s = scenario::load(fixture(file)).unwrap();
        let mut spec = s.deployment().clone();
        for role in [&mut spec.prefill, &mut spec.decode].into_iter().flatten() {
            role.async_scheduling = Some(!sync);
        }
        let dep = actors::sim::Deployment::build(s.model_spec(), &spec).unwrap();
        let workload = s.workload();
        // A cap far past either run's end (about 3,300 and 260 simulated
        // seconds), so that a loop fails here instead of hanging.
        let until = sim_core::SimTime::ZERO.saturating_add(sim_core::SimDuration::from_secs(100_000));
        let input = actors::sim::RunInput {
            seed: s.seed(),
            source: Box::new(workload.source(s.seed(), None).unwrap()),
            arrivals: workload.arrival_mode(),
            max_requests: None,
            slo: s.slo().clone(),
            until: Some(until),
        };
        let out = &actors::sim::run(&dep, input).unwrap();
        assert!(!out.cut_short, "{file}: ended by itself");
        assert_eq!(out.violations, Vec::<String>::new(), "{file}");
        assert_eq!(out.records.len(), n, "{file}");
        let failed: u64 = out.summary.failure_reasons.values().sum();
        assert_eq!(out.summary.completed + failed, n as u64, "{file}");
        if file == "livelock-long-outputs.toml" {
            assert_eq!(out.summary.completed, 19, "{:?}", out.summary.failure_reasons);
            assert!(out.summary.preemptions > 0);
        } else {
            let expired = "source hold expired after 500ms without a release from the decode rank";
            assert_eq!(out.summary.failure_reasons.keys().collect::<Vec<_>>(), [expired]);
            let least = if sync { 500 } else { 300 };
            assert!(out.summary.completed > least, "the decode rank keeps serving: {}", out.summary.completed);
        }
    }
}

/// A run whose stop flag is set (as Ctrl-C sets it) ends at its first
/// progress slice, one simulated second in: the requests in flight then
/// fail as unfinished, nothing is lost, and the run says it was stopped.
#[test]
fn a_stop_request_ends_the_run_at_the_next_slice() {
    use std::sync::atomic::AtomicBool;
    let s = scenario::load(scenario_file("glm-5.3-flash-1p1d.toml")).unwrap();
    let stopped = pdsim::runner::simulate(&s, 1, Some(200), |_| {}, &AtomicBool::new(true)).unwrap();
    assert!(stopped.interrupted);
    let out = &stopped.output;
    assert_eq!(out.violations, Vec::<String>::new());
    assert_eq!(out.final_time, sim_core::SimTime::ZERO.saturating_add(pdsim::runner::PROGRESS_SLICE));
    assert!(!out.records.is_empty() && out.records.len() < 200, "{} requests entered", out.records.len());
    assert!(out.summary.failure_reasons.contains_key("still in flight when the simulation ended"));
    let whole = pdsim::runner::simulate(&s, 1, Some(200), |_| {}, &AtomicBool::new(false)).unwrap();
    assert!(!whole.interrupted);
    assert_eq!(whole.output.records.len(), 200);
}

/// A role's `step_time = { file = "…" }` is the `step_time` that file
/// holds (what `pdsim calibrate --out` writes), read relative to the file
/// that names it: the shipped 1P1D scenario's two roles read one table,
/// and give the deployment a copy inline in each role would.
#[test]
fn a_step_time_file_is_read_by_each_role_that_names_it() {
    let s = scenario::load(scenario_file("llama-3.1-8b-1p1d.toml")).unwrap();
    let d = s.deployment();
    let (p, dec) = (d.prefill.as_ref().unwrap(), d.decode.as_ref().unwrap());
    assert_eq!(p.step_time, dec.step_time);
    let table: toml::Table =
        toml::from_str(&std::fs::read_to_string(scenario_file("steptimes/llama-3.1-8b-h200-tp4.toml")).unwrap())
            .unwrap();
    let want: actors::config::StepTimeSpec = table["step_time"].clone().try_into().unwrap();
    assert_eq!(p.step_time, want);
    // The resolved form holds the table itself, and loads back the same.
    let resolved = scratch("steptime-file-resolved.toml", &s.to_toml().unwrap());
    assert!(!std::fs::read_to_string(&resolved).unwrap().contains("file = "));
    assert_eq!(scenario::load(&resolved).unwrap().deployment(), d);
    // The file is among the scenario's inputs.
    assert!(s.inputs().iter().any(|(f, p)| *f == "step_time.file" && p.ends_with("llama-3.1-8b-h200-tp4.toml")));
}

/// What is wrong with a step-time file, placed at the reference.
#[test]
fn a_bad_step_time_file_is_refused_at_the_reference() {
    let table = scratch("st-ok.toml", "# a fit\nstep_time = { kind = \"linear\", fixed_us = 1000 }\n");
    let other = scratch("st-two.toml", "step_time = { kind = \"linear\", fixed_us = 1 }\nseed = 3\n");
    let bad = scratch("st-bad.toml", "step_time = { kind = \"linear\", fixed_us = -1 }\n");
    let dir = table.parent().unwrap();
    assert_eq!((dir, dir), (other.parent().unwrap(), bad.parent().unwrap()));
    let load = |st: &str| {
        let text = base_with_line(7, &format!("step_time = {st}"));
        scenario::load(scratch("st-ref.toml", &text)).map(|s| s.deployment().clone()).map_err(|e| e.to_string())
    };
    let ok = load("{ file = \"st-ok.toml\" }").unwrap();
    assert_eq!(
        ok.prefill.unwrap().step_time,
        load("{ kind = \"linear\", fixed_us = 1000 }").unwrap().prefill.unwrap().step_time
    );
    for (st, want) in [
        ("{ file = \"no-such.toml\" }", "st-ref.toml:7: prefill.step_time.file: cannot read "),
        (
            "{ file = \"st-two.toml\" }",
            "must hold one `step_time = { … }` (what pdsim calibrate --out writes), not seed",
        ),
        ("{ file = \"st-ok.toml\", kind = \"linear\" }", "st-ref.toml:7: prefill.step_time: unknown field `kind`"),
        ("{ file = \"st-bad.toml\" }", "st-bad.toml"),
    ] {
        let e = load(st).unwrap_err();
        assert!(e.contains(want), "{st}: {e}");
    }
}

/// vLLM's scheduler options pdsim does not model are refused by name with
/// vLLM's default and the reason, placed at the field, not reported as an
/// unknown field (a typo) nor ignored.
#[test]
fn unmodelled_vllm_scheduler_options_are_refused_with_the_reason() {
    assert!(base_scenario().lines().nth(7).unwrap().is_empty(), "line 8 is the blank line after [prefill]");
    for o in actors::options::UNMODELLED_SCHEDULER_OPTIONS {
        let path = scratch(&format!("option-{}.toml", o.name), &base_with_line(8, &format!("{} = 2", o.name)));
        let err = scenario::load(&path).unwrap_err();
        assert_eq!(err.line(), Some(8), "{err}");
        assert_eq!(err.field(), Some(format!("prefill.{}", o.name).as_str()), "{err}");
        assert!(err.message().contains("is not modelled"), "{err}");
        assert!(err.message().contains(o.why) && err.message().contains(o.default), "{err}");
    }
    assert_eq!(actors::options::UNMODELLED_SCHEDULER_OPTIONS.len(), 2);
}

/// vLLM's scheduler options pdsim follows are read per role and checked as
/// vLLM checks them, each error placed at its field; the partial-prefill
/// limits, which vLLM 0.33 does not have, are unknown fields.
#[test]
fn modelled_vllm_scheduler_options_are_read_and_checked() {
    let given = "long_prefill_token_threshold = 64\nlong_prefill_token_threshold_adaptive = true\n\
                 watermark = 0.05\nmax_num_active_seqs = 16\nmax_model_len = 4096\nenable_chunked_prefill = false\n\
                 policy = \"priority\"";
    let s = scenario::load(scratch("options-ok.toml", &base_with_line(8, given))).unwrap();
    let p = s.deployment().prefill.as_ref().unwrap();
    let o = p.scheduler_options(p.num_blocks.unwrap());
    assert_eq!(
        (o.long_prefill_token_threshold, o.long_prefill_adaptive, o.max_num_active_seqs, o.chunked_prefill),
        (64, true, Some(16), false)
    );
    assert!(o.priority, "policy = \"priority\"");
    // vLLM's watermark is a share of its blocks, its null block counted:
    // int(0.05 × 101) = 5.
    assert_eq!(o.watermark_blocks, 5);
    let d = s.deployment().decode.as_ref().unwrap();
    assert_eq!(d.scheduler_options(100), actors::options::SchedulerOptions::default());

    for (line, field, want) in [
        ("max_num_active_seqs = 0", "prefill.max_num_active_seqs", "must be from 1 to max_num_seqs (256), got 0"),
        ("max_num_active_seqs = 257", "prefill.max_num_active_seqs", "got 257"),
        ("watermark = 1.0", "prefill.watermark", "must be a share of the pool in [0, 1), got 1"),
        ("enable_chunked_prefill = false", "prefill.enable_chunked_prefill", "false needs a max_model_len"),
        (
            "enable_chunked_prefill = false\nmax_model_len = 10000",
            "prefill.enable_chunked_prefill",
            "max_num_batched_tokens (8192) of at least max_model_len (10000)",
        ),
        (
            "long_prefill_token_threshold = 5000\nmax_model_len = 4096",
            "prefill.long_prefill_token_threshold",
            "must not exceed max_model_len (4096), got 5000",
        ),
        ("max_num_partial_prefills = 2", "prefill.max_num_partial_prefills", "unknown field"),
        ("policy = \"lottery\"", "prefill.policy", "unknown variant `lottery`, expected `fcfs` or `priority`"),
    ] {
        let path = scratch("options-bad.toml", &base_with_line(8, line));
        let err = scenario::load(&path).unwrap_err();
        assert_eq!(err.field(), Some(field), "{line}: {err}");
        assert!(err.message().contains(want), "{line}: {err}");
    }
}

/// `[frontend]`: each field a time in µs from 0 to 10⁹, placed at its line
/// when out of range; a field left out takes the version's (3,600 µs), and
/// the resolved scenario (report.json) says what ran.
#[test]
fn the_front_end_is_read_checked_and_resolved() {
    let text = format!("{}\n[frontend]\nresponse_us = 250.5\n", base_scenario());
    let s = scenario::load(scratch("frontend.toml", &text)).unwrap();
    let f = s.front_end();
    assert_eq!((f.request.as_nanos(), f.response.as_nanos()), (3_600_000, 250_500));
    let v = pdsim::report::resolved_scenario(&s, 1, None);
    assert_eq!(v["frontend"], serde_json::json!({"request_us": 3600.0, "response_us": 250.5}));
    let bad = format!("{}\n[frontend]\nrequest_us = -1\n", base_scenario());
    let path = scratch("frontend-bad.toml", &bad);
    let err = scenario::load(&path).unwrap_err();
    assert_eq!(err.field(), Some("frontend.request_us"), "{err}");
    assert_eq!(err.line(), Some(base_scenario().lines().count() + 3), "{err}");
    assert_eq!(err.message(), "must be >= 0, got -1");
    let typo = format!("{}\n[frontend]\nrequest_ms = 1\n", base_scenario());
    let err = scenario::load(scratch("frontend-typo.toml", &typo)).unwrap_err();
    assert!(err.message().contains("unknown field `request_ms`"), "{err}");
}
