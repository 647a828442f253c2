//! The search space of a plan: every candidate deployment within
//! `max_gpus`, and the scenario of each.
//!
//! A candidate is a shape (aggregated: ranks × TP; P/D: prefill ranks ×
//! TP plus decode ranks × TP) and one value of each optional axis. Its
//! roles start from the base scenario's (the aggregated role for every
//! role of an aggregated base; the prefill and decode roles of a P/D base,
//! the prefill one for an aggregated candidate), with the count and TP
//! replaced, the KV pool derived from GPU memory at that TP (when the
//! model gives its layers and the scenario a `[hardware]`), and the axes'
//! values set. The model is derived again at the candidate's TP sizes
//! when the file named a preset or a `config.json`
//! ([`Scenario::with_edit`]).
//!
//! Candidates come in order of GPUs, then aggregated before P/D, then by
//! shape and axis values, so `candidates.csv` reads cheapest first.

use actors::config::{Policy, RoleSpec, StepTimeSpec};
use actors::validate::FieldError;

use super::{Mode, PlanSpec};
use crate::scenario::{Scenario, ScenarioError};

/// TP sizes tried when `[plan] tp` is absent (those up to `max_gpus`).
pub const DEFAULT_TPS: &[u32] = &[1, 2, 4, 8];

/// A candidate's ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Shape {
    /// Ranks that prefill and decode.
    Aggregated {
        /// Ranks.
        ranks: u32,
        /// TP size of each.
        tp: u32,
    },
    /// Prefill and decode ranks.
    Disaggregated {
        /// Prefill ranks.
        prefill: u32,
        /// TP size of a prefill rank.
        prefill_tp: u32,
        /// Decode ranks.
        decode: u32,
        /// TP size of a decode rank.
        decode_tp: u32,
    },
}

impl Shape {
    /// GPUs: ranks × TP over the roles.
    pub fn gpus(&self) -> u32 {
        match *self {
            Shape::Aggregated { ranks, tp } => ranks * tp,
            Shape::Disaggregated { prefill, prefill_tp, decode, decode_tp } => {
                prefill * prefill_tp + decode * decode_tp
            }
        }
    }

    /// Its mode.
    pub fn mode(&self) -> Mode {
        match self {
            Shape::Aggregated { .. } => Mode::Aggregated,
            Shape::Disaggregated { .. } => Mode::Disaggregated,
        }
    }

    /// `4 x TP2` or `2P x TP4 + 1D x TP8`.
    pub fn label(&self) -> String {
        match *self {
            Shape::Aggregated { ranks, tp } => format!("{ranks} x TP{tp}"),
            Shape::Disaggregated { prefill, prefill_tp, decode, decode_tp } => {
                format!("{prefill}P x TP{prefill_tp} + {decode}D x TP{decode_tp}")
            }
        }
    }
}

/// One value of each optional axis (`None`: the axis is not listed and
/// the base scenario's value holds).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Knobs {
    /// Every role's `max_num_batched_tokens`.
    pub max_num_batched_tokens: Option<u64>,
    /// Every role's `max_num_seqs`.
    pub max_num_seqs: Option<u32>,
    /// The link's bandwidth, GB/s.
    pub link_bandwidth_gb_s: Option<f64>,
    /// The router's prefill (and aggregated) policy.
    pub router_policy: Option<Policy>,
    /// Index into `[plan] step_time`.
    pub step_time: Option<usize>,
}

/// One deployment to try.
#[derive(Clone, Debug, PartialEq)]
pub struct Candidate {
    /// Its place in the plan's order (a row of `candidates.csv`).
    pub index: usize,
    /// Its ranks.
    pub shape: Shape,
    /// Its axis values.
    pub knobs: Knobs,
}

impl Candidate {
    /// GPUs it uses.
    pub fn gpus(&self) -> u32 {
        self.shape.gpus()
    }
}

/// The role a candidate's role starts from: the base scenario's.
fn template(base: &Scenario, mode_role: &str) -> Option<RoleSpec> {
    let d = base.deployment();
    match mode_role {
        "aggregated" => d.aggregated.clone().or_else(|| d.prefill.clone()),
        "prefill" => d.prefill.clone().or_else(|| d.aggregated.clone()),
        _ => d.decode.clone().or_else(|| d.aggregated.clone()),
    }
}

/// The base roles every candidate starts from, with their TP sizes.
fn templates(base: &Scenario) -> Vec<(&'static str, RoleSpec)> {
    ["aggregated", "prefill", "decode"].into_iter().filter_map(|r| template(base, r).map(|t| (r, t))).collect()
}

