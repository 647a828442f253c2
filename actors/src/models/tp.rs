//! Tensor parallelism: the bytes a rank of TP size `t` holds and moves, from
//! a model whose byte counts are given at a reference TP size, and how a
//! handoff between prefill TP `P` and decode TP `D` reads them (vLLM's
//! NIXL connector, `nixl/tp_mapping.py` `compute_tp_mapping`).
//!
//! Bytes per rank (H = a group's heads over the whole model):
//! - an attention group holds `max(1, H / t)` heads per rank: KV heads are
//!   split across ranks, and replicated once there are more ranks than
//!   heads (vLLM needs `H % t == 0` or `t % H == 0`);
//! - a Mamba-type state group (a prefix-cacheable `state`) is split
//!   across ranks: `H / t` heads each (`H % t == 0`); a tail ring (a
//!   `state` that is not prefix cacheable: vLLM's circular buffer, an
//!   attention-type cache) follows the attention rule.
//!
//! So `bytes(t) = bytes(r) / per_rank(r) × per_rank(t)`, exactly (a count
//! that does not divide is refused). Pages are sized by the model's first
//! attention group (the pool pads every page to the attention page), or by
//! its first group if it has none.
//!
//! GLM-5.3-Flash-like at TP 4 (`tp = 4`): its full attention is an MLA
//! latent, one head replicated on every rank (`heads = 1`): 13,045,120
//! bytes per block at any TP. A KDA group of 64 heads (16 a rank at TP 4)
//! moves 9,768,960 bytes a block at TP 4 and 4,884,480 at TP 8.
//!
//! A handoff ([`Reads`]): with `D ≥ P` each decode rank reads its heads from
//! one prefill rank (`d·P/D`), and `D/P` decode ranks read from each prefill
//! rank; with `P > D` a decode rank reads from `P/D` prefill ranks (for an
//! attention group only those holding distinct heads), each a slice. A
//! link's bandwidth is one rank's NIC, so a handoff takes as long as its
//! busiest NIC needs: a decode rank receives its own bytes, a prefill rank
//! sends what its `max(1, D/P)` readers take.

use crate::base::units::Bytes;
use crate::models::model::{CacheGroupKind, CacheGroupSpec, ModelSpec};

/// Why a model's bytes cannot be derived at a TP size: the field (relative
/// to the model, e.g. `cache_groups[2].heads`, or `tp` for the rank's own)
/// and what is wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardError {
    /// The field, relative to `model` (or `tp`: the rank's).
    pub field: String,
    /// What is wrong.
    pub problem: String,
}

impl ShardError {
    fn new(field: impl Into<String>, problem: impl Into<String>) -> Self {
        ShardError { field: field.into(), problem: problem.into() }
    }
}

/// Heads per rank of a group of `heads` at TP `t` (`sharded`: a Mamba-type
/// state), or what is wrong.
fn per_rank(sharded: bool, heads: u32, t: u32) -> Result<u64, String> {
    if t == 0 {
        return Err("tp 0: a role runs on at least one GPU".to_owned());
    }
    let (h, t) = (u64::from(heads), u64::from(t));
    match sharded {
        true => {
            if !h.is_multiple_of(t) {
                return Err(format!("{heads} heads cannot be split across tp {t} (a state group shards its heads)"));
            }
            Ok(h / t)
        }
        false => {
            if !h.is_multiple_of(t) && !t.is_multiple_of(h) {
                return Err(format!(
                    "{heads} KV heads and tp {t}: one must divide the other (KV heads are split, or replicated)"
                ));
            }
            Ok((h / t).max(1))
        }
    }
}

/// `bytes` given at reference TP `r`, at TP `t`.
fn scale(bytes: Bytes, sharded: bool, heads: u32, r: u32, t: u32) -> Result<Bytes, String> {
    let (at_r, at_t) = (per_rank(sharded, heads, r)?, per_rank(sharded, heads, t)?);
    if !bytes.get().is_multiple_of(at_r) {
        return Err(format!("{} bytes at tp {r} do not split into its {at_r} heads per rank", bytes.get()));
    }
    (bytes.get() / at_r).checked_mul(at_t).map(Bytes::new).ok_or_else(|| "overflows 64 bits".to_owned())
}

