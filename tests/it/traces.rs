//! Trace readers on small fixtures: Mooncake, Azure and BurstGPT, with
//! time_scale, limit and skip_malformed.

use std::path::PathBuf;

use actors::workload::{RequestSource, RequestSpec};
use pdsim::trace::{TraceFormat, TraceReader, TraceSpec};

use crate::common::{fixture, outcome, pdsim};

fn spec(format: TraceFormat, file: &str) -> TraceSpec {
    TraceSpec::new(format, fixture(file))
}

fn read_all(spec: &TraceSpec) -> Vec<RequestSpec> {
    let mut r = TraceReader::open(spec, true).unwrap();
    let mut out = Vec::new();
    while let Some(req) = r.next_request().unwrap() {
        out.push(req);
    }
    out
}

fn arrivals_ms(reqs: &[RequestSpec]) -> Vec<f64> {
    reqs.iter().map(|r| r.arrival.as_nanos() as f64 / 1e6).collect()
}

#[test]
fn mooncake_rows_become_requests_with_prefix_ids() {
    let reqs = read_all(&spec(TraceFormat::Mooncake, "traces/mooncake.jsonl"));
    assert_eq!(reqs.len(), 5, "the blank line is not a row");
    assert_eq!(arrivals_ms(&reqs), [0.0, 1000.0, 1000.0, 2500.0, 4000.0]);
    assert_eq!(reqs[2].prompt.get(), 1500);
    assert_eq!(reqs[2].output.get(), 300);
    assert_eq!(reqs[2].prefix.block_tokens.get(), 512);
    assert_eq!(reqs[2].prefix.ids, [0, 1, 3]);
    // Requests 0 and 2 share their first two 512-token blocks.
    assert_eq!(reqs[0].prefix.ids[..2], reqs[2].prefix.ids[..2]);
}

#[test]
fn time_scale_stretches_and_shrinks_gaps() {
    let mut s = spec(TraceFormat::Mooncake, "traces/mooncake.jsonl");
    s.time_scale = 2.0;
    assert_eq!(arrivals_ms(&read_all(&s)), [0.0, 2000.0, 2000.0, 5000.0, 8000.0]);
    s.time_scale = 0.5;
    assert_eq!(arrivals_ms(&read_all(&s)), [0.0, 500.0, 500.0, 1250.0, 2000.0]);
}

#[test]
fn limit_stops_early() {
    let mut s = spec(TraceFormat::Mooncake, "traces/mooncake.jsonl");
    s.limit = Some(2);
    let mut r = TraceReader::open(&s, true).unwrap();
    assert!(r.next_request().unwrap().is_some());
    assert!(r.next_request().unwrap().is_some());
    assert!(r.next_request().unwrap().is_none());
    assert_eq!(r.stats().rows_read, 2, "the reader stops reading at the limit");
}

#[test]
fn malformed_row_is_an_error_with_its_line_or_skipped_and_counted() {
    let s = spec(TraceFormat::Mooncake, "traces/mooncake-truncated.jsonl");
    let mut r = TraceReader::open(&s, true).unwrap();
    assert!(r.next_request().unwrap().is_some());
    assert!(r.next_request().unwrap().is_some());
    let err = r.next_request().unwrap_err().0;
    let want = format!("{}:3: malformed mooncake row: ", s.path.display());
    assert!(err.starts_with(&want), "{err}");
    assert!(err.contains("EOF while parsing"), "{err}");

    let mut s = s;
    s.skip_malformed = true;
    let stats = TraceReader::open(&s, true).unwrap().scan().unwrap();
    assert_eq!(stats.requests, 3);
    assert_eq!(stats.rows_read, 4);
    assert_eq!(stats.skipped_malformed, 1);
    assert!(stats.first_malformed.unwrap().contains("mooncake-truncated.jsonl:3:"));
}

#[test]
fn decreasing_timestamps_are_refused_unless_ignored() {
    let s = spec(TraceFormat::Mooncake, "traces/mooncake-decreasing.jsonl");
    let err = TraceReader::open(&s, true).unwrap().scan().unwrap_err().0;
    assert!(
        err.contains("mooncake-decreasing.jsonl:3: timestamp 2000 ms is earlier than the previous row's 3000 ms"),
        "{err}"
    );
    // A closed loop ignores timestamps: every arrival is 0.
    let mut r = TraceReader::open(&s, false).unwrap();
    let mut n = 0;
    while let Some(req) = r.next_request().unwrap() {
        assert_eq!(req.arrival.as_nanos(), 0);
        n += 1;
    }
    assert_eq!(n, 3);
}

