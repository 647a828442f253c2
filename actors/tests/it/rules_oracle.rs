//! Oracle tests: worked numbers of the grouped transfer rules, each with the
//! arithmetic that gives it.

use actors::model::CacheGroupKind;
use actors::rules::{
    Payload, RuleError, STATE_BLOCKS, blocks_for_step, blocks_held, full_attention_blocks, handoff_size,
    handoff_size_split, in_window_blocks, payload, prefill_clip_blocks, source_release, transferred_tokens,
};
use actors::units::{Bandwidth, Blocks, Bytes, Link, Tokens, transfer_time};
use sim_core::SimDuration;

use crate::model_fixtures::*;

fn t(n: u64) -> Tokens {
    Tokens::new(n)
}

fn blocks_payload(p: &Payload) -> &actors::rules::BlockPayload {
    match p {
        Payload::Blocks(b) => b,
        Payload::Tokens(_) => panic!("expected a grouped payload, got {p:?}"),
    }
}

const GLM_FIXED: u64 = 22_528 + 2 * 9_768_960 + 2 * 8_683_520;

#[test]
fn glm_group_bytes_and_fixed_bytes() {
    assert_eq!(GLM_FA, 13_045_120);
    assert_eq!(GLM_RING, 22_528);
    assert_eq!(GLM_KDA9, 9_768_960);
    assert_eq!(GLM_KDA8, 8_683_520);
    assert_eq!(GLM_FIXED, 36_927_488);
    assert_eq!(GLM_RING + 2 * GLM_KDA9 + 2 * GLM_KDA8, GLM_FIXED);

    let p = payload(&glm(), t(1_000), Tokens::ZERO).unwrap();
    let p = blocks_payload(&p);
    assert_eq!(p.fixed_bytes(), Bytes::new(36_927_488));
    assert_eq!(p.full_attention_bytes(), Bytes::new(13_045_120));
    let per_group: Vec<(&str, CacheGroupKind, u64, u64)> =
        p.groups().iter().map(|g| (g.name(), g.kind(), g.blocks().get(), g.bytes().get())).collect();
    assert_eq!(
        per_group,
        vec![
            ("full attention", CacheGroupKind::FullAttention, 1, 13_045_120),
            ("tail ring", CacheGroupKind::State, 1, 22_528),
            ("kda 0", CacheGroupKind::State, 1, 9_768_960),
            ("kda 1", CacheGroupKind::State, 1, 9_768_960),
            ("kda 2", CacheGroupKind::State, 1, 8_683_520),
            ("kda 3", CacheGroupKind::State, 1, 8_683_520),
        ]
    );
}

#[test]
fn glm_payload_table() {
    // Payload per rank = 13,045,120 × cdiv(N − 1, 2,176) + 36,927,488.
    let cases = [
        (1_000, 13_045_120 + 36_927_488),        // cdiv(999, 2176) = 1
        (2_177, 13_045_120 + 36_927_488),        // cdiv(2176, 2176) = 1
        (8_192, 13_045_120 * 4 + 36_927_488),    // cdiv(8191, 2176) = 4
        (131_072, 13_045_120 * 61 + 36_927_488), // cdiv(131071, 2176) = 61
    ];
    assert_eq!(cases.map(|c| c.1), [49_972_608, 49_972_608, 89_107_968, 832_679_808]);
    let gb1 = Bandwidth::from_gb_per_s(1.0).unwrap();
    let model = glm();
    for (n, bytes) in cases {
        let p = payload(&model, t(n), Tokens::ZERO).unwrap();
        assert_eq!(p.bytes(), Bytes::new(bytes), "N = {n}");
        assert_eq!(p.transferred_tokens(), t(n - 1), "Mamba-type backoff, N = {n}");
        // At 10⁹ bytes/s one byte takes one nanosecond.
        assert_eq!(transfer_time(p.bytes(), gb1), SimDuration::from_nanos(bytes));
    }
    let ms = transfer_time(Bytes::new(49_972_608), gb1).as_millis_f64();
    assert!((ms - 49.972608).abs() < 1e-9, "{ms}");
    assert_eq!(transfer_time(Bytes::new(832_679_808), gb1).to_string(), "832.679808ms");
}

