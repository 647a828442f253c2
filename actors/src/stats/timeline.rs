//! Exact timelines of the ranks and links.
//!
//! A rank's or a link's timeline is change-driven: a row (time, series,
//! value) for each series at each instant at which its value changed,
//! with the value it had when the instant ended ([`Timeline`]). The value
//! of a series at any time is that of its last row at or before it (every
//! series has a row at time zero), so the rows are the exact step
//! function: time-weighted means over them (occupancy, busy share, KV use)
//! are the exact ones, the last change before an idle period is there, and
//! several changes in one instant give one row with the final value.
//!
//! Where the values come from:
//! - A rank sets every series at the end of each instant it got messages
//!   at (its `Msg::Kick`), and at a crash. A run of pure decode steps is
//!   one event, but its steps change the KV counts (a member crossing a
//!   block boundary): the scheduler keeps the pool's counts after each of
//!   the run's steps that changes them, with the step's start, as it plans
//!   the run (`scheduler::plan`), and the rank writes them as rows once the
//!   steps are known to have happened: at the run's end, or at whatever
//!   cuts it (the steps that a cut drops are dropped from them too). Those
//!   rows are older than the event that writes them, so a rank holds the
//!   run's slice of the log back from its first planned step on until they
//!   are written (`sim` streams out only the rows before the earliest
//!   hold); the held rows are those of a run in flight, bounded by its
//!   length.
//! - A link sets its series after every message it handles.
//!
//! Why change-driven rather than sampled: sampling can only be exact at
//! its sample instants, and a time-weighted mean over samples is not the
//! exact one; the rows a change-driven timeline writes are as few as the
//! changes, and writing them needs no event of its own. Nothing of a run
//! depends on its timeline: the runs of decode steps are not cut at sample
//! times (they were, when a timeline was sampled at `timeline_interval_ms`,
//! which now has no effect), so with the timeline off
//! ([`crate::deploy::sim::Deployment::set_keep_timelines`]) the events, the
//! records and every report number are the same, and no row is stored.
//!
//! What it costs: per instant a rank or link handles, a dozen or so
//! comparisons (and a row per changed series); per planned run of decode
//! steps, one snapshot of the KV counts per step that changes them (in a
//! buffer reused from run to run, so nothing is allocated per event); no
//! event. Rows follow the changes: on the shipped GLM 1P1D scenario
//! (2,176-token blocks) 51.2 rows a request, against 47.8 with the 100 ms
//! sampling this replaces; on Llama-3.1-8B 1P1D (16-token blocks, so a
//! decoding request changes the KV counts every 16 steps) 66 against 8.
//! Events go down (GLM 1P1D: 20.2 a request, from 29.5), since runs of

use sim_core::SimTime;

/// What a timeline series measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Metric {
    /// KV blocks in use.
    KvUsed,
    /// KV blocks in use by one cache group (index in the model's group list).
    KvGroupUsed(u16),
    /// KV blocks free (cached-but-unpinned included).
    KvFree,
    /// Free blocks still holding cached prefixes.
    KvCachedFree,
    /// Sequences waiting to be scheduled.
    Waiting,
    /// Sequences in the running batch.
    Running,
    /// Sources held for handoffs (prefill ranks).
    HeldSources,
    /// Handoffs waiting for their reservation, a decode rank's remote loads
    /// (decode ranks).
    PendingReservations,
    /// Transfers in flight to this rank (decode ranks).
    Transferring,
    /// Transfers in flight: waiting out the latency or on the wire (links).
    ActiveTransfers,
    /// Transfers queued behind another (FIFO links).
    QueuedTransfers,
    /// Bytes of the transfers in flight (links).
    BytesInFlight,
    /// 1 while a step is in flight (ranks) or bytes are moving (links), else
    /// 0: its time-weighted mean is the busy share.
    Busy,
    /// Requests in the system here: on a rank, every request it holds
    /// (waiting, running, and on a decode rank the handoffs waiting for
    /// their reservation or in transfer; not a prefill rank's held sources,
    /// whose requests are on their decode rank by then), so that the ranks'
    /// series add up to the requests in the whole system; on a link, the
    /// transfers in flight (a request in transfer counts on its decode rank
    /// as well).
    Requests,
}

