//! Unit tests of the scheduler and the pool, one rule each.

use sim_core::{SimDuration, SimTime};

use super::*;
use crate::base::units::{Blocks, Bytes, Tokens};
use crate::kv::{Alloc, KvPool};
use crate::models::model::{CacheGroup, CacheGroupKind, CacheGroupSpec, Role};
use crate::models::steptime::{BatchShape, StepTimeModel};
use crate::requests::request::Request;
use crate::requests::workload::PrefixIds;

/// Every step takes 1 ms.
struct Fixed;
impl StepTimeModel for Fixed {
    fn step_time(&self, _: &BatchShape) -> SimDuration {
        SimDuration::from_millis(1)
    }
}

fn group(kind: CacheGroupKind, b: u64, window: Option<u64>) -> CacheGroup {
    group_caching(kind, b, window, kind != CacheGroupKind::SlidingWindow)
}

/// A group of `b`-token blocks that is prefix cacheable or not.
fn group_caching(kind: CacheGroupKind, b: u64, window: Option<u64>, cacheable: bool) -> CacheGroup {
    CacheGroupSpec {
        name: "g".into(),
        kind,
        block_size_tokens: Tokens::new(b),
        page_bytes: Bytes::new(1),
        transfer_bytes_per_block: Some(Bytes::new(1)),
        prefix_cacheable: Some(cacheable),
        window_tokens: window.map(Tokens::new),
        checkpoint_blocks: Some(Blocks::ZERO),
        heads: None,
    }
    .validate(Role::Aggregated, 0)
    .unwrap()
}

/// One full-attention group of 16-token blocks.
fn fa_pool(num_blocks: u64) -> KvPool {
    KvPool::new(vec![group(CacheGroupKind::FullAttention, 16, None)], num_blocks, true)
}

fn sched(mode: Mode, budget: u64, max_seqs: usize, num_blocks: u64) -> Scheduler {
    let limits = Limits { max_num_batched_tokens: budget, max_num_seqs: max_seqs };
    let mut s = Scheduler::with_pool(mode, limits, false, fa_pool(num_blocks), Box::new(Fixed), Box::new(VllmPolicy));
    s.set_check_invariants(true);
    s
}

fn req(id: u64, prompt: u64, output: u64) -> Box<Request> {
    Box::new(Request::new(id, Tokens::new(prompt), Tokens::new(output), PrefixIds::none(), SimTime::ZERO))
}

/// A prompt named by 16-token ids `ids` (shared content where they agree).
fn prefixed(id: u64, ids: &[u64], output: u64) -> Box<Request> {
    let prefix = PrefixIds { block_tokens: Tokens::new(16), ids: ids.to_vec() };
    Box::new(Request::new(id, Tokens::new(16 * ids.len() as u64), Tokens::new(output), prefix, SimTime::ZERO))
}

fn started(r: &mut Request) -> &mut Option<SimTime> {
    &mut r.t.prefill_started
}

/// Starts a step at `now`; returns (request id, tokens) of the sequences
/// computed one by one in it, in scheduling order.
fn step(s: &mut Scheduler, now: SimTime) -> Vec<(u64, u64)> {
    s.start_step(now, SimTime::MAX, started, false).expect("a step starts");
    let core = &s.core;
    core.batch.iter().map(|&k| (core.seqs.get(k).req.id, core.seqs.get(k).step_tokens.get())).collect()
}

/// Finishes the step in flight; returns the finished requests' ids.
fn finish(s: &mut Scheduler) -> Vec<u64> {
    let now = s.core.log.last_end();
    let mut done = Vec::new();
    s.finish_step(now, &mut done);
    done.iter()
        .map(|f| match f {
            Finished::Completed(r) | Finished::Prefilled { req: r, .. } => r.id,
        })
        .collect()
}

#[test]
fn running_sequences_go_first_then_admission_in_queue_order_within_the_token_budget() {
    let mut s = sched(Mode::Generate, 100, 8, 1_000);
    s.set_lazy_decoding(false);
    s.enqueue(req(0, 60, 2), Tokens::ZERO, SimTime::ZERO);
    s.enqueue(req(1, 60, 2), Tokens::ZERO, SimTime::ZERO);
    s.enqueue(req(2, 60, 2), Tokens::ZERO, SimTime::ZERO);
    // Budget 100: request 0 takes 60, request 1 its first chunk of 40;
    // request 2 waits for the next step.
    assert_eq!(step(&mut s, SimTime::ZERO), [(0, 60), (1, 40)]);
    finish(&mut s);
    // Next: 0 decodes 1 token, 1 finishes its prompt (20), and 2 takes
    // all 60 of its prompt (79 left in the budget).
    let t = s.core.log.last_end();
    assert_eq!(step(&mut s, t), [(0, 1), (1, 20), (2, 60)]);
}

#[test]
fn max_num_seqs_caps_the_running_sequences() {
    let mut s = sched(Mode::Generate, 1_000, 2, 1_000);
    for id in 0..3 {
        s.enqueue(req(id, 10, 5), Tokens::ZERO, SimTime::ZERO);
    }
    assert_eq!(step(&mut s, SimTime::ZERO), [(0, 10), (1, 10)]);
    assert_eq!(s.counts().waiting, 1);
}

#[test]
fn a_sequence_short_of_blocks_preempts_the_most_recently_admitted() {
    // 8 blocks of 16 tokens. Three 32-token prompts take 2 blocks each (6);
    // as they decode, each needs a third block at token 33: the first two
    // get them (8), the third finds none and preempts itself, the most
    // recently admitted; it goes back to the front of the queue.
    let mut s = sched(Mode::Generate, 1_000, 8, 8);
    s.set_lazy_decoding(false);
    for id in 0..3 {
        s.enqueue(req(id, 32, 10), Tokens::ZERO, SimTime::ZERO);
    }
    assert_eq!(step(&mut s, SimTime::ZERO), [(0, 32), (1, 32), (2, 32)]);
    finish(&mut s);
    let t = s.core.log.last_end();
    assert_eq!(step(&mut s, t), [(0, 1), (1, 1)]);
    assert_eq!(s.stats().preemptions, 1);
    let front = s.core.seqs.waiting[0];
    assert_eq!(s.core.seqs.get(front).req.id, 2);
    assert_eq!(s.core.seqs.get(front).req.preemptions, 1);
    assert_eq!(s.counts().used, 6, "the victim's 2 blocks went back; 0 and 1 hold 3 each");
}

#[test]
fn a_decode_ranks_priority_order_is_by_arrival_at_the_rank() {
    // vLLM's decode instance stamps a handoff's arrival when the proxy hands
    // it over, after its prefill: A, sent at 0 ms with a long prefill,
    // reaches the rank at 5 ms; B, sent at 1 ms, at 3 ms. Equal priorities
    // order by that arrival: B first, then A. A 64-token prompt takes 4
    // blocks of 16 and the pool has 6, so only the first is reserved.
    let mut s = sched(Mode::Generate, 100, 8, 6);
    s.set_options(SchedulerOptions { priority: true, ..SchedulerOptions::default() });
    let ms = |m: u64| SimTime::ZERO + SimDuration::from_millis(m);
    let mut b = req(1, 64, 2);
    b.t.arrival = ms(1);
    b.transferred_tokens = b.prompt;
    s.enqueue_remote(b, ms(3));
    let mut a = req(0, 64, 2);
    a.transferred_tokens = a.prompt;
    s.enqueue_remote(a, ms(5));
    s.start_one_step(ms(5), SimTime::MAX, started);
    let mut reserved = Vec::new();
    s.take_reserved(&mut reserved);
    let ids: Vec<u64> = reserved.iter().map(|(r, ..)| r.id).collect();
    assert_eq!(ids, [1], "the first to reach the rank is reserved first");
    assert_eq!(s.remote_waiting(), 1);
}

#[test]
fn a_request_that_can_never_fit_is_given_up() {
    // 3 blocks, a 64-token prompt needs 4.
    let mut s = sched(Mode::Generate, 1_000, 8, 3);
    s.enqueue(req(7, 64, 1), Tokens::ZERO, SimTime::ZERO);
    assert!(s.start_step(SimTime::ZERO, SimTime::MAX, started, false).is_none());
    let (r, needed) = s.take_stuck().expect("given up");
    assert_eq!((r.id, needed), (7, 4));
    assert_eq!(s.counts().used, 0);
}

#[test]
fn the_cache_never_serves_the_last_token_to_compute() {
    let mut pool = fa_pool(100);
    let r = prefixed(0, &[1, 2, 3, 4], 1);
    let mut a = Alloc::default();
    pool.pin_and_allocate(&mut a, &r.prefix, r.prompt, 0, (Tokens::ZERO, r.prompt), false).unwrap();
    pool.register(&mut a, &r.prefix, r.prompt, r.prompt);
    // All 4 blocks (64 tokens) cached; a 64-token goal may hit 63 tokens:
    // floor(63 / 16) = 3 blocks.
    assert_eq!(pool.cached_prefix(&r.prefix, r.prompt, r.id, r.prompt), 3);
    // A goal past the prompt (a recompute with generated tokens) may hit all 4.
    assert_eq!(pool.cached_prefix(&r.prefix, r.prompt, r.id, Tokens::new(65)), 4);
}