/// Whether a role's pool can be sized from GPU memory at any TP size.
fn pool_from_memory(base: &Scenario) -> bool {
    base.model_spec().arch.is_some() && base.deployment().hardware.is_some()
}

/// The TP sizes a role may take: every size when the step times scale
/// with TP (roofline) and the pool comes from memory; else the sizes that
/// `step_time_by_tp` gives, or the base roles' own.
pub fn allowed_tps(p: &PlanSpec, base: &Scenario) -> Option<Vec<u32>> {
    if let Some(by_tp) = &p.step_time_by_tp {
        let mut tps: Vec<u32> = by_tp.keys().filter_map(|k| k.parse().ok()).collect();
        tps.sort_unstable();
        return Some(tps);
    }
    let roofline = |s: &StepTimeSpec| matches!(s, StepTimeSpec::Roofline(_));
    let scales = match &p.step_time {
        Some(axis) => axis.iter().all(roofline),
        None => templates(base).iter().all(|(_, r)| roofline(&r.step_time)),
    };
    if scales && pool_from_memory(base) {
        return None;
    }
    let mut tps: Vec<u32> = templates(base).iter().map(|(_, r)| r.tp_under(base.model_spec())).collect();
    tps.sort_unstable();
    tps.dedup();
    Some(tps)
}

/// Why a TP size cannot be tried, when `[plan] tp` lists it.
pub(super) fn check_tps(p: &PlanSpec, base: &Scenario) -> Result<(), FieldError> {
    let Some(allowed) = allowed_tps(p, base) else { return Ok(()) };
    let Some(listed) = &p.tp else { return Ok(()) };
    for (i, t) in listed.iter().enumerate() {
        if !allowed.contains(t) {
            let why = if p.step_time_by_tp.is_some() {
                "[plan.step_time_by_tp] gives no step time for it".to_owned()
            } else {
                format!(
                    "the roles' step time (a table, measured at one TP size) or KV pool (num_blocks, with no \
                     model layers or [hardware] to size it from memory) holds only at tp {}; give roofline \
                     step times, or [plan.step_time_by_tp]",
                    allowed.iter().map(u32::to_string).collect::<Vec<_>>().join(", ")
                )
            };
            return Err(FieldError::new(format!("plan.tp[{i}]"), format!("tp {t} cannot be tried: {why}")));
        }
    }
    Ok(())
}

/// The TP sizes the plan tries.
pub fn tps(p: &PlanSpec, base: &Scenario) -> Vec<u32> {
    let listed: Vec<u32> = match &p.tp {
        Some(t) => t.clone(),
        None => DEFAULT_TPS.iter().copied().filter(|&t| t <= p.max_gpus).collect(),
    };
    match allowed_tps(p, base) {
        None => listed,
        Some(allowed) if p.tp.is_some() => listed.into_iter().filter(|t| allowed.contains(t)).collect(),
        // No list given: every size the step times hold at.
        Some(allowed) => allowed.into_iter().filter(|&t| t <= p.max_gpus).collect(),
    }
}

/// Every shape within `max_gpus` with roles of TP sizes `tps`.
pub fn shapes(p: &PlanSpec, tps: &[u32]) -> Vec<Shape> {
    let n = p.max_gpus;
    let modes = p.modes.clone().unwrap_or_else(|| vec![Mode::Aggregated, Mode::Disaggregated]);
    let hetero = p.heterogeneous_tp.unwrap_or(true);
    let mut out = Vec::new();
    if modes.contains(&Mode::Aggregated) {
        for &tp in tps {
            for ranks in 1..=n / tp {
                out.push(Shape::Aggregated { ranks, tp });
            }
        }
    }
    if modes.contains(&Mode::Disaggregated) {
        for &pt in tps {
            for &dt in tps {
                if pt != dt && (!hetero || (!pt.is_multiple_of(dt) && !dt.is_multiple_of(pt))) {
                    continue;
                }
                for prefill in 1..=n / pt {
                    let left = n - prefill * pt;
                    for decode in 1..=left / dt {
                        out.push(Shape::Disaggregated { prefill, prefill_tp: pt, decode, decode_tp: dt });
                    }
                }
            }
        }
    }
    out
}