impl Metric {
    /// A dense index, for a timeline's series table.
    fn slot(self) -> usize {
        match self {
            Metric::KvUsed => 0,
            Metric::KvFree => 1,
            Metric::KvCachedFree => 2,
            Metric::Waiting => 3,
            Metric::Running => 4,
            Metric::HeldSources => 5,
            Metric::PendingReservations => 6,
            Metric::Transferring => 7,
            Metric::ActiveTransfers => 8,
            Metric::QueuedTransfers => 9,
            Metric::BytesInFlight => 10,
            Metric::Busy => 11,
            Metric::Requests => 12,
            Metric::KvGroupUsed(g) => 13 + usize::from(g),
        }
    }
}

/// One row of a timeline: from `time` on, `metric` is `value` (until the
/// series' next row).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sample {
    /// When.
    pub time: SimTime,
    /// What.
    pub metric: Metric,
    /// The value.
    pub value: u64,
}

/// One sample of one entity (a rank or a link, by its index in report
/// order: the ranks as `SimOutput::ranks` lists them, then the links).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EntitySample {
    /// The entity's index.
    pub entity: u32,
    /// The sample.
    pub sample: Sample,
}

/// The samples of every timeline of a run, in the order they were
/// committed (each entity's in time order; across entities, rows a rank
/// writes when a run of decode steps ends can be older than other
/// entities' rows: see [`Timeline`]), shared by the timelines that log
/// into it. (A mutex, not a `RefCell`, so that reports holding timelines
/// can cross threads; it is taken once per committed instant, not per
/// event, and never contended: a run is one thread.)
pub type SampleLog = std::sync::Arc<std::sync::Mutex<Vec<EntitySample>>>;

/// The log's rows (a poisoned lock only means a panic elsewhere; the rows
/// are still whole).
pub(crate) fn log_rows(log: &SampleLog) -> std::sync::MutexGuard<'_, Vec<EntitySample>> {
    log.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Where a timeline's samples go.
#[derive(Clone, Debug)]
enum Store {
    /// Its own `samples`.
    Own,
    /// Nowhere.
    Discard,
    /// A run's shared log, under this entity index.
    Log(SampleLog, u32),
}

/// One series of a timeline.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Series {
    metric: Metric,
    /// Its value as of the last committed instant (none before its first).
    committed: Option<u64>,
    /// Its value as of the open instant.
    value: u64,
}

/// The exact timeline of one actor: change-driven rows, one per series
/// per instant at which its value changed, with the value it had when the
/// instant ended.
///
/// The actor sets its values (`set`) whenever they may have changed, at
/// the instant they changed; the values set at one instant stay open
/// until the actor sets values at a later instant (or the run commits
/// them, [`Timeline::commit_before`]), and are then committed: a row for
/// each series whose value differs from its last row. So several changes
/// in one instant give one row with the final value, a series that did
/// not change gives none, and every change, the last before an idle
/// period included, has its row at its instant: the value of a series at
/// any time is that of its last row at or before it, and time-weighted
/// means over the rows are exact.
///
/// Where the rows go is set when it is made (`sampling`): its own
/// `samples` (the default), nowhere (nothing is stored, and nothing of the
/// run depends on the timeline), or a run's shared [`SampleLog`], from
/// which `sim` streams them out in slices.
#[derive(Clone, Debug)]
pub struct Timeline {
    store: Store,
    /// The open instant.
    at: SimTime,
    /// Values were set at `at` and not committed yet.
    open: bool,
    /// The series in the order they first appeared (the order of their rows
    /// within an instant).
    series: Vec<Series>,
    /// `Metric::slot` -> position in `series` + 1 (0: not seen yet).
    index: Vec<u8>,
    /// The rows, in time order.
    pub samples: Vec<Sample>,
}

impl PartialEq for Timeline {
    /// Equal rows (wherever the rows are sent).
    fn eq(&self, other: &Self) -> bool {
        self.samples == other.samples
    }
}

impl Eq for Timeline {}

impl Default for Timeline {
    fn default() -> Self {
        Timeline {
            store: Store::Own,
            at: SimTime::ZERO,
            open: false,
            series: Vec::new(),
            index: Vec::new(),
            samples: Vec::new(),
        }
    }
}

/// Where a run's timelines send their rows: none is stored, or every row
/// goes into one shared log under its entity's index. (A timeline made on
/// its own, [`Timeline::new`], keeps its rows.)
#[derive(Clone, Debug)]
pub(crate) enum Sampling {
    /// None is stored.
    Discard,
    /// Into this log.
    Log(SampleLog),
}

impl Sampling {
    /// An empty timeline for the entity of index `entity` (the report order:
    /// ranks, then links), storing its rows as this says.
    pub(crate) fn timeline(&self, entity: u32) -> Timeline {
        let store = match self {
            Sampling::Discard => Store::Discard,
            Sampling::Log(log) => Store::Log(std::sync::Arc::clone(log), entity),
        };
        Timeline { store, ..Timeline::default() }
    }
}