#[test]
fn glm_payload_is_not_priced_by_pages() {
    // Six groups, one block each, at the 13,045,120-byte page: 78,270,720.
    let page_priced = 6 * 13_045_120;
    assert_eq!(page_priced, 78_270_720);
    let p = payload(&glm(), t(1_000), Tokens::ZERO).unwrap();
    assert_ne!(p.bytes(), Bytes::new(page_priced));
    assert_eq!(p.bytes(), Bytes::new(49_972_608));
}

#[test]
fn backoff_keeps_short_prompts() {
    let m = glm();
    assert_eq!(transferred_tokens(&m, t(1)), t(1));
    assert_eq!(transferred_tokens(&m, t(2)), t(1));
    assert_eq!(transferred_tokens(&m, t(0)), t(0));
    let p = payload(&m, t(1), Tokens::ZERO).unwrap();
    // T = 1: one full-attention block plus the fixed bytes.
    assert_eq!(p.bytes(), Bytes::new(13_045_120 + 36_927_488));
    // A model without Mamba-type state keeps all N.
    let plain = model(&spec(vec![fa("fa", 16, 100), state("ring", 16, 100, 10, false)]));
    assert_eq!(transferred_tokens(&plain, t(1_000)), t(1_000));
}

#[test]
fn window_rule_vectors() {
    // in_window(T, W, B) = cdiv(T, B) − floor(max(0, T − W + 1) / B).
    let vectors = [
        // (T, W, B, blocks, derivation)
        (7, 4, 4, 1),            // 2 − floor(4/4) = 1
        (100, 32, 16, 3),        // 7 − floor(69/16) = 7 − 4
        (1_000, 128, 16, 9),     // 63 − floor(873/16) = 63 − 54
        (1_024, 128, 16, 8),     // 64 − floor(897/16) = 64 − 56
        (1_025, 128, 16, 9),     // 65 − floor(898/16) = 65 − 56
        (10, 128, 16, 1),        // 1 − 0
        (4_096, 4_096, 16, 256), // 256 − floor(1/16) = 256 − 0
        (5_000, 4_096, 16, 257), // 313 − floor(905/16) = 313 − 56
        (5_000, 1_024, 16, 65),  // 313 − floor(3977/16) = 313 − 248
        (1_000, 33, 16, 3),      // 63 − floor(968/16) = 63 − 60
        (1_024, 32, 16, 2),      // 64 − floor(993/16) = 64 − 62
    ];
    for (tt, w, b, want) in vectors {
        assert_eq!(in_window_blocks(t(tt), t(w), t(b)), Blocks::new(want), "T={tt} W={w} B={b}");
        assert!(Blocks::new(want) <= prefill_clip_blocks(t(w), t(b)));
    }
    // Prefill clip cdiv(W, B) + 1: W 33, B 16 → 3 + 1.
    assert_eq!(prefill_clip_blocks(t(33), t(16)), Blocks::new(4));
    assert_eq!(full_attention_blocks(t(999), t(2_176)), Blocks::new(1));
    assert_eq!(full_attention_blocks(t(8_191), t(2_176)), Blocks::new(4));
}

#[test]
fn full_attention_plus_window_at_1024_tokens() {
    let groups = || vec![fa("fa", 16, 1_000), window("swa", 128, 16, 1_000)];
    // No Mamba state: T = 1,024 → FA cdiv(1024,16) = 64, window 64 − floor(897/16) = 8.
    let plain = model(&spec(groups()));
    let p = payload(&plain, t(1_024), Tokens::ZERO).unwrap();
    let blocks: Vec<u64> = blocks_payload(&p).groups().iter().map(|g| g.blocks().get()).collect();
    assert_eq!(blocks, vec![64, 8]);
    assert_eq!(p.bytes(), Bytes::new((64 + 8) * 1_000));

    // With a Mamba state: T = 1,023 → FA cdiv(1023,16) = 64,
    // window cdiv(1023,16) − floor(896/16) = 64 − 56 = 8, state 1.
    let mut with_mamba = groups();
    with_mamba.push(state("mamba", 16, 1_000, 900, true));
    let mamba = model(&spec(with_mamba));
    let p = payload(&mamba, t(1_024), Tokens::ZERO).unwrap();
    let bp = blocks_payload(&p);
    assert_eq!(bp.transferred_tokens(), t(1_023));
    let blocks: Vec<u64> = bp.groups().iter().map(|g| g.blocks().get()).collect();
    assert_eq!(blocks, vec![64, 8, 1]);
    // Fixed bytes: window 8 × 1,000 + state 1 × 900.
    assert_eq!(bp.fixed_bytes(), Bytes::new(8 * 1_000 + 900));
    assert_eq!(p.bytes(), Bytes::new(64 * 1_000 + 8 * 1_000 + 900));
}

