//! `requests.csv` and `timeline.csv` as typed columns, for data frames
//! (the Python package's `Result.requests` and `Result.timeline`).
//!
//! The columns have the files' names, in the files' order, and their
//! units: counts are integers, times are milliseconds as `f64` (the exact
//! nanoseconds divided by 10^6, which is the double nearest to the file's
//! six-decimal text, since the division is correctly rounded), a cell the
//! file leaves empty is `NaN` (a time) or code `-1` (a category). Text
//! cells (outcome, failure reason, rank, entity, metric) are categories:
//! one code per row into a list of distinct values in order of first
//! appearance. Rows are in the files' order.

use std::collections::BTreeMap;

use actors::model::Role;
use actors::request::{Outcome, Request};
use actors::sim::{LinkReport, RankReport};
use sim_core::SimTime;

use crate::report::{REQUEST_COLUMNS, metric_name, outcome_name};

/// One column's values.
#[derive(Clone, Debug, PartialEq)]
pub enum Values {
    /// Counts (never empty).
    Int(Vec<i64>),
    /// Milliseconds; `NaN` where the file's cell is empty.
    Float(Vec<f64>),
    /// Text as categories: per row an index into `categories`, `-1` where
    /// the file's cell is empty.
    Category {
        /// Per row, the index of its value.
        codes: Vec<i32>,
        /// The distinct values, in order of first appearance.
        categories: Vec<String>,
    },
}

/// Named columns of equal length.
#[derive(Clone, Debug, PartialEq)]
pub struct Table {
    /// `(name, values)` in the file's column order.
    pub columns: Vec<(&'static str, Values)>,
}

impl Table {
    /// The number of rows.
    pub fn rows(&self) -> usize {
        self.columns.first().map_or(0, |(_, v)| match v {
            Values::Int(x) => x.len(),
            Values::Float(x) => x.len(),
            Values::Category { codes, .. } => codes.len(),
        })
    }
}

/// Builds a category column a row at a time.
#[derive(Default)]
struct Categories {
    codes: Vec<i32>,
    categories: Vec<String>,
    index: BTreeMap<String, i32>,
}

impl Categories {
    fn with_capacity(n: usize) -> Self {
        Categories { codes: Vec::with_capacity(n), ..Categories::default() }
    }

    fn push(&mut self, value: Option<&str>) {
        let code = match value {
            None => -1,
            Some(v) => match self.index.get(v) {
                Some(&c) => c,
                None => {
                    let c = i32::try_from(self.categories.len()).expect("fewer than 2^31 distinct values");
                    self.categories.push(v.to_owned());
                    self.index.insert(v.to_owned(), c);
                    c
                }
            },
        };
        self.codes.push(code);
    }

