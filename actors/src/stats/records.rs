//! The records of ended requests, taken in id order as they end: a bounded
//! reorder buffer (requests end out of order; the buffer holds those that
//! ended after an earlier one still in flight), then, one request at a
//! time, the summary ([`SummaryBuilder`]), the digest, the bytes priced,
//! and either a caller's sink (the record is then dropped) or a vector of
//! all of them (the default, for callers that read `SimOutput::records`).

use std::collections::VecDeque;

use sim_core::SimTime;

use crate::requests::request::{Outcome, Request};
use crate::stats::histogram::Histogram;
use crate::stats::slo::SloSpec;
use crate::stats::summary::{Summary, SummaryBuilder};

/// Takes each record, in id order, as its request ends: see
/// [`crate::deploy::sim::Built::set_record_sink`].
pub type RecordSink = Box<dyn FnMut(&Request)>;

/// The digest of the per-request outcomes, folded one record at a time in
/// id order (see [`crate::deploy::sim::digest`]).
#[derive(Clone, Copy, Debug)]
pub struct Digest {
    h: u64,
    n: u64,
}

impl Default for Digest {
    fn default() -> Self {
        Digest { h: 0xcbf2_9ce4_8422_2325, n: 0 }
    }
}

impl Digest {
    #[inline]
    fn put(&mut self, w: u64) {
        self.h = (self.h ^ w).wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(29);
    }

    /// Folds in one record.
    pub fn add(&mut self, r: &Request) {
        let t = |x: Option<SimTime>| x.map_or(u64::MAX, SimTime::as_nanos);
        self.n += 1;
        self.put(r.id);
        self.put(match r.outcome {
            Outcome::InFlight => 0,
            Outcome::Completed => 1,
            Outcome::Failed(_) => 2,
        });
        for x in [r.prompt, r.output, r.generated, r.transferred_tokens, r.prefill_hit, r.decode_hit] {
            self.put(x.get());
        }
        self.put(r.transfer_bytes.get());
        self.put(u64::from(r.preemptions));
        for x in r.t.in_order() {
            self.put(t(x));
        }
    }

    /// The digest of the records folded in.
    pub fn value(&self) -> u64 {
        crate::requests::workload::mix(self.h, self.n)
    }
}

/// What the records add up to, once every one was taken.
pub(crate) struct Totals {
    pub(crate) records: Vec<Request>,
    pub(crate) summary: Summary,
    pub(crate) digest: u64,
    pub(crate) count: u64,
    pub(crate) priced: u64,
    /// Records out of id order or missing (ids are 0..n).
    pub(crate) out_of_order: u64,
}

/// The reorder buffer and what consumes it.
pub(crate) struct RecordStream {
    /// Id of the first slot of `pending`: every lower id has been taken.
    base: u64,
    pending: VecDeque<Option<Box<Request>>>,
    /// Records that ended (in the buffer or taken).
    ended: u64,
    summary: SummaryBuilder,
    digest: Digest,
    priced: u64,
    out_of_order: u64,
    sink: Option<RecordSink>,
    kept: Vec<Request>,
    /// Records expected, reserved in `kept` when the first is kept.
    expected: usize,
}

impl RecordStream {
    pub(crate) fn new() -> Self {
        RecordStream {
            base: 0,
            pending: VecDeque::new(),
            ended: 0,
            summary: SummaryBuilder::new(SloSpec::default()),
            digest: Digest::default(),
            priced: 0,
            out_of_order: 0,
            sink: None,
            kept: Vec::new(),
            expected: 0,
        }
    }

    /// Records the SLOs goodput counts against.
    pub(crate) fn set_slo(&mut self, slo: SloSpec) {
        self.summary = SummaryBuilder::new(slo);
    }

    /// The percentiles of the `bench` statistics.
    pub(crate) fn set_percentiles(&mut self, ps: &[f64]) {
        self.summary.set_percentiles(ps);
    }

    /// Bounds the summary's latency columns
    /// ([`SummaryBuilder::set_exact_limit`]).
    pub(crate) fn set_exact_limit(&mut self, limit: Option<usize>) {
        self.summary.set_exact_limit(limit);
    }