#[test]
fn decode_hit_skips_cached_full_attention_blocks() {
    let m = glm();
    // N = 8,192, T = 8,191: 4 FA blocks. K = 4,352 = 2 × 2,176 → 2 cached, 2 move.
    let p = payload(&m, t(8_192), t(2 * 2_176)).unwrap();
    let bp = blocks_payload(&p);
    assert_eq!(bp.hit_tokens(), t(2 * 2_176));
    assert_eq!(p.bytes(), Bytes::new(13_045_120 * 2 + 36_927_488));
    // K = 4,353 still counts only whole blocks: floor(4353 / 2176) = 2.
    assert_eq!(payload(&m, t(8_192), t(4_353)).unwrap().bytes(), p.bytes());
    // K = 8,192: the hit stops short of the last token, min(8192, 8191) =
    // 8,191 → floor(8191 / 2176) = 3 cached, 1 moves.
    let p = payload(&m, t(8_192), t(8_192)).unwrap();
    assert_eq!(p.bytes(), Bytes::new(13_045_120 + 36_927_488));
    assert!(!blocks_payload(&p).full_decode_hit());
}

#[test]
fn full_decode_hit_moves_nothing() {
    let m = glm();
    // N = 2,177, T = 2,176 = 1 FA block; K = 2,176 caches it: vLLM's decode
    // get_num_new_matched_tokens returns 2,176 − 2,176 = 0, a notification only.
    let p = payload(&m, t(2_177), t(2_176)).unwrap();
    let bp = blocks_payload(&p);
    assert!(bp.full_decode_hit());
    assert!(p.moves_nothing());
    assert_eq!(p.bytes(), Bytes::ZERO);
    assert_eq!(bp.fixed_bytes(), Bytes::ZERO);
    assert!(bp.groups().iter().all(|g| g.blocks() == Blocks::ZERO));
    // The fixed bytes are not charged on a full hit.
    assert_ne!(p.bytes(), Bytes::new(36_927_488));
    // K = N = 2,177: the hit is min(2,177, 2,176) = 2,176 = T, nothing moves either.
    assert!(payload(&m, t(2_177), t(2_177)).unwrap().moves_nothing());
    // K = N = 2,176: min(2,176, 2,175) = 2,175 rounds down to 0 (vLLM 0.33.0's
    // handoff moves 1 FA + ring + 4 KDA blocks, 49,972,608 bytes).
    let p = payload(&m, t(2_176), t(2_176)).unwrap();
    assert_eq!(blocks_payload(&p).hit_tokens(), Tokens::ZERO);
    assert_eq!(p.bytes(), Bytes::new(13_045_120 + 36_927_488));
    assert_eq!(p.bytes(), Bytes::new(49_972_608));

    // Without Mamba state T = N, and a hit never covers the last token, so
    // something always moves: K = N = 1,024 on B = 16 hits min(1,024, 1,023)
    // → 1,008 = 63 of 64 blocks: 1 FA block and the uncached in-window
    // blocks move (window blocks 56..64, 56..63 cached → 1 block). vLLM:
    // 786,432 bytes for gpt-oss-like (2 × 393,216).
    let plain = model(&spec(vec![fa("fa", 16, 1_000), window("swa", 128, 16, 1_000)]));
    for k in [1_024, 1_023] {
        let p = payload(&plain, t(1_024), t(k)).unwrap();
        let blocks: Vec<u64> = blocks_payload(&p).groups().iter().map(|g| g.blocks().get()).collect();
        assert_eq!(blocks, vec![1, 1], "K = {k}");
    }
}

#[test]
fn partial_hit_and_window_blocks() {
    let plain = model(&spec(vec![fa("fa", 16, 1_000), window("swa", 128, 16, 1_000)]));
    // N = T = 1,024, K = 512: 32 FA blocks cached, 64 − 32 = 32 move. The window's
    // in-window blocks are 56..64; none of them is below the hit (32), so 8 move.
    let p = payload(&plain, t(1_024), t(512)).unwrap();
    let blocks: Vec<u64> = blocks_payload(&p).groups().iter().map(|g| g.blocks().get()).collect();
    assert_eq!(blocks, vec![32, 8]);
    // K = 1,000: floor(1000/16) = 62 cached; FA 64 − 62 = 2 move; window blocks
    // 56..64 of which 56..62 are cached → 64 − max(56, 62) = 2 move.
    let p = payload(&plain, t(1_024), t(1_000)).unwrap();
    let blocks: Vec<u64> = blocks_payload(&p).groups().iter().map(|g| g.blocks().get()).collect();
    assert_eq!(blocks, vec![2, 2]);
    assert_eq!(p.bytes(), Bytes::new((2 + 2) * 1_000));
}

