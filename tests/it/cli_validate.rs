//! `pdsim validate`: every shipped scenario passes and prints a resolved
//! form that loads back; bad input exits 2 with one line naming the file,
//! the line and the field.

use std::path::Path;

use crate::common::{base_scenario, base_with_line, base_with_lines, fixture, outcome, pdsim, scenario_file, scratch};

/// Every scenario shipped in `scenarios/` (model fragments and sweeps live
/// in subfolders), so a new scenario is checked without being listed.
fn shipped() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(scenario_file(""))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".toml"))
        .collect();
    names.sort();
    for expected in
        ["default.toml", "glm-5.3-flash-1p1d.toml", "glm-5.3-flash-2p2d.toml", "llama-3.1-8b-aggregated.toml"]
    {
        assert!(names.iter().any(|n| n == expected), "{expected} is shipped");
    }
    names
}

#[test]
fn every_shipped_scenario_validates_and_its_resolved_form_loads_back() {
    for name in &shipped() {
        let path = scenario_file(name);
        let (code, stdout, stderr) = outcome(&pdsim(&["validate", path.to_str().unwrap()]));
        assert_eq!(code, 0, "{name}: {stderr}");
        assert!(stdout.starts_with("# pdsim validate: "), "{name}: {stdout}");
        let resolved: toml::Table = toml::from_str(&stdout).unwrap();
        assert!(resolved.contains_key("model"), "{name}");
        assert!(resolved.contains_key("workload"), "{name}");
        assert!(!resolved.contains_key("include"), "{name}: includes are resolved");
        // The resolved form is itself a scenario, and resolves to itself.
        // Its paths are relative to the scenario's folder, where it would
        // be saved; the scratch folder reaches the shipped traces the same
        // way.
        let again = scratch(&format!("resolved-{name}"), &stdout);
        let traces = again.parent().unwrap().join("traces");
        if std::fs::symlink_metadata(&traces).is_err() {
            let _ = std::os::unix::fs::symlink(scenario_file("traces"), &traces);
        }
        let (code, stdout2, stderr) = outcome(&pdsim(&["validate", again.to_str().unwrap()]));
        assert_eq!(code, 0, "{name} resolved: {stderr}");
        let body = |s: &str| s.lines().filter(|l| !l.starts_with('#')).collect::<Vec<_>>().join("\n");
        assert_eq!(body(&stdout), body(&stdout2), "{name}");
    }
}

#[test]
fn resolved_form_fills_defaults() {
    let (code, stdout, _) = outcome(&pdsim(&["validate", scenario_file("gpt-oss-1p1d.toml").to_str().unwrap()]));
    assert_eq!(code, 0);
    let t: toml::Table = toml::from_str(&stdout).unwrap();
    // Defaults of actors' DeploymentSpec, written out.
    assert_eq!(t["timeline_interval_ms"].as_float(), Some(100.0));
    assert_eq!(t["router"]["prefill_policy"].as_str(), Some("round_robin"));
    assert_eq!(t["link"]["sharing"].as_str(), Some("processor_sharing"));
    assert_eq!(t["seed"].as_integer(), Some(1));
    assert_eq!(t["prefill"]["prefix_caching"].as_bool(), Some(true));
    // The included model, inlined.
    assert_eq!(t["model"]["cache_groups"].as_array().unwrap().len(), 2);
}

#[test]
fn json_output_parses() {
    let (code, stdout, _) =
        outcome(&pdsim(&["validate", "--json", scenario_file("llama-3.1-8b-aggregated.toml").to_str().unwrap()]));
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(v["aggregated"]["count"], 2);
    assert_eq!(v["model"]["kv_bytes_per_token"], 32_768);
    assert_eq!(v["workload"]["shared_prefix"]["groups"], 16);
}

/// Validates `text` (written as `name`) expecting exit 2 and one stderr
/// line `pdsim: <file>:<line>: <field>: ...` holding `needle`.
fn refused(name: &str, text: &str, line: Option<usize>, field: &str, needle: &str) {
    let path = scratch(name, text);
    refused_file(&path, &path, line, field, needle);
}

