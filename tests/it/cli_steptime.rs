//! `pdsim steptime`: one step priced by a scenario role's model, as a run
//! builds it, with its terms; the role defaults to the only one; bad counts
//! and a missing role exit 2 naming the flag.

use crate::common::{base_scenario, outcome, pdsim, scenario_file, scratch};

fn steptime(scenario: &str, flags: &[&str]) -> (i32, String, String) {
    let mut args = vec!["steptime", scenario];
    args.extend_from_slice(flags);
    outcome(&pdsim(&args))
}

fn json(scenario: &str, flags: &[&str]) -> serde_json::Value {
    let mut flags = flags.to_vec();
    flags.push("--json");
    let (code, stdout, stderr) = steptime(scenario, &flags);
    assert_eq!(code, 0, "{stderr}");
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{stdout}: {e}"))
}

/// A small aggregated scenario on a table2d step time: prefill 1,024 → 20
/// ms and 8,192 → 200 ms, 0.778 ns a pair of the batch correction, 0.5 ns a
/// cached pair; decode 1 or 3 sequences at 100 or 300 tokens of context.
fn table2d_scenario() -> String {
    let model = scenario_file("models/llama-3.1-8b-tp4.toml");
    let text = format!(
        r#"include = [{model:?}]
vllm_version = "0.32.0"

[aggregated]
num_blocks = 1000
block_size_tokens = 16

[aggregated.step_time]
kind = "table2d"
prefill = [[1024, 20000], [8192, 200000]]
prefill_self_pair_ns = 0.778
prefill_cached_pair_ns = 0.5
decode = {{ seqs = [1, 3], context = [100, 300], us = [[10, 30], [20, 60]] }}

[workload]
requests = 10
arrival = {{ kind = "poisson", rate_per_s = 4.0 }}
prompt_tokens = {{ kind = "fixed", value = 100 }}
output_tokens = {{ kind = "fixed", value = 10 }}
"#
    );
    scratch("steptime-table2d.toml", &text).to_str().unwrap().to_owned()
}

