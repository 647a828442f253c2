//! The engine's guarantees: tie order, cancellation, random streams,
//! removed actors, run control, observers, determinism, and an M/M/1 oracle.

#[path = "../examples/mm1.rs"]
mod mm1;

use sim_core::rand::Rng;
use sim_core::{Actor, ActorId, Context, EngineError, EventId, SimTime, Simulation, StopReason};

/// A test message: a label, optionally naming an actor to forward to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Msg {
    Tag(u32),
    Forward(ActorId, u32),
    Draw,
    CancelLater(u32),
    Stop,
}

/// Records what it received, when, and from whom; acts on a few commands.
#[derive(Default)]
struct Recorder {
    seen: Vec<(SimTime, u32)>,
    draws: Vec<u64>,
    send_errors: Vec<EngineError>,
    timers: Vec<EventId>,
}

impl Actor<Msg> for Recorder {
    fn handle(&mut self, msg: Msg, ctx: &mut Context<'_, Msg>) {
        match msg {
            Msg::Tag(t) => self.seen.push((ctx.now(), t)),
            Msg::Forward(to, t) => {
                if let Err(e) = ctx.send(to, Msg::Tag(t)) {
                    self.send_errors.push(e);
                }
            }
            Msg::Draw => self.draws.push(ctx.rng().random()),
            Msg::CancelLater(t) => {
                let id = self.timers.remove(0);
                assert!(ctx.cancel(id), "a pending timer cancels");
                assert!(!ctx.cancel(id), "a cancelled timer does not cancel twice");
                self.seen.push((ctx.now(), t));
            }
            Msg::Stop => ctx.stop(),
        }
    }
}