impl Timeline {
    /// An empty timeline that keeps its own rows.
    pub fn new() -> Self {
        Timeline::default()
    }

    /// Stops logging (a run's report holds its timelines on their own).
    pub(crate) fn detach(&mut self) {
        if matches!(self.store, Store::Log(..)) {
            self.store = Store::Own;
        }
    }

    /// Whether it stores anything: off, [`Timeline::set`] does nothing.
    #[inline]
    pub fn keeps(&self) -> bool {
        !matches!(self.store, Store::Discard)
    }

    /// `metric` is `value` at `now` (the end of the instant decides; `now`
    /// never goes back).
    #[inline]
    pub fn set(&mut self, now: SimTime, metric: Metric, value: u64) {
        if !self.keeps() {
            return;
        }
        debug_assert!(now >= self.at || !self.open, "a timeline goes forward: {now} after {}", self.at);
        if now != self.at {
            self.commit();
            self.at = now;
        }
        self.open = true;
        let slot = metric.slot();
        if slot >= self.index.len() {
            self.index.resize(slot + 1, 0);
        }
        match self.index[slot] {
            0 => {
                self.series.push(Series { metric, committed: None, value });
                self.index[slot] = u8::try_from(self.series.len()).expect("fewer than 256 series");
            }
            i => self.series[usize::from(i) - 1].value = value,
        }
    }

    /// The value `metric` was last set to, if ever.
    pub fn last(&self, metric: Metric) -> Option<u64> {
        let i = *self.index.get(metric.slot())?;
        (i > 0).then(|| self.series[usize::from(i) - 1].value)
    }

    /// Commits the open instant if it is before `before` (every instant:
    /// `None`): its rows are written.
    pub fn commit_before(&mut self, before: Option<SimTime>) {
        if before.is_none_or(|t| self.at < t) {
            self.commit();
        }
    }

    /// Writes the rows of the open instant: one per series whose value
    /// changed since its last row.
    fn commit(&mut self) {
        if !std::mem::take(&mut self.open) {
            return;
        }
        let at = self.at;
        let changed = self.series.iter_mut().filter(|s| s.committed != Some(s.value)).map(|s| {
            s.committed = Some(s.value);
            Sample { time: at, metric: s.metric, value: s.value }
        });
        match &self.store {
            Store::Own => self.samples.extend(changed),
            Store::Discard => {}
            Store::Log(log, entity) => {
                let entity = *entity;
                log_rows(log).extend(changed.map(|sample| EntitySample { entity, sample }));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(ns: u64) -> SimTime {
        SimTime::from_nanos(ns)
    }

    #[test]
    fn a_timeline_writes_each_change_once_with_the_instants_final_value() {
        let mut tl = Timeline::default();
        tl.set(t(0), Metric::Waiting, 0);
        tl.set(t(0), Metric::Running, 0);
        // Three arrivals in one nanosecond: one row, the final value.
        tl.set(t(5), Metric::Waiting, 1);
        tl.set(t(5), Metric::Waiting, 2);
        tl.set(t(5), Metric::Waiting, 3);
        tl.set(t(5), Metric::Running, 0);
        // A change and its undoing in one instant: no row.
        tl.set(t(7), Metric::Running, 1);
        tl.set(t(7), Metric::Running, 0);
        assert_eq!(tl.last(Metric::Running), Some(0));
        assert_eq!(tl.last(Metric::Busy), None);
        tl.set(t(9), Metric::Waiting, 0);
        // The open instant is written only once it is over...
        tl.commit_before(Some(t(9)));
        let row = |ns, metric, value| Sample { time: t(ns), metric, value };
        let want = [row(0, Metric::Waiting, 0), row(0, Metric::Running, 0), row(5, Metric::Waiting, 3)];
        assert_eq!(tl.samples, want);
        // ... or the run ends: the last change before an idle period is kept.
        tl.commit_before(None);
        assert_eq!(tl.samples[3..], [row(9, Metric::Waiting, 0)]);
        tl.commit_before(None);
        assert_eq!(tl.samples.len(), 4);
    }

    #[test]
    fn a_timeline_that_keeps_nothing_stores_nothing() {
        let mut tl = Sampling::Discard.timeline(0);
        assert!(!tl.keeps());
        tl.set(t(1), Metric::KvUsed, 3);
        tl.commit_before(None);
        assert!(tl.samples.is_empty());
        assert_eq!(tl.last(Metric::KvUsed), None);
    }
}
