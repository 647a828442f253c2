//! NixlLink: a KV link with a latency and a bandwidth that concurrent
//! transfers share.
//!
//! A transfer first waits out the link's latency (not shared), then its bytes
//! are served:
//! - processor sharing: every active transfer progresses at bandwidth / n.
//!   The link keeps a virtual clock of the work one transfer has received
//!   (in units of 1/720,720 of a solo nanosecond, exact for up to 16 transfers
//!   sharing, since 720,720 = lcm(1..16)); a transfer finishes when the
//!   virtual clock reaches its finish tag. Whenever a transfer starts or
//!   ends, the one completion timer is cancelled and rescheduled for the
//!   earliest tag, rounded up to the nanosecond.
//! - FIFO: one transfer at a time at full bandwidth, in order of arrival.
//!
//! A lone transfer of b bytes takes `latency + ceil(b × 10^9 / bandwidth)` ns.
//!
//! Its timeline gets its state after every message it handles (the rows
//! are the changes, with the value at the end of each instant: see
//! [`crate::stats::timeline`]).

use std::collections::{BTreeMap, VecDeque};

use sim_core::{Actor, ActorId, Context, EventId, SimDuration, SimTime};

use crate::base::units::{Bandwidth, Bytes, transfer_time};
use crate::requests::request::ReqId;
use crate::serving::msg::Msg;
use crate::stats::timeline::{Metric, Timeline};
use serde::{Deserialize, Serialize};

/// How concurrent transfers on one link share its bandwidth.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Sharing {
    /// Every active transfer gets an equal share, re-timed exactly whenever
    /// a transfer starts or ends.
    #[default]
    ProcessorSharing,
    /// One transfer at a time at full bandwidth, in order of arrival.
    Fifo,
}

/// Work units per solo nanosecond: lcm(1..=16).
const SCALE: u128 = 720_720;

#[derive(Clone, Copy, Debug)]
struct Transfer {
    id: ReqId,
    bytes: Bytes,
    reply_to: ActorId,
    /// Solo service time of its bytes, ns.
    solo_ns: u64,
}

/// Counters of one link.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LinkStats {
    /// Transfers started.
    pub transfers: u64,
    /// Bytes of the transfers started.
    pub bytes_started: u64,
    /// Bytes of the transfers completed.
    pub bytes_completed: u64,
    /// Time with at least one transfer moving bytes.
    pub busy: SimDuration,
    /// Most transfers moving bytes at once.
    pub peak_active: u64,
    /// Most bytes in flight at the end of an instant (the timeline's
    /// largest `BytesInFlight`, kept whether or not the timeline stores
    /// rows).
    pub peak_sampled_bytes_in_flight: u64,
    /// Messages a link does not handle (a wiring bug if ever non-zero).
    pub unexpected: u64,
}

/// The link actor.
pub(crate) struct NixlLink {
    latency: SimDuration,
    bandwidth: Bandwidth,
    sharing: Sharing,
    /// Virtual work received by each active transfer since the start, in units.
    virtual_work: u128,
    last_update: SimTime,
    /// Active transfers by (finish tag, arrival order).
    active: BTreeMap<(u128, u64), Transfer>,
    /// FIFO mode: transfers waiting for the wire.
    queue: VecDeque<Transfer>,
    /// Transfers waiting out the latency, by request id.
    in_latency: BTreeMap<ReqId, Transfer>,
    order: u64,
    wake: Option<EventId>,
    busy_since: Option<SimTime>,
    /// Bytes of the transfers started and not yet completed.
    in_flight_bytes: u64,
    /// The last instant it handled a message at, and the bytes in flight
    /// after it (the peak takes them in once the instant is over).
    instant: (SimTime, u64),
    /// Counters.
    pub stats: LinkStats,
    /// Its state over time, exactly.
    pub timeline: Timeline,
}

impl NixlLink {
    /// A link.
    pub(crate) fn new(latency: SimDuration, bandwidth: Bandwidth, sharing: Sharing, timeline: Timeline) -> Self {
        let mut link = NixlLink {
            latency,
            bandwidth,
            sharing,
            virtual_work: 0,
            last_update: SimTime::ZERO,
            active: BTreeMap::new(),
            queue: VecDeque::new(),
            in_latency: BTreeMap::new(),
            order: 0,
            wake: None,
            busy_since: None,
            in_flight_bytes: 0,
            instant: (SimTime::ZERO, 0),
            stats: LinkStats::default(),
            timeline,
        };
        link.record(SimTime::ZERO);
        link
    }

