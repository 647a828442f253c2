//! The outputs of every shipped scenario, pinned.
//!
//! Each shipped scenario is run as `pdsim run scenarios/<file>` runs it (its
//! own seed and request count, the same label), and the bytes of its
//! `report.json`, `requests.csv` and `timeline.csv` are hashed (FNV-1a, 64
//! bits), and so is one scenario's report.html. A change of any number in
//! them fails a test here, so a change of behaviour shows up as a deliberate update of the table below, in a
//! commit that says which rule changed it; a refactoring leaves it alone.
//!
//! To re-derive a row by hand: `pdsim run scenarios/<file> --out DIR`, then
//! FNV-1a-64 (offset 0xcbf29ce484222325, prime 0x100000001b3) of each file.

use std::sync::atomic::AtomicBool;

use pdsim::{report, runner, scenario};

use crate::common::scenario_file;

/// (file, report.json, requests.csv, timeline.csv).
const PINNED: [(&str, u64, u64, u64); 13] = [
    ("default.toml", 0x8943_c9bc_caa3_3e03, 0x7260_4cd0_6a46_b307, 0xbc28_e9ea_4003_8c9c),
    ("glm-5.3-flash-1p1d.toml", 0x6e51_bfc6_75fc_a07a, 0x743c_87e5_82c1_fc68, 0x41a9_5e24_a3a2_50ae),
    ("glm-5.3-flash-2p1d-pressure.toml", 0x7fba_1533_2a5c_1de2, 0xdb1b_e3f8_b15b_a028, 0x89d7_d6e3_d047_5555),
    ("glm-5.3-flash-2p2d.toml", 0xdbaa_168f_a3f7_27af, 0xadce_024c_5065_0d42, 0x5d29_dad3_bc91_b32a),
    ("glm-5.3-flash-p4d8.toml", 0xe00d_f764_d80a_57d6, 0x827c_9d11_c44f_8983, 0xe718_902a_74b1_4bed),
    ("gpt-oss-1p1d.toml", 0x0940_1dbe_2dbd_3d2a, 0x2b97_7cab_a649_59b8, 0x9232_21e5_51fd_4037),
    ("llama-3.1-8b-1p1d.toml", 0x15fd_3ab5_1f21_f550, 0x70ee_a82b_c972_a311, 0xa350_2157_b663_9e94),
    ("llama-3.1-8b-aggregated.toml", 0x2016_36b7_9957_c489, 0x4e64_de52_3cb5_c74f, 0x5496_cc58_909c_08d6),
    ("llama-3.1-8b-h200-tp1.toml", 0xd56a_e364_d632_3aab, 0x4c30_9225_8992_b3ab, 0x6b6c_ada6_f24b_7c42),
    ("llama-3.1-8b-h200-tp2.toml", 0x08a3_8e7e_3ca0_deb1, 0x7e3b_1f8c_ec63_78d5, 0x3674_c107_64ac_3441),
    ("llama-3.1-8b-h200-tp4.toml", 0xa71a_e9fc_58ba_8f9d, 0x60e0_eedb_8d60_92b9, 0x7d28_8d03_8c8d_9e1a),
    ("llama-3.1-8b-mooncake.toml", 0xf3d9_a3d1_a51b_e9e6, 0x842e_9d05_365a_543d, 0x8783_01cb_b863_1acf),
    ("mamba2-hybrid-1p1d.toml", 0xc561_886e_e5a5_6cff, 0x8af8_487e_d16a_982b, 0xc6a8_d831_9aeb_5756),
];

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