#[test]
fn a_window_beside_a_mamba_state_reads_past_its_own_hit() {
    // W = 128, B = 32, N = 49: T = N − 1 = 48 (the Mamba backoff). The
    // decode rank caches K = 35 tokens: the full-attention hit is floor(35
    // / 32) = 1 block. Beside a Mamba state vLLM's connector lookup keeps
    // each group's hit apart (`get_computed_blocks_for_connector`): with
    // the window's own hit 0 its group reads cdiv(48, 32) − max(skipped
    // blocks 0, hit 0) = 2 blocks, where the shared hit gives 2 − 1 = 1.
    let m =
        model(&spec(vec![fa("fa", 32, 1_000), window("swa", 128, 32, 1_000), state("mamba", 32, 1_000, 900, true)]));
    let state = STATE_BLOCKS.get() * 900;
    let shared = handoff_size(&m, t(49), t(35)).unwrap();
    // Full attention cdiv(48, 32) − 1 = 1 block, the window 1, the state.
    assert_eq!(shared.bytes, Bytes::new(1_000 + 1_000 + state));
    let apart = handoff_size_split(&m, t(49), t(35), t(0)).unwrap();
    assert_eq!(apart.bytes, Bytes::new(1_000 + 2 * 1_000 + state));
    assert_eq!(apart.transferred_tokens, t(48));
    // The same hit in every group is the shared payload.
    assert_eq!(handoff_size_split(&m, t(49), t(35), t(35)).unwrap(), shared);
}

#[test]
fn linear_payload_moves_whole_blocks() {
    let m = model(&linear_spec(32_768));
    assert_eq!(m.as_linear().unwrap().block_size(), t(16));
    let p = payload(&m, t(1_000), Tokens::ZERO).unwrap();
    let Payload::Tokens(tp) = &p else { panic!("linear payload: {p:?}") };
    // cdiv(1,000, 16) = 63 blocks, the last one partly filled: 1,008 tokens.
    assert_eq!((tp.blocks(), tp.tokens()), (Blocks::new(63), t(1_008)));
    assert_eq!(tp.transferred_tokens(), t(1_000));
    assert_eq!(p.bytes(), Bytes::new(1_008 * 32_768));
    // A decode cache of 200 tokens hits floor(200 / 16) = 12 blocks: 51 move.
    let p = payload(&m, t(1_000), t(200)).unwrap();
    assert_eq!(p.bytes(), Bytes::new(51 * 16 * 32_768));
    // K = N: the hit stops at N − 1 = 999 → 62 blocks; the last one moves.
    let p = payload(&m, t(1_000), t(1_000)).unwrap();
    assert_eq!(p.bytes(), Bytes::new(16 * 32_768));
    // Another block size: B = 32, cdiv(1,000, 32) = 32 blocks = 1,024 tokens.
    let m32 = m.with_block_size(t(32));
    assert_eq!(payload(&m32, t(1_000), Tokens::ZERO).unwrap().bytes(), Bytes::new(1_024 * 32_768));
}

#[test]
fn payload_refuses_bad_input() {
    let m = glm();
    let err = payload(&m, t(1_000), t(1_001)).unwrap_err();
    assert_eq!(err, RuleError::HitExceedsPrompt { cached: 1_001, prompt: 1_000 });
    assert!(err.to_string().contains("decode_cached_tokens"), "{err}");
    let err = payload(&m, Tokens::ZERO, Tokens::ZERO).unwrap_err();
    assert!(err.to_string().contains("prompt_tokens"), "{err}");
    // u64::MAX tokens at 2 bytes each does not fit.
    let err = payload(&model(&linear_spec(2)), t(u64::MAX), Tokens::ZERO).unwrap_err();
    assert!(matches!(err, RuleError::Overflow { .. }), "{err}");
    let err = payload(&m, t(u64::MAX), Tokens::ZERO).unwrap_err();
    assert!(matches!(err, RuleError::Overflow { .. }), "{err}");
}