#[test]
fn a_failed_pin_and_allocate_changes_nothing_and_evicts_nothing() {
    // 10 blocks; a first request computes and frees 4 named blocks, which
    // stay cached and unpinned. A second request (a 6-block prompt sharing
    // them, then 6 more blocks than fit) must fail without evicting any.
    let mut pool = fa_pool(10);
    let a_req = prefixed(0, &[1, 2, 3, 4], 1);
    let mut a = Alloc::default();
    pool.pin_and_allocate(&mut a, &a_req.prefix, a_req.prompt, 0, (Tokens::ZERO, a_req.prompt), false).unwrap();
    pool.register(&mut a, &a_req.prefix, a_req.prompt, a_req.prompt);
    pool.release(&mut a, a_req.prompt);
    assert_eq!((pool.cached_free(), pool.free_plain()), (4, 6));
    let b_req = prefixed(1, &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12], 1);
    let hit = pool.cached_prefix(&b_req.prefix, b_req.prompt, b_req.id, b_req.prompt);
    assert_eq!(hit, 4);
    let mut b = Alloc::owned_by(1);
    // 12 blocks in all, 4 of them the hit: 8 more, 6 plain free.
    let short = pool
        .pin_and_allocate(&mut b, &b_req.prefix, b_req.prompt, hit, (Tokens::new(64), b_req.prompt), false)
        .unwrap_err();
    assert_eq!(short.needed, 12);
    assert!(b.is_empty());
    assert_eq!((pool.cached_free(), pool.free_plain(), pool.used(), pool.evicted_blocks()), (4, 6, 0, 0));
    pool.check().unwrap();
}

#[test]
fn evictions_made_ahead_are_undone_exactly() {
    // 12 blocks. A (3 named blocks), B (2 blocks of its own), C (2 named)
    // and D, which computed C's content without hitting it (2 later
    // copies), freed in the order A, B, D, C. The LRU order is then
    // A2 A1 A0 | B's 2 (a nameless run) | D1 D0 | C1 C0 (a request frees
    // its tail first), with 3 blocks plain free.
    let mut pool = fa_pool(12);
    let a = prefixed(0, &[1, 2, 3], 1);
    let b = req(1, 32, 1);
    let c = prefixed(2, &[7, 8], 1);
    let d = prefixed(3, &[7, 8], 1);
    let mut held: Vec<Alloc> = (0..4).map(Alloc::owned_by).collect();
    for (r, al) in [&a, &b, &c, &d].into_iter().zip(held.iter_mut()) {
        pool.pin_and_allocate(al, &r.prefix, r.prompt, 0, (Tokens::ZERO, r.prompt), false).unwrap();
        pool.register(al, &r.prefix, r.prompt, r.prompt);
    }
    for i in [0, 1, 3, 2] {
        pool.release(&mut held[i], [&a, &b, &c, &d][i].prompt);
    }
    // (free: plain and cached-but-unpinned together)
    assert_eq!((pool.free_plain(), pool.free()), (3, 12));
    let start = pool.clone();
    let before = pool.canonical();
    // A holding grows ahead: to 5 blocks at step 7 (3 plain, then A2 and A1
    // evicted), to 9 at step 8 (A0 evicted, B's run becomes plain, then
    // D1, a later copy: C1 still serves the content).
    let mut x = Alloc::owned_by(9);
    pool.resize_ahead(&mut x, Tokens::ZERO, Tokens::new(80), 7).unwrap();
    assert_eq!((pool.free_plain(), pool.evicted_blocks()), (0, 2));
    let after_7 = pool.canonical();
    pool.resize_ahead(&mut x, Tokens::new(80), Tokens::new(144), 8).unwrap();
    assert_eq!((pool.free_plain(), pool.free(), pool.evicted_blocks()), (0, 3, 4));
    let mut peek = pool.clone();
    peek.commit_evictions();
    assert_eq!(peek.cached_prefix(&c.prefix, c.prompt, 5, Tokens::new(64)), 2, "C's copies serve its content");
    assert!(pool.evicted_ahead());
    // Step 8 does not run: its blocks are given back, then its evictions
    // undone; the pool is as it was after step 7, and after step 6 when
    // those go too.
    pool.resize_from_free(&mut x, Tokens::new(79), Tokens::new(80)).unwrap();
    pool.undo_evictions_after(7);
    pool.check().unwrap();
    assert_eq!(pool.canonical(), after_7);
    assert!(!pool.evicted_ahead(), "step 7's evictions stay made");
    pool.resize_ahead(&mut x, Tokens::new(80), Tokens::new(144), 8).unwrap();
    pool.resize_from_free(&mut x, Tokens::new(79), Tokens::new(80)).unwrap();
    pool.undo_evictions_after(6);
    pool.check().unwrap();
    assert_eq!(pool.canonical(), after_7, "step 7's evictions were committed by the first undo");
    // From the start again, everything evicted for one step: all of it undone.
    let mut pool2 = start;
    let mut y = Alloc::owned_by(9);
    pool2.resize_ahead(&mut y, Tokens::ZERO, Tokens::new(192), 3).unwrap();
    assert_eq!((pool2.free_plain(), pool2.free()), (0, 0), "everything evicted");
    pool2.resize_from_free(&mut y, Tokens::ZERO, Tokens::ZERO).unwrap();
    pool2.undo_evictions_after(2);
    pool2.check().unwrap();
    assert_eq!(pool2.canonical(), before);
    assert_eq!(pool2.cached_prefix(&a.prefix, a.prompt, 5, Tokens::new(64)), 3);
}

#[test]
fn eviction_takes_the_least_recently_freed_cached_block_first() {
    let mut pool = fa_pool(3);
    // Three one-block requests, freed in the order 2, 0, 1.
    let reqs: Vec<Box<Request>> = (0..3).map(|i| prefixed(i, &[100 + i], 1)).collect();
    // One holding per request (the pool keeps a holding's pins by owner).
    let mut allocs: Vec<Alloc> = (0..3).map(Alloc::owned_by).collect();
    for (r, a) in reqs.iter().zip(allocs.iter_mut()) {
        pool.pin_and_allocate(a, &r.prefix, r.prompt, 0, (Tokens::ZERO, r.prompt), false).unwrap();
        pool.register(a, &r.prefix, r.prompt, r.prompt);
    }
    for i in [2, 0, 1] {
        pool.release(&mut allocs[i], reqs[i].prompt);
    }
    // One plain block needed: request 2's block goes (freed first).
    let mut x = Alloc::owned_by(3);
    pool.pin_and_allocate(&mut x, &PrefixIds::none(), Tokens::new(16), 0, (Tokens::ZERO, Tokens::new(16)), false)
        .unwrap();
    assert_eq!(pool.evicted_blocks(), 1);
    let hit =
        |pool: &KvPool, i: usize| pool.cached_prefix(&reqs[i].prefix, reqs[i].prompt, reqs[i].id, Tokens::new(17));
    assert_eq!((hit(&pool, 0), hit(&pool, 1), hit(&pool, 2)), (1, 1, 0));
}

#[test]
fn full_attention_groups_of_one_spec_are_evicted_group_by_group() {
    // Two full-attention groups of 16-token blocks, 12 blocks. A, 64 named
    // tokens, holds 4 + 4 and is freed: vLLM frees group by group, each
    // tail first (`kv_cache_coordinator.py:404-412`), so the eviction order
    // is group 0's blocks 3, 2, 1, 0, then group 1's. 4 blocks are plain.
    let fa = || group(CacheGroupKind::FullAttention, 16, None);
    let mut pool = KvPool::new(vec![fa(), fa()], 12, true);
    let a = prefixed(0, &[1, 2, 3, 4], 1);
    let mut held = Alloc::owned_by(0);
    pool.pin_and_allocate(&mut held, &a.prefix, a.prompt, 0, (Tokens::ZERO, a.prompt), false).unwrap();
    pool.register(&mut held, &a.prefix, a.prompt, a.prompt);
    pool.release(&mut held, a.prompt);
    let hit = |pool: &KvPool| pool.cached_prefix(&a.prefix, a.prompt, 9, Tokens::new(65));
    assert_eq!((hit(&pool), pool.free_plain(), pool.cached_free()), (4, 4, 8));
    // 48 unnamed tokens, 3 + 3 blocks: the 4 plain ones and 2 evicted,
    // group 0's blocks 3 and 2: A's prompt hits 2 blocks. (One entry for
    // a block in both groups would evict one entry of two blocks: 3.)
    let mut x = Alloc::owned_by(1);
    pool.pin_and_allocate(&mut x, &PrefixIds::none(), Tokens::new(48), 0, (Tokens::ZERO, Tokens::new(48)), false)
        .unwrap();
    assert_eq!((pool.evicted_blocks(), hit(&pool), pool.cached_free()), (2, 2, 6));
    pool.check().unwrap();
}

#[test]
fn full_attention_groups_are_held_apart_only_where_the_window_cache_takes_them() {
    // Held apart, a second full-attention group is a class of its own (a
    // window); folded, the groups are one class.
    let fa = || group(CacheGroupKind::FullAttention, 16, None);
    let classes = |groups: Vec<CacheGroup>, caching: bool| KvPool::new(groups, 100, caching).classes();
    assert_eq!(classes(vec![fa(), fa()], true), 2, "apart");
    assert_eq!(classes(vec![fa(), fa(), fa(), state_group(16, false)], true), 3, "apart, beside a tail ring");
    assert_eq!(classes(vec![fa(), fa()], false), 1, "no prefix cache: nothing to evict");
    // Beside a Mamba-type state (align mode) or a window, folded as before.
    assert_eq!(classes(vec![fa(), fa(), state_group(16, true), state_group(16, false)], true), 3);
    assert_eq!(classes(vec![fa(), fa(), cached_window(16, 33)], true), 2);
}