    /// Transfers started and not yet completed.
    pub(crate) fn in_flight(&self) -> usize {
        self.active.len() + self.queue.len() + self.in_latency.len()
    }

    /// Bytes of the transfers started and not yet completed.
    pub(crate) fn bytes_in_flight(&self) -> u64 {
        self.in_flight_bytes
    }

    /// Brings the virtual clock to `now`.
    fn advance(&mut self, now: SimTime) {
        let dt = u128::from((now - self.last_update).as_nanos());
        if let Some(share) = (dt * SCALE).checked_div(self.active.len() as u128) {
            self.virtual_work += share;
        }
        self.last_update = now;
    }

    fn enter_wire(&mut self, t: Transfer, now: SimTime) {
        match self.sharing {
            Sharing::ProcessorSharing => self.activate(t),
            Sharing::Fifo if self.active.is_empty() => self.activate(t),
            Sharing::Fifo => self.queue.push_back(t),
        }
        if self.busy_since.is_none() {
            self.busy_since = Some(now);
        }
        self.stats.peak_active = self.stats.peak_active.max(self.active.len() as u64);
    }

    fn activate(&mut self, t: Transfer) {
        let tag = self.virtual_work + u128::from(t.solo_ns) * SCALE;
        self.order += 1;
        self.active.insert((tag, self.order), t);
    }

    fn reschedule(&mut self, ctx: &mut Context<'_, Msg>) {
        if let Some(w) = self.wake.take() {
            ctx.cancel(w);
        }
        if let Some((&(tag, _), _)) = self.active.first_key_value() {
            let n = self.active.len() as u128;
            let ns = ((tag - self.virtual_work) * n).div_ceil(SCALE);
            let at = SimDuration::from_nanos(u64::try_from(ns).unwrap_or(u64::MAX));
            self.wake = Some(ctx.schedule(at, Msg::LinkWake));
        }
    }

    /// Sets its timeline to its state at `now`, after a message: what is
    /// in flight (waiting out the latency, on the wire, or queued), and
    /// whether bytes are moving.
    fn record(&mut self, now: SimTime) {
        if now != self.instant.0 {
            self.stats.peak_sampled_bytes_in_flight = self.stats.peak_sampled_bytes_in_flight.max(self.instant.1);
        }
        self.instant = (now, self.in_flight_bytes);
        let requests = self.in_flight() as u64;
        let tl = &mut self.timeline;
        if !tl.keeps() {
            return;
        }
        tl.set(now, Metric::ActiveTransfers, (self.active.len() + self.in_latency.len()) as u64);
        tl.set(now, Metric::QueuedTransfers, self.queue.len() as u64);
        tl.set(now, Metric::BytesInFlight, self.in_flight_bytes);
        tl.set(now, Metric::Requests, requests);
        tl.set(now, Metric::Busy, u64::from(self.busy_since.is_some()));
    }

    /// The end of the run: the last instant counts towards the peak.
    pub(crate) fn close(&mut self) {
        self.stats.peak_sampled_bytes_in_flight = self.stats.peak_sampled_bytes_in_flight.max(self.instant.1);
    }

    fn complete_due(&mut self, ctx: &mut Context<'_, Msg>) {
        let now = ctx.now();
        self.advance(now);
        while let Some(entry) = self.active.first_entry() {
            if entry.key().0 > self.virtual_work {
                break;
            }
            let t = entry.remove();
            self.stats.bytes_completed += t.bytes.get();
            self.in_flight_bytes -= t.bytes.get();
            ctx.send(t.reply_to, Msg::TransferCompleted(t.id)).expect("decode ranks outlive the run");
            if self.sharing == Sharing::Fifo
                && let Some(next) = self.queue.pop_front()
            {
                self.activate(next);
            }
        }
        if self.active.is_empty() {
            // Keep the virtual clock small; nothing is active to compare with it.
            self.virtual_work = 0;
            if let Some(since) = self.busy_since.take() {
                self.stats.busy += now - since;
            }
        }
        self.reschedule(ctx);
    }
}