    /// Sends records to `sink` instead of keeping them.
    pub(crate) fn set_sink(&mut self, sink: RecordSink) {
        self.sink = Some(sink);
        self.kept = Vec::new();
    }

    /// Room for `n` kept records, made when the first record is kept: a
    /// sink set after this (as `sim::build` primes the router before its
    /// caller can set one) never makes it, so a streamed run reserves
    /// nothing.
    pub(crate) fn reserve(&mut self, n: usize) {
        self.expected = n;
    }

    /// Requests that ended so far.
    pub(crate) fn ended(&self) -> u64 {
        self.ended
    }

    /// An ended request: taken at once if every earlier one was, else kept
    /// until they are.
    pub(crate) fn push(&mut self, req: Box<Request>) {
        self.ended += 1;
        let Some(slot) = req.id.checked_sub(self.base).and_then(|i| usize::try_from(i).ok()) else {
            // An id already taken: out of order (a bug); taken as it comes.
            self.out_of_order += 1;
            self.take(req);
            return;
        };
        if slot >= self.pending.len() {
            self.pending.resize_with(slot + 1, || None);
        }
        if self.pending[slot].is_some() {
            self.out_of_order += 1;
            self.take(req);
            return;
        }
        self.pending[slot] = Some(req);
        while let Some(Some(_)) = self.pending.front() {
            let r = self.pending.pop_front().flatten().expect("checked");
            self.base += 1;
            self.take(r);
        }
    }

    /// Folds `r` in; it leaves its box only to be kept (a sink reads it
    /// where it is).
    fn take(&mut self, r: Box<Request>) {
        self.summary.add(&r);
        self.digest.add(&r);
        self.priced += r.transfer_bytes.get();
        match &mut self.sink {
            Some(sink) => sink(&r),
            None => {
                if self.kept.capacity() == 0 {
                    self.kept.reserve(self.expected);
                }
                self.kept.push(*r);
            }
        }
    }

    /// Takes what is still buffered (in id order, over any gap: a missing
    /// id is counted) and adds everything up; `itl` is the run's
    /// inter-token histogram, `peak_tokens` the most output tokens in a
    /// 1 s window.
    pub(crate) fn finish(mut self, itl: &Histogram, peak_tokens: u64) -> Totals {
        while let Some(slot) = self.pending.pop_front() {
            match slot {
                Some(r) => self.take(r),
                None => self.out_of_order += 1,
            }
        }
        Totals {
            count: self.summary.requests(),
            summary: self.summary.finish(itl, peak_tokens),
            digest: self.digest.value(),
            priced: self.priced,
            out_of_order: self.out_of_order,
            records: self.kept,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::units::Tokens;
    use crate::requests::workload::PrefixIds;
    use sim_core::SimTime;

    fn record(id: u64) -> Box<Request> {
        let mut r = Request::new(id, Tokens::new(10), Tokens::new(5), PrefixIds::default(), SimTime::ZERO);
        r.fail(crate::requests::request::FailReason::Unfinished, SimTime::ZERO);
        Box::new(r)
    }

    /// The room for the expected records is made when the first is kept,
    /// so a run that streams them to a sink (set after the router is
    /// primed) reserves none: 2^20 records of over 300 bytes were 350 MB
    /// of address space a streamed run never touched.
    #[test]
    fn a_streamed_run_reserves_no_room_for_records() {
        let mut streamed = RecordStream::new();
        streamed.reserve(1 << 20);
        streamed.set_sink(Box::new(|_| {}));
        for id in 0..3 {
            streamed.push(record(id));
        }
        assert_eq!(streamed.kept.capacity(), 0);
        let mut kept = RecordStream::new();
        kept.reserve(1000);
        assert_eq!(kept.kept.capacity(), 0, "nothing kept yet");
        kept.push(record(0));
        assert!(kept.kept.capacity() >= 1000);
        assert_eq!(kept.kept.len(), 1);
    }
}