    fn done(self) -> Values {
        Values::Category { codes: self.codes, categories: self.categories }
    }
}

/// A count as `i64` (every count pdsim keeps is far below 2^63: tokens
/// below 2^32 a request, bytes of a run's transfers).
fn int(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// `ns` nanoseconds as milliseconds.
fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

/// `requests.csv` of these records (in id order, as a run keeps them) as
/// columns: [`REQUEST_COLUMNS`], each cell the value of the file's.
pub fn requests(records: &[Request], disaggregated: bool) -> Table {
    let n = records.len();
    let first_role = if disaggregated { Role::Prefill } else { Role::Aggregated };
    let mut outcome = Categories::with_capacity(n);
    let mut reason = Categories::with_capacity(n);
    let mut prefill_rank = Categories::with_capacity(n);
    let mut decode_rank = Categories::with_capacity(n);
    // id, prompt, output, generated, then transferred tokens, transfer
    // bytes, the two hits and preemptions.
    let mut ints: [Vec<i64>; 9] = std::array::from_fn(|_| Vec::with_capacity(n));
    // The 12 stamps, then the 9 spans.
    let mut floats: [Vec<f64>; 21] = std::array::from_fn(|_| Vec::with_capacity(n));
    let mut rank_names: [Vec<String>; 2] = Default::default();
    for r in records {
        let s = &r.t;
        outcome.push(Some(outcome_name(&r.outcome)));
        match r.outcome {
            Outcome::Failed(why) => reason.push(Some(&why.to_string())),
            _ => reason.push(Some(crate::report::NO_FAILURE)),
        }
        for (k, (cats, role, index)) in
            [(&mut prefill_rank, first_role, r.prefill_rank), (&mut decode_rank, Role::Decode, r.decode_rank)]
                .into_iter()
                .enumerate()
        {
            let names = &mut rank_names[k];
            let name = index.map(|i| {
                let i = i as usize;
                while names.len() <= i {
                    names.push(format!("{}{}", role.as_str(), names.len()));
                }
                names[i].as_str()
            });
            cats.push(name);
        }
        let counts = [
            r.id,
            r.prompt.get(),
            r.output.get(),
            r.generated.get(),
            r.transferred_tokens.get(),
            r.transfer_bytes.get(),
            r.prefill_hit.get(),
            r.decode_hit.get(),
            u64::from(r.preemptions),
        ];
        for (col, v) in ints.iter_mut().zip(counts) {
            col.push(int(v));
        }
        let spans = crate::report::derived_spans(r);
        let stamps = s.in_order().map(|t| t.map(SimTime::as_nanos));
        let times = stamps.into_iter().chain(spans.into_iter().map(|d| d.map(|d| d.as_nanos())));
        for (col, t) in floats.iter_mut().zip(times) {
            col.push(t.map_or(f64::NAN, ms));
        }
    }
    let [id, prompt, output, generated, transferred, bytes, prefill_hit, decode_hit, preemptions] = ints;
    let mut values: Vec<Values> = vec![
        Values::Int(id),
        outcome.done(),
        reason.done(),
        Values::Int(prompt),
        Values::Int(output),
        Values::Int(generated),
        prefill_rank.done(),
        decode_rank.done(),
    ];
    values.extend([transferred, bytes, prefill_hit, decode_hit, preemptions].map(Values::Int));
    values.extend(floats.into_iter().map(Values::Float));
    values.push(Values::Int(records.iter().map(|r| i64::from(r.priority)).collect()));
    debug_assert_eq!(values.len(), REQUEST_COLUMNS.len());
    Table { columns: REQUEST_COLUMNS.iter().copied().zip(values).collect() }
}

/// The columns of `timeline.csv`.
pub const TIMELINE_COLUMNS: [&str; 4] = ["time_ms", "entity", "metric", "value"];

/// `timeline.csv` of these ranks and links as columns
/// ([`TIMELINE_COLUMNS`]), rows in the file's order: by time, then entity
/// (ranks in report order, then links), then the order the entity
/// recorded them.
pub fn timeline(ranks: &[RankReport], links: &[LinkReport]) -> Table {
    let entities: Vec<(&str, &[String], &actors::metrics::Timeline)> = ranks
        .iter()
        .map(|r| (r.name.as_str(), r.groups.as_slice(), &r.timeline))
        .chain(links.iter().map(|l| (l.name.as_str(), &[][..], &l.timeline)))
        .collect();
    let mut rows: Vec<(u64, usize, usize)> = Vec::new();
    for (e, (_, _, tl)) in entities.iter().enumerate() {
        rows.extend(tl.samples.iter().enumerate().map(|(i, s)| (s.time.as_nanos(), e, i)));
    }
    rows.sort_unstable();
    let n = rows.len();
    let mut time = Vec::with_capacity(n);
    let mut entity = Categories::with_capacity(n);
    let mut metric = Categories::with_capacity(n);
    let mut value = Vec::with_capacity(n);
    let mut names: BTreeMap<(usize, actors::metrics::Metric), String> = BTreeMap::new();
    for (t, e, i) in rows {
        let (name, groups, tl) = entities[e];
        let s = &tl.samples[i];
        time.push(ms(t));
        entity.push(Some(name));
        let m = names.entry((e, s.metric)).or_insert_with(|| metric_name(s.metric, groups));
        metric.push(Some(m));
        value.push(int(s.value));
    }
    let values = [Values::Float(time), entity.done(), metric.done(), Values::Int(value)];
    Table { columns: TIMELINE_COLUMNS.into_iter().zip(values).collect() }
}