#[test]
fn a_landed_handoff_keeps_its_arrival_at_the_rank_under_the_priority_policy() {
    // A reaches the rank at 3 ms and B at 5 ms; both are reserved, B lands
    // first (10 ms), A later (12 ms). Landed handoffs wait in priority
    // order, equal priorities by arrival at the rank: A goes first.
    let mut s = sched(Mode::Generate, 100, 8, 100);
    s.set_lazy_decoding(false);
    s.set_options(SchedulerOptions { priority: true, ..SchedulerOptions::default() });
    let ms = |m: u64| SimTime::ZERO + SimDuration::from_millis(m);
    for (id, at) in [(0, 3), (1, 5)] {
        let mut r = req(id, 32, 2);
        r.transferred_tokens = r.prompt;
        s.enqueue_remote(r, ms(at));
    }
    s.start_one_step(ms(5), SimTime::MAX, started);
    let mut reserved = Vec::new();
    s.take_reserved(&mut reserved);
    assert_eq!(reserved.iter().map(|(r, ..)| r.id).collect::<Vec<_>>(), [0, 1]);
    let (a, b) = (reserved.remove(0), reserved.remove(0));
    s.enqueue_landed(b.0, b.2, ms(10));
    s.enqueue_landed(a.0, a.2, ms(12));
    assert_eq!(step(&mut s, ms(12)), [(0, 1), (1, 1)], "each computes its last prompt token, A first");
}

#[test]
fn a_window_prefill_in_flight_counts_its_block_table_against_the_cap() {
    // vLLM's `_request_remaining_blocks` for a running request is
    // `min(cdiv(N, B), cap) − len(block table)` per window group, and the
    // table keeps its skipped blocks as null blocks. Full attention and a
    // 33-token window of 8-token blocks, a budget of 16 (cap: cdiv(32 +
    // 16, 8) + 1 = 7), one 224-token prompt. After 8 steps (128 tokens,
    // 16 positions): full attention 28 − 16 = 12, the window min(28, 7) −
    // 16 → 0; 12 in all. (Counting the window's blocks from 128 to 224
    // less those it holds gave one more.)
    let groups = vec![group(CacheGroupKind::FullAttention, 8, None), cached_window(8, 33)];
    let limits = Limits { max_num_batched_tokens: 16, max_num_seqs: 4 };
    let pool = KvPool::new(groups, 200, true);
    let mut s = Scheduler::with_pool(Mode::Generate, limits, false, pool, Box::new(Fixed), Box::new(VllmPolicy));
    s.set_check_invariants(true);
    s.set_lazy_decoding(false);
    s.enqueue(req(0, 224, 2), Tokens::ZERO, SimTime::ZERO);
    for k in 0..8 {
        assert_eq!(step(&mut s, SimTime::ZERO + SimDuration::from_millis(k)), [(0, 16)]);
        assert!(finish(&mut s).is_empty());
    }
    assert_eq!(s.core.inflight_prefill_blocks(), 12);
}

/// Under the asynchronous loop a schedule call that plans nothing but lets
/// a finished sequence leave (or takes in held work) is followed by the
/// next call at once; with `caller_between` the scheduler returns after it
/// instead, everything queued made visible, and the caller's own call
/// plans what the scheduler would have. A (16 tokens, one output) runs
/// alone; B arrives during its step: at its end the first call is empty
/// (A leaves after it; B is held back), the second schedules B's 16.
#[test]
fn an_empty_asynchronous_call_returns_to_a_caller_with_outputs_between() {
    let run = |caller_between: bool| {
        let mut s = sched(Mode::Generate, 64, 4, 20);
        s.set_engine_loop(EngineLoop::Async, true);
        s.enqueue(req(0, 16, 1), Tokens::ZERO, SimTime::ZERO);
        let dt = s.start_step(SimTime::ZERO, SimTime::MAX, started, false).expect("A's step");
        s.enqueue(req(1, 16, 1), Tokens::ZERO, SimTime::ZERO + SimDuration::from_micros(10));
        let end = SimTime::ZERO + dt;
        finish(&mut s);
        let first = s.start_step(end, SimTime::MAX, started, caller_between);
        let second = first.is_none().then(|| s.start_step(end, SimTime::MAX, started, false));
        (
            first.is_some(),
            second.map(|d| d.is_some()),
            s.core.batch.iter().map(|&k| s.core.seqs.get(k).req.id).collect::<Vec<_>>(),
        )
    };
    assert_eq!(run(false), (true, None, vec![1]), "the scheduler makes the second call itself");
    assert_eq!(run(true), (false, Some(true), vec![1]), "the caller makes it");
}

/// Schedules running sequences in order and admits waiting ones, as far
/// as the budget goes, but passes over the running sequence at index 1
/// while the flag is set (a step that leaves a prefill in flight
/// unscheduled, as vLLM's running loop does when it stops early).
struct PassOverSecond(std::sync::Arc<std::sync::atomic::AtomicBool>);
impl BatchPolicy for PassOverSecond {
    fn schedule(&mut self, step: &mut Step<'_>) -> Result<(), Replan> {
        let skip = self.0.load(std::sync::atomic::Ordering::Relaxed);
        let mut from = 0;
        while let Some(i) = step.next_to_compute(from) {
            from = i + 1;
            if !(skip && i == 1) {
                let k = step.chunk(i, step.tokens_left(i).get().min(step.budget()));
                step.schedule_running(i, k);
            }
        }
        while step.waiting() > 0 && step.budget() > 0 && step.admit(0) {}
        Ok(())
    }
}

#[test]
fn a_prefill_in_flight_the_step_passes_over_still_counts() {
    // vLLM keeps a request among the prefills in flight from the chunk that
    // leaves it prefilling until a step that is not a prefill chunk is
    // scheduled for it (`_inflight_prefills`): a step that does not
    // schedule it at all still counts its remaining blocks. B = 16, a
    // budget of 32: A (24 tokens) and B (56): step 1, A 24 and B 8; step
    // 2, A decodes and B computes 31 (39 of 56); step 3 passes B over:
    // B still needs cdiv(56, 16) − cdiv(39, 16) = 4 − 3 = 1 block. (Its
    // last step's 31 tokens read as this step's gave 70 ≥ 56: none.)
    let skip = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let limits = Limits { max_num_batched_tokens: 32, max_num_seqs: 4 };
    let policy = Box::new(PassOverSecond(skip.clone()));
    let mut s = Scheduler::with_pool(Mode::Generate, limits, false, fa_pool(100), Box::new(Fixed), policy);
    s.set_check_invariants(true);
    s.set_lazy_decoding(false);
    s.enqueue(req(0, 24, 5), Tokens::ZERO, SimTime::ZERO);
    s.enqueue(req(1, 56, 5), Tokens::ZERO, SimTime::ZERO);
    assert_eq!(step(&mut s, SimTime::ZERO), [(0, 24), (1, 8)]);
    finish(&mut s);
    assert_eq!(step(&mut s, SimTime::ZERO + SimDuration::from_millis(1)), [(0, 1), (1, 31)]);
    finish(&mut s);
    skip.store(true, std::sync::atomic::Ordering::Relaxed);
    assert_eq!(step(&mut s, SimTime::ZERO + SimDuration::from_millis(2)), [(0, 1)]);
    assert_eq!(s.core.inflight_prefill_blocks(), 1);
}

#[test]
fn a_landed_handoff_is_cached_when_admission_reaches_it() {
    // vLLM caches a landed load's blocks when its waiting loop peeks the
    // request (`_update_waiting_for_remote_kv`), not when the read ends,
    // and the loop stops before peeking once `max_num_seqs` run. A (ids
    // 1, 2) and B (ids 3, 4), 32 tokens each, are reserved; B lands first.
    let mut s = sched(Mode::Generate, 100, 1, 100);
    s.set_lazy_decoding(false);
    let ms = |m: u64| SimTime::ZERO + SimDuration::from_millis(m);
    for (id, ids) in [(0, [1, 2]), (1, [3, 4])] {
        let mut r = prefixed(id, &ids, 2);
        r.transferred_tokens = r.prompt;
        s.enqueue_remote(r, ms(1));
    }
    s.start_one_step(ms(1), SimTime::MAX, started);
    let mut reserved = Vec::new();
    s.take_reserved(&mut reserved);
    let (a, b) = (reserved.remove(0), reserved.remove(0));
    let (a_prefix, b_prefix) = (a.0.prefix.clone(), b.0.prefix.clone());
    let hit = |s: &Scheduler, p: &PrefixIds| s.core.pool.cached_prefix(p, Tokens::new(32), 9, Tokens::new(33));
    s.enqueue_landed(b.0, b.2, ms(10));
    assert_eq!(hit(&s, &b_prefix), 0, "landed, not looked at yet: not cached");
    s.enqueue_landed(a.0, a.2, ms(12));
    // A goes first (reserved first) and runs; with one sequence running
    // the loop stops before B: A's blocks are cached, B's still not.
    assert_eq!(step(&mut s, ms(12)), [(0, 1)]);
    assert_eq!((hit(&s, &a_prefix), hit(&s, &b_prefix)), (2, 0));
    assert!(finish(&mut s).is_empty());
    // A's second token; then A is done and B is reached, cached and run.
    assert_eq!(step(&mut s, ms(20)), [(0, 1)]);
    assert_eq!(finish(&mut s), [0]);
    assert_eq!(step(&mut s, ms(30)), [(1, 1)]);
    assert_eq!(hit(&s, &b_prefix), 2);
}

