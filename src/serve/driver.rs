//! The simulation driver: one thread owns the live run
//! ([`actors::sim::build_live`]) and keeps its clock on the wall clock.
//!
//! It sleeps until the next simulated event, mapped to the wall clock
//! ([`Clock`]), or until a request arrives from an HTTP handler; then it
//! injects the arrivals at their simulated time (the wall instant each came
//! in, or the clock if the run is already past it), runs every event due
//! by now, and hands each output token and each end to its request's
//! stream. Given the arrival times, everything it produces is the
//! simulation's: the wall clock only decides when.

use std::collections::{HashMap, VecDeque};
use std::io::{self, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actors::config::SloSpec;
use actors::request::{Outcome, Request};
use actors::sim::{Deployment, build_live};
use actors::units::Tokens;
use sim_core::SimTime;
use tokio::sync::mpsc::UnboundedSender;

use super::metrics::Metrics;

/// The map between the wall clock and the simulated clock:
/// `simulated = (wall − start) × speed`.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    /// The wall instant of simulated time 0.
    pub start: Instant,
    /// Simulated seconds per wall second.
    pub speed: f64,
}

impl Clock {
    /// The simulated time of wall instant `wall` (0 before the start).
    pub fn sim(&self, wall: Instant) -> SimTime {
        let ns = wall.saturating_duration_since(self.start).as_nanos() as f64 * self.speed;
        SimTime::from_nanos(ns as u64)
    }

    /// The wall instant of simulated time `t`.
    pub fn wall(&self, t: SimTime) -> Instant {
        self.start + Duration::from_nanos((t.as_nanos() as f64 / self.speed) as u64)
    }
}

/// A request from an HTTP handler.
#[derive(Debug)]
pub struct Arrival {
    /// When it came in.
    pub stamp: Instant,
    /// Prompt tokens.
    pub prompt: u64,
    /// Output tokens.
    pub output: u64,
    /// Its priority (vLLM's request field).
    pub priority: i32,
    /// Where its events go.
    pub events: UnboundedSender<Event>,
}

/// What a request's stream hears from the driver, in this order: admitted
/// (or refused), its tokens, its end.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// It entered the simulation as request `id`, at simulated time `at`.
    Admitted {
        /// The simulation's request id.
        id: u64,
        /// Its simulated arrival.
        at: SimTime,
    },
    /// The simulation refused it (the message says why).
    Refused(String),
    /// An output token came out at simulated time `at`.
    Token {
        /// Its simulated time.
        at: SimTime,
    },
    /// It ended: completed, or failed with a reason.
    Ended {
        /// `None`: completed; else why it failed.
        failure: Option<String>,
        /// Its simulated end.
        at: SimTime,
    },
}

/// What the driver runs with.
pub struct Driver {
    /// The deployment.
    pub deployment: Deployment,
    /// The seed.
    pub seed: u64,
    /// The clock map.
    pub clock: Clock,
    /// Where requests come from.
    pub arrivals: Receiver<Arrival>,
    /// What `/metrics` shows.
    pub metrics: Arc<Mutex<Metrics>>,
    /// Where `--record` writes the arrivals.
    pub record: Option<Box<dyn Write + Send>>,
    /// Set to stop.
    pub stop: Arc<AtomicBool>,
}

/// The longest the driver sleeps before it looks at the stop flag again.
const IDLE: Duration = Duration::from_millis(50);

/// An output on its way to its client.
enum Out {
    /// A token of request `id`.
    Token(u64),
    /// The request's end.
    End(Box<Request>),
}

/// A request in flight: where its events go, its arrival and last token.
struct InFlight {
    events: UnboundedSender<Event>,
    arrival: SimTime,
    last: Option<SimTime>,
}

/// Writes one arrival as a Mooncake trace row: the timestamp in ms to the
/// nanosecond (six decimals, read back exactly), no shared prefix.
fn record_row(out: &mut dyn Write, at: SimTime, prompt: u64, output: u64, priority: i32) -> io::Result<()> {
    let ns = at.as_nanos();
    // (The priority only when it is not vLLM's default, so that a record
    // of default requests reads as before.)
    let priority = if priority == 0 { String::new() } else { format!(", \"priority\": {priority}") };
    writeln!(
        out,
        "{{\"timestamp\": {}.{:06}, \"input_length\": {prompt}, \"output_length\": {output}, \"hash_ids\": []{priority}}}",
        ns / 1_000_000,
        ns % 1_000_000
    )
}

