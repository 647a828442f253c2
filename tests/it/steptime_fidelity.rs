//! The shipped Llama-3.1-8B/H200 scenarios against the data their step
//! times come from: every point of AIConfigurator's TP 1, 2 and 4 grids
//! (tests/fixtures/aic-llama-3.1-8b-h200/), priced by the scenario's own
//! model exactly as a run builds it, within 10 %; and the roofline alone
//! (the same scenario, `step_time = { kind = "roofline" }`, no fitted
//! number) within 20 %, 13 % on average.
//!
//! Error tables (|model − measured| / measured), as measured:
//!
//! ```text
//! scenario  model     region   points  mean    worst
//! tp1       table2d   prefill      30  0.33 %  1.42 %  (256 tokens on 768 cached)
//! tp1       table2d   decode      160  0.00 %  0.00 %  (every point a grid node)
//! tp2       table2d   prefill      30  0.15 %  2.55 %  (256 on 768 cached)
//! tp2       table2d   decode      160  0.00 %  0.00 %
//! tp4       table2d   prefill      30  0.22 %  2.72 %  (256 on 768 cached: faster than 256 on nothing)
//! tp4       table2d   decode      160  0.00 %  0.00 %
//! tp1       roofline  prefill      30  4.16 % 13.51 %  (128 tokens)
//! tp1       roofline  decode      160  4.49 % 17.14 %  (160 sequences at 512)
//! tp2       roofline  prefill      30  6.11 % 11.34 %  (256 tokens)
//! tp2       roofline  decode      160  3.22 % 14.99 %  (192 sequences at 512)
//! tp4       roofline  prefill      30  12.22 % 16.40 % (256 tokens)
//! tp4       roofline  decode      160  5.52 % 19.38 %  (160 sequences at 512)
//! ```
//!
//! The roofline's defaults are derived from three points of these grids
//! (one-sequence decode at TP 1 and 4, one-token prefill at TP 1; see
//! `RooflineParams`), not fitted to them; before its per-layer costs,
//! separate weight and KV efficiencies and the all-reduce's α–β defaults
//! it gave 6.2 / 22.3, 7.9 / 21.7, 10.2 / 21.3 and 5.2 / 16.3 %, with an
//! overhead of 1 ms a step that made up for the missing layer costs on
//! this 32-layer model only; with the TP 4 grid's whole excess over TP 1
//! read as all-reduce latency (16.75 µs, so weights at 0.68 and 7.25 µs a
//! layer) 4.8 / 22.3, 4.8 / 21.5, 7.4 / 16.0, 5.4 / 15.7, 13.9 / 22.1
//! and 6.0 / 23.6 %.

use actors::config::StepTimeSpec;
use actors::model::Role;
use actors::sim::Deployment;
use pdsim::calibrate::{self, Region};
use pdsim::scenario;

use crate::common::{fixture, scenario_file};

/// The points of the fixture grids at `tp`.
fn points(tp: u32) -> Vec<calibrate::Point> {
    let mut all = Vec::new();
    for kind in ["prefill", "decode"] {
        let path = fixture(&format!("aic-llama-3.1-8b-h200/aic_{kind}_tp{tp}.csv"));
        all.extend(calibrate::read_points(&path).unwrap());
    }
    assert_eq!(all.len(), 190, "30 prefill and 160 decode points");
    all
}

/// The worst error by region of the scenario's aggregated model (or the
/// roofline in its place), printed as a table.
fn worst(tp: u32, roofline: bool) -> Vec<(Region, f64, f64)> {
    let s = scenario::load(scenario_file(&format!("llama-3.1-8b-h200-tp{tp}.toml"))).unwrap();
    let mut spec = s.deployment().clone();
    if roofline {
        spec.aggregated.as_mut().unwrap().step_time =
            toml::from_str::<toml::Table>("kind = \"roofline\"").unwrap().try_into::<StepTimeSpec>().unwrap();
    }
    let dep = Deployment::build(s.model_spec(), &spec).unwrap();
    let model = dep.step_time_for(Role::Aggregated).unwrap();
    let fits = calibrate::fit_errors(model.as_ref(), &points(tp));
    println!("tp{tp} {}:\n{}", if roofline { "roofline" } else { "table2d" }, calibrate::error_table(&fits));
    fits.iter().filter(|f| f.steps > 0).map(|f| (f.region, f.mean_error, f.worst_error)).collect()
}

#[test]
fn the_shipped_h200_scenarios_price_every_measured_point_within_10_percent() {
    for tp in [1, 2, 4] {
        let fits = worst(tp, false);
        assert_eq!(fits.len(), 2, "prefill and decode points");
        // The issue's bar is 10 %; the tables do far better, and a change
        // that loses that should fail here: 1.42 % / 2.55 % / 2.72 % worst
        // (above).
        for (region, mean, worst) in fits {
            assert!(worst <= 0.03, "tp{tp} {region:?}: worst {:.2} %", worst * 100.0);
            assert!(mean <= 0.005, "tp{tp} {region:?}: mean {:.2} %", mean * 100.0);
        }
    }
}

#[test]
fn the_roofline_alone_prices_every_measured_point_within_20_percent() {
    for tp in [1, 2, 4] {
        for (region, mean, worst) in worst(tp, true) {
            assert!(worst <= 0.20, "tp{tp} {region:?}: worst {:.2} %", worst * 100.0);
            assert!(mean <= 0.13, "tp{tp} {region:?}: mean {:.2} %", mean * 100.0);
        }
    }
}

/// A table predicts what it was not fitted on: the TP 1 grid without some
/// of its points (three single-prompt lengths of the prefill table, four
/// batch sizes and two contexts of the decode grid), fitted, then asked
/// for the points left out, which it interpolates.
///
/// Measured (|model − measured| / measured over the 3 + 64 held-out
/// points): prefill mean 2.17 %, worst 2.52 % (384 tokens, between 256
/// and 512: the table is linear in tokens, the kernels are not); decode
/// mean 0.68 %, worst 2.59 % (4 sequences at 2,048, between 1,152 and
/// 4,096).
#[test]
fn a_calibrated_table_interpolates_points_it_was_not_given() {
    let all = points(1);
    let held_out = |p: &calibrate::Point| {
        let r = &p.row;
        ["batch=1 isl=384 ", "batch=1 isl=640 ", "batch=1 isl=1536 "].iter().any(|h| r.starts_with(h))
            || ["batch=12 ", "batch=56 ", "batch=112 ", "batch=192 "]
                .iter()
                .any(|h| r.starts_with(h) && r.contains("context="))
            || r.ends_with("context=1056")
            || r.ends_with("context=2048")
    };
    let (test, train): (Vec<_>, Vec<_>) = all.into_iter().partition(held_out);
    // 3 prefill; decode: 4 batches × 8 contexts + 2 contexts × 20 batches − the 4 × 2 in both.
    assert_eq!(test.len(), 3 + 4 * 8 + 2 * 20 - 4 * 2);
    let spec = calibrate::fit(calibrate::Kind::Table2d, &train).unwrap();
    let model = actors::steptime::build(&spec, None).unwrap();
    let fits = calibrate::fit_errors(model.as_ref(), &test);
    println!("held out:\n{}", calibrate::error_table(&fits));
    for f in fits.iter().filter(|f| f.steps > 0) {
        let bound = 0.035;
        assert!(f.worst_error <= bound, "{:?}: worst {:.2} %", f.region, f.worst_error * 100.0);
    }
}