impl ModelSpec {
    /// The model as a rank of TP size `tp` holds it: every byte count at
    /// `tp`. Unchanged when the model gives no reference `tp`, or the same;
    /// otherwise every group (or a linear model) needs its heads.
    pub fn at_tp(&self, tp: u32) -> Result<ModelSpec, ShardError> {
        let Some(r) = self.tp else { return Ok(self.clone()) };
        if r == 0 {
            return Err(ShardError::new("tp", "must be greater than 0"));
        }
        if r == tp {
            return Ok(self.clone());
        }
        let mut out = self.clone();
        let why = |field: String| move |p: String| ShardError::new(field, format!("{p} (from the model's tp {r})"));
        if let Some(kv) = self.kv_bytes_per_token {
            let heads = self.kv_heads.ok_or_else(|| {
                ShardError::new("kv_heads", format!("missing: needed to derive the bytes at tp {tp} from tp {r}"))
            })?;
            out.kv_bytes_per_token = Some(scale(kv, false, heads, r, tp).map_err(why("kv_heads".into()))?);
        }
        let sharded = |g: &CacheGroupSpec| g.kind == CacheGroupKind::State && g.prefix_cacheable == Some(true);
        // Pages follow the first attention group (or the first group).
        let page_group = self.cache_groups.iter().position(|g| !sharded(g)).unwrap_or(0);
        let mut page_scale: Option<(Bytes, Bytes)> = None;
        for (i, g) in self.cache_groups.iter().enumerate() {
            let field = |f: &str| format!("cache_groups[{i}].{f}");
            let heads = g.heads.ok_or_else(|| {
                ShardError::new(field("heads"), format!("missing: needed to derive the bytes at tp {tp} from tp {r}"))
            })?;
            let o: &mut CacheGroupSpec = &mut out.cache_groups[i];
            if let Some(t) = g.transfer_bytes_per_block {
                o.transfer_bytes_per_block = Some(scale(t, sharded(g), heads, r, tp).map_err(why(field("heads")))?);
            }
            if i == page_group {
                let new = scale(g.page_bytes, sharded(g), heads, r, tp).map_err(why(field("heads")))?;
                page_scale = Some((g.page_bytes, new));
            }
        }
        if let Some((old, new)) = page_scale {
            // Every page is the same (the gate checks); a differing one stays
            // as it is, for the gate to name.
            for o in out.cache_groups.iter_mut().filter(|o| o.page_bytes == old) {
                o.page_bytes = new;
            }
        }
        out.tp = Some(tp);
        Ok(out)
    }
}

/// How one handoff reads between prefill TP `p` and decode TP `d`, per
/// decode rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reads {
    /// Prefill ranks one decode rank reads from.
    pub sources: u32,
    /// Decode ranks that read from one prefill rank.
    pub readers: u32,
}

impl Reads {
    /// The reads of a handoff between prefill TP `p` and decode TP `d`,
    /// for a model whose attention groups have `kv_heads` KV heads (the
    /// most of any group; `None`: no attention group, or unknown) and
    /// which has state groups (`state`), as vLLM maps them: `D ≥ P` one
    /// source; `P > D` `P/D` sources, for attention only those holding
    /// distinct heads (`min(P/D, max(1, H/D))`), all `P/D` for a state.
    ///
    /// `p` and `d` must divide one another (checked by the validator).
    pub fn new(p: u32, d: u32, kv_heads: Option<u32>, state: bool) -> Reads {
        if d >= p {
            return Reads { sources: 1, readers: d / p };
        }
        let a = p / d;
        let attn = kv_heads.map_or(a, |h| a.min((h / d).max(1)));
        Reads { sources: if state { a } else { attn }, readers: 1 }
    }

    /// [`Reads::new`] for `model`: its attention groups' most KV heads (or
    /// a linear model's `kv_heads`), and whether it has Mamba-type state
    /// groups.
    pub fn for_model(model: &ModelSpec, p: u32, d: u32) -> Reads {
        let sharded = |g: &&CacheGroupSpec| g.kind == CacheGroupKind::State && g.prefix_cacheable == Some(true);
        let kv_heads = model.cache_groups.iter().filter(|g| !sharded(g)).filter_map(|g| g.heads).max();
        let state = model.cache_groups.iter().any(|g| sharded(&g));
        Reads::new(p, d, kv_heads.or(model.kv_heads), state)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_follow_vllms_mapping() {
        // D ≥ P: one source, D/P readers per prefill rank.
        assert_eq!(Reads::new(4, 8, Some(8), true), Reads { sources: 1, readers: 2 });
        assert_eq!(Reads::new(4, 4, None, false), Reads { sources: 1, readers: 1 });
        // P = 8 > D = 2: a decode rank covers 4 prefill ranks; with 8 KV
        // heads they hold 4 distinct heads (8 / 2), with 2 heads only 1.
        assert_eq!(Reads::new(8, 2, Some(8), false).sources, 4);
        assert_eq!(Reads::new(8, 2, Some(2), false).sources, 1);
        // A Mamba state is split on every prefill rank: all 4 are read.
        assert_eq!(Reads::new(8, 2, Some(2), true).sources, 4);
    }

    #[test]
    fn a_linear_models_bytes_at_other_tp_sizes() {
        // Llama-3.1-8B-like: 32,768 bytes a token at TP 4 with 8 KV heads
        // (2 a rank): 16,384 a head-token.
        let m = ModelSpec {
            kv_bytes_per_token: Some(Bytes::new(32_768)),
            tp: Some(4),
            kv_heads: Some(8),
            ..Default::default()
        };
        let at = |t| m.at_tp(t).map(|s| s.kv_bytes_per_token.unwrap().get());
        assert_eq!(at(2), Ok(65_536)); // 4 heads a rank
        assert_eq!(at(8), Ok(16_384)); // 1
        assert_eq!(at(16), Ok(16_384)); // replicated: still 1
        assert_eq!(at(4), Ok(32_768));
        assert_eq!(at(3).unwrap_err().field, "kv_heads"); // neither divides
    }
}