#[test]
fn azure_wall_clock_timestamps_to_the_nanosecond() {
    let reqs = read_all(&spec(TraceFormat::Azure, "traces/azure.csv"));
    // 23:59:59.5 → 23:59:59.53125 → 00:00:00.25 (next day) → 00:00:02.0000001
    let ns: Vec<u64> = reqs.iter().map(|r| r.arrival.as_nanos()).collect();
    assert_eq!(ns, [0, 31_250_000, 750_000_000, 2_500_000_100]);
    assert_eq!(reqs[0].prompt.get(), 4808);
    assert_eq!(reqs[3].output.get(), 251);
    assert!(reqs.iter().all(|r| r.prefix.ids.is_empty()));
}

#[test]
fn azure_bad_rows() {
    let s = spec(TraceFormat::Azure, "traces/azure-bad.csv");
    let err = TraceReader::open(&s, true).unwrap().scan().unwrap_err().0;
    assert!(err.ends_with("azure-bad.csv:4: malformed azure row: ContextTokens: invalid token count `abc`"), "{err}");
    let mut s = s;
    s.skip_malformed = true;
    let stats = TraceReader::open(&s, true).unwrap().scan().unwrap();
    // Line 4 (not a number) and line 5 (2 fields) are skipped.
    assert_eq!((stats.requests, stats.skipped_malformed, stats.rows_read), (3, 2, 5));
    let err = TraceReader::open(&spec(TraceFormat::Azure, "traces/azure-noheader.csv"), true).unwrap_err().0;
    assert!(err.contains("azure-noheader.csv:1: azure header lacks column `ContextTokens`"), "{err}");
}

#[test]
fn burstgpt_skips_failed_requests() {
    let s = spec(TraceFormat::Burstgpt, "traces/burstgpt.csv");
    let mut r = TraceReader::open(&s, true).unwrap();
    let mut reqs = Vec::new();
    while let Some(req) = r.next_request().unwrap() {
        reqs.push(req);
    }
    // Row 2 (0 response tokens) is a failed request: skipped and counted.
    assert_eq!(reqs.len(), 4);
    assert_eq!(r.stats().skipped_failed, 1);
    assert_eq!(r.stats().skipped_malformed, 0);
    // Timestamps in seconds from the first row (5 s): 0, 113, 135, 135.5.
    assert_eq!(arrivals_ms(&reqs), [0.0, 113_000.0, 135_000.0, 135_500.0]);
    assert_eq!(reqs[1].prompt.get(), 417);
    assert_eq!(reqs[1].output.get(), 276);
    // A quoted model name with a comma is one field.
    assert_eq!(reqs[3].prompt.get(), 12);
}

#[test]
fn missing_file_names_the_path() {
    let s = TraceSpec::new(TraceFormat::Mooncake, PathBuf::from("no/such/trace.jsonl"));
    let err = TraceReader::open(&s, true).unwrap_err().0;
    assert!(err.starts_with("cannot open no/such/trace.jsonl: "), "{err}");
}

/// vLLM's timed_trace options map onto the Mooncake reader: the same rows
/// under other names, in seconds, with 512-token chunks, are the same
/// requests; with vLLM's default chunk (16 tokens) the ids cover 16 tokens
/// each.
#[test]
fn timed_trace_rows_are_the_mooncake_rows_they_rename() {
    let mooncake = read_all(&spec(TraceFormat::Mooncake, "traces/mooncake.jsonl"));
    let mut timed = spec(TraceFormat::TimedTrace, "traces/timed-trace.jsonl");
    timed.chunk_hash_size = Some(512);
    timed.label_timestamp = Some("ts".into());
    timed.label_input_length = Some("in".into());
    timed.label_output_length = Some("out".into());
    timed.label_hash_ids = Some("hashes".into());
    assert_eq!(read_all(&timed), mooncake);
    timed.chunk_hash_size = None;
    let reqs = read_all(&timed);
    assert!(reqs.iter().all(|r| r.prefix.block_tokens.get() == 16));
    assert_eq!(reqs[2].prefix.ids, [0, 1, 3]);
    // Timestamps in ms, as Mooncake's: sec_multiplier 0.001.
    timed.sec_multiplier = Some(0.001);
    assert_eq!(arrivals_ms(&read_all(&timed)), [0.0, 1.0, 1.0, 2.5, 4.0]);
}

