//! pdsim's scheduler against vLLM's own, step by step, on the recorded
//! cases of `conformance/cases/` (each `CASE.json` beside `CASE.vllm.jsonl`,
//! the log of vLLM 0.33.0's v1 `Scheduler` driven on CPU; see
//! `conformance/README.md`).
//!
//! A step matches when the same requests are scheduled with the same
//! tokens in the same order, the same ones are preempted, and the same ones
//! finish after it. Cases pdsim does not follow yet are listed, with the
//! vLLM rule that makes the difference, and must still differ: a rule that
//! lands turns its cases identical, and this list shrinks in that commit.

use std::path::{Path, PathBuf};

use actors::steps::{Case, StepLine, run_case};
use serde_json::Value;

/// (case, the vLLM rule pdsim does not follow yet): none today. The last
/// ones were asynchronous Mamba cases, before pdsim freed a state's blocks
/// on the processed-token basis (`crate::vllm::mamba::earlier_states`).
const NOT_YET: &[(&str, &str)] = &[];

/// The decode-side cases (`pd_cases/`) pdsim does not follow yet, with what
/// differs: none today. The last was gen-pd-1664-117, before a Mamba load's
/// count took its Mamba group's own hit (`KvPool::lagging_state`).
const NOT_YET_PD: &[(&str, &str)] = &[];

/// (batch in scheduling order, preempted, finished after, reserved loads of
/// a decode case).
type Step = (Vec<(u64, u64)>, Vec<u64>, Vec<u64>, Option<Vec<u64>>);

fn cases_dir(dir: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../conformance").join(dir)
}

fn ids(v: &Value) -> Vec<u64> {
    let mut out: Vec<u64> = v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).collect();
    out.sort_unstable();
    out
}

/// vLLM's log: `batch` sorted by id, the scheduling order in `order`.
fn vllm_log(path: &Path) -> Vec<Step> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            let batch = v["batch"].as_object().unwrap();
            let order = v["order"].as_array().unwrap();
            let scheduled = order
                .iter()
                .map(|id| {
                    let id = id.as_u64().unwrap();
                    (id, batch[&id.to_string()].as_u64().unwrap())
                })
                .collect();
            let reserved =
                v.get("reserved").map(|r| r.as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).collect());
            (scheduled, ids(&v["preempted"]), ids(&v["finished_after"]), reserved)
        })
        .collect()
}

fn pdsim_log(lines: Vec<StepLine>) -> Vec<Step> {
    lines.into_iter().map(|l| (l.batch, l.preempted, l.finished_after, l.reserved)).collect()
}

/// Recorded case names in `dir`, and the first difference of each from
/// vLLM's log (`None`: identical).
fn compare_dir(dir: &str) -> Vec<(String, Option<String>)> {
    let mut names: Vec<String> = std::fs::read_dir(cases_dir(dir))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter_map(|n| n.strip_suffix(".vllm.jsonl").map(str::to_owned))
        .collect();
    names.sort();
    names
        .into_iter()
        .map(|name| {
            let d = cases_dir(dir);
            let case: Case = serde_json::from_str(&std::fs::read_to_string(d.join(format!("{name}.json"))).unwrap())
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            let ours = pdsim_log(run_case(&case).unwrap_or_else(|e| panic!("{name}: {e}")));
            let theirs = vllm_log(&d.join(format!("{name}.vllm.jsonl")));
            let first = (0..ours.len().max(theirs.len())).find(|&i| ours.get(i) != theirs.get(i));
            let diff = first.map(|i| format!("differs at step {i}: pdsim {:?}, vLLM {:?}", ours.get(i), theirs.get(i)));
            (name, diff)
        })
        .collect()
}

#[test]
fn the_scheduler_matches_vllm_step_for_step_on_the_recorded_cases() {
    let results = compare_dir("cases");
    assert!(results.len() >= 160, "the recorded cases are there: {}", results.len());
    check_against(&results, NOT_YET);
}

/// Every case identical but those listed, which must still differ.
fn check_against(results: &[(String, Option<String>)], not_yet: &[(&str, &str)]) {
    let mut wrong = Vec::new();
    for (name, diff) in results {
        let listed = not_yet.iter().find(|(n, _)| n == name);
        match (diff, listed) {
            (None, None) | (Some(_), Some(_)) => {}
            (Some(d), None) => wrong.push(format!("{name}: {d}")),
            (None, Some((_, rule))) => wrong.push(format!("{name}: now identical; take it off NOT_YET ({rule})")),
        }
    }
    for (listed, _) in not_yet {
        if !results.iter().any(|(n, _)| n == listed) {
            wrong.push(format!("{listed}: listed in NOT_YET but not a recorded case"));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// The decode side of P/D: `conformance/pd_cases/`, vLLM 0.33.0's decode
/// scheduler with its NIXL pull connector (`vllm_pd_steps.py`), where
/// handoffs are reserved in the waiting loop and land `load_steps` calls
/// later, full attention and hybrids (a window, `gen-pd-7-*`; a Mamba
/// state, `gen-pd-8-*`). Every recorded case must be step-identical, the
/// reservations included, but those of [`NOT_YET_PD`].
#[test]
fn the_decode_side_matches_vllm_step_for_step_on_the_recorded_cases() {
    let results = compare_dir("pd_cases");
    assert!(results.len() >= 180, "the recorded decode cases are there: {}", results.len());
    check_against(&results, NOT_YET_PD);
}