#[test]
fn window_source_keeps_two_of_64_blocks() {
    let m = model(&spec(vec![fa("fa", 16, 1_000), window("swa", 32, 16, 1_000)]));
    let g = m.as_grouped().unwrap();
    // 1,024 tokens in one step: the window group holds cdiv(1024,16) = 64 blocks
    // and keeps in_window = 64 − floor(993/16) = 2.
    let r = source_release(g, Tokens::ZERO, t(1_024), false);
    let swa = r.groups()[1];
    assert_eq!((swa.held(), swa.keep(), swa.free()), (Blocks::new(64), Blocks::new(2), Blocks::new(62)));
    let fa_rel = r.groups()[0];
    assert_eq!((fa_rel.held(), fa_rel.keep(), fa_rel.free()), (Blocks::new(64), Blocks::new(64), Blocks::ZERO));
    assert_eq!(blocks_held(&g.groups()[1], t(1_024)), Blocks::new(2));
    // In two steps of 512 the last step starts at 512: the window group holds
    // 64 − floor((512 − 32 + 1)/16) = 64 − 30 = 34 and frees 32.
    let r = source_release(g, t(512), t(1_024), false);
    assert_eq!(r.groups()[1].held(), Blocks::new(34));
    assert_eq!(r.groups()[1].free(), Blocks::new(32));
}

#[test]
fn glm_source_frees_checkpoint_blocks() {
    let m = glm();
    let g = m.as_grouped().unwrap();
    // N = 8,192, T = 8,191 in one step with checkpoint blocks (prefix
    // caching on). Held: FA cdiv(8191, 2176) = 4, ring 1, each KDA group its
    // running block + 1 checkpoint block = 2.
    let t_ = transferred_tokens(&m, t(8_192));
    let r = source_release(g, Tokens::ZERO, t_, true);
    assert_eq!(r.held(), Blocks::new(4 + 1 + 4 * 2));
    assert_eq!(r.freed(), Blocks::new(4)); // one checkpoint block per KDA group
    assert_eq!(r.kept(), Blocks::new(9)); // 4 FA + 1 ring + 4 KDA
    let frees: Vec<u64> = r.groups().iter().map(|x| x.free().get()).collect();
    assert_eq!(frees, vec![0, 0, 1, 1, 1, 1]);

    // Without prefix caching ("none" mode) no checkpoint blocks: holds and
    // keeps 9, frees nothing.
    let r = source_release(g, Tokens::ZERO, t_, false);
    assert_eq!((r.held(), r.kept(), r.freed()), (Blocks::new(9), Blocks::new(9), Blocks::ZERO));
    // The checkpoint blocks never move: the payload is the same either way.
    assert_eq!(payload(&m, t(8_192), Tokens::ZERO).unwrap().bytes(), Bytes::new(89_107_968));
}

#[test]
fn step_holdings() {
    let m = model(&spec(vec![window("swa", 128, 16, 1), state("ring", 16, 1, 1, false)]));
    let g = m.as_grouped().unwrap();
    let (swa, ring) = (&g.groups()[0], &g.groups()[1]);
    // Chunk 1,000..1,024 of a 128-token window: cdiv(1024,16) − floor(873/16) = 64 − 54.
    assert_eq!(blocks_for_step(swa, t(1_000), t(1_024), false), Blocks::new(10));
    assert_eq!(blocks_held(swa, t(1_024)), Blocks::new(8));
    assert_eq!(blocks_held(ring, Tokens::ZERO), Blocks::ZERO);
    assert_eq!(blocks_held(ring, t(1)), STATE_BLOCKS);
    // A ring has no checkpoint blocks, so `with_checkpoints` adds nothing.
    assert_eq!(blocks_for_step(ring, Tokens::ZERO, t(16), true), Blocks::new(1));
}

#[test]
fn link_delay_adds_latency() {
    let link = Link { latency: SimDuration::from_micros(20), bandwidth: Bandwidth::from_gb_per_s(25.0).unwrap() };
    // 89,107,968 bytes at 25 × 10⁹ B/s: 3,564,318.72 ns → 3,564,319 (rounded up),
    // plus 20,000 ns latency.
    assert_eq!(link.delay(Bytes::new(89_107_968)).as_nanos(), 3_564_319 + 20_000);
}
