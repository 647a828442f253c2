//! Running scenarios: one seeded simulation ([`simulate`]), and many at once
//! on worker threads with their results delivered in a fixed order
//! ([`ordered_parallel`]), which is how `pdsim run --replicas` and
//! `pdsim sweep` stay deterministic whatever the number of threads.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use actors::sim::{Deployment, Progress, RunInput, SimError, SimOutput};
use actors::workload::{RequestSource, RequestSpec, WorkloadError};
use sim_core::SimDuration;

use crate::scenario::Scenario;
use crate::workload::{SourceStats, WorkloadSource};

/// Simulated time between two progress callbacks of [`simulate`].
pub const PROGRESS_SLICE: SimDuration = SimDuration::from_secs(1);

/// Why a run failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RunError {
    /// The input is wrong (a deployment the engine refuses, a malformed
    /// trace row met mid-run).
    #[error("{0}")]
    BadInput(String),
    /// pdsim failed on good input.
    #[error("{0}")]
    Internal(String),
}

/// One finished simulation and what it was run with.
#[derive(Debug)]
pub struct Run {
    /// The seed of every random stream.
    pub seed: u64,
    /// The request count that replaced the scenario's, if any.
    pub requests: Option<u64>,
    /// What the simulation produced.
    pub output: SimOutput,
    /// What the workload read and made (trace rows read and skipped).
    pub workload: SourceStats,
    /// Wall-clock time of the simulation (never written to a report file).
    pub wall: Duration,
    /// The run was stopped early by its `stop` flag (requests in flight at
    /// that point failed as unfinished; later ones never entered).
    pub interrupted: bool,
    /// [`Keep::sketch_above`], as the run was made.
    pub sketch_above: Option<u64>,
}

/// Passes requests through and keeps the source's counters where the caller
/// can read them after the engine has consumed the source.
struct Counted {
    inner: WorkloadSource,
    stats: Rc<RefCell<SourceStats>>,
}

impl RequestSource for Counted {
    fn next_request(&mut self) -> Result<Option<RequestSpec>, WorkloadError> {
        let next = self.inner.next_request();
        *self.stats.borrow_mut() = self.inner.stats();
        next
    }
}

/// What a run keeps beyond its summary, and the percentiles its summary's
/// `bench` statistics report: see [`simulate_with`].
pub struct Keep {
    /// The ranks' and links' timelines (off: not stored; nothing else
    /// changes).
    pub timelines: bool,
    /// `None`: every record, in `SimOutput::records`; `Some(sink)`: each
    /// record goes to `sink` in id order as its request ends, and none is
    /// kept.
    pub record_sink: Option<actors::records::RecordSink>,
    /// With `timelines`: `None` keeps the samples in the reports; `Some(make)`
    /// makes, from the entities (name, cache groups; in report order), a
    /// sink that takes them in slices in timeline.csv's order as the run
    /// goes, and none is kept.
    pub sample_sink: Option<SampleSinkFactory>,
    /// The percentiles of the `bench` statistics (`--percentiles`; each
    /// within 0..=100, see [`actors::bench::check_percentiles`]).
    pub percentiles: Vec<f64>,
    /// `--sketch-above N`: each latency statistic keeps N values exactly,
    /// then a quantile sketch, so the summary's memory stops growing
    /// ([`actors::sim::Built::set_exact_latency_limit`]); `None` keeps
    /// every value.
    pub sketch_above: Option<u64>,
}

/// Makes a sample sink from the run's entities: see [`Keep::sample_sink`].
pub type SampleSinkFactory = Box<dyn FnOnce(&[(String, Vec<String>)]) -> actors::sim::SampleSink>;

impl Default for Keep {
    fn default() -> Self {
        Keep {
            timelines: true,
            record_sink: None,
            sample_sink: None,
            percentiles: actors::bench::DEFAULT_PERCENTILES.to_vec(),
            sketch_above: None,
        }
    }
}

/// Runs `scenario` with `seed` (its own seed is ignored), serving `requests`
/// requests when given instead of the scenario's count. `on_progress` is
/// called after every [`PROGRESS_SLICE`] of simulated time; the results do
/// not depend on it. Once `stop` is set (by a Ctrl-C handler), the run ends
/// at the next slice ([`Run::interrupted`]).
///
/// # Errors
/// [`RunError::BadInput`] when the engine refuses the deployment or the
/// workload fails mid-run (a malformed trace row).
pub fn simulate(
    scenario: &Scenario,
    seed: u64,
    requests: Option<u64>,
    on_progress: impl FnMut(Progress),
    stop: &AtomicBool,
) -> Result<Run, RunError> {
    simulate_with(scenario, seed, requests, on_progress, stop, Keep::default())
}

