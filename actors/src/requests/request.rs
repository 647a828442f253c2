//! A request as it moves through the deployment, with its timestamps, and
//! the reasons a request can fail.

use std::fmt;

use sim_core::{SimDuration, SimTime};

use crate::base::units::{Bytes, Tokens};
use crate::models::model::{HandoffSide, Role};
use crate::requests::workload::PrefixIds;

/// The most tokens (prompt and output together) one request may have: far
/// beyond any model's context, and small enough that no count overflows.
pub const MAX_REQUEST_TOKENS: u64 = 1 << 32;

/// A request's number, in arrival order from 0.
pub type ReqId = u64;

/// One request. It travels boxed inside the protocol messages, so each actor
/// that handles it stamps its own part of the record.
#[derive(Clone, Debug, PartialEq)]
pub struct Request {
    /// Its number.
    pub id: ReqId,
    /// Prompt tokens (N).
    pub prompt: Tokens,
    /// Output tokens to generate.
    pub output: Tokens,
    /// Its priority, as vLLM's `priority` request field (lower is served
    /// first; 0 by default): read only by a rank whose scheduler runs
    /// vLLM's priority policy.
    pub priority: i32,
    /// Shared-prefix identity, for prefix caching (emptied once the request ends).
    pub prefix: PrefixIds,
    /// When each stage happened.
    pub t: Stamps,
    /// Index of the prefill (or aggregated) rank that served it.
    pub prefill_rank: Option<u32>,
    /// Index of the decode rank that served it.
    pub decode_rank: Option<u32>,
    /// Tokens the prefill computed and handed off (T).
    pub transferred_tokens: Tokens,
    /// Bytes moved over the link.
    pub transfer_bytes: Bytes,
    /// Prompt tokens found in the prefill (or aggregated) rank's prefix cache.
    pub prefill_hit: Tokens,
    /// Prompt tokens found in the decode rank's prefix cache.
    pub decode_hit: Tokens,
    /// Times it was preempted (its KV freed, to be recomputed).
    pub preemptions: u32,
    /// Output tokens generated so far.
    pub generated: Tokens,
    /// Longest gap between two of its output tokens.
    pub max_itl: SimDuration,
    /// The sum of the squares of the gaps between its output tokens, ns²
    /// (for the inter-token std; the sum of the gaps is last − first token;
    /// it would saturate at 2¹²⁸ ns², some gaps of centuries).
    pub itl_sq_sum: u128,
    /// How it ended.
    pub outcome: Outcome,
}

impl Request {
    /// A new request arriving at `arrival`.
    pub fn new(id: ReqId, prompt: Tokens, output: Tokens, prefix: PrefixIds, arrival: SimTime) -> Self {
        Request {
            id,
            prompt,
            output,
            priority: 0,
            prefix,
            t: Stamps { arrival, ..Stamps::default() },
            prefill_rank: None,
            decode_rank: None,
            transferred_tokens: Tokens::ZERO,
            transfer_bytes: Bytes::ZERO,
            prefill_hit: Tokens::ZERO,
            decode_hit: Tokens::ZERO,
            preemptions: 0,
            generated: Tokens::ZERO,
            max_itl: SimDuration::ZERO,
            itl_sq_sum: 0,
            outcome: Outcome::InFlight,
        }
    }

    /// Marks it failed, unless it already ended.
    pub fn fail(&mut self, reason: FailReason, now: SimTime) {
        if self.outcome == Outcome::InFlight {
            self.outcome = Outcome::Failed(reason);
            self.t.finished = Some(now);
        }
    }

    /// Moves its output times (first and last token, its end) from when the
    /// engine made them to when its client gets them, `way_out` later (the
    /// API server's response leg). Done once, as the request is recorded.
    pub(crate) fn shift_to_client_time(&mut self, way_out: SimDuration) {
        for t in [&mut self.t.first_token, &mut self.t.last_token, &mut self.t.finished].into_iter().flatten() {
            *t = t.saturating_add(way_out);
        }
    }

    /// Time to first token.
    pub fn ttft(&self) -> Option<SimDuration> {
        Some(self.t.first_token? - self.t.arrival)
    }
    /// End-to-end latency.
    pub fn e2e(&self) -> Option<SimDuration> {
        Some(self.t.finished? - self.t.arrival)
    }
    /// Time per output token after the first: (E2E − TTFT)/(output − 1);
    /// `None` for a single output token or an unfinished request.
    pub fn tpot(&self) -> Option<SimDuration> {
        if self.outcome != Outcome::Completed || self.generated.get() < 2 {
            return None;
        }
        let span = self.t.last_token? - self.t.first_token?;
        Some(SimDuration::from_nanos(span.as_nanos() / (self.generated.get() - 1)))
    }
}

/// When each stage of a request happened (`None`: it never got there).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stamps {
    /// Entered the system (reached the API server).
    pub arrival: SimTime,
    /// Queued at the prefill (or aggregated) rank: its engine core has it,
    /// one way in through the API server after its arrival.
    pub prefill_queued: Option<SimTime>,
    /// First scheduled on the prefill (or aggregated) rank.
    pub prefill_started: Option<SimTime>,
    /// Prefill done; the source is held (disaggregated only).
    pub prefill_done: Option<SimTime>,
    /// The decode rank got ReserveDestination.
    pub reserve_requested: Option<SimTime>,
    /// The decode rank's blocks were reserved.
    pub reserved: Option<SimTime>,
    /// The transfer started on the link.
    pub transfer_started: Option<SimTime>,
    /// The transfer completed (or, with nothing to move, the reservation).
    pub transfer_done: Option<SimTime>,
    /// First scheduled on the decode rank.
    pub decode_started: Option<SimTime>,
    /// First output token, as its client gets it (one way out through the
    /// API server after the step that made it).
    pub first_token: Option<SimTime>,
    /// Last output token, as its client gets it.
    pub last_token: Option<SimTime>,
    /// Completed or failed, as its client learns it.
    pub finished: Option<SimTime>,
}