/// Validates `path`, expecting the error to name `place` (the file that has
/// the problem) at `line`.
fn refused_file(path: &Path, place: &Path, line: Option<usize>, field: &str, needle: &str) {
    let (code, stdout, stderr) = outcome(&pdsim(&["validate", path.to_str().unwrap()]));
    assert_eq!(code, 2, "{}: stdout {stdout} stderr {stderr}", path.display());
    assert!(stdout.is_empty());
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
    let field = if field.is_empty() { String::new() } else { format!("{field}: ") };
    let at = match line {
        Some(l) => format!("pdsim: {}:{l}: {field}", place.display()),
        None => format!("pdsim: {}: {field}", place.display()),
    };
    assert!(stderr.starts_with(&at), "expected {at:?}, got {stderr:?}");
    assert!(stderr.contains(needle), "{stderr:?} lacks {needle:?}");
}

#[test]
fn the_base_scenario_is_valid() {
    let path = scratch("base.toml", &base_scenario());
    let (code, _, stderr) = outcome(&pdsim(&["validate", path.to_str().unwrap()]));
    assert_eq!(code, 0, "{stderr}");
}

#[test]
fn unknown_fields_are_refused() {
    refused(
        "unknown-role-field.toml",
        &base_with_line(6, "num_blocks = 100\nfrob = 1"),
        Some(7),
        "prefill.frob",
        "unknown field `frob`",
    );
    refused("unknown-top.toml", &base_with_line(1, "nmae = \"x\""), Some(1), "nmae", "unknown field `nmae`");
    refused(
        "unknown-step-field.toml",
        &base_with_line(11, "step_time = { kind = \"linear\", fixed_ms = 1 }"),
        Some(11),
        "decode.step_time",
        "unknown field `fixed_ms`",
    );
    refused(
        "unknown-variant.toml",
        &base_with_line(15, "arrival = { kind = \"poison\", rate_per_s = 4.0 }"),
        Some(15),
        "workload.arrival.kind",
        "unknown variant `poison`",
    );
}

#[test]
fn wrong_types_are_refused() {
    refused(
        "wrong-type.toml",
        &base_with_line(6, "num_blocks = \"many\""),
        Some(6),
        "prefill.num_blocks",
        "invalid type: string",
    );
    refused("negative-u64.toml", &base_with_line(14, "requests = -1"), Some(14), "workload.requests", "-1");
    // A TOML syntax error has a line but no field.
    refused("syntax.toml", &base_with_line(16, "prompt_tokens = { kind = \"fixed\", value = }"), Some(16), "", "");
}