/// A scenario names them as vLLM's flags do (`chunk_hash_size`,
/// `sec_multiplier`, `label_*`); `validate` reads the whole trace with
/// them, and an option a CSV format cannot take is exit 2 naming it.
#[test]
fn timed_trace_scenarios_validate_and_run() {
    let f = fixture("trace-timed.toml");
    let (code, stdout, stderr) = outcome(&pdsim(&["validate", f.to_str().unwrap()]));
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("5 rows"), "{stdout}");
    let text = std::fs::read_to_string(&f).unwrap().replace(r#"format = "timed_trace""#, r#"format = "azure""#);
    let bad = crate::common::scratch(
        "trace-timed-azure.toml",
        &text
            .replace("../../scenarios", &format!("{}/scenarios", crate::common::root().display()))
            .replace("traces/timed-trace.jsonl", &fixture("traces/timed-trace.jsonl").display().to_string()),
    );
    let (code, _, stderr) = outcome(&pdsim(&["validate", bad.to_str().unwrap()]));
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("workload.trace.chunk_hash_size") && stderr.contains("only the mooncake and timed_trace"),
        "{stderr}"
    );
}

/// vLLM's priority policy on a trace that carries priorities: a burst the
/// rank serves a few at a time, in a pool small enough that decoding
/// requests preempt each other, every other request at priority 0, the
/// rest at 1. Under `policy = "priority"` every priority-0 request has its
/// first token before any priority-1 request (a preempted one goes back
/// ahead of them); under FCFS the two halves interleave.
#[test]
fn a_trace_s_priorities_order_the_queue_under_the_priority_policy() {
    let rows: String = (0..40)
        .map(|i| {
            format!("{{\"timestamp\": 0, \"input_length\": 200, \"output_length\": 20, \"priority\": {}}}\n", i % 2)
        })
        .collect();
    let trace = crate::common::scratch("priority-trace.jsonl", &rows);
    // Per priority: the first tokens' times (ms) and the preemptions.
    let run = |policy: &str| -> [(Vec<f64>, u64); 2] {
        // 200 + 20 tokens take 14 blocks of 16: three such requests fill 40.
        let scenario = format!(
            "[model]\npreset = \"llama-3.1-8b\"\n[hardware]\ngpu = \"h200\"\n\
             [aggregated]\npolicy = \"{policy}\"\nmax_num_seqs = 4\nnum_blocks = 40\n\
             step_time = {{ kind = \"linear\", fixed_us = 1000 }}\n[frontend]\nrequest_us = 0.0\nresponse_us = 0.0\n\
             [workload.trace]\nformat = \"mooncake\"\npath = \"{}\"\n",
            trace.display()
        );
        let file = crate::common::scratch(&format!("priority-{policy}.toml"), &scenario);
        let out_dir = crate::common::scratch_dir(&format!("priority-{policy}"));
        let (code, _, err) = outcome(&pdsim(&[
            "run",
            file.to_str().unwrap(),
            "--out",
            out_dir.to_str().unwrap(),
            "-q",
            "--no-trace",
            "--no-timeline",
            "--no-vllm-bench",
        ]));
        assert_eq!(code, 0, "{err}");
        let csv = crate::common::parse_csv(&std::fs::read_to_string(out_dir.join("requests.csv")).unwrap());
        let col = |name: &str| csv[0].iter().position(|c| c == name).unwrap();
        let (id, ttft, preempted) = (col("id"), col("ttft_ms"), col("preemptions"));
        let mut by: [(Vec<f64>, u64); 2] = Default::default();
        for row in &csv[1..] {
            let p = &mut by[row[id].parse::<usize>().unwrap() % 2];
            p.0.push(row[ttft].parse::<f64>().unwrap());
            p.1 += row[preempted].parse::<u64>().unwrap();
        }
        by
    };
    let max = |v: &[f64]| v.iter().copied().fold(f64::MIN, f64::max);
    let min = |v: &[f64]| v.iter().copied().fold(f64::MAX, f64::min);
    let [high, low] = run("priority");
    assert_eq!((high.0.len(), low.0.len()), (20, 20));
    assert!(high.1 + low.1 > 0, "the pool is small enough to preempt");
    assert!(max(&high.0) < min(&low.0), "priority 0 up to {} ms, priority 1 from {} ms", max(&high.0), min(&low.0));
    let [even, odd] = run("fcfs");
    assert!(even.1 + odd.1 > 0, "the pool is small enough to preempt");
    assert!(min(&odd.0) < max(&even.0), "FCFS interleaves the two");
}
