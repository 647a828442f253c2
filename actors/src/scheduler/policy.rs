//! Batching policies: which sequences run in a step, which are admitted,
//! and which are preempted. [`VllmPolicy`] is the default.

use super::step::{Replan, Step};

/// Forms one step. The scheduler calls it once per step (twice when the
/// first attempt, with the decoding set in place, asks to replan), with a
/// [`Step`] whose operations keep every invariant of the scheduler; a
/// policy only decides what to ask for, in which order.
pub trait BatchPolicy: Send {
    /// Puts the step's sequences in it. Pass a [`Replan`] from
    /// [`Step::preempt_last`] on with `?`.
    fn schedule(&mut self, step: &mut Step<'_>) -> Result<(), Replan>;
}

/// vLLM's v1 scheduler, as pdsim follows it (`v1/core/sched/scheduler.py`,
/// `schedule()`).
///
/// - Running sequences first, in admission order: each takes the tokens it
///   still has to compute before its next output token (a prefill chunk,
///   or one token when decoding), up to the step's token budget
///   (`max_num_batched_tokens`; chunked prefill).
/// - A running sequence that cannot get its blocks preempts the most
///   recently admitted running sequence (recompute preemption), until it
///   fits or is itself the one preempted.
/// - Then waiting sequences are admitted in queue order while the budget
///   and `max_num_seqs` allow, each with its first chunk. No admission
///   happens in a step that preempted, unless the step would otherwise be
///   empty.
///
/// Where pdsim departs from vLLM, on purpose:
/// - a waiting sequence that cannot get its blocks stops admission (first
///   come, first served) unless the step is still empty: then later
///   sequences that fit may go ahead, so that a preempted sequence needing
///   a large recompute cannot stall requests whose blocks are already
///   reserved;
/// - the sequences preempted in this step sit it out if the step is empty:
///   taking them straight back could repeat forever (a recompute whose
///   first chunk fits but whose second does not, beside sequences that
///   hold the rest of the pool and wait behind it for the token budget, is
///   preempted and taken back at every step; vLLM's own order would loop
///   there), so the sequences behind them run and free their blocks
///   (unless nothing else can: then they are taken back);
/// - a waiting sequence that cannot get its blocks with nothing else
///   holding any can never fit: it fails instead of waiting forever.
#[derive(Clone, Copy, Debug, Default)]
pub struct VllmPolicy;

impl BatchPolicy for VllmPolicy {
    fn schedule(&mut self, step: &mut Step<'_>) -> Result<(), Replan> {
        // Running sequences first, in admission order.
        let mut i = 0;
        while step.budget() > 0 {
            let Some(next) = step.next_to_compute(i) else { break };
            i = next;
            let k = step.tokens_left(i).get().min(step.budget());
            if k == 0 {
                i += 1;
                continue;
            }
            let scheduled = loop {
                if step.schedule_running(i, k) {
                    break true;
                }
                // Preempt the most recently admitted, until it fits.
                let victim = step.preempt_last()?;
                if victim == i {
                    break false;
                }
            };
            if !scheduled {
                break;
            }
            i += 1;
        }

        // Admission in queue order; the ones preempted in this step wait
        // at the front and sit it out first.
        let preempted = step.preempted();
        let mut wi = preempted;
        let mut sitting_out = preempted > 0;
        loop {
            if wi >= step.waiting() || step.budget() == 0 || step.running() >= step.max_num_seqs() {
                if sitting_out && step.is_empty() {
                    sitting_out = false;
                    wi = 0;
                    continue;
                }
                break;
            }
            let empty = step.is_empty();
            if preempted > 0 && !empty {
                break;
            }
            if step.admit(wi) {
                continue;
            }
            if step.never_fits(wi) {
                step.give_up(wi);
                continue;
            }
            if !empty {
                break;
            }
            wi += 1;
        }
        Ok(())
    }
}
