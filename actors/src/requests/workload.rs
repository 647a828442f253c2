//! What a simulation serves: requests, pulled one at a time from a source.
//!
//! A [`RequestSource`] is asked for the next request only when the router
//! needs it (the next arrival of an open loop, or a completion in a closed
//! loop), so a trace of any length is replayed in memory bounded by the
//! requests in flight.

use sim_core::SimTime;

use crate::base::units::Tokens;

pub use crate::base::keys::mix;

/// One request as a workload describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestSpec {
    /// When it arrives (open loop); ignored by a closed loop.
    pub arrival: SimTime,
    /// Prompt tokens, at least 1.
    pub prompt: Tokens,
    /// Output tokens to generate, at least 1.
    pub output: Tokens,
    /// What the prompt shares with other prompts, for prefix caching.
    pub prefix: PrefixIds,
    /// Its priority (vLLM's `priority` request field: lower first; 0 by
    /// default), read by ranks under the priority policy.
    pub priority: i32,
}

/// The identity of a prompt's leading content, as chained block ids: id `i`
/// names the whole prompt prefix up to the end of block `i` of
/// `block_tokens` tokens (two prompts with an equal id `i` agree on every
/// token up to there), as Mooncake traces' `hash_ids` do with 512-token
/// blocks. Empty ids: the prompt shares nothing.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PrefixIds {
    /// Tokens one id covers.
    pub block_tokens: Tokens,
    /// Chained ids of the prompt's blocks, in order.
    pub ids: Vec<u64>,
}

impl PrefixIds {
    /// No shared content.
    pub fn none() -> Self {
        PrefixIds::default()
    }

    /// The identity of the prompt's first `end` tokens, if the ids cover
    /// them, as the cache key of a pool block of `b` tokens ending there
    /// (`named_key`).
    pub fn key_through(&self, end: Tokens, prompt: Tokens, b: Tokens) -> Option<u64> {
        let g = self.block_tokens.get();
        if g == 0 || end.is_zero() || end > prompt {
            return None;
        }
        let idx = (end.get() - 1) / g;
        // Ids are content hashes of the (possibly partial) blocks, so an
        // equal id also means an equal length of a partial last block.
        let id = *self.ids.get(usize::try_from(idx).ok()?)?;
        Some(named_key(id, idx, end.get(), g, b.get()))
    }

    /// Appends to `out` [`PrefixIds::key_through`] of the ends of at most
    /// `most` consecutive `b`-token blocks from block `first` on (ends
    /// `(first + 1)·b`, `(first + 2)·b`, …), up to the first block it gives
    /// none for. Where pool blocks tile the ids' blocks in groups
    /// (`named_key`), an id's keys are its group's hash with the places
    /// counted up: one hash an id and a store a block, with the run's
    /// length known up front (the blocks within the prompt and the ids).
    pub fn push_block_keys(&self, b: Tokens, first: u64, prompt: Tokens, most: u64, out: &mut Vec<u64>) {
        let (g, bt) = (self.block_tokens.get(), b.get());
        if !groups_blocks(g, bt) {
            out.extend(self.block_keys(b, first, prompt).take(usize::try_from(most).unwrap_or(usize::MAX)));
            return;
        }
        let runs = self.group_runs(g, bt, first, prompt, most);
        out.reserve(runs.len);
        for (k, n) in runs {
            // A group's places are the key's low bits, counted up.
            out.extend((0..n).map(|place| k + place));
        }
    }

    /// [`PrefixIds::push_block_keys`]'s keys as runs of one group each
    /// (where pool blocks of `b` tokens tile the ids' blocks in groups,
    /// `named_key`), appended to `out` as (the run's first key, its
    /// blocks): the run's keys are the first with the place counted up. So
    /// a group's keys are registered with one lookup of its record and no
    /// key written down. `false`, and nothing appended, where the blocks
    /// are not grouped.
    pub fn push_group_runs(&self, b: Tokens, first: u64, prompt: Tokens, most: u64, out: &mut Vec<(u64, u64)>) -> bool {
        self.group_runs_of(b, first, prompt, most).map(|runs| out.extend(runs)).is_some()
    }