#[test]
fn a_linear_role_prices_a_step_and_names_its_terms() {
    let model = scenario_file("models/llama-3.1-8b-tp4.toml");
    let text = format!(
        "include = [{model:?}]\n\n[aggregated]\nnum_blocks = 1000\nstep_time = {{ kind = \"linear\", fixed_us = 3000.0, \
         per_token_us = 10.0, per_context_token_us = 0.01 }}\n\n[workload]\nrequests = 1\n\
         arrival = {{ kind = \"poisson\", rate_per_s = 1.0 }}\nprompt_tokens = {{ kind = \"fixed\", value = 10 }}\n\
         output_tokens = {{ kind = \"fixed\", value = 1 }}\n"
    );
    let s = scratch("steptime-linear.toml", &text);
    let s = s.to_str().unwrap();
    // 3,000 fixed + 10 × 1,000 tokens + 0.01 × 1,000 tokens of context
    // after the step = 13,010 µs.
    let (code, stdout, stderr) = steptime(s, &["--prefill-tokens", "1000"]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(stdout.lines().next(), Some("13010.000 µs"), "{stdout}");
    assert!(stdout.contains("per_token"), "{stdout}");
    let v = json(s, &["--prefill-tokens", "1000"]);
    assert_eq!(v["step_us"], 13_010.0);
    assert_eq!(v["terms"]["fixed"], 3_000.0);
    assert_eq!(v["terms"]["per_token"], 10_000.0);
    assert_eq!(v["terms"]["per_context_token"], 10.0);
    // A mixed step: 1,000 prefill tokens and 4 decodes on 4,000 of context:
    // 1,004 tokens, 1,000 + 4 × 1,001 = 5,004 after the step:
    // 3,000 + 10,040 + 50.04 = 13,090.04 µs.
    let v = json(s, &["--prefill-tokens", "1000", "--decode-seqs", "4", "--context-tokens", "4000"]);
    assert_eq!(v["step_us"], 13_090.04);
}

#[test]
fn a_table2d_role_prices_prefill_and_decode_apart() {
    let s = table2d_scenario();
    // 8 prompts of 1,024: 200,000 µs less 29,360,128 pairs × 0.778 ns
    // (8,192 × 8,193/2 − 8 × 1,024 × 1,025/2) = 22,842.179584 µs:
    // 177,157.820416 µs, rounded up to the ns.
    let v = json(&s, &["--prefill-tokens", "8192", "--prefill-seqs", "8"]);
    assert_eq!(v["step_us"], 177_157.821);
    assert_eq!(v["terms"]["prefill_table"], 200_000.0);
    assert_eq!(v["terms"]["prefill_batch_correction"], -22_842.179584);
    assert_eq!(v["terms"]["decode_grid"], 0.0);
    // 2 decodes on 400 tokens of context (200 each): halfway between the
    // grid's 20 µs (1 sequence) and 40 µs (3 sequences) at context 200.
    assert_eq!(json(&s, &["--decode-seqs", "2", "--context-tokens", "400"])["step_us"], 30.0);
    // One prompt of 8,192 and a decode at 100: 200,000 + 10 µs.
    let v = json(&s, &["--prefill-tokens", "8192", "--decode-seqs", "1", "--context-tokens", "100"]);
    assert_eq!(v["step_us"], 200_010.0);
    // With no decode, the context is the prefill's cache: 256 tokens on
    // 768, P(256) = 20,000 − 180,000 × 768/7,168 = 714.285715 µs (whole
    // ps) + 256 × 768 × 0.5 ns = 98.304 µs: 812.589715, rounded up.
    let v = json(&s, &["--prefill-tokens", "256", "--context-tokens", "768"]);
    assert_eq!(v["step_us"], 812.59);
    assert_eq!(v["terms"]["prefill_cached_attention"], 98.304);
}

#[test]
fn a_pd_scenario_needs_a_role() {
    let s = scratch("steptime-pd.toml", &base_scenario());
    let s = s.to_str().unwrap();
    let (code, _, stderr) = steptime(s, &["--decode-seqs", "1"]);
    assert_eq!(code, 2);
    assert_eq!(stderr, "pdsim: --role: the scenario has prefill and decode ranks; name one with --role\n");
    let (code, _, stderr) = steptime(s, &["--role", "aggregated", "--decode-seqs", "1"]);
    assert_eq!(code, 2);
    assert_eq!(stderr, "pdsim: --role aggregated: the scenario has no aggregated ranks (it has prefill and decode)\n");
    // The decode role's linear model: 1,000 µs fixed.
    assert_eq!(json(s, &["--role", "decode", "--decode-seqs", "1"])["step_us"], 1_000.0);
}

#[test]
fn impossible_counts_exit_2_naming_the_flag() {
    let s = scenario_file("llama-3.1-8b-aggregated.toml");
    let s = s.to_str().unwrap();
    let refused = |flags: &[&str], want: &str| {
        let (code, _, stderr) = steptime(s, flags);
        assert_eq!(code, 2, "{flags:?}");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(stderr.starts_with(want), "{stderr:?} does not start with {want:?}");
    };
    refused(
        &["--prefill-tokens", "4", "--prefill-seqs", "5"],
        "pdsim: --prefill-seqs: 5 prefill sequences need at least 5 prefill tokens (one each), got 4",
    );
    refused(&["--prefill-tokens", "4", "--prefill-seqs", "0"], "pdsim: --prefill-seqs: must be >= 1");
    refused(&["--context-tokens", "10"], "pdsim: --context-tokens: 10 tokens of context, but the step has no sequence");
    refused(
        &["--decode-seqs", "1", "--context-tokens", "10", "--prefill-cached", "11"],
        "pdsim: --prefill-cached: 11 is more than the 10 context tokens",
    );
    refused(&["--prefill-tokens", "-5"], "pdsim: invalid value '-5' for '--prefill-tokens <N>'");
}

#[test]
fn a_bad_grid_in_a_scenario_names_its_line_and_cell() {
    let text = std::fs::read_to_string(table2d_scenario()).unwrap().replace("[20, 60]", "[20, -60]");
    let path = scratch("steptime-bad-grid.toml", &text);
    let (code, _, stderr) = outcome(&pdsim(&["validate", path.to_str().unwrap()]));
    assert_eq!(code, 2);
    // The decode line is line 13 of the file.
    let want = format!("pdsim: {}:13: aggregated.step_time.decode.us[1][1]: must be >= 0, got -60\n", path.display());
    assert_eq!(stderr, want);
}
