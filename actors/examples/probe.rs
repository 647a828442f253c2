use actors::config::*;
use actors::model::ModelSpec;
use actors::sim::{self, Deployment, RunInput};
use actors::units::*;
use actors::workload::*;
use sim_core::SimTime;
fn main() {
    let role = |n| RoleSpec {
        count: 1,
        tp: 4,
        num_blocks: n,
        max_num_batched_tokens: 8192,
        max_num_seqs: 256,
        block_size_tokens: None,
        prefix_caching: true,
        vllm_version: None,
        step_time: StepTimeSpec::Linear {
            fixed_us: 6000.0,
            per_token_us: 40.0,
            per_seq_us: 0.0,
            per_context_token_us: 0.001,
        },
    };
    let spec = DeploymentSpec {
        vllm_version: None,
        prefill: Some(role(20000)),
        decode: Some(role(20000)),
        aggregated: None,
        link: LinkSpec { bandwidth_gb_s: 50.0, ..Default::default() },
        router: Default::default(),
        faults: Default::default(),
        timeline_interval_ms: 100.0,
        check_invariants: false,
    };
    let model = ModelSpec { name: None, kv_bytes_per_token: Some(Bytes::new(32768)), cache_groups: vec![] };
    let dep = Deployment::build(&model, &spec).unwrap();
    let r = RequestSpec {
        arrival: SimTime::ZERO,
        prompt: Tokens::new(1024),
        output: Tokens::new(128),
        prefix: PrefixIds::none(),
    };
    let mut best = f64::MAX;
    let iters: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(15);
    for _ in 0..iters {
        let t = std::time::Instant::now();
        let out = sim::run(
            &dep,
            RunInput {
                seed: 1,
                source: Box::new(std::iter::repeat_n(r.clone(), 10000)),
                arrivals: ArrivalMode::Closed { concurrency: 16 },
                max_requests: None,
                slo: SloSpec::default(),
                until: None,
            },
        )
        .unwrap();
        best = best.min(t.elapsed().as_secs_f64());
        std::hint::black_box(out.digest);
    }
    println!("best {:.2} ms = {:.0} req/s", best * 1e3, 10000.0 / best);
}
