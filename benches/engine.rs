//! Engine throughput in events per second, each beside a bare
//! `BinaryHeap` of (time, seq) keys doing the same pushes and pops.
//!
//! `cargo bench -p pdsim --bench engine`
//!
//! - ping_pong: two actors bounce one message; one event pending.
//! - hold/N: 64 actors and N pending events; each delivered event schedules
//!   one new event at a uniform random delay drawn from the actor's stream
//!   (the baseline draws the same way from one stream).

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use sim_core::{Actor, ActorId, Context, SimDuration, SimTime, Simulation};

/// Events delivered per benchmark iteration.
const EVENTS: u64 = 100_000;
/// Mean delay of the hold model, in nanoseconds.
const MEAN_DELAY_NS: u64 = 1_000;

struct Pong {
    peer: Option<ActorId>,
}

impl Actor<u64> for Pong {
    fn handle(&mut self, n: u64, ctx: &mut Context<'_, u64>) {
        let peer = self.peer.expect("wired");
        ctx.send_after(SimDuration::from_nanos(1), peer, n + 1).expect("peer exists");
    }
}

struct Hold;

impl Actor<u64> for Hold {
    fn handle(&mut self, n: u64, ctx: &mut Context<'_, u64>) {
        let delay = ctx.rng().random_range(1..2 * MEAN_DELAY_NS);
        ctx.schedule(SimDuration::from_nanos(delay), n + 1);
    }
}

fn ping_pong(c: &mut Criterion) {
    let mut g = c.benchmark_group("ping_pong");
    g.throughput(Throughput::Elements(EVENTS));

    let mut sim = Simulation::new(1);
    let a = sim.add_actor("a", Pong { peer: None }).unwrap();
    let b = sim.add_actor("b", Pong { peer: Some(a) }).unwrap();
    sim.actor_mut::<Pong>(a).unwrap().peer = Some(b);
    sim.schedule(SimTime::ZERO, a, 0).unwrap();
    g.bench_function("engine", |bench| {
        bench.iter(|| {
            for _ in 0..EVENTS {
                sim.step();
            }
        })
    });

    let mut heap = BinaryHeap::new();
    let (mut now, mut seq) = (0u64, 0u64);
    heap.push(Reverse((now, seq)));
    g.bench_function("bare_heap", |bench| {
        bench.iter(|| {
            for _ in 0..EVENTS {
                let Reverse((t, _)) = heap.pop().unwrap();
                now = black_box(t);
                seq += 1;
                heap.push(Reverse((now + 1, seq)));
            }
        })
    });
    g.finish();
}

fn hold(c: &mut Criterion) {
    let mut g = c.benchmark_group("hold");
    g.throughput(Throughput::Elements(EVENTS));
    for pending in [1_000u64, 100_000] {
        let mut sim = Simulation::new(1);
        let ids: Vec<ActorId> = (0..64).map(|i| sim.add_actor(&format!("hold{i}"), Hold).unwrap()).collect();
        let mut init = ChaCha8Rng::seed_from_u64(2);
        for i in 0..pending {
            let at = SimTime::from_nanos(init.random_range(0..2 * MEAN_DELAY_NS));
            sim.schedule(at, ids[(i % 64) as usize], 0).unwrap();
        }
        g.bench_with_input(BenchmarkId::new("engine", pending), &pending, |bench, _| {
            bench.iter(|| {
                for _ in 0..EVENTS {
                    sim.step();
                }
            })
        });

        let mut heap = BinaryHeap::with_capacity(pending as usize);
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let mut seq = 0u64;
        for _ in 0..pending {
            seq += 1;
            heap.push(Reverse((init.random_range(0..2 * MEAN_DELAY_NS), seq)));
        }
        g.bench_with_input(BenchmarkId::new("bare_heap", pending), &pending, |bench, _| {
            bench.iter(|| {
                for _ in 0..EVENTS {
                    let Reverse((t, _)) = heap.pop().unwrap();
                    let delay = rng.random_range(1..2 * MEAN_DELAY_NS);
                    seq += 1;
                    heap.push(Reverse((black_box(t) + delay, seq)));
                }
            })
        });
    }
    g.finish();
}

criterion_group!(benches, ping_pong, hold);
criterion_main!(benches);