#[test]
fn shipped_scenarios_give_their_pinned_outputs() {
    let mut wrong = Vec::new();
    for (file, want_report, want_requests, want_timeline) in PINNED {
        let s = scenario::load(scenario_file(file)).unwrap();
        let label = format!("scenarios/{file}");
        let run = runner::simulate(&s, s.seed(), None, |_| {}, &AtomicBool::new(false)).unwrap();
        assert_eq!(run.output.violations, Vec::<String>::new(), "{file}");
        let disaggregated = s.deployment().prefill.is_some();
        let (mut rep, mut req, mut tl) = (Vec::new(), Vec::new(), Vec::new());
        report::write_report(&mut rep, &report::report(&s, &label, &run)).unwrap();
        report::write_requests_csv(&mut req, &run.output.records, disaggregated).unwrap();
        report::write_timeline_csv(&mut tl, &run.output.ranks, &run.output.links).unwrap();
        let got = (fnv1a(&rep), fnv1a(&req), fnv1a(&tl));
        if got != (want_report, want_requests, want_timeline) {
            wrong.push(format!("(\"{file}\", {:#018x}, {:#018x}, {:#018x})", got.0, got.1, got.2));
        }
    }
    assert!(wrong.is_empty(), "outputs changed; if on purpose, the new rows are:\n{}", wrong.join("\n"));
}

/// The same runs as `pdsim run --no-trace --no-timeline` makes them: the
/// records streamed to requests.csv as requests end (through the reorder
/// buffer, in id order), no record and no timeline sample kept, the summary
/// from the compact columns. report.json and requests.csv are the pinned
/// bytes all the same.
#[test]
fn streamed_runs_without_timelines_give_the_pinned_report_and_requests() {
    use std::cell::RefCell;
    use std::rc::Rc;
    let mut wrong = Vec::new();
    for (file, want_report, want_requests, _) in PINNED {
        let s = scenario::load(scenario_file(file)).unwrap();
        let label = format!("scenarios/{file}");
        let disaggregated = s.deployment().prefill.is_some();
        let req = Rc::new(RefCell::new(Vec::new()));
        let mut rows = report::RequestRows::new(disaggregated);
        req.borrow_mut().extend_from_slice(rows.header());
        let sink = Rc::clone(&req);
        let keep = runner::Keep {
            timelines: false,
            record_sink: Some(Box::new(move |r| sink.borrow_mut().extend_from_slice(rows.row(r)))),
            sample_sink: None,
            ..runner::Keep::default()
        };
        let run = runner::simulate_with(&s, s.seed(), None, |_| {}, &AtomicBool::new(false), keep).unwrap();
        assert_eq!(run.output.violations, Vec::<String>::new(), "{file}");
        assert!(run.output.records.is_empty(), "{file}: records streamed, not kept");
        assert!(run.output.ranks.iter().all(|r| r.timeline.samples.is_empty()), "{file}");
        assert!(run.output.links.iter().all(|l| l.timeline.samples.is_empty()), "{file}");
        let mut rep = Vec::new();
        report::write_report(&mut rep, &report::report(&s, &label, &run)).unwrap();
        let got = (fnv1a(&rep), fnv1a(&req.borrow()));
        if got != (want_report, want_requests) {
            wrong.push(format!("{file}: {:#018x}, {:#018x}", got.0, got.1));
        }
    }
    assert!(wrong.is_empty(), "streamed outputs differ from the pinned ones:\n{}", wrong.join("\n"));
}

/// As `pdsim run --no-trace` makes timeline.csv: the samples streamed out
/// of the run in slices, none kept in the reports; the pinned bytes.
#[test]
fn streamed_timelines_give_the_pinned_timeline() {
    use std::cell::RefCell;
    use std::rc::Rc;
    let mut wrong = Vec::new();
    for (file, want_report, _, want_timeline) in PINNED {
        let s = scenario::load(scenario_file(file)).unwrap();
        let label = format!("scenarios/{file}");
        let tl = Rc::new(RefCell::new(report::TimelineRows::HEADER.to_vec()));
        let out = Rc::clone(&tl);
        let keep = runner::Keep {
            timelines: true,
            record_sink: None,
            sample_sink: Some(Box::new(move |entities| {
                let mut rows = report::TimelineRows::new(entities);
                Box::new(move |samples| {
                    let mut buf = out.borrow_mut();
                    for x in samples {
                        rows.push(&mut buf, x);
                    }
                })
            })),
            ..runner::Keep::default()
        };
        let run = runner::simulate_with(&s, s.seed(), None, |_| {}, &AtomicBool::new(false), keep).unwrap();
        assert_eq!(run.output.violations, Vec::<String>::new(), "{file}");
        assert!(run.output.ranks.iter().all(|r| r.timeline.samples.is_empty()), "{file}");
        let mut rep = Vec::new();
        report::write_report(&mut rep, &report::report(&s, &label, &run)).unwrap();
        let got = (fnv1a(&rep), fnv1a(&tl.borrow()));
        if got != (want_report, want_timeline) {
            wrong.push(format!("{file}: {:#018x}, {:#018x}", got.0, got.1));
        }
    }
    assert!(wrong.is_empty(), "streamed timelines differ from the pinned ones:\n{}", wrong.join("\n"));
}