/// Every candidate: shapes × axis values, in the plan's order.
///
/// # Errors
/// More than [`super::MAX_CANDIDATES`] (naming the count).
pub fn candidates(p: &PlanSpec, base: &Scenario) -> Result<Vec<Candidate>, FieldError> {
    let tps = tps(p, base);
    let mut shapes = shapes(p, &tps);
    shapes.sort_by_key(|s| (s.gpus(), *s));
    fn axis<T: Clone>(v: &Option<Vec<T>>) -> Vec<Option<T>> {
        match v {
            Some(list) => list.iter().cloned().map(Some).collect(),
            None => vec![None],
        }
    }
    let mnbt = axis(&p.max_num_batched_tokens);
    let mns = axis(&p.max_num_seqs);
    let bw = axis(&p.link_bandwidth_gb_s);
    let router = axis(&p.router_policy);
    let st: Vec<Option<usize>> = match &p.step_time {
        Some(list) => (0..list.len()).map(Some).collect(),
        None => vec![None],
    };
    let per_shape = mnbt.len() * mns.len() * router.len() * st.len();
    let total: usize =
        shapes.iter().map(|s| per_shape * if matches!(s, Shape::Disaggregated { .. }) { bw.len() } else { 1 }).sum();
    if total > super::MAX_CANDIDATES {
        return Err(FieldError::new(
            "plan.max_gpus",
            format!(
                "the plan has {total} candidates, more than {}; lower max_gpus or list fewer TP sizes or axis values",
                super::MAX_CANDIDATES
            ),
        ));
    }
    let mut out = Vec::with_capacity(total);
    for shape in shapes {
        let bws: &[Option<f64>] = if matches!(shape, Shape::Disaggregated { .. }) { &bw } else { &[None] };
        for a in &mnbt {
            for b in &mns {
                for c in bws {
                    for d in &router {
                        for e in &st {
                            let knobs = Knobs {
                                max_num_batched_tokens: *a,
                                max_num_seqs: *b,
                                link_bandwidth_gb_s: *c,
                                router_policy: *d,
                                step_time: *e,
                            };
                            out.push(Candidate { index: out.len(), shape, knobs });
                        }
                    }
                }
            }
        }
    }
    Ok(out)
}

/// A value as TOML.
fn value<T: serde::Serialize>(v: &T) -> Result<toml::Value, String> {
    toml::Value::try_from(v).map_err(|e| format!("cannot serialize: {e}"))
}

/// The role table of `role` (`aggregated`, `prefill`, `decode`) with
/// `count` ranks of `tp`, under `c`'s axis values.
fn role_table(
    p: &PlanSpec,
    base: &Scenario,
    role: &str,
    count: u32,
    tp: u32,
    knobs: &Knobs,
) -> Result<toml::Value, String> {
    let t = template(base, role).ok_or_else(|| format!("the base scenario has no role to make a {role} role from"))?;
    let mut v = value(&t)?;
    let table = v.as_table_mut().ok_or("a role is a table")?;
    table.insert("count".into(), toml::Value::Integer(i64::from(count)));
    table.insert("tp".into(), toml::Value::Integer(i64::from(tp)));
    if pool_from_memory(base) {
        table.remove("num_blocks");
    }
    if let Some(x) = knobs.max_num_batched_tokens {
        table.insert("max_num_batched_tokens".into(), toml::Value::Integer(x as i64));
    }
    if let Some(x) = knobs.max_num_seqs {
        table.insert("max_num_seqs".into(), toml::Value::Integer(i64::from(x)));
    }
    let step_time = match (knobs.step_time, &p.step_time, &p.step_time_by_tp) {
        (Some(i), Some(list), _) => Some(&list[i]),
        (_, _, Some(by_tp)) => by_tp.get(&tp.to_string()),
        _ => None,
    };
    if let Some(s) = step_time {
        table.insert("step_time".into(), value(s)?);
    }
    Ok(v)
}

/// Sets the dotted `path` of `table`, creating tables on the way.
pub(crate) fn set(table: &mut toml::Table, path: &str, v: toml::Value) -> Result<(), String> {
    let mut here = table;
    let mut keys = path.split('.').peekable();
    while let Some(k) = keys.next() {
        if keys.peek().is_none() {
            here.insert(k.to_owned(), v);
            return Ok(());
        }
        let next = here.entry(k.to_owned()).or_insert_with(|| toml::Value::Table(toml::Table::new()));
        here = next.as_table_mut().ok_or_else(|| format!("`{k}` is not a table"))?;
    }
    Ok(())
}

