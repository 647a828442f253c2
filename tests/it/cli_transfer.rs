//! `pdsim transfer`: the worked numbers of SPEC §3 through the command
//! line, the JSON shape, and the flag errors.

use serde_json::Value;

use crate::common::{fixture, outcome, pdsim, scenario_file};

/// Runs `pdsim transfer SCENARIO ARGS --json` and parses its stdout.
fn transfer_json(scenario: &std::path::Path, args: &[&str]) -> Value {
    let s = scenario.to_str().unwrap();
    let mut all = vec!["transfer", s];
    all.extend_from_slice(args);
    all.push("--json");
    let (code, stdout, stderr) = outcome(&pdsim(&all));
    assert_eq!(code, 0, "stderr: {stderr}");
    serde_json::from_str(&stdout).unwrap()
}

fn glm() -> std::path::PathBuf {
    fixture("glm-1gbps.toml")
}

// GLM-5.3-Flash-like at TP 4: a Mamba-type model, so T = N − 1, and
// payload = 13,045,120 × cdiv(N − 1, 2,176) + 36,927,488 (fixed: ring
// 22,528 + 2 × 9,768,960 + 2 × 8,683,520). At 1 GB/s (10^9 bytes/s) with no
// latency, delay in ms = bytes / 10^6.

#[test]
fn glm_worked_numbers_at_one_gb_per_s() {
    // (N, payload, delay ms):
    //   1,000:   cdiv(999, 2,176) = 1   → 13,045,120 + 36,927,488 = 49,972,608
    //   2,177:   cdiv(2,176, 2,176) = 1 → 49,972,608
    //   8,192:   cdiv(8,191, 2,176) = 4 → 52,180,480 + 36,927,488 = 89,107,968
    //   131,072: cdiv(131,071, 2,176) = 61 (60 × 2,176 = 130,560 < 131,071)
    //            → 795,752,320 + 36,927,488 = 832,679,808
    for (n, bytes, ms) in [
        (1_000u64, 49_972_608u64, 49.972608),
        (2_177, 49_972_608, 49.972608),
        (8_192, 89_107_968, 89.107968),
        (131_072, 832_679_808, 832.679808),
    ] {
        let v = transfer_json(&glm(), &["--prompt-tokens", &n.to_string(), "--bandwidth-gb-s", "1"]);
        assert_eq!(v["payload_bytes"], bytes, "N = {n}");
        assert_eq!(v["delay_ms"].as_f64().unwrap(), ms, "N = {n}");
        assert_eq!(v["delay_ns"], bytes, "N = {n}: 1 byte per ns at 1 GB/s");
        assert_eq!(v["transferred_tokens"], n - 1);
        assert_eq!(v["fixed_bytes"], 36_927_488u64);
        assert_eq!(v["units"], "blocks");
        assert_eq!(v["full_decode_hit"], false);
    }
}

