//! Errors for engine misuse. Domain failures are messages, not these.

use crate::engine::ActorId;
use thiserror::Error;

/// What the engine refuses to do.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum EngineError {
    /// A message was addressed to an actor that was never added or has been removed.
    #[error("no actor with id {0:?} (never added, or removed)")]
    NoSuchActor(ActorId),
    /// Actor names key their random streams, so two live actors may not share one.
    #[error("an actor named {0:?} already exists; names key the random streams and must be unique")]
    DuplicateName(String),
    /// An event was scheduled before the current time.
    #[error("cannot schedule at {at} ns: the clock is already at {now} ns")]
    InThePast {
        /// The requested instant, in nanoseconds.
        at: u64,
        /// The current instant, in nanoseconds.
        now: u64,
    },
}