/// Edits a resolved scenario table into candidate `c`'s deployment.
pub fn apply(p: &PlanSpec, base: &Scenario, c: &Candidate, table: &mut toml::Table) -> Result<(), String> {
    for role in ["aggregated", "prefill", "decode"] {
        table.remove(role);
    }
    match c.shape {
        Shape::Aggregated { ranks, tp } => {
            table.insert("aggregated".into(), role_table(p, base, "aggregated", ranks, tp, &c.knobs)?);
        }
        Shape::Disaggregated { prefill, prefill_tp, decode, decode_tp } => {
            table.insert("prefill".into(), role_table(p, base, "prefill", prefill, prefill_tp, &c.knobs)?);
            table.insert("decode".into(), role_table(p, base, "decode", decode, decode_tp, &c.knobs)?);
        }
    }
    if let Some(bw) = c.knobs.link_bandwidth_gb_s {
        set(table, "link.bandwidth_gb_s", toml::Value::Float(bw))?;
    }
    if let Some(policy) = c.knobs.router_policy {
        set(table, "router.prefill_policy", value(&policy)?)?;
    }
    let name = match base.name() {
        Some(n) => format!("{n}-{}", slug(&c.shape.label())),
        None => slug(&c.shape.label()),
    };
    table.insert("name".into(), toml::Value::String(name));
    Ok(())
}

/// `2P x TP4 + 1D x TP8` → `2p-tp4-1d-tp8`.
pub fn slug(label: &str) -> String {
    let mut out = String::new();
    for w in label.split_whitespace() {
        if matches!(w, "x" | "+") {
            continue;
        }
        if !out.is_empty() {
            out.push('-');
        }
        out.push_str(&w.to_ascii_lowercase());
    }
    out
}

/// Candidate `c`'s scenario, with `edit` applied after the candidate's
/// own changes (the rate and the request count).
///
/// # Errors
/// The candidate makes no valid scenario (a model that does not fit the
/// GPU at its TP size, heads that do not divide it): the loader's message.
pub fn scenario(
    p: &PlanSpec,
    base: &Scenario,
    c: &Candidate,
    edit: impl FnOnce(&mut toml::Table) -> Result<(), String>,
) -> Result<Scenario, ScenarioError> {
    let label = format!("{} ({})", base.source(), c.shape.label());
    base.with_edit(&label, |t| {
        apply(p, base, c, t)?;
        edit(t)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn spec(max_gpus: u32, hetero: bool) -> PlanSpec {
        toml::from_str(&format!("max_gpus = {max_gpus}\nheterogeneous_tp = {hetero}")).unwrap()
    }

    #[test]
    fn four_gpus_make_eighteen_shapes() {
        // Aggregated: TP 1 x 1..4, TP 2 x 1..2, TP 4 x 1 = 7. P/D (p, d >= 1):
        // TP 1/1, p + d <= 4: 6; TP 1/2, p + 2d <= 4: 2; TP 2/1: 2; TP 2/2: 1 = 11.
        assert_eq!(shapes(&spec(4, true), &[1, 2, 4]).len(), 18);
        // Without heterogeneous TP: 7 + 6 + 1.
        assert_eq!(shapes(&spec(4, false), &[1, 2, 4]).len(), 14);
    }

    #[test]
    fn slugs() {
        assert_eq!(slug("2P x TP4 + 1D x TP8"), "2p-tp4-1d-tp8");
        assert_eq!(slug("3 x TP1"), "3-tp1");
    }

    proptest! {
        #[test]
        fn shapes_fit_and_are_distinct(max_gpus in 1u32..24, hetero in any::<bool>(), mask in 1u8..16) {
            let tps: Vec<u32> = [1u32, 2, 4, 8].iter().enumerate().filter(|(i, _)| mask & (1 << i) != 0).map(|(_, t)| *t).collect();
            let all = shapes(&spec(max_gpus, hetero), &tps);
            for (i, s) in all.iter().enumerate() {
                prop_assert!(s.gpus() >= 1 && s.gpus() <= max_gpus);
                prop_assert!(!all[..i].contains(s));
                if let Shape::Disaggregated { prefill_tp, decode_tp, .. } = *s {
                    prop_assert!(prefill_tp % decode_tp == 0 || decode_tp % prefill_tp == 0);
                    prop_assert!(hetero || prefill_tp == decode_tp);
                }
            }
            // Every aggregated shape within the budget is there.
            for &tp in &tps {
                for ranks in 1..=max_gpus / tp {
                    let want = Shape::Aggregated { ranks, tp };
                    prop_assert!(all.contains(&want), "missing {:?}", want);
                }
            }
        }
    }
}