/// [`simulate`], keeping only what `keep` says: a run that streams its
/// records and keeps no timeline holds only what is in flight.
///
/// # Errors
/// As [`simulate`].
pub fn simulate_with(
    scenario: &Scenario,
    seed: u64,
    requests: Option<u64>,
    mut on_progress: impl FnMut(Progress),
    stop: &AtomicBool,
    keep: Keep,
) -> Result<Run, RunError> {
    let start = Instant::now();
    let mut dep = Deployment::build(scenario.model_spec(), scenario.deployment())
        .map_err(|e| RunError::BadInput(format!("{}: {e}", scenario.source())))?;
    dep.set_keep_timelines(keep.timelines);
    let workload = scenario.workload();
    workload
        .check_arrival_span(requests, "the run's request count")
        .map_err(|e| RunError::BadInput(format!("{}: {e}", scenario.source())))?;
    let mut source = workload.source(seed, requests).map_err(|e| RunError::BadInput(e.0))?;
    source.set_file(scenario.source());
    let stats = Rc::new(RefCell::new(source.stats()));
    let input = RunInput {
        seed,
        source: Box::new(Counted { inner: source, stats: Rc::clone(&stats) }),
        arrivals: workload.arrival_mode(),
        max_requests: requests,
        slo: scenario.slo().clone(),
        until: None,
    };
    let sim_error = |e: SimError| match e {
        SimError::Workload(w) => RunError::BadInput(w.0),
        e @ SimError::PastEndOfTime { .. } => RunError::BadInput(format!("{}: {e}", scenario.source())),
    };
    let mut built = actors::sim::build(&dep, input).map_err(sim_error)?;
    built.set_percentiles(&keep.percentiles);
    built.set_exact_latency_limit(keep.sketch_above.map(|n| usize::try_from(n).unwrap_or(usize::MAX)));
    if let Some(sink) = keep.record_sink {
        built.set_record_sink(sink);
    }
    if let Some(make) = keep.sample_sink {
        let sink = make(&built.entities());
        built.set_sample_sink(sink);
    }
    let sketch_above = keep.sketch_above;
    let mut stopped = false;
    let output = built
        .run_in_slices(PROGRESS_SLICE, |p| {
            on_progress(p);
            stopped = stop.load(Ordering::Relaxed);
            !stopped
        })
        .map_err(sim_error)?;
    // A run that ended on its own in its last slice is whole.
    let interrupted = stopped && output.cut_short;
    let workload = stats.borrow().clone();
    Ok(Run { seed, requests, output, workload, wall: start.elapsed(), interrupted, sketch_above })
}

/// Runs `work(i)` for every `i` in `0..count` on `jobs` threads and hands
/// each result to `sink` on the calling thread **in index order**, as soon
/// as every lower index has been handed over (results that arrive early
/// wait in a buffer). Results travel over a crossbeam channel.
///
/// After an error at index `j` (of `work` or of `sink`) no index above `j`
/// is started, but every index below it still runs, so the error returned,
/// that of the lowest failing index, does not depend on `jobs` either.
///
/// # Errors
/// The first error, as above.
pub fn ordered_parallel<T, E>(
    count: usize,
    jobs: usize,
    work: impl Fn(usize) -> Result<T, E> + Sync,
    mut sink: impl FnMut(usize, T) -> Result<(), E>,
) -> Result<(), E>
where
    T: Send,
    E: Send,
{
    let jobs = jobs.clamp(1, count.max(1));
    let next = AtomicUsize::new(0);
    // Indices at or above this are not started (the lowest failure so far).
    let limit = AtomicUsize::new(count);
    let (tx, rx) = crossbeam_channel::unbounded::<(usize, Result<T, E>)>();
    std::thread::scope(|scope| {
        for _ in 0..jobs {
            let tx = tx.clone();
            let (next, limit, work) = (&next, &limit, &work);
            scope.spawn(move || {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= count || i >= limit.load(Ordering::Relaxed) {
                        break;
                    }
                    let result = work(i);
                    if result.is_err() {
                        limit.fetch_min(i, Ordering::Relaxed);
                    }
                    if tx.send((i, result)).is_err() {
                        break;
                    }
                }
            });
        }
        drop(tx);
        let mut pending: BTreeMap<usize, T> = BTreeMap::new();
        let mut first_error: Option<(usize, E)> = None;
        let mut expected = 0;
        for (i, result) in rx {
            match result {
                Ok(value) => {
                    pending.insert(i, value);
                }
                Err(e) => {
                    if first_error.as_ref().is_none_or(|(j, _)| i < *j) {
                        first_error = Some((i, e));
                    }
                }
            }
            // Hand over what is now in order, up to the first error.
            // (A failed index is never in `pending`, so this stops there.)
            while let Some(value) = pending.remove(&expected) {
                if let Err(e) = sink(expected, value) {
                    limit.fetch_min(expected, Ordering::Relaxed);
                    first_error = Some((expected, e));
                    break;
                }
                expected += 1;
            }
        }
        match first_error {
            Some((_, e)) => Err(e),
            None => Ok(()),
        }
    })
}

/// The worker threads to use by default: the machine's available
/// parallelism (1 if unknown).
pub fn default_jobs() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_arrive_in_order_whatever_the_jobs() {
        for jobs in [1, 2, 5] {
            let mut seen = Vec::new();
            ordered_parallel::<_, ()>(
                20,
                jobs,
                |i| {
                    // Later indices finish first.
                    std::thread::sleep(Duration::from_micros(((20 - i) * 50) as u64));
                    Ok(i * 10)
                },
                |i, v| {
                    seen.push((i, v));
                    Ok(())
                },
            )
            .unwrap();
            assert_eq!(seen, (0..20).map(|i| (i, i * 10)).collect::<Vec<_>>());
        }
    }

    #[test]
    fn the_lowest_failing_index_wins() {
        for jobs in [1, 3] {
            let mut seen = Vec::new();
            let r = ordered_parallel(
                10,
                jobs,
                |i| if i == 4 || i == 7 { Err(i) } else { Ok(i) },
                |i, _| {
                    seen.push(i);
                    Ok(())
                },
            );
            assert_eq!(r, Err(4));
            assert_eq!(seen, vec![0, 1, 2, 3]);
        }
    }
}