/// An actor of another type, to check downcasts.
struct Idle;
impl Actor<Msg> for Idle {
    fn handle(&mut self, _: Msg, _: &mut Context<'_, Msg>) {}
}

fn tags(sim: &Simulation<Msg>, id: ActorId) -> Vec<u32> {
    sim.actor::<Recorder>(id).unwrap().seen.iter().map(|&(_, t)| t).collect()
}

#[test]
fn same_instant_events_run_in_scheduling_order() {
    let mut sim = Simulation::new(1);
    let a = sim.add_actor("a", Recorder::default()).unwrap();
    let b = sim.add_actor("b", Recorder::default()).unwrap();
    let t = SimTime::from_nanos(5);
    // Scheduled out of time order, and interleaved between two actors at one instant.
    sim.schedule(SimTime::from_nanos(9), a, Msg::Tag(9)).unwrap();
    for i in 0..4 {
        sim.schedule(t, if i % 2 == 0 { a } else { b }, Msg::Forward(a, 10 + i)).unwrap();
    }
    sim.schedule(t, a, Msg::Tag(99)).unwrap();
    sim.run();
    // Each Forward sends with zero delay, so its Tag lands after every event
    // already queued for t=5 (Tag 99 included), in the order the Forwards ran.
    assert_eq!(tags(&sim, a), vec![99, 10, 11, 12, 13, 9]);
    let times: Vec<u64> = sim.actor::<Recorder>(a).unwrap().seen.iter().map(|s| s.0.as_nanos()).collect();
    assert_eq!(times, vec![5, 5, 5, 5, 5, 9]);
}

#[test]
fn cancelled_events_never_fire() {
    let mut sim = Simulation::new(1);
    let r = sim.add_actor("r", Recorder::default()).unwrap();
    let keep = sim.schedule(SimTime::from_nanos(30), r, Msg::Tag(1)).unwrap();
    let gone = sim.schedule(SimTime::from_nanos(20), r, Msg::Tag(2)).unwrap();
    sim.actor_mut::<Recorder>(r).unwrap().timers.push(gone);
    sim.schedule(SimTime::from_nanos(10), r, Msg::CancelLater(3)).unwrap();
    assert_eq!(sim.pending(), 3);
    let summary = sim.run();
    assert_eq!(tags(&sim, r), vec![3, 1]);
    assert_eq!(summary.events_delivered, 2, "the cancelled event is not counted as delivered");
    assert_eq!(summary.final_time, SimTime::from_nanos(30));
    assert!(!sim.cancel(keep), "a delivered event cannot be cancelled");
    assert_eq!(sim.pending(), 0);
    // A slot freed by a cancellation is reused; the stale handle must not cancel the new event.
    let old = sim.schedule(SimTime::from_nanos(40), r, Msg::Tag(4)).unwrap();
    assert!(sim.cancel(old));
    sim.schedule(SimTime::from_nanos(50), r, Msg::Tag(5)).unwrap();
    assert!(!sim.cancel(old));
    sim.run();
    assert_eq!(tags(&sim, r), vec![3, 1, 5]);
}

/// `take` cancels an event and hands back its message, once: what a run
/// stopped early uses to account for messages it never delivered.
#[test]
fn a_taken_event_gives_back_its_message_once() {
    let mut sim = Simulation::new(1);
    let r = sim.add_actor("r", Recorder::default()).unwrap();
    let early = sim.schedule(SimTime::from_nanos(10), r, Msg::Tag(1)).unwrap();
    let late = sim.schedule(SimTime::from_nanos(30), r, Msg::Tag(2)).unwrap();
    let summary = sim.run_until(SimTime::from_nanos(20));
    assert_eq!(summary.stop_reason, StopReason::TimeLimit);
    assert_eq!(sim.take(early), None, "delivered");
    assert_eq!(sim.take(late), Some(Msg::Tag(2)));
    assert_eq!(sim.take(late), None, "taken already");
    assert_eq!(sim.pending(), 0);
    // Its slot is reused; the stale handle takes nothing from the new event.
    sim.schedule(SimTime::from_nanos(40), r, Msg::Tag(3)).unwrap();
    assert_eq!(sim.take(late), None);
    sim.run();
    assert_eq!(tags(&sim, r), vec![1, 3]);
}

fn draws_of_x(seed: u64, add_other_first: bool) -> Vec<u64> {
    let mut sim = Simulation::new(seed);
    if add_other_first {
        let w = sim.add_actor("w", Recorder::default()).unwrap();
        for i in 0..5 {
            sim.schedule(SimTime::from_nanos(i), w, Msg::Draw).unwrap();
        }
    }
    let x = sim.add_actor("x", Recorder::default()).unwrap();
    for i in 0..5 {
        sim.schedule(SimTime::from_nanos(i), x, Msg::Draw).unwrap();
    }
    sim.run();
    sim.actor::<Recorder>(x).unwrap().draws.clone()
}

#[test]
fn adding_an_actor_leaves_another_actors_draws_unchanged() {
    let alone = draws_of_x(7, false);
    assert_eq!(alone.len(), 5);
    assert_eq!(alone, draws_of_x(7, true), "another actor (added first, drawing interleaved) shifts nothing");
    assert_ne!(alone, draws_of_x(8, false), "another seed gives other numbers");
    let mut w = sim_core::rng::stream_for(7, "w");
    let mut x = sim_core::rng::stream_for(7, "x");
    assert_ne!(w.random::<u64>(), x.random::<u64>(), "two names, two streams");
}

#[test]
fn messages_to_removed_actors_are_errors_not_panics() {
    let mut sim = Simulation::new(1);
    let a = sim.add_actor("a", Recorder::default()).unwrap();
    let b = sim.add_actor("b", Recorder::default()).unwrap();
    // In flight when b is removed: dropped at delivery and counted.
    sim.schedule(SimTime::from_nanos(10), b, Msg::Tag(1)).unwrap();
    sim.remove_actor(b).unwrap();
    assert_eq!(sim.schedule(SimTime::from_nanos(1), b, Msg::Tag(2)), Err(EngineError::NoSuchActor(b)));
    assert_eq!(sim.remove_actor(b), Err(EngineError::NoSuchActor(b)));
    // Sent from a handler after removal: the sender sees the error.
    sim.schedule(SimTime::from_nanos(5), a, Msg::Forward(b, 3)).unwrap();
    // The name is free again, and the new actor gets a new id.
    let b2 = sim.add_actor("b", Recorder::default()).unwrap();
    assert_ne!(b, b2);
    let summary = sim.run();
    assert_eq!(summary.events_undelivered, 1);
    assert_eq!(summary.events_delivered, 1);
    assert_eq!(sim.actor::<Recorder>(a).unwrap().send_errors, vec![EngineError::NoSuchActor(b)]);
    assert!(tags(&sim, b2).is_empty());
}

#[test]
fn misuse_is_reported() {
    let mut sim = Simulation::<Msg>::new(1);
    let a = sim.add_actor("a", Recorder::default()).unwrap();
    assert!(matches!(sim.add_actor("a", Recorder::default()), Err(EngineError::DuplicateName(n)) if n == "a"));
    sim.schedule(SimTime::from_nanos(10), a, Msg::Tag(1)).unwrap();
    sim.run();
    let err = sim.schedule(SimTime::from_nanos(9), a, Msg::Tag(2)).unwrap_err();
    assert_eq!(err, EngineError::InThePast { at: 9, now: 10 });
    assert!(err.to_string().contains("9 ns"), "{err}");
    assert_eq!(sim.actor_id("a"), Some(a));
    assert!(sim.actor::<Idle>(a).is_none(), "wrong type downcasts to None");
}

#[test]
fn run_until_delivers_up_to_and_including_the_limit() {
    let mut sim = Simulation::new(1);
    let a = sim.add_actor("a", Recorder::default()).unwrap();
    for t in [10, 20, 20, 30] {
        sim.schedule(SimTime::from_nanos(t), a, Msg::Tag(t as u32)).unwrap();
    }
    let s = sim.run_until(SimTime::from_nanos(20));
    assert_eq!((s.events_delivered, s.stop_reason), (3, StopReason::TimeLimit));
    assert_eq!(s.final_time, SimTime::from_nanos(20));
    let s = sim.run_until(SimTime::from_nanos(25));
    assert_eq!((s.events_delivered, s.final_time), (0, SimTime::from_nanos(25)), "the clock moves to the limit");
    let s = sim.run_until(SimTime::from_nanos(100));
    assert_eq!(
        (s.events_delivered, s.stop_reason, s.final_time),
        (1, StopReason::QueueEmpty, SimTime::from_nanos(100))
    );
    assert_eq!(tags(&sim, a), vec![10, 20, 20, 30]);
}

#[test]
fn predicates_and_stop_requests_end_a_run_that_can_resume() {
    let mut sim = Simulation::new(1);
    let a = sim.add_actor("a", Recorder::default()).unwrap();
    for t in 1..=6 {
        sim.schedule(SimTime::from_nanos(t), a, Msg::Tag(t as u32)).unwrap();
    }
    sim.schedule(SimTime::from_nanos(4), a, Msg::Stop).unwrap();
    let s = sim.run_while_not(|s| s.actor::<Recorder>(a).unwrap().seen.len() == 2);
    assert_eq!((s.events_delivered, s.stop_reason), (2, StopReason::Predicate));
    let s = sim.run();
    assert_eq!((s.stop_reason, s.final_time), (StopReason::Stopped, SimTime::from_nanos(4)));
    assert_eq!(tags(&sim, a), vec![1, 2, 3, 4], "the Stop at t=4 came after Tag 4");
    let s = sim.run();
    assert_eq!((s.events_delivered, s.stop_reason), (2, StopReason::QueueEmpty));
}

#[test]
fn observers_see_every_delivered_event() {
    let mut log = Vec::new();
    {
        let mut sim = Simulation::with_observer(1, |t: SimTime, from: Option<ActorId>, to: ActorId, m: &Msg| {
            log.push((t.as_nanos(), from.is_some(), to, *m));
        });
        let a = sim.add_actor("a", Recorder::default()).unwrap();
        let b = sim.add_actor("b", Recorder::default()).unwrap();
        sim.schedule(SimTime::from_nanos(3), a, Msg::Forward(b, 7)).unwrap();
        sim.run();
    }
    assert_eq!(log.len(), 2);
    assert_eq!((log[0].0, log[0].1), (3, false), "injected: no sender");
    assert_eq!((log[1].0, log[1].1, log[1].3), (3, true, Msg::Tag(7)));
}

/// FNV-1a over the delivered-event log of an M/M/1 run.
fn mm1_digest(seed: u64, customers: u64) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut sim = Simulation::with_observer(seed, |t: SimTime, from: Option<ActorId>, to: ActorId, m: &mm1::Msg| {
        let (kind, stamp) = match *m {
            mm1::Msg::Arrive => (0u64, 0),
            mm1::Msg::Customer(at) => (1, at.as_nanos()),
            mm1::Msg::ServiceDone => (2, 0),
        };
        for word in [t.as_nanos(), from.map_or(0, ActorId::as_u64), to.as_u64(), kind, stamp] {
            for byte in word.to_le_bytes() {
                h ^= u64::from(byte);
                h = h.wrapping_mul(0x0000_0100_0000_01b3);
            }
        }
    });
    mm1::simulate(&mut sim, customers, 0.7);
    drop(sim);
    h
}