#[test]
fn glm_groups_in_model_order() {
    let v = transfer_json(&glm(), &["--prompt-tokens", "8192"]);
    let groups = v["groups"].as_array().unwrap();
    let rows: Vec<(&str, &str, u64, u64)> = groups
        .iter()
        .map(|g| {
            (
                g["name"].as_str().unwrap(),
                g["kind"].as_str().unwrap(),
                g["blocks"].as_u64().unwrap(),
                g["bytes"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        rows,
        [
            ("full attention", "full_attention", 4, 4 * 13_045_120),
            ("tail ring", "state", 1, 22_528),
            ("kda 0", "state", 1, 9_768_960),
            ("kda 1", "state", 1, 9_768_960),
            ("kda 2", "state", 1, 8_683_520),
            ("kda 3", "state", 1, 8_683_520),
        ]
    );
    let sum: u64 = rows.iter().map(|r| r.3).sum();
    assert_eq!(v["payload_bytes"], sum);
    assert!(v.get("tokens").is_none(), "a grouped payload counts blocks, not tokens");
}

#[test]
fn bandwidth_flag_overrides_the_scenario_link() {
    // 49,972,608 bytes at 2 × 10^9 bytes/s = 24,986,304 ns.
    let v = transfer_json(&glm(), &["--prompt-tokens", "1000", "--bandwidth-gb-s", "2"]);
    assert_eq!(v["delay_ns"], 24_986_304u64);
    assert_eq!(v["bandwidth_gb_s"], 2.0);
    // The shipped 1P1D scenario: 50 GB/s and 20 µs latency:
    // 20,000 + 49,972,608 / 50 = 20,000 + 999,452.16 → ceil 999,453 ns.
    let v = transfer_json(&scenario_file("glm-5.3-flash-1p1d.toml"), &["--prompt-tokens", "1000"]);
    assert_eq!(v["delay_ns"], 1_019_453u64);
    assert_eq!(v["latency_us"], 20.0);
}

#[test]
fn decode_prefix_hits() {
    // N = 8,192, K = 4,352 = 2 blocks of 2,176: T = 8,191 needs 4
    // full-attention blocks, 2 are cached, 2 move:
    // 2 × 13,045,120 + 36,927,488 = 63,017,728.
    let v = transfer_json(&glm(), &["--prompt-tokens", "8192", "--decode-cached-tokens", "4352"]);
    assert_eq!(v["payload_bytes"], 63_017_728u64);
    assert_eq!(v["decode_hit_tokens"], 4_352);
    assert_eq!(v["full_decode_hit"], false);
    // N = 4,353: T = 4,352 is exactly 2 blocks; K = 4,352 caches both, so
    // vLLM moves nothing at all (not even the state groups).
    let v = transfer_json(&glm(), &["--prompt-tokens", "4353", "--decode-cached-tokens", "4352"]);
    assert_eq!(v["payload_bytes"], 0);
    assert_eq!(v["fixed_bytes"], 0);
    assert_eq!(v["full_decode_hit"], true);
    assert_eq!(v["delay_ns"], 0);
    // K = N = 2,176: a hit never covers the last prompt token, min(2,176,
    // 2,175) rounds down to 0 blocks, and the whole handoff moves, as
    // vLLM 0.33.0's: 13,045,120 + 36,927,488 = 49,972,608 bytes.
    let v = transfer_json(&glm(), &["--prompt-tokens", "2176", "--decode-cached-tokens", "2176"]);
    assert_eq!((v["decode_hit_tokens"].as_u64(), v["payload_bytes"].as_u64()), (Some(0), Some(49_972_608)));
}

#[test]
fn linear_model_moves_whole_blocks() {
    // Llama-3.1-8B at TP 4: 32,768 bytes per token, blocks of 16. N =
    // 1,000, K = 100: the hit is floor(100 / 16) = 6 blocks, and
    // cdiv(1,000, 16) − 6 = 57 blocks = 912 tokens move: 912 × 32,768 =
    // 29,884,416 bytes; at 50 GB/s plus 20 µs: 20,000 + 597,688.32 → 617,689 ns.
    let v = transfer_json(
        &scenario_file("llama-3.1-8b-1p1d.toml"),
        &["--prompt-tokens", "1000", "--decode-cached-tokens", "100"],
    );
    assert_eq!(v["units"], "tokens");
    assert_eq!(v["groups"].as_array().unwrap().len(), 0);
    assert_eq!((v["tokens"].as_u64(), v["blocks"].as_u64()), (Some(912), Some(57)));
    assert_eq!(v["decode_hit_tokens"], 96);
    assert_eq!(v["transferred_tokens"], 1000);
    assert_eq!(v["payload_bytes"], 29_884_416u64);
    assert_eq!(v["fixed_bytes"], 0);
    assert_eq!(v["delay_ns"], 617_689u64);
}

#[test]
fn sliding_window_model() {
    // gpt-oss-20b: 393,216 bytes per block; N = 1,024 (no Mamba state, so
    // T = N): 64 full-attention blocks + in_window(1,024) = 64 −
    // floor((1,024 − 127) / 16) = 64 − 56 = 8 window blocks. vLLM numbers
    // its groups by their first layer, and layer 0 slides: the window group
    // comes first.
    let v = transfer_json(&scenario_file("gpt-oss-1p1d.toml"), &["--prompt-tokens", "1024"]);
    assert_eq!(v["payload_bytes"], 28_311_552u64);
    assert_eq!(v["groups"][0]["blocks"], 8);
    assert_eq!(v["groups"][1]["blocks"], 64);
    assert_eq!(v["fixed_bytes"], 8 * 393_216u64);
}

#[test]
fn table_output_is_readable() {
    let (code, stdout, _) = outcome(&pdsim(&["transfer", glm().to_str().unwrap(), "--prompt-tokens", "1000"]));
    assert_eq!(code, 0);
    assert!(stdout.contains("49,972,608 bytes"), "{stdout}");
    assert!(stdout.contains("36,927,488"), "{stdout}");
    assert!(stdout.contains("49.972608 ms"), "{stdout}");
    assert!(stdout.contains("kda 3"), "{stdout}");
    assert!(stdout.contains("999 tokens handed off"), "{stdout}");
}

/// Runs `pdsim transfer` expecting exit 2 and one stderr line holding every
/// one of `needles`.
fn refused(args: &[&str], needles: &[&str]) {
    let mut all = vec!["transfer"];
    all.extend_from_slice(args);
    let (code, stdout, stderr) = outcome(&pdsim(&all));
    assert_eq!(code, 2, "args {args:?}: stderr {stderr}");
    assert!(stdout.is_empty(), "{stdout}");
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
    assert!(stderr.starts_with("pdsim: "), "{stderr}");
    for n in needles {
        assert!(stderr.contains(n), "{stderr:?} lacks {n:?}");
    }
}

#[test]
fn bad_flags_exit_2_naming_the_flag() {
    let g = glm();
    let g = g.to_str().unwrap();
    refused(&[g, "--prompt-tokens", "100", "--decode-cached-tokens", "101"], &["--decode-cached-tokens", "101"]);
    refused(&[g, "--prompt-tokens", "0"], &["--prompt-tokens"]);
    refused(&[g, "--prompt-tokens", "-5"], &["--prompt-tokens"]);
    refused(&[g, "--prompt-tokens", "100", "--bandwidth-gb-s", "0"], &["--bandwidth-gb-s", "got 0"]);
    refused(&[g, "--prompt-tokens", "100", "--bandwidth-gb-s", "-1"], &["--bandwidth-gb-s", "got -1"]);
    // Positive, but less than a byte a second.
    refused(&[g, "--prompt-tokens", "100", "--bandwidth-gb-s", "1e-12"], &["--bandwidth-gb-s", "rounds to 0 bytes"]);
    refused(&[g], &["--prompt-tokens"]);
    refused(&["no/such/scenario.toml", "--prompt-tokens", "100"], &["no/such/scenario.toml", "cannot read"]);
}

#[test]
fn heterogeneous_tp_derives_each_ranks_bytes() {
    // The shipped prefill TP 4 / decode TP 8 scenario, N = 1,000 (T = 999):
    // per decode TP rank, the MLA latent and the ring are replicated
    // (13,045,120 and 22,528 bytes a block at any TP), the KDA groups'
    // 64 heads halve: 9,768,960 / 2 = 4,884,480 and 8,683,520 / 2 =
    // 4,341,760. 13,045,120 + 22,528 + 2 x 4,884,480 + 2 x 4,341,760 =
    // 31,520,128 bytes a decode rank. Each prefill rank serves 8 / 4 = 2
    // decode ranks, so its NIC sends 63,040,256 bytes: 20,000 ns +
    // 63,040,256 / 50 = 1,260,805.12 -> 1,280,806 ns.
    let v = transfer_json(&scenario_file("glm-5.3-flash-p4d8.toml"), &["--prompt-tokens", "1000"]);
    let blocks: Vec<u64> = v["groups"].as_array().unwrap().iter().map(|g| g["bytes"].as_u64().unwrap()).collect();
    assert_eq!(blocks, [13_045_120, 22_528, 4_884_480, 4_884_480, 4_341_760, 4_341_760]);
    assert_eq!(v["payload_bytes"], 31_520_128u64);
    assert_eq!((v["prefill_tp"].as_u64(), v["decode_tp"].as_u64()), (Some(4), Some(8)));
    assert_eq!(v["prefill_ranks_read"], 1);
    assert_eq!(v["link_bytes"], 63_040_256u64);
    assert_eq!(v["delay_ns"], 1_280_806u64);
    // Equal TP: the busiest NIC carries one decode rank's bytes.
    let v = transfer_json(&scenario_file("glm-5.3-flash-1p1d.toml"), &["--prompt-tokens", "1000"]);
    assert_eq!((v["payload_bytes"].as_u64(), v["link_bytes"].as_u64()), (Some(49_972_608), Some(49_972_608)));
}
