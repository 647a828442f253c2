//! sim-core: a domain-free, deterministic discrete-event engine.
//!
//! - Virtual time is integer nanoseconds ([`SimTime`], [`SimDuration`]).
//! - One queue orders every event by (time, insertion sequence).
//! - Actors live in a slot map behind generational [`ActorId`]s and handle a
//!   message type `M` chosen by the domain (usually one enum).
//! - Handlers get a [`Context`]: the clock, sends with a delay, timers that
//!   cancel in O(1), their own seeded random stream, and a stop request.
//! - An optional [`Observer`] sees every delivered event; without one the
//!   loop pays nothing for it.
//!
//! No threads, no global state, no wall clock: the same actors, inputs and
//! seed give the same run on every machine. See [`Simulation`] for the
//! ordering guarantees.

#![warn(missing_docs, unreachable_pub)]

pub mod engine;
pub mod error;
mod queue;
pub mod rng;
pub mod time;

pub use engine::{Actor, ActorId, Context, EventId, NoObserver, Observer, RunSummary, Simulation, StopReason};
pub use error::EngineError;
/// The `rand` crate sim-core draws with, so domains sample with the same traits.
pub use rand;
pub use rng::ActorRng;
pub use time::{SimDuration, SimTime};
