//! An M/M/1 queue from three actors: arrivals, one FIFO server, and a sink
//! that measures time in system. Run with
//! `cargo run --release -p sim-core --example mm1 [customers] [rho] [seed]`.
//!
//! Closed form: mean time in system W = 1 / (mu - lambda).

use std::collections::VecDeque;

use sim_core::rand::Rng;
use sim_core::{Actor, ActorId, ActorRng, Context, SimDuration, SimTime, Simulation};

/// The messages of the M/M/1 model.
#[derive(Debug, Clone, Copy)]
pub enum Msg {
    /// Timer of the source: the next customer arrives now.
    Arrive,
    /// A customer, stamped with its arrival time.
    Customer(SimTime),
    /// Timer of the server: the customer in service is done.
    ServiceDone,
}

/// An exponential sample with the given mean, rounded once to whole nanoseconds.
pub fn exponential(rng: &mut ActorRng, mean_secs: f64) -> SimDuration {
    let u: f64 = rng.random();
    SimDuration::from_secs_f64(-(1.0 - u).ln() * mean_secs)
}

/// Emits `remaining` customers at exponential inter-arrival times.
pub struct Source {
    server: ActorId,
    mean_gap_secs: f64,
    remaining: u64,
}

impl Actor<Msg> for Source {
    fn handle(&mut self, msg: Msg, ctx: &mut Context<'_, Msg>) {
        debug_assert!(matches!(msg, Msg::Arrive));
        let now = ctx.now();
        ctx.send(self.server, Msg::Customer(now)).expect("server exists");
        self.remaining -= 1;
        if self.remaining > 0 {
            let gap = exponential(ctx.rng(), self.mean_gap_secs);
            ctx.schedule(gap, Msg::Arrive);
        }
    }
}

/// One FIFO server with exponential service times.
pub struct Server {
    sink: ActorId,
    mean_service_secs: f64,
    queue: VecDeque<SimTime>,
    busy: bool,
}

impl Actor<Msg> for Server {
    fn handle(&mut self, msg: Msg, ctx: &mut Context<'_, Msg>) {
        match msg {
            Msg::Customer(arrived) => self.queue.push_back(arrived),
            Msg::ServiceDone => {
                let done = self.queue.pop_front().expect("a customer was in service");
                ctx.send(self.sink, Msg::Customer(done)).expect("sink exists");
                self.busy = false;
            }
            Msg::Arrive => unreachable!("the server gets no arrival timer"),
        }
        if !self.busy && !self.queue.is_empty() {
            self.busy = true;
            let service = exponential(ctx.rng(), self.mean_service_secs);
            ctx.schedule(service, Msg::ServiceDone);
        }
    }
}

/// Sums time in system over departed customers.
#[derive(Default)]
pub struct Sink {
    /// Customers that left the system.
    pub departed: u64,
    /// Sum of their times in system, in nanoseconds.
    pub total_ns: u128,
}

impl Actor<Msg> for Sink {
    fn handle(&mut self, msg: Msg, ctx: &mut Context<'_, Msg>) {
        if let Msg::Customer(arrived) = msg {
            self.departed += 1;
            self.total_ns += u128::from((ctx.now() - arrived).as_nanos());
        }
    }
}

/// The result of one M/M/1 run.
pub struct Mm1Result {
    /// Customers served.
    pub customers: u64,
    /// Measured mean time in system, seconds.
    pub mean_time_in_system: f64,
    /// The closed form 1/(mu - lambda), seconds.
    pub expected: f64,
    /// Events the engine delivered.
    pub events: u64,
}

/// Simulates `customers` customers at load `rho` with a mean service time of 1 ms.
pub fn simulate<O: sim_core::Observer<Msg>>(sim: &mut Simulation<Msg, O>, customers: u64, rho: f64) -> Mm1Result {
    let mean_service_secs = 1e-3;
    let mean_gap_secs = mean_service_secs / rho;
    let sink = sim.add_actor("sink", Sink::default()).expect("fresh name");
    let server = sim
        .add_actor("server", Server { sink, mean_service_secs, queue: VecDeque::new(), busy: false })
        .expect("fresh name");
    let source = sim.add_actor("source", Source { server, mean_gap_secs, remaining: customers }).expect("fresh name");
    sim.schedule(SimTime::ZERO, source, Msg::Arrive).expect("source exists");
    let summary = sim.run();
    let sink = sim.actor::<Sink>(sink).expect("sink is a Sink");
    let (lambda, mu) = (1.0 / mean_gap_secs, 1.0 / mean_service_secs);
    Mm1Result {
        customers: sink.departed,
        mean_time_in_system: sink.total_ns as f64 / 1e9 / sink.departed as f64,
        expected: 1.0 / (mu - lambda),
        events: summary.events_delivered,
    }
}

#[allow(dead_code)] // the test suite includes this file as a module and has its own main
fn main() {
    let mut args = std::env::args().skip(1);
    let customers: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(1_000_000);
    let rho: f64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(0.7);
    let seed: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(1);
    let mut sim = Simulation::new(seed);
    let r = simulate(&mut sim, customers, rho);
    println!(
        "M/M/1 at rho {rho}, seed {seed}: {} customers, {} events; mean time in system {:.4} ms, closed form 1/(mu - lambda) = {:.4} ms ({:+.2}%)",
        r.customers,
        r.events,
        r.mean_time_in_system * 1e3,
        r.expected * 1e3,
        (r.mean_time_in_system / r.expected - 1.0) * 100.0
    );
}