impl Driver {
    /// Runs until the stop flag is set or every sender of arrivals is gone.
    ///
    /// # Errors
    /// When the record cannot be written.
    pub fn run(mut self) -> io::Result<()> {
        let mut dep = self.deployment.clone();
        // A server runs for hours: keep nothing that grows with the requests.
        dep.set_keep_timelines(false);
        let mut live = build_live(&dep, self.seed, SloSpec::default());
        live.set_record_sink(|_| {});
        live.set_exact_latency_limit(Some(4096));
        let mut flights: HashMap<u64, InFlight> = HashMap::new();
        let (mut tokens, mut ended): (Vec<(u64, SimTime)>, Vec<Request>) = (Vec::new(), Vec::new());
        let mut held: VecDeque<(SimTime, Out)> = VecDeque::new();
        let response = dep.front_end().response;
        let mut pending: Vec<Arrival> = Vec::new();
        let mut wrote = false;
        let mut last_at = SimTime::ZERO;
        loop {
            if self.stop.load(Ordering::Relaxed) {
                break;
            }
            let now = Instant::now();
            let target = self.clock.sim(now);
            // Arrivals first, at their own instant when the run is not past it.
            while let Ok(a) = self.arrivals.try_recv() {
                pending.push(a);
            }
            let mut prompt_tokens = 0;
            for a in pending.drain(..) {
                // (Arrivals must not go back: one stamped before an earlier
                // one that the driver took first enters with it.)
                let at = self.clock.sim(a.stamp).max(live.now()).max(last_at);
                last_at = at;
                match live.inject_with_priority(at, Tokens::new(a.prompt), Tokens::new(a.output), a.priority) {
                    Ok(id) => {
                        prompt_tokens += a.prompt;
                        if let Some(out) = self.record.as_mut() {
                            record_row(out, at, a.prompt, a.output, a.priority)?;
                            wrote = true;
                        }
                        let _ = a.events.send(Event::Admitted { id, at });
                        flights.insert(id, InFlight { events: a.events, arrival: at, last: None });
                    }
                    Err(e) => {
                        let _ = a.events.send(Event::Refused(e.to_string()));
                    }
                }
            }
            live.advance_to(target);
            live.take_tokens(&mut tokens);
            live.take_ended(&mut ended);
            // Each output reaches its client one way out through the API
            // server after the engine made it (an end's time already says
            // so): held until then, in time order, a request's tokens
            // before its end.
            let batch = held.len();
            held.extend(tokens.drain(..).map(|(id, at)| (at.saturating_add(response), Out::Token(id))));
            held.extend(ended.drain(..).map(|r| (r.t.finished.unwrap_or(target), Out::End(Box::new(r)))));
            held.make_contiguous()[batch..].sort_by_key(|(at, _)| *at);
            let load = live.load();
            {
                let mut m = self.metrics.lock().expect("metrics");
                m.prompt_tokens += prompt_tokens;
                m.running = load.running;
                m.waiting = load.waiting;
                m.kv_usage = if load.kv_blocks == 0 { 0.0 } else { load.kv_used_blocks as f64 / load.kv_blocks as f64 };
                while held.front().is_some_and(|(at, _)| *at <= target) {
                    let (at, out) = held.pop_front().expect("the front is there");
                    match out {
                        Out::Token(id) => tokens.push((id, at)),
                        Out::End(r) => ended.push(*r),
                    }
                }
                m.generation_tokens += tokens.len() as u64;
                for &(id, at) in &tokens {
                    let Some(f) = flights.get_mut(&id) else { continue };
                    match f.last {
                        None => m.ttft.observe((at - f.arrival).as_secs_f64()),
                        Some(prev) => m.itl.observe((at - prev).as_secs_f64()),
                    }
                    f.last = Some(at);
                    let _ = f.events.send(Event::Token { at });
                }
                for r in &ended {
                    let Some(f) = flights.remove(&r.id) else { continue };
                    let at = r.t.finished.unwrap_or(target);
                    let failure = match r.outcome {
                        Outcome::Completed => {
                            m.success += 1;
                            m.e2e.observe((at - f.arrival).as_secs_f64());
                            None
                        }
                        Outcome::Failed(reason) => {
                            m.failed += 1;
                            Some(reason.to_string())
                        }
                        Outcome::InFlight => Some("unfinished".to_owned()),
                    };
                    let _ = f.events.send(Event::Ended { failure, at });
                }
            }
            tokens.clear();
            ended.clear();
            if wrote {
                if let Some(out) = self.record.as_mut() {
                    out.flush()?;
                }
                wrote = false;
            }
            // Sleep until the next event is due on the wall clock, a
            // request comes, or it is time to look at the stop flag.
            let now = Instant::now();
            let next = live.next_event_time().into_iter().chain(held.front().map(|(at, _)| *at)).min();
            let wake = next.map(|t| self.clock.wall(t)).unwrap_or(now + IDLE).min(now + IDLE);
            match self.arrivals.recv_timeout(wake.saturating_duration_since(now)) {
                Ok(a) => pending.push(a),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => break,
            }
        }
        if let Some(out) = self.record.as_mut() {
            out.flush()?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A row reads back to the nanosecond: 1,234,567,891 ns is 1234.567891 ms;
    /// a priority other than 0 is kept.
    #[test]
    fn a_recorded_row_keeps_the_nanosecond() {
        let mut out = Vec::new();
        record_row(&mut out, SimTime::from_nanos(1_234_567_891), 10, 3, 0).unwrap();
        record_row(&mut out, SimTime::from_nanos(2_000_000), 10, 3, -4).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "{\"timestamp\": 1234.567891, \"input_length\": 10, \"output_length\": 3, \"hash_ids\": []}\n\
             {\"timestamp\": 2.000000, \"input_length\": 10, \"output_length\": 3, \"hash_ids\": [], \"priority\": -4}\n"
        );
    }

    #[test]
    fn the_clock_maps_both_ways() {
        let start = Instant::now();
        let c = Clock { start, speed: 10.0 };
        let t = c.sim(start + Duration::from_millis(5));
        assert_eq!(t, SimTime::from_nanos(50_000_000));
        assert_eq!(c.wall(t), start + Duration::from_millis(5));
    }
}
