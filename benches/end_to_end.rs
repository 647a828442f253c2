//! Whole runs, reported as simulated requests per second.
//!
//! `cargo bench -p pdsim --bench end_to_end`
//!
//! The cases are in `common/mod.rs` (shared with the test that pins their
//! digests). Throughput counts requests, so criterion's "elem/s" is
//! simulated requests per second.

mod common;

use std::hint::black_box;

use actors::sim::{self, Deployment};
use common::{REQUESTS, cases, workload};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};

fn end_to_end(c: &mut Criterion) {
    // Run after run in one process, as the command line's sweeps do.
    pdsim::heap::keep_slack();
    let mut g = c.benchmark_group("end_to_end");
    g.throughput(Throughput::Elements(REQUESTS));
    g.sample_size(20);
    for (name, model, spec) in cases() {
        let dep = Deployment::build(&model, &spec).expect("valid");
        g.bench_function(name, |b| {
            b.iter(|| {
                let out = sim::run(&dep, workload()).expect("runs");
                assert_eq!(out.summary.completed, REQUESTS);
                black_box(out.digest)
            })
        });
    }
    g.finish();
}

criterion_group!(benches, end_to_end);
criterion_main!(benches);