impl Actor<Msg> for NixlLink {
    fn handle(&mut self, msg: Msg, ctx: &mut Context<'_, Msg>) {
        let now = ctx.now();
        match msg {
            Msg::StartTransfer { id, bytes, reply_to } => {
                self.stats.transfers += 1;
                self.stats.bytes_started += bytes.get();
                self.in_flight_bytes += bytes.get();
                let t = Transfer { id, bytes, reply_to, solo_ns: transfer_time(bytes, self.bandwidth).as_nanos() };
                if self.latency.as_nanos() > 0 {
                    self.in_latency.insert(id, t);
                    ctx.schedule(self.latency, Msg::WireReady(id));
                } else {
                    self.advance(now);
                    self.enter_wire(t, now);
                    self.complete_due(ctx);
                }
            }
            Msg::WireReady(id) => {
                let t = self.in_latency.remove(&id).expect("latency timer of a known transfer");
                self.advance(now);
                self.enter_wire(t, now);
                self.complete_due(ctx);
            }
            Msg::LinkWake => {
                self.wake = None;
                self.complete_due(ctx);
            }
            // Only decode ranks and the link's own timers address a link.
            _ => self.stats.unexpected += 1,
        }
        self.record(now);
    }
}

#[cfg(test)]
mod tests {
    use sim_core::{Actor, Context, SimDuration, SimTime, Simulation};

    use super::*;

    /// Receives TransferCompleted and notes when.
    #[derive(Default)]
    struct Sink(Vec<(u64, u64)>);
    impl Actor<Msg> for Sink {
        fn handle(&mut self, msg: Msg, ctx: &mut Context<'_, Msg>) {
            if let Msg::TransferCompleted(id) = msg {
                self.0.push((id, ctx.now().as_nanos()));
            }
        }
    }

    /// Runs transfers `(id, start ms, bytes)` on one zero-latency 1 GB/s link.
    fn link_run(sharing: Sharing, transfers: &[(u64, u64, u64)]) -> Vec<(u64, u64)> {
        let mut sim = Simulation::new(1);
        let bw = Bandwidth::from_gb_per_s(1.0).unwrap();
        let link = sim.add_actor("link", NixlLink::new(SimDuration::ZERO, bw, sharing, Timeline::new())).unwrap();
        let sink = sim.add_actor("sink", Sink::default()).unwrap();
        for &(id, at_ms, bytes) in transfers {
            let msg = Msg::StartTransfer { id, bytes: Bytes::new(bytes), reply_to: sink };
            sim.schedule(SimTime::from_nanos(at_ms * 1_000_000), link, msg).unwrap();
        }
        sim.run();
        let l = sim.actor::<NixlLink>(link).unwrap();
        assert_eq!(l.stats.bytes_started, l.stats.bytes_completed);
        sim.actor::<Sink>(sink).unwrap().0.clone()
    }

    const MB100: u64 = 100_000_000; // 100 ms alone at 1 GB/s

    #[test]
    fn processor_sharing_retimes_transfers_exactly() {
        // Two equal transfers together: each gets half the bandwidth, so each
        // takes twice as long as alone: 200 ms.
        assert_eq!(
            link_run(Sharing::ProcessorSharing, &[(1, 0, MB100), (2, 0, MB100)]),
            [(1, 200_000_000), (2, 200_000_000)]
        );
        // B starts halfway through A: A has 50 ms of solo work left, done at half
        // speed: 150 ms. B then has 50 ms left alone: 200 ms.
        assert_eq!(
            link_run(Sharing::ProcessorSharing, &[(1, 0, MB100), (2, 50, MB100)]),
            [(1, 150_000_000), (2, 200_000_000)]
        );
        // Three-way: A 100 MB at 0, B 30 MB at 10 ms, C 60 MB at 20 ms.
        // 0-10: A alone, 90 MB left. 10-20: halves, A 85, B 25 left.
        // From 20: thirds; B's 25 MB take 75 ms -> B at 95 ms; A 60, C 35 left.
        // Halves: C's 35 take 70 ms -> C at 165 ms; A has 25 left -> 190 ms.
        let three = [(1, 0, MB100), (2, 10, 30_000_000), (3, 20, 60_000_000)];
        assert_eq!(link_run(Sharing::ProcessorSharing, &three), [(2, 95_000_000), (3, 165_000_000), (1, 190_000_000)]);
        // FIFO: one at a time.
        assert_eq!(link_run(Sharing::Fifo, &[(1, 0, MB100), (2, 50, MB100)]), [(1, 100_000_000), (2, 200_000_000)]);
    }
}