impl Stamps {
    /// Every stamp in stage order, arrival first (the order of
    /// `requests.csv`'s columns and of the run digest).
    pub fn in_order(&self) -> [Option<SimTime>; 12] {
        [
            Some(self.arrival),
            self.prefill_queued,
            self.prefill_started,
            self.prefill_done,
            self.reserve_requested,
            self.reserved,
            self.transfer_started,
            self.transfer_done,
            self.decode_started,
            self.first_token,
            self.last_token,
            self.finished,
        ]
    }
}

/// How a request ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Not yet ended.
    InFlight,
    /// Generated all its output tokens.
    Completed,
    /// Ended without its output, for this reason.
    Failed(FailReason),
}

/// The commands of the handoff protocol, by name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    /// Router → prefill rank: compute this prompt and hold its KV.
    SubmitHandoffPrefill,
    /// Decode → prefill rank: the transfer is done; free the source.
    ReleaseSource,
    /// Decode or router → prefill rank: give up the source.
    CancelSource,
    /// Router → decode rank: reserve blocks for this held source.
    ReserveDestination,
    /// Router → decode rank: give up this destination.
    CancelDestination,
    /// Router → aggregated rank: serve this request locally.
    Submit,
}

impl Command {
    /// The command's name.
    pub const fn as_str(self) -> &'static str {
        match self {
            Command::SubmitHandoffPrefill => "SubmitHandoffPrefill",
            Command::ReleaseSource => "ReleaseSource",
            Command::CancelSource => "CancelSource",
            Command::ReserveDestination => "ReserveDestination",
            Command::CancelDestination => "CancelDestination",
            Command::Submit => "Submit",
        }
    }

    /// The end of a handoff the command belongs to; `None` for
    /// [`Command::Submit`], which serves a request with no handoff.
    pub const fn side(self) -> Option<HandoffSide> {
        match self {
            Command::SubmitHandoffPrefill | Command::ReleaseSource | Command::CancelSource => Some(HandoffSide::Source),
            Command::ReserveDestination | Command::CancelDestination => Some(HandoffSide::Destination),
            Command::Submit => None,
        }
    }

    /// Whether a rank of `role` accepts it: a handoff command by
    /// [`Role::accepts`] (source commands only on prefill ranks,
    /// destination commands only on decode ranks), a local one only on an
    /// aggregated rank. Every rank's refusals follow this.
    pub const fn accepted_by(self, role: Role) -> bool {
        match self.side() {
            Some(side) => role.accepts(side),
            None => matches!(role, Role::Aggregated),
        }
    }
}

/// Why a request failed. Every failed request keeps one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailReason {
    /// A rank was sent a command its role does not accept.
    Refused {
        /// The refusing rank's role.
        role: Role,
        /// The command.
        command: Command,
    },
    /// The decode rank aborted the handoff.
    DecodeAborted,
    /// The prefill rank stopped holding the source before the decode side
    /// released it.
    SourceHoldExpired {
        /// How long it was held.
        held: SimDuration,
    },
    /// The request needs more KV blocks than the rank's whole pool.
    DoesNotFit {
        /// The refusing rank's role.
        role: Role,
        /// Blocks it needs.
        needed: u64,
        /// Blocks the pool has.
        capacity: u64,
    },
    /// Its prompt leaves no room for an output token within the rank's
    /// `max_model_len`.
    ExceedsMaxModelLen {
        /// The refusing rank's role.
        role: Role,
        /// The rank's limit, tokens.
        max_model_len: u64,
    },
    /// The simulation ended (a time limit) with the request still in flight.
    Unfinished,
    /// Its decode rank crashed.
    DecodeCrashed,
    /// Every decode rank is down.
    NoDecodeRank,
}

impl fmt::Display for FailReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FailReason::Refused { role, command } => {
                let side = match command.side() {
                    Some(HandoffSide::Source) => "source",
                    Some(HandoffSide::Destination) => "destination",
                    None => "local",
                };
                let what = if role.accepts(HandoffSide::Source) {
                    "only source commands"
                } else if role.accepts(HandoffSide::Destination) {
                    "only destination commands"
                } else {
                    "no handoff commands"
                };
                write!(f, "{role} rank refused {side} command {}: it accepts {what}", command.as_str())
            }
            FailReason::DecodeAborted => f.write_str("decode rank aborted the handoff; source cancelled"),
            FailReason::SourceHoldExpired { held } => {
                write!(f, "source hold expired after {held} without a release from the decode rank")
            }
            FailReason::DoesNotFit { role, needed, capacity } => {
                write!(f, "{role} rank cannot fit the request: needs {needed} blocks, pool has {capacity}")
            }
            FailReason::ExceedsMaxModelLen { role, max_model_len } => {
                write!(f, "{role} rank refused the request: its prompt reaches max_model_len {max_model_len}")
            }
            FailReason::Unfinished => f.write_str("still in flight when the simulation ended"),
            FailReason::DecodeCrashed => f.write_str("decode rank crashed"),
            FailReason::NoDecodeRank => f.write_str("no decode rank is up; source cancelled"),
        }
    }
}
