//! The messages of the serving domain: the handoff protocol's commands and
//! replies, and the actors' own timers.

use sim_core::{ActorId, SimTime};

use crate::base::units::Bytes;
use crate::requests::request::{Command, FailReason, ReqId, Request};
use crate::requests::workload::RequestSpec;

/// Every message an actor of this crate sends or receives.
#[derive(Debug)]
pub enum Msg {
    /// Router timer: the next request arrives now.
    Arrival,
    /// Router timer: a closed-loop client saw its request end (one way out
    /// through the API server after the engine ended it) and sends its next.
    ClientNext,
    /// A live run's caller → router: this request arrives now (its
    /// `arrival` is the event's time).
    Inject(Box<RequestSpec>),
    /// Router → prefill rank (source command): compute this prompt, truncated
    /// by the backoff, and hold its KV for a handoff.
    SubmitHandoffPrefill(Box<Request>),
    /// Prefill rank → router: the prefill is done and the source is held.
    SourceHeld(Box<Request>),
    /// Router → decode rank (destination command): reserve blocks for this
    /// held source (its prefill rank is `req.prefill_rank`) and pull it.
    ReserveDestination(Box<Request>),
    /// Decode rank → link: move `bytes` for request `id`, then tell `reply_to`.
    StartTransfer {
        /// The request.
        id: ReqId,
        /// Bytes to move.
        bytes: Bytes,
        /// Who gets [`Msg::TransferCompleted`].
        reply_to: ActorId,
    },
    /// Link → decode rank: the transfer of request `id` is done.
    TransferCompleted(ReqId),
    /// Decode rank → prefill rank (source command): the KV arrived; free the source.
    ReleaseSource(ReqId),
    /// Decode rank → prefill rank (source command): give up the source.
    CancelSource(ReqId, FailReason),
    /// Router → decode rank (destination command): give up the destination
    /// (its source is gone).
    CancelDestination(ReqId, FailReason),
    /// Prefill rank → router: a held source expired before its release.
    SourceExpired(ReqId, FailReason),
    /// Router → aggregated rank: serve this request with no handoff.
    Submit(Box<Request>),
    /// Any rank → router: the request completed or failed.
    Finished(Box<Request>),
    /// Rank timer: the scheduler step in flight is done.
    StepDone,
    /// Rank, at the end of an instant it received messages at: schedule the
    /// next step with everything that arrived.
    Kick,
    /// Link timer: the earliest transfer may be done.
    LinkWake,
    /// Link timer: transfer `id` has waited out the latency and reaches the wire.
    WireReady(ReqId),
    /// Prefill rank timer: the oldest held source's hold may have run out.
    HoldCheck,
    /// Router timer (an injected fault): decode rank `index` crashes now.
    CrashDecode(u32),
    /// Router → decode rank: crash now (the fault, delivered).
    Crash,
    /// A crashed decode rank's heartbeats for request `id` stopped: its
    /// lease on the prefill rank now runs out at the time given. (Stands
    /// for the heartbeats that no longer come.)
    LeaseLost(ReqId, SimTime),
    /// Decode rank `index` → router: it is down; send it nothing more.
    RankDown(u32),
}

impl Msg {
    /// The protocol command this message is, if it is one.
    pub const fn command(&self) -> Option<Command> {
        Some(match self {
            Msg::SubmitHandoffPrefill(_) => Command::SubmitHandoffPrefill,
            Msg::ReleaseSource(_) => Command::ReleaseSource,
            Msg::CancelSource(..) => Command::CancelSource,
            Msg::ReserveDestination(_) => Command::ReserveDestination,
            Msg::CancelDestination(..) => Command::CancelDestination,
            Msg::Submit(_) => Command::Submit,
            _ => return None,
        })
    }

    /// The request a command carries, taken out of it.
    pub fn into_request(self) -> Option<Box<Request>> {
        match self {
            Msg::SubmitHandoffPrefill(r) | Msg::ReserveDestination(r) | Msg::Submit(r) => Some(r),
            _ => None,
        }
    }
}