#[test]
fn a_finished_requests_own_full_blocks_wait_their_turn_in_the_eviction_order() {
    // vLLM caches every full block of computed KV, so a finished request's
    // own blocks join the LRU tail (freed in reverse, before its shared
    // ones) instead of being reused first. 6 blocks, B = 16.
    let mut pool = fa_pool(6);
    // X: one named block, computed and freed: the LRU order is [X].
    let x_req = prefixed(0, &[7], 1);
    let mut x = Alloc::owned_by(0);
    pool.pin_and_allocate(&mut x, &x_req.prefix, x_req.prompt, 0, (Tokens::ZERO, x_req.prompt), false).unwrap();
    pool.register(&mut x, &x_req.prefix, x_req.prompt, x_req.prompt);
    pool.release(&mut x, x_req.prompt);
    // A: 40 prompt tokens, the first block named (its prefix ids), and 20
    // generated: 59 computed, 4 blocks, 3 of them full. Freed: its partial
    // block plain, its 2 own full blocks a nameless run, then its named
    // one: [X, 2 nameless, A0].
    let a_prefix = PrefixIds { block_tokens: Tokens::new(16), ids: vec![1] };
    let mut a = Alloc::owned_by(1);
    let a_prompt = Tokens::new(40);
    pool.pin_and_allocate(&mut a, &a_prefix, a_prompt, 0, (Tokens::ZERO, a_prompt), false).unwrap();
    pool.register(&mut a, &a_prefix, a_prompt, a_prompt);
    pool.resize(&mut a, Tokens::new(58), Tokens::new(59), false).unwrap();
    assert_eq!(pool.used(), 4);
    pool.release(&mut a, Tokens::new(59));
    // 6 − 1 (X) − 4 (A) = 1 plain, plus A's partial block: 2; X and A0
    // cached (the run is evictable but counts as no cached content).
    assert_eq!((pool.free_plain(), pool.cached_free(), pool.free(), pool.evicted_blocks()), (2, 2, 6, 0));
    pool.check().unwrap();
    // Three blocks: 2 plain are too few, so X is evicted and the nameless
    // run behind it becomes plain: 1 + 2 + 2 = 5 free, 3 taken, 2 left; A0
    // stays cached. Were A's own blocks plain, 4 would be free and nothing
    // evicted.
    let mut y = Alloc::owned_by(2);
    pool.pin_and_allocate(&mut y, &PrefixIds::none(), Tokens::new(48), 0, (Tokens::ZERO, Tokens::new(48)), false)
        .unwrap();
    assert_eq!((pool.free_plain(), pool.cached_free(), pool.free(), pool.evicted_blocks()), (2, 1, 3, 1));
    assert_eq!(pool.cached_prefix(&x_req.prefix, x_req.prompt, 0, Tokens::new(17)), 0);
    assert_eq!(pool.cached_prefix(&a_prefix, a_prompt, 3, a_prompt), 1);
    pool.check().unwrap();
    // Hitting A0 takes the last named entry off the order, and the step
    // 16..17 takes one block more: 1 plain left, nothing cached.
    let mut z = Alloc::owned_by(3);
    pool.pin_and_allocate(&mut z, &a_prefix, a_prompt, 1, (Tokens::new(16), Tokens::new(17)), false).unwrap();
    assert_eq!((pool.free_plain(), pool.cached_free()), (1, 0));
    pool.check().unwrap();
}

#[test]
fn content_cached_twice_keeps_both_copies_until_the_last_is_evicted() {
    // vLLM's `BlockHashToBlockMap` keeps several blocks per hash: A and B
    // compute the same named block (neither hit it), so both copies stay
    // cached, each freed into the eviction order by its holder, and a hit
    // finds the content until its last copy goes. 4 blocks, B = 16.
    let mut pool = fa_pool(4);
    let r = |id| prefixed(id, &[5], 1);
    let (a_req, b_req) = (r(0), r(1));
    let (mut a, mut b) = (Alloc::owned_by(0), Alloc::owned_by(1));
    for (x, q) in [(&mut a, &a_req), (&mut b, &b_req)] {
        pool.pin_and_allocate(x, &q.prefix, q.prompt, 0, (Tokens::ZERO, q.prompt), false).unwrap();
    }
    pool.register(&mut a, &a_req.prefix, a_req.prompt, a_req.prompt);
    pool.register(&mut b, &b_req.prefix, b_req.prompt, b_req.prompt);
    assert_eq!((pool.used(), pool.free_plain()), (2, 2));
    // A's copy becomes evictable; B still holds its own (one copy for
    // both would stay pinned by B).
    pool.release(&mut a, a_req.prompt);
    assert_eq!((pool.used(), pool.cached_free(), pool.free_plain()), (1, 1, 2));
    pool.check().unwrap();
    // Three blocks evict A's copy; B's keeps the content cached.
    let mut y = Alloc::owned_by(2);
    pool.pin_and_allocate(&mut y, &PrefixIds::none(), Tokens::new(48), 0, (Tokens::ZERO, Tokens::new(48)), false)
        .unwrap();
    assert_eq!(pool.evicted_blocks(), 1);
    let c_req = prefixed(3, &[5, 6], 1);
    assert_eq!(pool.cached_prefix(&c_req.prefix, c_req.prompt, 3, c_req.prompt), 1);
    pool.check().unwrap();
    // B's copy, freed, is the one left to hit.
    pool.release(&mut b, b_req.prompt);
    pool.release(&mut y, Tokens::ZERO);
    assert_eq!((pool.cached_free(), pool.free_plain()), (1, 3));
    assert_eq!(pool.cached_prefix(&c_req.prefix, c_req.prompt, 3, c_req.prompt), 1);
    pool.check().unwrap();
}

#[test]
fn the_next_copy_in_caching_order_takes_an_evicted_first_copys_place() {
    // vLLM's map serves a hash's first block still cached (insertion
    // order). A, B, C compute key K (copies 1, 2, 3); X computes another.
    // Freed A, B, X, C: the order is [K1, K2, X, K3]. 5 blocks, B = 16.
    let mut pool = fa_pool(5);
    let reqs: Vec<Box<Request>> = (0..3).map(|i| prefixed(i, &[5], 1)).chain([prefixed(3, &[9], 1)]).collect();
    let mut allocs: Vec<Alloc> = (0..4).map(Alloc::owned_by).collect();
    for (r, a) in reqs.iter().zip(allocs.iter_mut()) {
        pool.pin_and_allocate(a, &r.prefix, r.prompt, 0, (Tokens::ZERO, r.prompt), false).unwrap();
        pool.register(a, &r.prefix, r.prompt, r.prompt);
    }
    for i in [0, 1, 3, 2] {
        pool.release(&mut allocs[i], reqs[i].prompt);
    }
    pool.check().unwrap();
    // Two blocks: the plain one, then K1 goes and K2 is first.
    let mut y = Alloc::owned_by(4);
    pool.pin_and_allocate(&mut y, &PrefixIds::none(), Tokens::new(32), 0, (Tokens::ZERO, Tokens::new(32)), false)
        .unwrap();
    assert_eq!(pool.evicted_blocks(), 1);
    // D hits K (pins K2, leaving [X, K3]) and needs one block more: X goes.
    // Had K3 taken K1's place, D would pin it and K2 would go, not X.
    let d = prefixed(5, &[5, 6], 1);
    let mut da = Alloc::owned_by(5);
    assert_eq!(pool.cached_prefix(&d.prefix, d.prompt, 5, d.prompt), 1);
    pool.pin_and_allocate(&mut da, &d.prefix, d.prompt, 1, (Tokens::new(16), Tokens::new(17)), false).unwrap();
    assert_eq!(pool.evicted_blocks(), 2);
    assert_eq!(pool.cached_prefix(&reqs[3].prefix, reqs[3].prompt, 6, Tokens::new(17)), 0, "X evicted");
    assert_eq!(pool.cached_prefix(&d.prefix, d.prompt, 6, d.prompt), 1, "K still cached");
    pool.check().unwrap();
}

#[test]
fn a_hit_pinned_after_the_key_map_changed_pins_the_copy_it_serves_then() {
    // The pool keeps the slots a lookup found for the pin that follows; a
    // change of the key map in between must not let the pin use them. A
    // and B compute key K (copies K1, K2), both freed: [K1, K2], one plain
    // block. D looks up K (K1). Y takes 2 blocks: the plain one and K1, so
    // K2 takes K1's place; Y gives its blocks back. D's pin then pins K2
    // (the stale slot is K1's, freed) and takes one of Y's. 3 blocks,
    // B = 16.
    let mut pool = fa_pool(3);
    let reqs: Vec<Box<Request>> = (0..2).map(|i| prefixed(i, &[5], 1)).collect();
    let mut allocs: Vec<Alloc> = (0..2).map(Alloc::owned_by).collect();
    for (r, a) in reqs.iter().zip(allocs.iter_mut()) {
        pool.pin_and_allocate(a, &r.prefix, r.prompt, 0, (Tokens::ZERO, r.prompt), false).unwrap();
        pool.register(a, &r.prefix, r.prompt, r.prompt);
    }
    for (r, a) in reqs.iter().zip(allocs.iter_mut()) {
        pool.release(a, r.prompt);
    }
    let d = prefixed(5, &[5, 6], 1);
    assert_eq!(pool.cached_prefix(&d.prefix, d.prompt, 5, d.prompt), 1);
    let mut y = Alloc::owned_by(4);
    pool.pin_and_allocate(&mut y, &PrefixIds::none(), Tokens::new(32), 0, (Tokens::ZERO, Tokens::new(32)), false)
        .unwrap();
    assert_eq!(pool.evicted_blocks(), 1);
    pool.release(&mut y, Tokens::new(32));
    let mut da = Alloc::owned_by(5);
    pool.pin_and_allocate(&mut da, &d.prefix, d.prompt, 1, (Tokens::new(16), Tokens::new(17)), false).unwrap();
    // Pinned: K2, no longer evictable; the copy K1 is gone.
    pool.check().unwrap();
    assert_eq!((pool.used(), pool.cached_free(), pool.free_plain()), (2, 0, 1));
    pool.release(&mut da, Tokens::new(17));
    pool.check().unwrap();
}