    /// The runs [`PrefixIds::push_group_runs`] appends, one at a time
    /// (`None` where the blocks are not grouped).
    pub(crate) fn group_runs_of(&self, b: Tokens, first: u64, prompt: Tokens, most: u64) -> Option<GroupRuns<'_>> {
        let (g, bt) = (self.block_tokens.get(), b.get());
        groups_blocks(g, bt).then(|| self.group_runs(g, bt, first, prompt, most))
    }

    /// The runs of [`PrefixIds::push_group_runs`] (blocks of `bt` tokens
    /// tiling ids' blocks of `g`).
    fn group_runs(&self, g: u64, bt: u64, first: u64, prompt: Tokens, most: u64) -> GroupRuns<'_> {
        let per = g / bt;
        // Block j ends at (j + 1)·b, within the prompt for j < prompt / b,
        // and lies in the ids' block j / per at place j % per.
        let covered = u64::try_from(self.ids.len()).unwrap_or(u64::MAX).saturating_mul(per);
        let end = (prompt.get() / bt).min(covered).min(first.saturating_add(most));
        GroupRuns {
            ids: &self.ids,
            per,
            next: first,
            end,
            len: usize::try_from(end.saturating_sub(first)).unwrap_or(0),
        }
    }

    /// [`PrefixIds::push_block_keys`]'s run one key at a time, for any
    /// block sizes: one division for the run instead of one a block.
    fn block_keys(&self, b: Tokens, first: u64, prompt: Tokens) -> impl Iterator<Item = u64> + '_ {
        let (g, b) = (self.block_tokens.get(), b.get());
        let mut end = first.saturating_add(1).saturating_mul(b);
        // The id of the block holding token end − 1: idx·g < end ≤ (idx + 1)·g.
        let mut idx = end.saturating_sub(1).checked_div(g).unwrap_or(0);
        let mut bound = idx.saturating_add(1).saturating_mul(g);
        let mut done = g == 0 || b == 0;
        // Grouped keys ([`named_key`]): the group's hash once an id, the
        // place counted up (the blocks tile the id's).
        let grouped = !done && groups_blocks(g, b);
        let mut place = if grouped { end.saturating_sub(1) % g / b } else { 0 };
        let mut group = None;
        std::iter::from_fn(move || {
            if done || end == 0 || end > prompt.get() {
                done = true;
                return None;
            }
            while end > bound {
                idx += 1;
                bound = bound.saturating_add(g);
                (group, place) = (None, 0);
            }
            let Some(&id) = usize::try_from(idx).ok().and_then(|i| self.ids.get(i)) else {
                done = true;
                return None;
            };
            let k = if grouped {
                let h = *group.get_or_insert_with(|| mix(id, idx));
                place += 1;
                crate::base::keys::grouped_key(h, place - 1)
            } else {
                named_key(id, idx, end, g, b)
            };
            debug_assert_eq!(k, named_key(id, idx, end, g, b));
            end = end.saturating_add(b);
            Some(k)
        })
    }
}

/// The cache key of the pool block of `b` tokens that ends at token `end`
/// within the ids' block `idx` (of `g` tokens) whose id is `id`: for one
/// `b` (each kind of key of a pool is made with one block size), one key
/// for each (id, end), as `mix(id, end)` would give. When the pool's blocks
/// tile the ids' blocks in groups worth a record (`b` divides `g`, from
/// [`MIN_GROUP`] to [`GROUP_LEN`](crate::base::keys::GROUP_LEN) of them), the keys of one
/// id's blocks are grouped in the key map, their place the block's within
/// the id; else each is a key of its own. (Ids name content in place, but
/// the group is a mix of the id and its index all the same, so that an id
/// repeated at another place keeps distinct keys.)
pub(crate) fn named_key(id: u64, idx: u64, end: u64, g: u64, b: u64) -> u64 {
    use crate::base::keys::{grouped_key, plain_key};
    if groups_blocks(g, b) { grouped_key(mix(id, idx), (end - 1) % g / b) } else { plain_key(mix(id, end)) }
}

/// The grouped keys of blocks `next..end` as runs of one group each: (the
/// first key, blocks).
pub(crate) struct GroupRuns<'a> {
    ids: &'a [u64],
    /// Pool blocks an id's block.
    per: u64,
    next: u64,
    end: u64,
    /// Blocks in all (`end - next` at the start).
    len: usize,
}

impl Iterator for GroupRuns<'_> {
    type Item = (u64, u64);

    #[inline]
    fn next(&mut self) -> Option<(u64, u64)> {
        if self.next >= self.end {
            return None;
        }
        let (j, per) = (self.next, self.per);
        let idx = j / per;
        let base = idx * per;
        let stop = (base + per).min(self.end);
        self.next = stop;
        Some((crate::base::keys::grouped_key(mix(self.ids[idx as usize], idx), j - base), stop - j))
    }
}

/// Whether pool blocks of `b` tokens tile ids' blocks of `g` in groups
/// ([`named_key`]).
#[inline]
fn groups_blocks(g: u64, b: u64) -> bool {
    b > 0 && g.is_multiple_of(b) && (MIN_GROUP..=crate::base::keys::GROUP_LEN as u64).contains(&(g / b))
}