#[test]
fn zero_and_negative_rates_and_sizes_are_refused() {
    for (rate, got) in [("-3", "got -3"), ("0", "got 0"), ("0.0", "got 0")] {
        refused(
            &format!("rate{rate}.toml"),
            &base_with_line(15, &format!("arrival = {{ kind = \"poisson\", rate_per_s = {rate} }}")),
            Some(15),
            "workload.arrival.rate_per_s",
            &format!("must be > 0, {got}"),
        );
    }
    refused(
        "zero-blocks.toml",
        &base_with_line(10, "num_blocks = 0"),
        Some(10),
        "decode.num_blocks",
        "must be >= 1, got 0",
    );
    refused("zero-requests.toml", &base_with_line(14, "requests = 0"), Some(14), "workload.requests", "must be >= 1");
    refused(
        "zero-fixed.toml",
        &base_with_line(17, "output_tokens = { kind = \"fixed\", value = 0 }"),
        Some(17),
        "workload.output_tokens.value",
        "must be >= 1",
    );
    // Lengths no request can hold, or a distribution that cannot be
    // sampled, are refused here rather than when the run draws them.
    refused(
        "huge-fixed.toml",
        &base_with_line(16, "prompt_tokens = { kind = \"fixed\", value = 4294967296 }"),
        Some(16),
        "workload.prompt_tokens.value",
        "4294967296 tokens is more than a request may hold",
    );
    refused(
        "unsampleable.toml",
        &base_with_line(16, "prompt_tokens = { kind = \"lognormal\", mean = 100, std = 1e300 }"),
        Some(16),
        "workload.prompt_tokens.std",
        "cannot be sampled",
    );
    refused(
        "huge-together.toml",
        &base_with_line(16, "prompt_tokens = { kind = \"uniform\", min = 1, max = 4294967290 }"),
        Some(17),
        "workload.output_tokens",
        "up to 4294967290 prompt and 10 output tokens",
    );
    refused(
        "negative-step.toml",
        &base_with_line(7, "step_time = { kind = \"linear\", fixed_us = -5 }"),
        Some(7),
        "prefill.step_time.fixed_us",
        "must be >= 0, got -5",
    );
    refused(
        "table-points.toml",
        &base_with_line(7, "step_time = { kind = \"table\", points = [[1, 100], [512, 300], [256, 400]] }"),
        Some(7),
        "prefill.step_time.points[2]",
        "strictly increasing",
    );
    refused(
        "zero-bandwidth.toml",
        &(base_scenario() + "\n[link]\nbandwidth_gb_s = 0\n"),
        Some(20),
        "link.bandwidth_gb_s",
        "must be > 0, got 0",
    );
    refused(
        "crash-rank.toml",
        &(base_scenario() + "\n[faults]\ndecode_crashes = [{ rank = 1, at_s = 5.0 }]\n"),
        Some(20),
        "faults.decode_crashes[0].rank",
        "decode ranks are 0..1, got 1",
    );
    refused(
        "hold-and-lease.toml",
        &(base_scenario() + "\n[faults]\nsource_hold_s = 10\nsource_lease_s = 30\n"),
        Some(21),
        "faults.source_lease_s",
        "not both",
    );
    refused(
        "tiny-bandwidth.toml",
        &(base_scenario() + "\n[link]\nbandwidth_gb_s = 1e-12\n"),
        Some(20),
        "link.bandwidth_gb_s",
        "rounds to 0 bytes per second",
    );
    refused(
        "uniform-inverted.toml",
        &base_with_line(16, "prompt_tokens = { kind = \"uniform\", min = 10, max = 5 }"),
        Some(16),
        "workload.prompt_tokens.max",
        "must be >= min 10",
    );
}

/// Checks that once only actors made, behind the harness's own
/// (`source_lease_s`, `decode_crashes`, the upper bounds), are the one
/// validator's now, placed at their line.
#[test]
fn checks_once_only_in_actors_name_their_line() {
    refused(
        "lease-range.toml",
        &(base_scenario() + "\n[faults]\nsource_lease_s = 0\n"),
        Some(20),
        "faults.source_lease_s",
        "must be from 1e-6 to 1e7 seconds, got 0",
    );
    refused(
        "hold-range.toml",
        &(base_scenario() + "\n[faults]\nsource_hold_s = 1e8\n"),
        Some(20),
        "faults.source_hold_s",
        "must be from 1e-9 to 1e7 seconds, got 100000000",
    );
    // The second crash, on its own line of the array.
    refused(
        "crash-time.toml",
        &(base_scenario()
            + "\n[faults]\ndecode_crashes = [\n  { rank = 0, at_s = 5.0 },\n  { rank = 0, at_s = -1 },\n]\n"),
        Some(22),
        "faults.decode_crashes[1].at_s",
        "must be from 0 to 1e6 seconds, got -1",
    );
    refused(
        "too-many-ranks.toml",
        &base_with_line(10, "count = 2000\nnum_blocks = 100"),
        Some(10),
        "decode.count",
        "must be from 1 to 1024, got 2000",
    );
    refused(
        "huge-step.toml",
        &base_with_line(7, "step_time = { kind = \"linear\", fixed_us = 2e9 }"),
        Some(7),
        "prefill.step_time.fixed_us",
        "must be at most 1e9 µs (1,000 s), got 2000000000",
    );
    refused(
        "zero-interval.toml",
        &base_with_line(4, "timeline_interval_ms = 0"),
        Some(4),
        "timeline_interval_ms",
        "must be from 1e-6 to 1e9 ms, got 0",
    );
}

