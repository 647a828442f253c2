//! `pdsim run`'s per-request times against vLLM 0.33.0's scheduler driven
//! in simulated time (`conformance/vllm_timed.py`: the engine core's loop,
//! synchronous or with the asynchronous batch queue, a simulated clock and
//! the same `linear` step time; for a 1P1D deployment,
//! `conformance/vllm_pd_timed.py`: a prefill and a decode engine with
//! vLLM's NIXL connector, the proxy between them and pdsim's link), on the
//! recorded cases in `conformance/timed/` (`conformance/record_timed.sh`
//! regenerates them).
//!
//! Each case is a scenario (`NAME.toml`, its requests in `NAME.trace.jsonl`)
//! run as `pdsim run` runs it, and vLLM's times (`NAME.vllm.jsonl`): every
//! request must arrive, get its first token and finish at the same
//! nanosecond, preempted as often.

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;

use pdsim::{runner, scenario};
use serde_json::Value;

use crate::common::root;

/// Cases pdsim does not follow yet, with what differs (none now; an
/// entry here must differ, or the test asks for it to be taken off).
const NOT_YET: &[(&str, &str)] = &[];

fn timed_dir() -> PathBuf {
    root().join("conformance/timed")
}

/// The recorded cases, by name.
fn cases() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(timed_dir())
        .unwrap()
        .filter_map(|e| {
            let name = e.unwrap().file_name().into_string().unwrap();
            name.strip_suffix(".toml").map(str::to_owned)
        })
        .collect();
    names.sort();
    names
}

/// One case's first difference, if any, and its request count.
fn check(name: &str) -> Result<usize, String> {
    let dir = timed_dir();
    let s = scenario::load(dir.join(format!("{name}.toml"))).map_err(|e| e.to_string())?;
    let run = runner::simulate(&s, s.seed(), None, |_| {}, &AtomicBool::new(false)).map_err(|e| e.to_string())?;
    let records = &run.output.records;
    let theirs: Vec<Value> = std::fs::read_to_string(dir.join(format!("{name}.vllm.jsonl")))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    if records.len() != theirs.len() {
        return Err(format!("{} requests in pdsim, {} in vLLM", records.len(), theirs.len()));
    }
    let mut ours: Vec<_> = records.iter().collect();
    ours.sort_by_key(|r| r.id);
    for (r, v) in ours.iter().zip(&theirs) {
        let ns = |t: Option<sim_core::SimTime>| t.map(|t| t.as_nanos());
        let got = [Some(r.t.arrival.as_nanos()), ns(r.t.first_token), ns(r.t.finished), Some(u64::from(r.preemptions))];
        let want = ["arrival_ns", "first_token_ns", "finished_ns", "preemptions"].map(|k| v[k].as_u64());
        if r.id != v["id"].as_u64().unwrap() || got != want {
            return Err(format!(
                "request {}: pdsim {got:?} vLLM {want:?} (arrival, first token, finish, preemptions)",
                r.id
            ));
        }
        // A P/D case (vllm_pd_timed.py): the times on its way too (the
        // reservation only where there was a read: a handoff with nothing
        // to read is only a notification to vLLM's connector).
        if v.get("reserved_ns").is_some() {
            let t = &r.t;
            let read = !v["transfer_done_ns"].is_null();
            let got = [t.prefill_done, t.reserved.filter(|_| read), t.transfer_done, t.decode_started].map(ns);
            let mut want =
                ["prefill_done_ns", "reserved_ns", "transfer_done_ns", "decode_started_ns"].map(|k| v[k].as_u64());
            if !read {
                want[1] = None;
            }
            if got != want {
                return Err(format!(
                    "request {}: pdsim {got:?} vLLM {want:?} (prefill done, reserved, transfer done, decode started)",
                    r.id
                ));
            }
        }
    }
    Ok(theirs.len())
}

#[test]
fn recorded_timed_cases_give_vllms_times_to_the_nanosecond() {
    let names = cases();
    assert!(names.len() >= 30, "the recorded timed cases are missing ({} found)", names.len());
    // (The bar: at least 5,000 requests timed exactly.)
    let mut requests = 0;
    let mut wrong = Vec::new();
    for name in &names {
        let expected_to_differ = NOT_YET.iter().any(|(n, _)| n == name);
        match check(name) {
            Ok(n) if !expected_to_differ => requests += n,
            Ok(_) => wrong.push(format!("{name}: now identical; take it off NOT_YET")),
            Err(e) if !expected_to_differ => wrong.push(format!("{name}: {e}")),
            Err(_) => {}
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    assert!(requests >= 5_000, "only {requests} requests compared");
}