#[test]
fn a_source_release_frees_what_the_rule_frees_per_group() {
    // Full attention and a window of 32 tokens, B = 16: a 1,024-token
    // prefill in one step holds 64 + 64 blocks; the source keeps 64 + 2
    // (rules::group_release: the window keeps cdiv(1024,16) − floor(993/16)
    // = 64 − 62 = 2).
    let groups =
        vec![group(CacheGroupKind::FullAttention, 16, None), group(CacheGroupKind::SlidingWindow, 16, Some(32))];
    let mut pool = KvPool::new(groups, 1_000, true);
    let mut a = Alloc::default();
    pool.pin_and_allocate(&mut a, &PrefixIds::none(), Tokens::new(1_024), 0, (Tokens::ZERO, Tokens::new(1_024)), false)
        .unwrap();
    assert_eq!(pool.group_used(), [64, 64]);
    pool.release_to_source(&mut a);
    assert_eq!(pool.group_used(), [64, 2]);
    assert_eq!(pool.used(), 66);
    pool.check().unwrap();
}

/// A prefix-cacheable sliding window of `w` tokens, blocks of `b`.
fn cached_window(b: u64, w: u64) -> CacheGroup {
    group_caching(CacheGroupKind::SlidingWindow, b, Some(w), true)
}

/// Request `id` with the five 16-token blocks named 1..=5 (80 tokens),
/// computed in one step and then one decode step (80..81) on `pool`.
fn five_named_blocks(pool: &mut KvPool, id: u64) -> (Box<Request>, Alloc) {
    let r = prefixed(id, &[1, 2, 3, 4, 5], 2);
    let mut a = Alloc::owned_by(id);
    pool.pin_and_allocate(&mut a, &r.prefix, r.prompt, 0, (Tokens::ZERO, r.prompt), false).unwrap();
    pool.register(&mut a, &r.prefix, r.prompt, r.prompt);
    pool.resize(&mut a, Tokens::new(80), Tokens::new(81), false).unwrap();
    pool.check().unwrap();
    (r, a)
}

#[test]
fn a_hit_needs_the_window_blocks_before_its_end_cached() {
    // Full attention beside a window of W = 33, B = 16: vLLM caches the
    // window group's full blocks too, frees those leaving the window into
    // the eviction order, and a hit needs cdiv(W − 1, B) = 2 cached window
    // blocks in a row before its end (`SlidingWindowManager`). 15 blocks.
    let groups = vec![group(CacheGroupKind::FullAttention, 16, None), cached_window(16, 33)];
    let mut pool = KvPool::new(groups, 15, true);
    // A: 80 tokens in one step (5 + 5 blocks), then 80..81: the window
    // skips floor((80 − 33 + 1) / 16) = 3 blocks, freed into the order
    // last first ([w2, w1, w0]); it holds full attention 6, window 3.
    let (b, _a) = five_named_blocks(&mut pool, 0);
    assert_eq!(pool.group_used(), [6, 3]);
    assert_eq!((pool.free_plain(), pool.cached_free()), (15 - 9 - 3, 3));
    // B, the same prompt: full attention hits floor(79 / 16) = 4 blocks;
    // window blocks 3 (A's) and 2 (cached) end there: 4.
    let hit = |pool: &KvPool| pool.cached_prefix(&b.prefix, b.prompt, 1, b.prompt);
    assert_eq!(hit(&pool), 4);
    // 32 tokens of a request without a name, 2 + 2 blocks: 3 plain, so w2
    // goes. From
    // block 3 back: 3 cached, 2 not; then 1 and 0 in a row: the hit ends
    // at 0 + 2 = 2 blocks, though 4 full-attention blocks are cached.
    let mut x = Alloc::owned_by(2);
    pool.pin_and_allocate(&mut x, &PrefixIds::none(), Tokens::new(48), 0, (Tokens::ZERO, Tokens::new(32)), false)
        .unwrap();
    assert_eq!(pool.evicted_blocks(), 1);
    assert_eq!(hit(&pool), 2);
    // X finishes: its 2 + 2 full blocks of its own join the order as a
    // nameless run behind w1, w0. B's hit of 2 then pins window blocks 0
    // and 1 off the order (and A's full-attention blocks 0 and 1), the run
    // at the head becomes 4 plain blocks, and the step 32..48 takes 1 + 1.
    pool.release(&mut x, Tokens::new(32));
    assert_eq!((pool.free_plain(), pool.cached_free(), pool.free()), (0, 2, 6));
    let mut bb = Alloc::owned_by(1);
    pool.pin_and_allocate(&mut bb, &b.prefix, b.prompt, 2, (Tokens::new(32), Tokens::new(48)), false).unwrap();
    assert_eq!((pool.free_plain(), pool.cached_free()), (2, 0));
    assert_eq!(pool.group_used(), [6 + 1, 3 + 3]);
    pool.check().unwrap();
}

#[test]
fn a_window_only_model_hits_on_its_window_blocks() {
    // No full-attention group: vLLM's window manager hits alone. W = 33,
    // B = 16, 12 blocks. A computes 80 tokens and 80..81, then finishes:
    // its window blocks 4 and 3 (named) follow 2, 1, 0 into the order, its
    // partial block 5 is freed plain.
    let mut pool = KvPool::new(vec![cached_window(16, 33)], 12, true);
    let (b, mut a) = five_named_blocks(&mut pool, 0);
    pool.release(&mut a, Tokens::new(81));
    assert_eq!((pool.free_plain(), pool.cached_free()), (12 - 5, 5));
    // B, the same prompt: of floor(79 / 16) = 4 blocks, window blocks 3
    // and 2 end the hit: 64 tokens, pinning 2 blocks.
    assert_eq!(pool.cached_prefix(&b.prefix, b.prompt, 1, b.prompt), 4);
    assert_eq!(pool.hit_tokens(4), Tokens::new(64));
    let mut bb = Alloc::owned_by(1);
    pool.pin_and_allocate(&mut bb, &b.prefix, b.prompt, 4, (Tokens::new(64), Tokens::new(80)), false).unwrap();
    // Window blocks 2, 3 pinned and 4 new: 3 held, 3 cached left.
    assert_eq!((pool.used(), pool.cached_free()), (3, 3));
    pool.check().unwrap();
}

#[test]
fn a_reservation_counts_the_hits_evictable_blocks_against_what_it_must_leave() {
    // Window-only, W = 33, B = 16, 10 blocks: A's five named window blocks
    // are cached and unpinned. B (96 tokens) hits 5 blocks; its
    // reservation for the step 95..96 pins blocks 3 and 4 (in that step's
    // window, floor(63 / 16) = 3 skipped) and takes 6 − 3 − 2 = 1 more:
    // 1 + 2 touched + 9 to leave > 10, so it fails, changing nothing.
    let mut pool = KvPool::new(vec![cached_window(16, 33)], 10, true);
    let a_req = prefixed(0, &[1, 2, 3, 4, 5], 1);
    let mut a = Alloc::owned_by(0);
    pool.pin_and_allocate(&mut a, &a_req.prefix, a_req.prompt, 0, (Tokens::ZERO, a_req.prompt), false).unwrap();
    pool.register(&mut a, &a_req.prefix, a_req.prompt, a_req.prompt);
    pool.release(&mut a, a_req.prompt);
    let b = prefixed(1, &[1, 2, 3, 4, 5, 6], 1);
    let hit = pool.cached_prefix(&b.prefix, b.prompt, 1, b.prompt);
    assert_eq!(hit, 5);
    let mut bb = Alloc::owned_by(1);
    let span = (Tokens::new(95), Tokens::new(96));
    assert!(pool.pin_and_allocate_leaving(&mut bb, &b.prefix, b.prompt, hit, span, false, 9).is_err());
    assert_eq!((pool.free(), pool.cached_free()), (10, 5));
    // Leaving 7 it fits: 3 blocks held, 2 of them the hit's.
    pool.pin_and_allocate_leaving(&mut bb, &b.prefix, b.prompt, hit, span, false, 7).unwrap();
    assert_eq!((pool.used(), pool.cached_free()), (3, 3));
    pool.check().unwrap();
}

#[test]
fn a_one_token_window_hits_without_holding_a_window_block() {
    // W = 1: a hit needs one cached window block before its end, but a
    // holding at a block-aligned hit keeps cdiv(0, 16) = 0 of them.
    let groups = vec![group(CacheGroupKind::FullAttention, 16, None), cached_window(16, 1)];
    let mut pool = KvPool::new(groups, 20, true);
    let a_req = prefixed(0, &[1, 2], 1);
    let mut a = Alloc::owned_by(0);
    pool.pin_and_allocate(&mut a, &a_req.prefix, a_req.prompt, 0, (Tokens::ZERO, a_req.prompt), false).unwrap();
    pool.register(&mut a, &a_req.prefix, a_req.prompt, a_req.prompt);
    pool.release(&mut a, a_req.prompt);
    let b = prefixed(1, &[1, 2, 3], 1);
    assert_eq!(pool.cached_prefix(&b.prefix, b.prompt, 1, b.prompt), 2);
    let mut bb = Alloc::owned_by(1);
    pool.pin_and_allocate(&mut bb, &b.prefix, b.prompt, 2, (Tokens::new(32), Tokens::new(48)), false).unwrap();
    // Full attention 2 pinned + 1; the window's block 2 alone.
    assert_eq!(pool.group_used(), [3, 1]);
    pool.check().unwrap();
}

/// A state group of `b`-token blocks; `cacheable`: Mamba-type (align mode
/// with prefix caching), else a tail ring that opts out.
fn state_group(b: u64, cacheable: bool) -> CacheGroup {
    group_caching(CacheGroupKind::State, b, None, cacheable)
}

/// Full attention beside a prefix-cacheable state group, both of 16-token
/// blocks (Mamba's align mode), `num_blocks` blocks.
fn fa_state_pool(num_blocks: u64) -> KvPool {
    KvPool::new(vec![group(CacheGroupKind::FullAttention, 16, None), state_group(16, true)], num_blocks, true)
}

