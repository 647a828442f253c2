//! The outputs of every shipped scenario, pinned.
//!
//! Each shipped scenario is run as `pdsim run scenarios/<file>` runs it (its
//! own seed and request count, the same label), and the bytes of its
//! `report.json`, `requests.csv` and `timeline.csv` are hashed (FNV-1a, 64
//! bits). A change of any number in them fails this test, so a change of
//! behaviour shows up as a deliberate update of the table below, in a
//! commit that says which rule changed it; a refactoring leaves it alone.
//!
//! To re-derive a row by hand: `pdsim run scenarios/<file> --out DIR`, then
//! FNV-1a-64 (offset 0xcbf29ce484222325, prime 0x100000001b3) of each file.

use std::sync::atomic::AtomicBool;

use pdsim::{report, runner, scenario};

use crate::common::scenario_file;

/// (file, report.json, requests.csv, timeline.csv).
const PINNED: [(&str, u64, u64, u64); 11] = [
    ("default.toml", 0x02b9_988e_57b4_7958, 0x21f6_8370_4d3c_25a9, 0x7adf_a445_ae61_39c9),
    ("glm-5.3-flash-1p1d.toml", 0x7809_b146_0f4b_c635, 0x17be_0ffd_61ee_0bbc, 0x2c9e_5c9a_47a2_2b7c),
    ("glm-5.3-flash-2p1d-pressure.toml", 0x7d2f_3153_b7a5_eaf8, 0x38ad_f5bb_71e5_1e11, 0x7e07_a87c_c0b7_444d),
    ("glm-5.3-flash-2p2d.toml", 0x58a8_3aef_32df_c0e8, 0x6808_499a_7236_30cf, 0x0b08_715f_6c54_42f3),
    ("glm-5.3-flash-p4d8.toml", 0x7565_3823_b8a4_1248, 0xcbac_954e_2772_3d69, 0x3bad_3415_a437_f897),
    ("gpt-oss-1p1d.toml", 0x9260_b4eb_336f_a624, 0x5c74_d7c6_8f01_617a, 0x426c_db95_5434_514a),
    ("llama-3.1-8b-1p1d.toml", 0x992a_3bbf_3245_c8be, 0x1d29_5e94_fcc3_1516, 0x0b0c_705b_4477_da63),
    ("llama-3.1-8b-aggregated.toml", 0xfb45_7b67_4329_49cc, 0x82da_4816_8d2f_a3fa, 0x5287_75e5_1149_3a84),
    ("llama-3.1-8b-h200-tp1.toml", 0x5eec_e632_d2c5_5f35, 0xe143_0827_41a4_55e9, 0xa3d2_21d1_ef7c_07b4),
    ("llama-3.1-8b-h200-tp4.toml", 0x7ab0_c69d_a18e_b773, 0xdf38_2258_9bbf_62db, 0x3c70_905f_8dd2_8ce4),
    ("mamba2-hybrid-1p1d.toml", 0xaf09_930b_d43c_8678, 0x9fbe_6291_5b58_bb32, 0x64ea_4c2f_a41e_9348),
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