#[test]
fn roles_must_make_a_topology() {
    // No [decode]: the error points at [prefill] (line 5).
    refused(
        "no-decode.toml",
        &base_with_lines(&[(9, ""), (10, ""), (11, "")]),
        Some(5),
        "decode",
        "missing table [decode]",
    );
    // [aggregated] beside [prefill]/[decode].
    refused(
        "mixed-topology.toml",
        &(base_scenario() + "\n[aggregated]\nnum_blocks = 10\nstep_time = { kind = \"linear\" }\n"),
        Some(19),
        "aggregated",
        "cannot be combined",
    );
    // block_size_tokens means nothing for a grouped model.
    refused(
        "grouped-block-size.toml",
        &base_with_line(10, "num_blocks = 100\nblock_size_tokens = 16"),
        Some(11),
        "decode.block_size_tokens",
        "grouped model",
    );
}

#[test]
fn model_gates_name_the_model_file_and_group() {
    // A group without transfer_bytes_per_block, in an included fragment:
    // the error names the fragment and the group's [[model.cache_groups]]
    // line (3).
    let model = scratch(
        "model-no-transfer.toml",
        "[model]\nname = \"x\"\n[[model.cache_groups]]\nname = \"fa\"\nkind = \"full_attention\"\n\
         block_size_tokens = 16\npage_bytes = 100\nprefix_cacheable = true\n",
    );
    let text = base_with_line(2, &format!("include = [{:?}]", model.to_str().unwrap()));
    let path = scratch("uses-model-no-transfer.toml", &text);
    refused_file(
        &path,
        &model,
        Some(3),
        "model.cache_groups[0].transfer_bytes_per_block",
        "missing field transfer_bytes_per_block",
    );
    // A model with no groups and no kv_bytes_per_token.
    let model = scratch("model-empty.toml", "# nothing but a name\n[model]\nname = \"x\"\n");
    let text = base_with_line(2, &format!("include = [{:?}]", model.to_str().unwrap()));
    let path = scratch("uses-model-empty.toml", &text);
    refused_file(&path, &model, Some(2), "model.cache_groups", "missing field kv_bytes_per_token or cache_groups");
    // No [model] at all.
    refused("no-model.toml", &base_with_line(2, ""), None, "model", "missing table [model]");
}

#[test]
fn vllm_version_gates() {
    refused(
        "old-version.toml",
        &base_with_line(3, "vllm_version = \"0.20.0\""),
        Some(3),
        "vllm_version",
        "not supported",
    );
    // No version anywhere: placed at [prefill], the first grouped role.
    refused("no-version.toml", &base_with_line(3, ""), Some(5), "prefill.vllm_version", "missing field vllm_version");
    // A role's own version overrides the top-level one.
    refused(
        "role-version.toml",
        &base_with_line(10, "num_blocks = 100\nvllm_version = \"0.1.0\""),
        Some(11),
        "decode.vllm_version",
        "\"0.1.0\" is not supported for a grouped decode rank",
    );
}

#[test]
fn includes_report_where_they_fail() {
    refused(
        "include-missing.toml",
        &base_with_line(2, "include = [\"nowhere/model.toml\"]"),
        Some(2),
        "include[0]",
        "cannot read",
    );
    // a → b → a
    let a = scratch("cycle-a.toml", "include = [\"cycle-b.toml\"]\n");
    scratch("cycle-b.toml", "seed = 3\ninclude = [\"cycle-a.toml\"]\n");
    let b = a.with_file_name("cycle-b.toml");
    refused_file(&a, &b, Some(2), "include[0]", "include cycle");
}

#[test]
fn malformed_trace_row_is_reported_with_its_line() {
    let scenario = fixture("trace-mooncake-truncated.toml");
    let (code, _, stderr) = outcome(&pdsim(&["validate", scenario.to_str().unwrap()]));
    assert_eq!(code, 2, "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("mooncake-truncated.jsonl:3: malformed mooncake row"), "{stderr}");
    // The same trace with skip_malformed: valid, and the skip is counted.
    let (code, stdout, stderr) = outcome(&pdsim(&["validate", fixture("trace-mooncake-skip.toml").to_str().unwrap()]));
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("3 requests from 4 rows (1 malformed rows skipped"), "{stdout}");
}