/// A request finishing on a rank with vLLM's KV connector frees the
/// window blocks below the window of all it computed first, ahead of its
/// full-attention blocks (`_connector_finished` → `remove_skipped_blocks`);
/// without one, its blocks go group by group, full attention first, each
/// tail first. W = 17, B = 16 (a hit needs the one window block before its
/// end). A, three named blocks, computes 0..47 and 47..48, which frees
/// window block floor((47 − 17 + 1) / 16) − 1 = 0; the finish at 48 skips
/// floor((48 − 17 + 1) / 16) = 2 blocks, so block 1 goes first. The order
/// with the connector: window 0, window 1, full attention 2, 1, 0, window
/// 2; without: window 0, full attention 2, 1, 0, window 2, 1. A pool of 6
/// holds them all; X, 16 tokens (2 blocks), evicts the first two. B, the
/// same three blocks and one more, then hits 3 (window 2 before that end
/// is cached) with the connector, and without it 2 (full-attention block 2
/// gone; window block 1 before that end is cached).
#[test]
fn a_connector_finish_frees_the_skipped_window_blocks_first() {
    let hit_after_two_evictions = |connector: bool| {
        let groups = vec![group(CacheGroupKind::FullAttention, 16, None), cached_window(16, 17)];
        let mut pool = KvPool::new(groups, 6, true);
        let a_req = prefixed(0, &[1, 2, 3], 1);
        let (p, t) = (&a_req.prefix, a_req.prompt);
        let mut a = Alloc::owned_by(0);
        pool.pin_and_allocate(&mut a, p, t, 0, (Tokens::ZERO, Tokens::new(47)), false).unwrap();
        pool.register(&mut a, p, t, Tokens::new(47));
        pool.resize(&mut a, Tokens::new(47), Tokens::new(48), false).unwrap();
        pool.register(&mut a, p, t, Tokens::new(48));
        if connector {
            pool.release_with_connector(&mut a, Tokens::new(48));
        } else {
            pool.release(&mut a, Tokens::new(48));
        }
        pool.check().unwrap();
        assert_eq!((pool.free_plain(), pool.cached_free()), (0, 6));
        let mut x = Alloc::owned_by(2);
        pool.pin_and_allocate(&mut x, &PrefixIds::none(), Tokens::new(20), 0, (Tokens::ZERO, Tokens::new(16)), false)
            .unwrap();
        assert_eq!(pool.evicted_blocks(), 2);
        pool.check().unwrap();
        let b = prefixed(1, &[1, 2, 3, 4], 1);
        pool.cached_prefix(&b.prefix, b.prompt, 1, b.prompt)
    };
    assert_eq!(hit_after_two_evictions(true), 3);
    assert_eq!(hit_after_two_evictions(false), 2);
}

/// A request finishing on a rank with vLLM's KV connector frees its
/// superseded state block first (`_connector_finished` →
/// `remove_skipped_blocks`), ahead of its full-attention blocks; without
/// one, its blocks go group by group, full attention first. A, three
/// named blocks' worth of ids, computes 0..32 (its state at 32 cached)
/// and a decode step 32..33, and finishes. 20 blocks: 3 stay cached (two
/// full-attention blocks and the state at 32), 17 plain; taking 18 evicts
/// the first cached entry in the order.
#[test]
fn a_connector_finish_frees_the_superseded_state_first() {
    let state_at_32_after_one_eviction = |connector: bool| {
        let mut pool = fa_state_pool(20);
        let a_req = prefixed(0, &[1, 2, 3], 1);
        let mut a = Alloc::owned_by(0);
        pool.pin_and_allocate(&mut a, &a_req.prefix, a_req.prompt, 0, (Tokens::ZERO, Tokens::new(32)), false).unwrap();
        pool.register(&mut a, &a_req.prefix, a_req.prompt, Tokens::new(32));
        pool.resize(&mut a, Tokens::new(32), Tokens::new(33), false).unwrap();
        if connector {
            pool.release_with_connector(&mut a, Tokens::new(33));
        } else {
            pool.release(&mut a, Tokens::new(33));
        }
        assert_eq!((pool.free_plain(), pool.cached_free()), (17, 3));
        assert!(pool.hit_state_cached(&a_req.prefix, a_req.prompt, 9, 2));
        let mut c = Alloc::owned_by(1);
        let t = Tokens::new(17 * 16);
        pool.pin_and_allocate(&mut c, &PrefixIds::none(), t, 0, (Tokens::ZERO, t), false).unwrap();
        assert_eq!(pool.evicted_blocks(), 1);
        pool.check().unwrap();
        pool.hit_state_cached(&a_req.prefix, a_req.prompt, 9, 2)
    };
    assert!(!state_at_32_after_one_eviction(true), "the state went first");
    assert!(state_at_32_after_one_eviction(false), "a full-attention block went first");
}

/// A prefill's source release under the asynchronous loop gives back the
/// two earlier states it still holds, the later one first: vLLM frees
/// that range from its end (`MambaManager._remove_blocks_in_range`,
/// `single_type_kv_cache_manager.py:1620`), so the later state is evicted
/// first. A, eight named blocks, computes 0..16 (state at 16), 16..112
/// (state at 112) and, with that step still in flight, 112..121, and is
/// released as a source. 40 blocks: the source holds 8 + 1, the two states
/// are cached free, the rest plain; a request taking every plain block and
/// one more (its full-attention blocks and a state block) evicts the state
/// at 112 and leaves the one at 16.
#[test]
fn a_source_release_frees_its_later_state_first() {
    let mut pool = fa_state_pool(40);
    let a_req = prefixed(0, &[1, 2, 3, 4, 5, 6, 7, 8], 1);
    let (p, t) = (&a_req.prefix, a_req.prompt);
    let mut a = Alloc::owned_by(0);
    pool.pin_and_allocate(&mut a, p, t, 0, (Tokens::ZERO, Tokens::new(16)), false).unwrap();
    pool.register(&mut a, p, t, Tokens::new(16));
    pool.resize(&mut a, Tokens::new(16), Tokens::new(112), false).unwrap();
    pool.register(&mut a, p, t, Tokens::new(112));
    pool.resize_lagging(&mut a, Tokens::new(16), Tokens::new(112), Tokens::new(121), false).unwrap();
    pool.register(&mut a, p, t, Tokens::new(121));
    pool.check().unwrap();
    pool.release_to_source(&mut a);
    pool.check().unwrap();
    assert_eq!(pool.cached_free(), 2, "both earlier states are cached and free");
    assert!(pool.hit_state_cached(p, t, 9, 1) && pool.hit_state_cached(p, t, 9, 7));
    let mut c = Alloc::owned_by(1);
    let take = Tokens::new(16 * pool.free_plain());
    pool.pin_and_allocate(&mut c, &PrefixIds::none(), take, 0, (Tokens::ZERO, take), false).unwrap();
    assert_eq!(pool.evicted_blocks(), 1);
    pool.check().unwrap();
    assert!(!pool.hit_state_cached(p, t, 9, 7), "the state at 112 went first");
    assert!(pool.hit_state_cached(p, t, 9, 1), "the state at 16 stays cached");
}

/// A state a decode step writes on a block boundary is registered when
/// the step is scheduled; a preemption while that step is in flight, its
/// input token a placeholder (hashable 47 of 48), frees it uncached, as
/// vLLM never hashed its block: it goes back as a plain block and cannot
/// be hit. Once the token is known (hashable 48) it stays cached.
/// Full attention and a state group, B = 16, 12 blocks: A computes 0..47
/// in one step (no boundary state: a state is cached where a step ends)
/// and then 47..48.
#[test]
fn a_preemption_frees_a_state_its_step_in_flight_wrote_uncached() {
    let cached_after_preemption = |hashable: u64| {
        let mut pool = fa_state_pool(12);
        let a_req = prefixed(0, &[1, 2, 3], 1);
        let (p, t) = (&a_req.prefix, a_req.prompt);
        let mut a = Alloc::owned_by(0);
        pool.pin_and_allocate(&mut a, p, t, 0, (Tokens::ZERO, Tokens::new(47)), false).unwrap();
        pool.register(&mut a, p, t, Tokens::new(47));
        pool.resize(&mut a, Tokens::new(47), Tokens::new(48), false).unwrap();
        pool.register_state(&mut a, p, t, Tokens::new(48));
        assert!(pool.hit_state_cached(p, t, 9, 3), "registered when the step is scheduled");
        let hashable = Tokens::new(hashable);
        pool.forget_states_past(&mut a, hashable);
        pool.check().unwrap();
        pool.register_own(&mut a, p, t, hashable);
        pool.release(&mut a, hashable);
        pool.check().unwrap();
        assert_eq!(pool.used(), 0);
        (pool.hit_state_cached(p, t, 9, 3), pool.cached_free())
    };
    // Cached after the preemption: full-attention blocks through the
    // tokens known (floor(47/16) = 2, floor(48/16) = 3), and the state at
    // 48 only once its token is known.
    assert_eq!(cached_after_preemption(47), (false, 2));
    assert_eq!(cached_after_preemption(48), (true, 3 + 1));
}