/// The fewest blocks an id's blocks must be for their keys to be grouped: a
/// group's record (144 bytes) then serves at least this many keys; fewer
/// are plain keys, 8 bytes a cell. (A threshold chosen, not measured.)
const MIN_GROUP: u64 = 4;

/// Why a workload could not give its next request (a malformed trace row, an
/// unreadable file). The text names the place; the run stops with it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct WorkloadError(pub String);

/// A stream of requests.
pub trait RequestSource {
    /// The next request, or `None` when the workload is exhausted. For an
    /// open loop, arrivals must not decrease.
    fn next_request(&mut self) -> Result<Option<RequestSpec>, WorkloadError>;

    /// How many requests remain, if known (to size the records up front).
    fn remaining_hint(&self) -> Option<u64> {
        None
    }
}

impl<I: Iterator<Item = RequestSpec>> RequestSource for I {
    fn next_request(&mut self) -> Result<Option<RequestSpec>, WorkloadError> {
        Ok(self.next())
    }

    fn remaining_hint(&self) -> Option<u64> {
        self.size_hint().1.map(|n| n as u64)
    }
}

/// When requests enter the system.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArrivalMode {
    /// At the arrival times the source gives.
    Open,
    /// A fixed number in flight: one enters whenever one leaves (arrival
    /// times from the source are ignored).
    Closed {
        /// Requests in flight.
        concurrency: u32,
    },
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        /// The run of keys is key_through's, block by block, and ends where
        /// key_through first gives none (ids shorter than the prompt, a
        /// partial last block, pool blocks smaller, equal or larger than
        /// the ids' blocks, or tiling them in groups half the time).
        #[test]
        fn block_keys_are_key_through_of_each_block_end(
            tile in 0u64..40,
            grouped in any::<bool>(),
            b in 1u64..40,
            ids in prop::collection::vec(any::<u64>(), 0..30),
            prompt in 0u64..1200,
            first in 0u64..40,
            most in 0u64..60,
        ) {
            // (Grouped: 4 to 32 pool blocks an id's block.)
            let g = if grouped { b * (MIN_GROUP + tile % 29) } else { tile };
            prop_assert!(!grouped || groups_blocks(g, b));
            let p = PrefixIds { block_tokens: Tokens::new(g), ids };
            let prompt = Tokens::new(prompt);
            let expected: Vec<u64> = (first..)
                .map(|i| p.key_through(Tokens::new((i + 1) * b), prompt, Tokens::new(b)))
                .take_while(Option::is_some)
                .flatten()
                .collect();
            let got: Vec<u64> = p.block_keys(Tokens::new(b), first, prompt).collect();
            prop_assert_eq!(&got, &expected);
            // The appended run is the same, cut at `most`, after what the
            // buffer held.
            let mut pushed = vec![7];
            p.push_block_keys(Tokens::new(b), first, prompt, most, &mut pushed);
            let cut = expected.len().min(most as usize);
            prop_assert_eq!(pushed[0], 7);
            prop_assert_eq!(&pushed[1..], &expected[..cut]);
            // Grouped, the same keys come as runs of one group each, a
            // group's places counted up; not grouped, no runs.
            let mut runs = vec![(7, 7)];
            let is = p.push_group_runs(Tokens::new(b), first, prompt, most, &mut runs);
            prop_assert_eq!(is, groups_blocks(g, b));
            prop_assert_eq!(runs[0], (7, 7));
            if is {
                let group = |k: u64| k / crate::base::keys::GROUP_LEN as u64;
                let mut keys = Vec::new();
                for &(k, n) in &runs[1..] {
                    prop_assert!(n > 0 && group(k) == group(k + n - 1), "a run stays in its group");
                    keys.extend((0..n).map(|j| k + j));
                }
                prop_assert_eq!(&keys, &expected[..cut]);
            } else {
                prop_assert_eq!(runs.len(), 1);
            }
        }

        /// A key names one (id, end): the blocks of a prompt have distinct
        /// keys, grouped (pool blocks tiling the ids') or not, and the same
        /// id at another index gives other keys too.
        #[test]
        fn named_keys_are_distinct_for_distinct_blocks(
            g in 1u64..70,
            b in 1u64..70,
            ids in prop::collection::vec(0u64..3, 1..30),
        ) {
            let p = PrefixIds { block_tokens: Tokens::new(g), ids };
            let prompt = Tokens::new(g * p.ids.len() as u64);
            let keys: Vec<u64> = p.block_keys(Tokens::new(b), 0, prompt).collect();
            let mut distinct = keys.clone();
            distinct.sort_unstable();
            distinct.dedup();
            prop_assert_eq!(distinct.len(), keys.len(), "{:?}", keys);
            if groups_blocks(g, b) {
                prop_assert!(keys.iter().all(|&k| k & crate::base::keys::GROUPED != 0));
            }
        }
    }
}
