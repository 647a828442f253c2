//! Property tests of the grouped transfer rules over random groups and lengths.

use actors::model::{CacheGroupKind, CacheGroupSpec, Model};
use actors::rules::{
    Payload, blocks_for_step, blocks_held, handoff_size, in_window_blocks, payload, prefill_clip_blocks,
    skipped_blocks, source_release, transferred_tokens,
};
use actors::units::{Blocks, Bytes, Tokens};
use proptest::prelude::*;

use crate::model_fixtures::{model, spec};

fn config() -> ProptestConfig {
    ProptestConfig { cases: 256, ..ProptestConfig::default() }
}

/// One random group: (kind index, window, transfer bytes, prefix cacheable,
/// checkpoint blocks); kinds 0..4 include windows, 0..1 and 3 do not.
fn group_parts(windows: bool) -> impl Strategy<Value = (u8, u64, u64, bool, u64)> {
    let kind = if windows { (0u8..4).boxed() } else { prop_oneof![Just(0u8), Just(3u8)].boxed() };
    (kind, 1u64..=600, 1u64..=1_000_000, any::<bool>(), 0u64..=2)
}

/// A random valid grouped model: 1 to 5 groups, the full-attention groups
/// sharing one block size, every page the largest transfer.
fn grouped_model() -> impl Strategy<Value = Model> {
    model_with(true)
}

/// A random valid grouped model without window groups.
fn model_without_windows() -> impl Strategy<Value = Model> {
    model_with(false)
}

fn model_with(windows: bool) -> impl Strategy<Value = Model> {
    (1u64..=64, 1u64..=64, prop::collection::vec(group_parts(windows), 1..=5)).prop_map(|(fa_b, other_b, parts)| {
        let page = parts.iter().map(|p| p.2).max().unwrap_or(1);
        let groups = parts
            .iter()
            .enumerate()
            .map(|(i, &(k, w, bytes, pc, ckpt))| {
                let kind = [
                    CacheGroupKind::FullAttention,
                    CacheGroupKind::SlidingWindow,
                    CacheGroupKind::Convolution,
                    CacheGroupKind::State,
                ][usize::from(k)];
                let mamba = kind == CacheGroupKind::State && pc;
                CacheGroupSpec {
                    name: format!("g{i}"),
                    kind,
                    block_size_tokens: Tokens::new(if kind == CacheGroupKind::FullAttention { fa_b } else { other_b }),
                    page_bytes: Bytes::new(page),
                    transfer_bytes_per_block: Some(Bytes::new(bytes)),
                    prefix_cacheable: Some(pc),
                    window_tokens: kind.is_window().then_some(Tokens::new(w)),
                    checkpoint_blocks: mamba.then_some(Blocks::new(ckpt)),
                    heads: None,
                }
            })
            .collect();
        model(&spec(groups))
    })
}

fn has_window(m: &Model) -> bool {
    m.as_grouped().is_some_and(|g| g.groups().iter().any(|g| g.kind().is_window()))
}

/// Bytes of one block of each window group, summed: the most a window dip
/// can take off the payload when T grows by one token.
fn window_block_bytes(m: &Model) -> u64 {
    m.as_grouped()
        .map(|g| g.groups().iter().filter(|g| g.kind().is_window()).map(|g| g.transfer_bytes_per_block().get()).sum())
        .unwrap_or(0)
}