/// A remote load on a Mamba hybrid whose full-attention hit ends where
/// no state is cached, one being cached below it: vLLM's connector lookup
/// keeps the Mamba group's own hit apart (`get_computed_blocks_for_
/// connector`) and its count takes that state when it is evictable, though
/// the load never holds it. B = 16, 5 blocks: A computes 0..16 (its state
/// at 16 cached) and 16..40, and finishes: cached full-attention blocks 0
/// and 1 and the state at 16, two plain. D's load of 64 tokens hits 2
/// blocks: it needs 4 − 2 + 1 = 3 blocks, and counts its 2 hit blocks and
/// the state at 16 as taken: 5 − 3 = 2 left, short by one (without the
/// state, 3 left, and it fit).
#[test]
fn a_mamba_load_counts_its_state_groups_own_hit_below_the_full_attention_one() {
    let mut pool = fa_state_pool(5);
    let a_req = prefixed(0, &[1, 2, 3], 1);
    let (p, t) = (&a_req.prefix, a_req.prompt);
    let mut a = Alloc::owned_by(0);
    pool.pin_and_allocate(&mut a, p, t, 0, (Tokens::ZERO, Tokens::new(16)), false).unwrap();
    pool.register(&mut a, p, t, Tokens::new(16));
    pool.resize(&mut a, Tokens::new(16), Tokens::new(40), false).unwrap();
    pool.register(&mut a, p, t, Tokens::new(40));
    pool.release(&mut a, Tokens::new(40));
    pool.check().unwrap();
    assert_eq!((pool.cached_free(), pool.free_plain()), (3, 2));
    // (A later schedule call: a state cached in this one is not usable.)
    pool.new_step(1);
    let d = prefixed(1, &[1, 2, 3, 4], 1);
    let to = Tokens::new(64);
    assert_eq!(pool.cached_prefix(&d.prefix, d.prompt, 1, d.prompt), 1, "the hit every group agrees on");
    assert!(!pool.hit_state_cached(&d.prefix, d.prompt, 1, 2) && pool.hit_state_cached(&d.prefix, d.prompt, 1, 1));
    let short = pool.load_fits(&d.prefix, d.prompt, 1, 2, (to, to), 0).map_err(|s| (s.needed, s.available));
    assert_eq!(short, Err((3, 2)));
}

/// Two requests that compute the same state (neither hit it) each keep
/// their own block of it, cached as two copies, as vLLM's
/// `BlockHashToBlockMap` keeps both: registering the second frees nothing,
/// and the state stays cached while either copy is.
#[test]
fn the_same_state_computed_twice_is_cached_twice() {
    let mut pool = fa_state_pool(20);
    let (a_req, b_req, c_req) = (prefixed(0, &[1, 2, 3], 1), prefixed(1, &[1, 2, 3], 1), prefixed(2, &[1, 2, 3], 1));
    let (mut a, mut b) = (Alloc::owned_by(0), Alloc::owned_by(1));
    let to = Tokens::new(32);
    pool.pin_and_allocate(&mut a, &a_req.prefix, a_req.prompt, 0, (Tokens::ZERO, to), false).unwrap();
    pool.pin_and_allocate(&mut b, &b_req.prefix, b_req.prompt, 0, (Tokens::ZERO, to), false).unwrap();
    // Each: 2 full-attention blocks and the state block it writes.
    assert_eq!(pool.used(), 6);
    pool.register(&mut a, &a_req.prefix, a_req.prompt, to);
    pool.register(&mut b, &b_req.prefix, b_req.prompt, to);
    assert_eq!(pool.used(), 6, "both keep their blocks");
    pool.check().unwrap();
    // A third request hits both blocks and the state at 32, while either
    // copy of it is cached.
    let hit = |pool: &KvPool| pool.cached_prefix(&c_req.prefix, c_req.prompt, 2, c_req.prompt);
    assert_eq!(hit(&pool), 2);
    pool.release(&mut a, to);
    assert_eq!((pool.used(), hit(&pool)), (3, 2));
    pool.check().unwrap();
    // A's copies (the first ones) are evicted: B's become first, and C's
    // hit pins them.
    let mut d = Alloc::owned_by(3);
    let d_prompt = Tokens::new(16 * 16);
    pool.pin_and_allocate(&mut d, &PrefixIds::none(), d_prompt, 0, (Tokens::ZERO, d_prompt), false).unwrap();
    assert_eq!((pool.used(), hit(&pool)), (20, 2));
    pool.check().unwrap();
    pool.release(&mut d, Tokens::ZERO);
    // (A later schedule call: a state cached in this one cannot be hit.)
    pool.new_step(1);
    let mut c = Alloc::owned_by(2);
    let c_span = (to, c_req.prompt);
    pool.pin_and_allocate(&mut c, &c_req.prefix, c_req.prompt, 2, c_span, false).unwrap();
    pool.check().unwrap();
    pool.release(&mut b, to);
    pool.check().unwrap();
    pool.release(&mut c, c_req.prompt);
    assert_eq!((pool.used(), hit(&pool)), (0, 2));
    pool.check().unwrap();
}

/// A seeded run of 40 requests with shared prefixes on `pool` (16-token
/// prefix ids): each request as it ended (id, end, preemptions, tokens
/// generated, prefix hit, priority), in the order they ended, the preemptions, and
/// the pool's counts at the end. The pool balances after every step
/// (check_invariants). `by_priority`: vLLM's priority policy, with
/// priorities 0 to 2 drawn per request.
type Ended = (u64, SimTime, u32, Tokens, Tokens, i32);
fn seeded_run(pool: KvPool, lazy: bool, by_priority: bool) -> (Vec<Ended>, u64, (u64, usize, usize)) {
    let limits = Limits { max_num_batched_tokens: 64, max_num_seqs: 16 };
    let mut s = Scheduler::with_pool(Mode::Generate, limits, false, pool, Box::new(Fixed), Box::new(VllmPolicy));
    s.set_check_invariants(true);
    s.set_lazy_decoding(lazy);
    s.set_options(SchedulerOptions { priority: by_priority, ..SchedulerOptions::default() });
    s.set_max_run(7);
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut next = |m: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % m
    };
    for id in 0..40 {
        let ids: Vec<u64> = (0..1 + next(6)).map(|j| if j < 2 { j } else { 1_000 * id + j }).collect();
        let mut req = prefixed(id, &ids, 1 + next(40));
        req.priority = next(3) as i32;
        s.enqueue(req, Tokens::ZERO, SimTime::ZERO);
    }
    let (mut now, mut completed, mut steps) = (SimTime::ZERO, 0, 0);
    let mut log = Vec::new();
    let mut done = Vec::new();
    while let Some(dt) = s.start_step(now, SimTime::MAX, started, false) {
        now += dt;
        s.finish_step(now, &mut done);
        for f in done.drain(..) {
            let (Finished::Completed(r) | Finished::Prefilled { req: r, .. }) = f;
            log.push((r.id, r.t.finished.unwrap_or(now), r.preemptions, r.generated, r.prefill_hit, r.priority));
            completed += 1;
        }
        while s.take_stuck().is_some() {
            completed += 1;
        }
        steps += 1;
        assert!(steps < 100_000, "the run ends");
    }
    assert_eq!(completed, 40);
    s.check().unwrap();
    let preemptions = s.stats().preemptions;
    let c = s.counts();
    (log, preemptions, (c.used, c.waiting, c.running))
}

#[test]
fn blocks_are_conserved_and_a_run_ends_with_every_block_back() {
    // A seeded mix of prompts, outputs and shared prefixes on small pools
    // of every kind of cache group (preemptions included): the pool
    // balances after every step and holds nothing at the end, and the
    // decoding set's runs schedule what stepping one by one schedules.
    let fa = || group(CacheGroupKind::FullAttention, 16, None);
    let pools: Vec<(&str, Vec<CacheGroup>, u64)> = vec![
        ("full attention", vec![fa()], 40),
        // Held as a full-attention group and a window no block leaves.
        ("two full-attention groups", vec![fa(), fa()], 80),
        ("three full-attention groups beside a tail ring", vec![fa(), fa(), fa(), state_group(16, false)], 130),
        ("window cache", vec![fa(), cached_window(16, 33)], 60),
        ("two window groups of one spec", vec![fa(), cached_window(16, 33), cached_window(16, 33)], 90),
        ("window cache, B 32", vec![fa(), cached_window(32, 64)], 60),
        ("window only", vec![cached_window(16, 40)], 24),
        ("window beside a tail ring", vec![fa(), cached_window(16, 17), state_group(16, false)], 70),
        ("Mamba align mode", vec![fa(), state_group(16, true), state_group(16, false)], 50),
        (
            "window beside a Mamba state",
            vec![fa(), cached_window(16, 33), state_group(16, true), state_group(16, false)],
            80,
        ),
        (
            "two window groups beside a Mamba state",
            vec![fa(), cached_window(16, 33), cached_window(16, 33), state_group(16, true), state_group(16, false)],
            110,
        ),
        ("Mamba only", vec![state_group(16, true), state_group(16, false)], 12),
        // Blocks smaller than the 16-token ids: an id's blocks are one
        // group's keys, registered and hit a group's run at a time.
        ("full attention B 4 (grouped)", vec![group(CacheGroupKind::FullAttention, 4, None)], 160),
        ("full attention B 2 (grouped)", vec![group(CacheGroupKind::FullAttention, 2, None)], 320),
        ("window cache B 4 (grouped)", vec![group(CacheGroupKind::FullAttention, 4, None), cached_window(4, 33)], 240),
    ];
    // The mean end of the requests of priority `p`, in nanoseconds.
    let mean_end = |log: &[Ended], p: i32| {
        let ends: Vec<u64> = log.iter().filter(|e| e.5 == p).map(|e| e.1.as_nanos()).collect();
        ends.iter().sum::<u64>() / ends.len() as u64
    };
    for (name, groups, blocks) in pools {
        let mut logs = Vec::new();
        for by_priority in [false, true] {
            let pool = || KvPool::new(groups.clone(), blocks, true);
            let (fast, preemptions, end) = seeded_run(pool(), true, by_priority);
            let (slow, _, _) = seeded_run(pool(), false, by_priority);
            assert!(preemptions > 0, "{name}: the pool was under pressure");
            assert_eq!(end, (0, 0, 0), "{name}: every block back");
            assert!(fast.iter().any(|e| e.4 > Tokens::ZERO), "{name}: some prompts hit the cache");
            assert_eq!(fast, slow, "{name}, priority policy {by_priority}");
            logs.push(fast);
        }
        // The policy is at work: it changes the run, and the requests of
        // the first priority end sooner than those of the last on average.
        let (fcfs, priority) = (&logs[0], &logs[1]);
        assert_ne!(fcfs, priority, "{name}: the priority policy changed nothing");
        assert!(mean_end(priority, 0) < mean_end(priority, 2), "{name}: priority 0 ends first");
    }
}

