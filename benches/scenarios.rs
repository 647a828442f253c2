//! Whole scenario runs through the library, as `pdsim run --no-trace
//! --no-timeline` makes them (records streamed as requests end and
//! formatted as requests.csv rows into a scratch buffer, no timeline kept),
//! reported as simulated requests per second (criterion's "elem/s").
//!
//! `cargo bench -p pdsim --bench scenarios`
//!
//! - the shipped `glm-5.3-flash-1p1d`, `llama-3.1-8b-1p1d` and
//!   `llama-3.1-8b-aggregated` scenarios at 20,000 requests each;
//! - `llama-aggregated-mooncake`: the Llama aggregated deployment replaying
//!   the first 2,000 rows of Mooncake's conversation trace with their
//!   512-token `hash_ids` (prefix caching on: the pool's cache is the hot
//!   path), from `benches/scenarios/`.
//!
//! The engine (`cargo bench -p pdsim --bench engine`) and the
//! end-to-end runs of the library alone (`cargo bench -p pdsim --bench
//! end_to_end`) sit beside these.

use std::cell::RefCell;
use std::hint::black_box;
use std::path::Path;
use std::rc::Rc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use pdsim::report::RequestRows;
use pdsim::runner::{self, Keep};
use pdsim::scenario;

/// (name, scenario file from the package root, requests: `None` = all of the trace).
const CASES: [(&str, &str, Option<u64>); 4] = [
    ("glm-5.3-flash-1p1d", "scenarios/glm-5.3-flash-1p1d.toml", Some(20_000)),
    ("llama-3.1-8b-1p1d", "scenarios/llama-3.1-8b-1p1d.toml", Some(20_000)),
    ("llama-3.1-8b-aggregated", "scenarios/llama-3.1-8b-aggregated.toml", Some(20_000)),
    ("llama-aggregated-mooncake", "benches/scenarios/llama-aggregated-mooncake.toml", None),
];

fn scenarios(c: &mut Criterion) {
    // Run after run in one process, as `pdsim` itself keeps its heap.
    pdsim::heap::keep_slack();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let stop = AtomicBool::new(false);
    let mut g = c.benchmark_group("scenarios");
    g.sample_size(10);
    g.measurement_time(Duration::from_secs(10));
    for (name, file, requests) in CASES {
        let s = scenario::load(root.join(file)).expect("a shipped scenario loads");
        let disaggregated = s.deployment().prefill.is_some();
        let once = || {
            let bytes = Rc::new(RefCell::new(0u64));
            let counted = Rc::clone(&bytes);
            let mut rows = RequestRows::new(disaggregated);
            let keep = Keep {
                timelines: false,
                record_sink: Some(Box::new(move |r| *counted.borrow_mut() += rows.row(r).len() as u64)),
                sample_sink: None,
                ..Keep::default()
            };
            let run = runner::simulate_with(&s, s.seed(), requests, |_| {}, &stop, keep).expect("runs");
            assert!(run.output.violations.is_empty(), "{name}: {:?}", run.output.violations);
            black_box(*bytes.borrow());
            run.output.summary.requests
        };
        let n = once();
        g.throughput(Throughput::Elements(n));
        g.bench_function(name, |b| b.iter(|| black_box(once())));
    }
    g.finish();
}

criterion_group!(benches, scenarios);
criterion_main!(benches);
