//! `pdsim::columns` (the Python package's data frames) against the files
//! `pdsim run` writes for the same run: cell for cell, a time being the
//! double nearest to the file's six-decimal text.

use std::sync::atomic::AtomicBool;

use pdsim::columns::{self, Table, Values};
use pdsim::report::{csv_field, write_requests_csv, write_timeline_csv};
use pdsim::runner::simulate;
use pdsim::scenario;

use crate::common::{parse_csv, scenario_file};

/// Checks every cell of `table` against the CSV `text` (header included).
fn same_as_csv(table: &Table, text: &str) {
    let rows = parse_csv(text);
    let names: Vec<&str> = table.columns.iter().map(|(n, _)| *n).collect();
    assert_eq!(rows[0], names, "the file's header");
    assert_eq!(rows.len() - 1, table.rows(), "one row per file line");
    for (c, (name, values)) in table.columns.iter().enumerate() {
        for (r, row) in rows[1..].iter().enumerate() {
            let cell = row[c].as_str();
            let ok = match values {
                Values::Int(v) => cell == v[r].to_string(),
                // Rust's parse is correctly rounded, so this is the double
                // nearest to the text, which ns / 10^6 is too.
                Values::Float(v) => {
                    if cell.is_empty() {
                        v[r].is_nan()
                    } else {
                        cell.parse::<f64>().unwrap() == v[r]
                    }
                }
                Values::Category { codes, categories } => match usize::try_from(codes[r]) {
                    Ok(i) => csv_field(&categories[i]) == cell || categories[i] == cell,
                    Err(_) => cell.is_empty(),
                },
            };
            assert!(ok, "row {r} column {name}: file {cell:?}, columns {values:?}", values = pick(values, r));
        }
    }
}

fn pick(values: &Values, r: usize) -> String {
    match values {
        Values::Int(v) => v[r].to_string(),
        Values::Float(v) => v[r].to_string(),
        Values::Category { codes, categories } => {
            usize::try_from(codes[r]).map_or_else(|_| "(empty)".into(), |i| categories[i].clone())
        }
    }
}

/// The 2P1D pressure scenario waits, preempts and (with aborts turned on)
/// fails requests, so every kind of cell appears: empty stages, failure
/// reasons, both ranks.
#[test]
fn requests_and_timeline_columns_are_the_files_cells() {
    let base = scenario::load(scenario_file("glm-5.3-flash-2p1d-pressure.toml")).unwrap();
    let s = base.with_overrides(&[("faults.decode_abort_probability", toml::Value::Float(0.2))]).unwrap();
    let run = simulate(&s, 3, Some(300), |_| {}, &AtomicBool::new(false)).unwrap();
    let out = &run.output;
    assert!(out.summary.failed > 0 && out.summary.completed > 0, "both outcomes appear");
    let mut text = Vec::new();
    write_requests_csv(&mut text, &out.records, true).unwrap();
    let table = columns::requests(&out.records, true);
    assert_eq!(table.rows(), 300);
    same_as_csv(&table, std::str::from_utf8(&text).unwrap());
    let mut text = Vec::new();
    write_timeline_csv(&mut text, &out.ranks, &out.links).unwrap();
    let table = columns::timeline(&out.ranks, &out.links);
    assert!(table.rows() > 1000);
    same_as_csv(&table, std::str::from_utf8(&text).unwrap());
}

/// An aggregated run (two ranks) names its ranks `aggregated<k>` and has
/// no decode rank.
#[test]
fn aggregated_columns_name_their_ranks() {
    let s = scenario::load(scenario_file("llama-3.1-8b-aggregated.toml")).unwrap();
    let run = simulate(&s, 1, Some(50), |_| {}, &AtomicBool::new(false)).unwrap();
    let mut text = Vec::new();
    write_requests_csv(&mut text, &run.output.records, false).unwrap();
    let table = columns::requests(&run.output.records, false);
    same_as_csv(&table, std::str::from_utf8(&text).unwrap());
    let col = |name: &str| &table.columns.iter().find(|(n, _)| *n == name).unwrap().1;
    let Values::Category { codes, categories } = col("prefill_rank") else { panic!("a category") };
    assert_eq!(categories, &["aggregated0".to_owned(), "aggregated1".to_owned()]);
    assert!(codes.iter().all(|&c| c == 0 || c == 1));
    let Values::Category { codes, .. } = col("decode_rank") else { panic!("a category") };
    assert!(codes.iter().all(|&c| c == -1));
}