/// What every group holds together, summed over the classes of groups that
/// hold alike, is the sum group by group: for a GLM-like model (one
/// full-attention group, a tail ring, four Mamba-type states with a
/// checkpoint block each, all of one block size), with states of another
/// block size and a window group beside them, in align mode and not, over
/// steps that start and end on and off block boundaries.
#[test]
fn groups_folded_into_classes_hold_what_each_group_holds() {
    let with_checkpoint = |b: u64| {
        CacheGroupSpec {
            name: "kda".into(),
            kind: CacheGroupKind::State,
            block_size_tokens: Tokens::new(b),
            page_bytes: Bytes::new(1),
            transfer_bytes_per_block: Some(Bytes::new(1)),
            prefix_cacheable: Some(true),
            window_tokens: None,
            checkpoint_blocks: Some(Blocks::new(1)),
            heads: None,
        }
        .validate(Role::Aggregated, 0)
        .unwrap()
    };
    let glm: Vec<CacheGroup> = [group(CacheGroupKind::FullAttention, 32, None), state_group(32, false)]
        .into_iter()
        .chain((0..4).map(|_| with_checkpoint(32)))
        .collect();
    let mut mixed = glm.clone();
    mixed.extend([with_checkpoint(64), state_group(64, true), group(CacheGroupKind::SlidingWindow, 32, Some(40))]);
    for (groups, classes) in [(glm, 3), (mixed, 6)] {
        for caching in [true, false] {
            let pool = KvPool::new(groups.clone(), 1_000, caching);
            assert_eq!(pool.classes(), classes);
            for from in [0, 1, 31, 32, 33, 63, 64, 65, 200] {
                for to in [from, from + 1, from + 31, from + 32, from + 100] {
                    for checkpoints in [false, true] {
                        let (folded, each) = pool.all_blocks_both_ways(Tokens::new(from), Tokens::new(to), checkpoints);
                        assert_eq!(folded, each, "{from}..{to} checkpoints {checkpoints} caching {caching}");
                    }
                }
            }
        }
    }
}

/// Full attention, a prefix-cacheable window of W = 33 and a Mamba state,
/// all of 16-token blocks (the window cache beside align mode).
fn fa_window_state_pool(num_blocks: u64) -> KvPool {
    let groups = vec![group(CacheGroupKind::FullAttention, 16, None), cached_window(16, 33), state_group(16, true)];
    KvPool::new(groups, num_blocks, true)
}

#[test]
fn window_groups_of_one_spec_free_and_evict_their_blocks_group_by_group() {
    // Two window groups of one spec (W = 17, B = 16: a hit needs the
    // cdiv(16, 16) = 1 window block before its end cached in both). A (five
    // named blocks) computes 0..80, then decodes 80..81. That step frees
    // the window blocks below its window, floor((80 − 17 + 1) / 16) = 4,
    // into the eviction order group by group, each the last first (vLLM's
    // coordinator calls each group's `remove_skipped_blocks`): the first
    // group's blocks 3, 2, 1, 0, then the second's. A holds 6
    // full-attention blocks and 2 window blocks in each group: 10 of 22,
    // 8 cached, 4 plain.
    let groups = vec![group(CacheGroupKind::FullAttention, 16, None), cached_window(16, 17), cached_window(16, 17)];
    let mut pool = KvPool::new(groups, 22, true);
    let a_req = prefixed(0, &[1, 2, 3, 4, 5], 1);
    let mut a = Alloc::owned_by(0);
    let (p, t) = (&a_req.prefix, a_req.prompt);
    pool.pin_and_allocate(&mut a, p, t, 0, (Tokens::ZERO, Tokens::new(80)), false).unwrap();
    pool.register(&mut a, p, t, Tokens::new(80));
    pool.resize(&mut a, Tokens::new(80), Tokens::new(81), false).unwrap();
    pool.check().unwrap();
    assert_eq!(pool.group_used(), [6, 2, 2]);
    assert_eq!((pool.free_plain(), pool.cached_free()), (4, 8));
    // B: A's first four blocks and one more. Its full-attention hit is
    // floor(79 / 16) = 4 blocks (A pins them), and window block 3, before
    // that end, is cached in both groups: 4.
    let b = prefixed(1, &[1, 2, 3, 4, 9], 1);
    let hit = |pool: &KvPool| pool.cached_prefix(&b.prefix, b.prompt, 1, b.prompt);
    assert_eq!(hit(&pool), 4);
    // X, 32 tokens in one step (2 blocks in each group, 6), evicts two: the
    // first group's window blocks 3 and 2. Block 1 is the last cached in
    // both, so B hits 1 + 1 = 2. (Had one entry stood for a block in both
    // groups, the eviction would have taken block 3 of each, and B would
    // hit 3.)
    let mut x = Alloc::owned_by(2);
    pool.pin_and_allocate(&mut x, &PrefixIds::none(), Tokens::new(40), 0, (Tokens::ZERO, Tokens::new(32)), false)
        .unwrap();
    assert_eq!(pool.evicted_blocks(), 2);
    assert_eq!(hit(&pool), 2);
    assert_eq!((pool.free_plain(), pool.cached_free()), (0, 6));
    pool.check().unwrap();
}

#[test]
fn a_window_beside_a_mamba_state_frees_window_blocks_then_the_state_into_the_order() {
    // A (six named blocks) computes 0..32 and 32..96, then decodes 96..97.
    // That step frees the window blocks below its window, floor((96 − 33
    // + 1) / 16) = 4, last first, and then the state after 32, which it
    // no longer holds: all five into the eviction order, the window blocks
    // first (vLLM's `remove_skipped_blocks` goes group by group, the
    // window group before the Mamba one). A then holds full attention 7,
    // the window blocks 4, 5 and 6, and the states after 96 and 97: 12 of
    // 41 blocks, 24 plain.
    let mut pool = fa_window_state_pool(41);
    let a_req = prefixed(0, &[1, 2, 3, 4, 5, 6], 1);
    let mut a = Alloc::owned_by(0);
    let (p, t) = (&a_req.prefix, a_req.prompt);
    pool.pin_and_allocate(&mut a, p, t, 0, (Tokens::ZERO, Tokens::new(32)), false).unwrap();
    pool.register(&mut a, p, t, Tokens::new(32));
    pool.resize(&mut a, Tokens::new(32), Tokens::new(96), false).unwrap();
    pool.register(&mut a, p, t, Tokens::new(96));
    pool.check().unwrap();
    pool.resize(&mut a, Tokens::new(96), Tokens::new(97), false).unwrap();
    pool.check().unwrap();
    assert_eq!(pool.group_used(), [7, 3, 2]);
    assert_eq!((pool.free_plain(), pool.cached_free()), (24, 5));
    // B: the first two blocks and one more. Its hit: full attention
    // floor(47 / 16) = 2 blocks, window blocks 0 and 1 before that end,
    // the state after 32 at it: 2.
    let b = prefixed(1, &[1, 2, 9], 1);
    let hit = |pool: &KvPool| pool.cached_prefix(&b.prefix, b.prompt, 1, b.prompt);
    assert_eq!(hit(&pool), 2);
    // X, 192 tokens in one step (12 + 12 + 1 blocks), evicts one block:
    // window block 3, the head of the order, and B still hits 2 (had the
    // state gone first, B would hit none).
    let mut x = Alloc::owned_by(2);
    pool.pin_and_allocate(&mut x, &PrefixIds::none(), Tokens::new(200), 0, (Tokens::ZERO, Tokens::new(192)), false)
        .unwrap();
    assert_eq!(pool.evicted_blocks(), 1);
    assert_eq!(hit(&pool), 2);
    pool.check().unwrap();
}

/// A prefill's source release with a window beside a Mamba state (align
/// mode) frees the window blocks below the window and the earlier state,
/// counting the state group from its holding as it was before the window
/// moved. A (eight named blocks) computes 0..64 (the state at 64) and
/// 64..96 (its window, W = 33, then starts at block floor((64 − 33 + 1) /
/// 16) = 2: blocks 0 and 1 go into the eviction order). The release at 96
/// frees window blocks 2 and 3 (floor((96 − 33 + 1) / 16) = 4) and the
/// state at 64, all cached: the source keeps full attention 6, the window
/// blocks 4 and 5, the state at 96: 9 of 60, 5 cached, 46 plain. Its
/// release then caches all 14.
#[test]
fn a_source_release_beside_a_mamba_state_keeps_the_window_and_the_last_state() {
    let mut pool = fa_window_state_pool(60);
    let a_req = prefixed(0, &[1, 2, 3, 4, 5, 6, 7, 8], 1);
    let (p, t) = (&a_req.prefix, a_req.prompt);
    let mut a = Alloc::owned_by(0);
    pool.pin_and_allocate(&mut a, p, t, 0, (Tokens::ZERO, Tokens::new(64)), false).unwrap();
    pool.register(&mut a, p, t, Tokens::new(64));
    pool.resize(&mut a, Tokens::new(64), Tokens::new(96), false).unwrap();
    pool.register(&mut a, p, t, Tokens::new(96));
    pool.check().unwrap();
    pool.release_to_source(&mut a);
    pool.check().unwrap();
    assert_eq!(pool.group_used(), [6, 2, 1]);
    assert_eq!((pool.used(), pool.cached_free(), pool.free_plain()), (9, 5, 46));
    pool.release(&mut a, Tokens::new(96));
    pool.check().unwrap();
    assert_eq!((pool.used(), pool.cached_free(), pool.free_plain()), (0, 14, 46));
}