#[test]
fn same_seed_same_event_log_other_seed_other_log() {
    let a = mm1_digest(11, 20_000);
    assert_eq!(a, mm1_digest(11, 20_000));
    assert_ne!(a, mm1_digest(12, 20_000));
}

#[test]
fn mm1_mean_time_in_system_matches_the_closed_form() {
    // rho = 0.7 with a 1 ms mean service: lambda = 700/s, mu = 1000/s,
    // W = 1/(mu - lambda) = 1/300 s = 3.333 ms. Over 1,000,000 customers the
    // sampling error of the mean is under 1%; the bound is 2.5%.
    let mut sim = Simulation::new(2026);
    let r = mm1::simulate(&mut sim, 1_000_000, 0.7);
    assert_eq!(r.customers, 1_000_000);
    assert_eq!(r.events, 4 * 1_000_000, "arrive, enqueue, service done, depart: four events a customer");
    assert!((r.expected - 1.0 / 300.0).abs() < 1e-12);
    let rel = (r.mean_time_in_system / r.expected - 1.0).abs();
    assert!(rel < 0.025, "measured {} s vs {} s ({:.2}%)", r.mean_time_in_system, r.expected, rel * 100.0);
}

/// Sends itself end-of-instant messages and zero-delay chains, recording
/// the order things arrive in.
#[derive(Default)]
struct Batcher {
    seen: Vec<(u64, &'static str)>,
}

#[derive(Debug)]
enum Ev {
    /// An arrival: asks for one end-of-instant flush, and chains `more`
    /// further arrivals at the same instant with zero delay.
    Arrive {
        more: u32,
    },
    Flush,
}

impl Actor<Ev> for Batcher {
    fn handle(&mut self, msg: Ev, ctx: &mut Context<'_, Ev>) {
        let t = ctx.now().as_nanos();
        match msg {
            Ev::Arrive { more } => {
                self.seen.push((t, "arrive"));
                if self.seen.iter().filter(|&&(at, what)| at == t && what == "arrive").count() == 1 {
                    ctx.at_end_of_instant(Ev::Flush);
                }
                if more > 0 {
                    ctx.schedule(sim_core::SimDuration::ZERO, Ev::Arrive { more: more - 1 });
                }
            }
            Ev::Flush => self.seen.push((t, "flush")),
        }
    }
}

#[test]
fn an_end_of_instant_message_comes_after_everything_at_its_instant() {
    // Three arrivals at t = 5 (one scheduled, two chained by zero-delay
    // sends while the flush waits) and one at t = 9: each instant's flush
    // comes after all of that instant's arrivals and before the next one's.
    let mut sim: Simulation<Ev> = Simulation::new(1);
    let a = sim.add_actor("a", Batcher::default()).unwrap();
    sim.schedule(SimTime::from_nanos(5), a, Ev::Arrive { more: 2 }).unwrap();
    sim.schedule(SimTime::from_nanos(9), a, Ev::Arrive { more: 0 }).unwrap();
    assert_eq!(sim.pending(), 2);
    let s = sim.run();
    assert_eq!(s.stop_reason, StopReason::QueueEmpty);
    assert_eq!(s.events_delivered, 6, "4 arrivals and 2 flushes");
    let seen = &sim.actor::<Batcher>(a).unwrap().seen;
    assert_eq!(seen, &[(5, "arrive"), (5, "arrive"), (5, "arrive"), (5, "flush"), (9, "arrive"), (9, "flush")]);
    // A time limit at the instant still delivers its flush.
    let mut sim: Simulation<Ev> = Simulation::new(1);
    let a = sim.add_actor("a", Batcher::default()).unwrap();
    sim.schedule(SimTime::from_nanos(5), a, Ev::Arrive { more: 0 }).unwrap();
    sim.run_until(SimTime::from_nanos(5));
    assert_eq!(sim.actor::<Batcher>(a).unwrap().seen, [(5, "arrive"), (5, "flush")]);
    assert_eq!(sim.pending(), 0);
}
