//! sim-core: a domain-free deterministic discrete-event engine.
pub mod time;
pub use time::{SimDuration, SimTime};