fn full_attention_bytes(p: &Payload) -> u64 {
    match p {
        Payload::Blocks(b) => b.full_attention_bytes().get(),
        Payload::Tokens(t) => t.bytes().get(),
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn in_window_never_exceeds_prefill_clip(t in 0u64..100_000, w in 1u64..10_000, b in 1u64..512) {
        let (t, w, b) = (Tokens::new(t), Tokens::new(w), Tokens::new(b));
        let n = in_window_blocks(t, w, b);
        prop_assert!(n <= prefill_clip_blocks(w, b));
        prop_assert!(n <= t.blocks_ceil(b));
        prop_assert_eq!(n.get() + skipped_blocks(t, w, b).get(), t.blocks_ceil(b).get());
        // Past the window's first fill it is cdiv(W − 1, B) or one more.
        if t.get() + 1 >= w.get() {
            let base = Tokens::new(w.get() - 1).blocks_ceil(b).get();
            prop_assert!(n.get() == base || n.get() == base + 1, "{} vs {}", n.get(), base);
        }
    }

    #[test]
    fn payload_grows_with_the_prompt(m in grouped_model(), n in 1u64..20_000, extra in 1u64..5_000) {
        let small = payload(&m, Tokens::new(n), Tokens::ZERO).unwrap();
        let large = payload(&m, Tokens::new(n + extra), Tokens::ZERO).unwrap();
        // Full-attention bytes never shrink as N grows.
        prop_assert!(full_attention_bytes(&large) >= full_attention_bytes(&small));
        if has_window(&m) {
            // A window's in-window count can drop by one block as T grows
            // (cdiv(W − 1, B) or one more), never by more.
            prop_assert!(large.bytes().get() + window_block_bytes(&m) >= small.bytes().get());
        } else {
            prop_assert!(large.bytes() >= small.bytes());
        }
    }

    #[test]
    fn payload_without_windows_is_monotone_in_n(
        m in model_without_windows(),
        n in 1u64..50_000,
    ) {
        let a = payload(&m, Tokens::new(n), Tokens::ZERO).unwrap().bytes();
        let b = payload(&m, Tokens::new(n + 1), Tokens::ZERO).unwrap().bytes();
        prop_assert!(b >= a);
    }

    #[test]
    fn the_brief_handoff_size_agrees_with_the_payload(m in grouped_model(), n in 1u64..20_000, k in 0u64..20_000) {
        let (n, k) = (Tokens::new(n), Tokens::new(k.min(n)));
        let full = payload(&m, n, k).unwrap();
        let brief = handoff_size(&m, n, k).unwrap();
        prop_assert_eq!(brief.bytes, full.bytes());
        prop_assert_eq!(brief.transferred_tokens, full.transferred_tokens());
        prop_assert_eq!(brief.moves_nothing, full.moves_nothing());
    }

    #[test]
    fn decode_hit_never_increases_payload(
        m in grouped_model(), n in 1u64..20_000, k1 in 0u64..20_000, k2 in 0u64..20_000,
    ) {
        let (lo, hi) = (k1.min(k2).min(n), k1.max(k2).min(n));
        let none = payload(&m, Tokens::new(n), Tokens::ZERO).unwrap();
        let some = payload(&m, Tokens::new(n), Tokens::new(lo)).unwrap();
        let more = payload(&m, Tokens::new(n), Tokens::new(hi)).unwrap();
        prop_assert!(some.bytes() <= none.bytes());
        prop_assert!(more.bytes() <= some.bytes());
    }

    #[test]
    fn bytes_are_blocks_times_transfer_bytes(m in grouped_model(), n in 1u64..20_000, k in 0u64..20_000) {
        let k = k.min(n);
        let p = payload(&m, Tokens::new(n), Tokens::new(k)).unwrap();
        let Payload::Blocks(bp) = &p else { panic!("grouped model, block payload") };
        let g = m.as_grouped().unwrap();
        let t = transferred_tokens(&m, Tokens::new(n));
        prop_assert_eq!(bp.transferred_tokens(), t);
        let mut total = 0u64;
        let mut fixed = 0u64;
        for (group, moved) in g.groups().iter().zip(bp.groups()) {
            prop_assert_eq!(moved.bytes().get(), moved.blocks().get() * group.transfer_bytes_per_block().get());
            // A group never moves more than it holds for T tokens.
            prop_assert!(moved.blocks() <= blocks_held(group, t));
            total += moved.bytes().get();
            if group.kind() != CacheGroupKind::FullAttention {
                fixed += moved.bytes().get();
            }
        }
        prop_assert_eq!(bp.total_bytes().get(), total);
        prop_assert_eq!(bp.fixed_bytes().get(), fixed);
        if bp.full_decode_hit() {
            prop_assert_eq!(total, 0);
        }
        if k == 0 {
            // With no hit every group moves exactly what it holds.
            for (group, moved) in g.groups().iter().zip(bp.groups()) {
                prop_assert_eq!(moved.blocks(), blocks_held(group, t));
            }
        }
    }

    #[test]
    fn kept_plus_freed_is_held(m in grouped_model(), t in 0u64..20_000, from in 0u64..20_000, ckpt in any::<bool>()) {
        let g = m.as_grouped().unwrap();
        let (t, from) = (Tokens::new(t), Tokens::new(from.min(t)));
        let r = source_release(g, from, t, ckpt);
        prop_assert_eq!(r.groups().len(), g.groups().len());
        for (group, rel) in g.groups().iter().zip(r.groups()) {
            prop_assert_eq!(rel.keep() + rel.free(), rel.held());
            prop_assert_eq!(rel.keep(), blocks_held(group, t));
            prop_assert_eq!(rel.held(), blocks_for_step(group, from, t, ckpt));
            if group.kind() == CacheGroupKind::FullAttention {
                prop_assert_eq!(rel.free(), Blocks::ZERO);
            }
        }
        prop_assert_eq!(r.kept() + r.freed(), r.held());
    }
}