/// report.html of a shipped scenario, as `pdsim run --html` writes it: the
/// page is a function of the run's files alone (no path, no time stamp;
/// logarithms and powers from libm), so its bytes are pinned too, and a
/// change of layout or of float formatting shows up here. The run is
/// `mamba2-hybrid-1p1d.toml` at 300 requests: every chart kind, links
/// and cache groups included, at a size debug builds run quickly.
#[test]
fn a_shipped_scenarios_page_gives_its_pinned_bytes() {
    use crate::common::{outcome, pdsim_in, scratch_dir};
    const PINNED_PAGE: u64 = 0xad9b_ce87_9eae_82ca;
    let dir = scratch_dir("pinned-page");
    // From the package root, by a relative path: the page names the
    // scenario as the command line did, and a clone may live anywhere.
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let file = "scenarios/mamba2-hybrid-1p1d.toml";
    let args = ["run", file, "--requests", "300", "--html", "--no-trace", "-q", "--out", dir.to_str().unwrap()];
    let (code, _, stderr) = outcome(&pdsim_in(root, &args));
    assert_eq!(code, 0, "{stderr}");
    let page = std::fs::read(dir.join("report.html")).unwrap();
    assert_eq!(fnv1a(&page), PINNED_PAGE, "report.html changed; if on purpose, pin {:#018x}", fnv1a(&page));
}

/// The end-to-end benchmark's cases, from `benches/common/mod.rs`.
#[path = "../../benches/common/mod.rs"]
mod e2e;

/// The end-to-end benchmark's cases as scenario files
/// (`benches/scenarios/e2e-*.toml`) are the benchmark's model and
/// deployment field for field, and run as `pdsim run` runs them they make
/// the runs the benchmark makes through the library: the same digest
/// (every request's outcome, counts and times) and the same summary counts.
/// So the command line can be timed at 10⁶ requests of the cases the
/// benchmark times at 10⁴.
#[test]
fn end_to_end_scenario_files_are_the_benchmark_runs() {
    use actors::sim::{self, Deployment};
    let files = ["e2e-llama-aggregated.toml", "e2e-llama-1p1d.toml", "e2e-glm-1p1d.toml"];
    for ((name, model, spec), file) in e2e::cases().into_iter().zip(files) {
        let dep = Deployment::build(&model, &spec).unwrap();
        let lib = sim::run(&dep, e2e::workload()).unwrap();
        let s = scenario::load(crate::common::root().join("benches/scenarios").join(file)).unwrap();
        // Field for field (settings this workload cannot show, such as
        // prefix caching without prefix ids, included)...
        assert_eq!(s.model_spec(), &model, "{file}");
        assert_eq!(s.deployment(), &spec, "{file}");
        // ... and as runs.
        let run = runner::simulate(&s, s.seed(), None, |_| {}, &AtomicBool::new(false)).unwrap();
        assert_eq!(run.output.violations, Vec::<String>::new(), "{file}");
        assert_eq!(run.output.summary.completed, e2e::REQUESTS, "{file}");
        assert_eq!(run.output.summary.requests, lib.summary.requests, "{file}");
        assert_eq!(run.output.digest, lib.digest, "{file} is not the benchmark's {name}");
    }
}
