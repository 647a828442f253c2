//! Batching policies: which sequences run in a step, which are admitted,
//! and which are preempted. [`VllmPolicy`] is the default.

use super::step::{Replan, Step};

/// Forms one step. The scheduler calls it once per schedule call (twice
/// when the first attempt, with the decoding set in place, asks to replan;
/// a call that only preempted is followed by another), with a
/// [`Step`] whose operations keep every invariant of the scheduler; a
/// policy only decides what to ask for, in which order.
pub trait BatchPolicy: Send {
    /// Puts the step's sequences in it. Pass a [`Replan`] from
    /// [`Step::preempt_last`] or [`Step::preempt_lowest_priority`] on with
    /// `?`; a `None` from them means the victim may not be preempted now.
    fn schedule(&mut self, step: &mut Step<'_>) -> Result<(), Replan>;
}

/// vLLM's v1 scheduler, as pdsim follows it (`v1/core/sched/scheduler.py`,
/// `schedule()`; checked step by step against vLLM 0.33.0's own code by
/// `conformance/`).
///
/// - Running sequences first, in admission order: each takes the tokens it
///   still has to compute before its next output token (a prefill chunk,
///   or one token when decoding), up to the step's token budget
///   (`max_num_batched_tokens`; chunked prefill) and, with vLLM's
///   `long_prefill_token_threshold`, at most that many unless it is the
///   only request running or waiting ([`Step::share`]).
/// - A running sequence that cannot get its blocks preempts the most
///   recently admitted running sequence (recompute preemption), until it
///   fits or is itself the one preempted. On a decode rank under the
///   asynchronous loop, a victim the step in flight was scheduled with is
///   not preempted: no more running sequences are scheduled in the step
///   (vLLM defers frees there, [`Step::preempt_last`]).
///   Under vLLM's priority policy the victim is the running sequence of
///   the largest (priority, arrival), which may already be in the step
///   (it leaves it, its tokens back in the budget), and a sequence that
///   preempts itself lets the ones after it try.
/// - A step that preempted admits nothing (`if not preempted_reqs`).
/// - Otherwise waiting sequences are admitted in queue order while the
///   budget and `max_num_active_seqs` (by default `max_num_seqs`) allow,
///   each with its first chunk (its whole prompt, with chunked prefill
///   off), and only if its whole known sequence fits
///   (`scheduler_reserve_full_isl`) leaving the watermark free; the
///   first that cannot be admitted stops admission (first come, first
///   served; under the priority policy, in (priority, arrival) order).
///   The queue holds a decode rank's landed handoffs first, then
///   preempted sequences, then new ones; a decode rank's new handoffs
///   (remote loads) are reserved there, taking no tokens and no running
///   slot.
///
/// Where pdsim departs from vLLM, on purpose: a waiting sequence that
/// cannot get its blocks with nothing else running or holding any can
/// never fit: it fails instead of waiting for ever (vLLM would retry it at
/// every step).
#[derive(Clone, Copy, Debug, Default)]
pub struct VllmPolicy;

impl BatchPolicy for VllmPolicy {
    fn schedule(&mut self, step: &mut Step<'_>) -> Result<(), Replan> {
        // Running sequences first, in admission order.
        let mut i = 0;
        'running: while step.budget() > 0 {
            let Some(next) = step.next_to_compute(i) else { break };
            i = next;
            let k = step.chunk(i, step.share(step.tokens_left(i).get()));
            if k == 0 {
                i += 1;
                continue;
            }
            let scheduled = loop {
                if step.schedule_running(i, k) {
                    break true;
                }
                // Preempt the most recently admitted (under the priority
                // policy, the lowest priority), until it fits.
                let victim = if step.by_priority() { step.preempt_lowest_priority()? } else { step.preempt_last()? };
                // vLLM would have to defer the victim's free: it stops here.
                let Some(victim) = victim else { break 'running };
                if victim == i {
                    break false;
                }
                // (One before it in running order: it moved up by one.)
                i -= usize::from(victim < i);
            };
            if !scheduled {
                if step.by_priority() {
                    // It preempted itself: the ones after it (now from `i`
                    // on) may still fit.
                    continue;
                }
                break;
            }
            i += 1;
        }

        // A step that preempted admits nothing.
        if step.preempted() > 0 {
            return Ok(());
        }
        // Admission in queue order: first come, first served (under the
        // priority policy, in (priority, arrival) order).
        while step.waiting() > 0 && step.budget() > 0 && step.running() < step.max_num_active_seqs() {
            if step.admit(0) {
                continue;
            }
            if step.never_fits(0) {
                step.give_up(0);
                continue;
            }
            break;
        }
        Ok(())
    }
}
