//! `report.html`: a self-contained page of tables and charts made from the
//! files of a run folder (`pdsim report DIR`, `pdsim run --html`) or of a
//! sweep folder (`sweep.csv`).
//!
//! The page reads only what the folder holds, so it can be made for any
//! run after the fact: `report.json` (required for a run), `requests.csv`
//! (latency distributions, stages, rates over time) and `timeline.csv` (KV
//! use, queues, busy shares and links over time). A missing optional file
//! is said in place of the charts it would give.
//!
//! Self-contained: inline CSS, charts as inline SVG ([`svg`]), no script,
//! font, image or link to anything outside the file. Deterministic: the
//! page is a function of the files' contents only (no time stamps, no
//! paths, fixed number formatting), so the same folder gives the same
//! bytes. Series are reduced as they are read (`read.rs`) and thinned to
//! the plot's pixels, so the page stays a few hundred KB however long the
//! run.
//!
//! Every chart is a `<figure class="chart" data-chart="NAME">` holding one
//! `<svg>` whose data elements have the class `mark`; a note in place of a
//! chart is a `<p class="missing" data-missing="FILE">`.

use std::fmt::{self, Write as _};
use std::path::{Path, PathBuf};

mod plan_page;
pub(crate) mod read;
mod run_page;
pub mod svg;
mod sweep_page;

pub use plan_page::plan_page;
use svg::esc;

/// A report that cannot be made: one line naming the file (and line,
/// column or field) and the problem. Bad input: exit status 2.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReportError(String);

impl ReportError {
    fn new(msg: impl Into<String>) -> Self {
        ReportError(msg.into())
    }

    /// The message.
    pub fn message(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ReportError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ReportError {}

/// What kind of folder a report was made of.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A run folder (`report.json`).
    Run,
    /// A sweep folder (`sweep.csv`).
    Sweep,
}

/// A rendered page.
#[derive(Clone, Debug)]
pub struct Page {
    kind: Kind,
    html: String,
    charts: usize,
    missing: Vec<String>,
}

impl Page {
    /// What it reports on.
    pub fn kind(&self) -> Kind {
        self.kind
    }

    /// The HTML text.
    pub fn html(&self) -> &str {
        &self.html
    }

    /// The number of charts drawn.
    pub fn charts(&self) -> usize {
        self.charts
    }

    /// The optional files that were missing (their charts are notes).
    pub fn missing(&self) -> &[String] {
        &self.missing
    }
}

/// The file name the report is written under, in the folder it reports on.
pub const FILE_NAME: &str = "report.html";

/// Renders the report of the folder `dir`: a sweep's when it holds
/// `sweep.csv`, else a run's (`report.json`).
///
/// # Errors
/// The folder has neither file, or a file is malformed (the error names
/// it, with the line and the column or field).
pub fn render(dir: &Path) -> Result<Page, ReportError> {
    let sweep = dir.join("sweep.csv");
    let report = dir.join("report.json");
    if sweep.is_file() {
        return sweep_page::render(dir);
    }
    if report.exists() {
        return run_page::render(dir);
    }
    let hint = if has_shards(dir) {
        " (a sharded sweep: `cat sweep.shard-*-of-N.csv > sweep.csv` joins its shards)"
    } else {
        " (a folder `pdsim run` or `pdsim sweep` wrote)"
    };
    if !dir.is_dir() {
        return Err(ReportError::new(format!("{}: not a folder{hint}", dir.display())));
    }
    Err(ReportError::new(format!("{}: no report.json or sweep.csv in this folder{hint}", dir.display())))
}

fn has_shards(dir: &Path) -> bool {
    std::fs::read_dir(dir).is_ok_and(|entries| {
        entries.flatten().any(|e| {
            let n = e.file_name();
            let n = n.to_string_lossy();
            n.starts_with("sweep.shard-") && n.ends_with(".csv")
        })
    })
}

/// Renders the report of `dir` and writes it to `out` (default
/// `dir/report.html`), through `out.partial` renamed when whole. Returns
/// the page and where it went.
///
/// # Errors
/// As [`render`]; the file cannot be written (naming it).
pub fn write(dir: &Path, out: Option<&Path>) -> Result<(Page, PathBuf), ReportError> {
    let path = out.map_or_else(|| dir.join(FILE_NAME), Path::to_path_buf);
    // Refused before the work: a link, a device or a pipe at the name is
    // never written through or replaced (`crate::output`).
    crate::output::check_target(&path).map_err(ReportError::new)?;
    let page = render(dir)?;
    crate::output::write_atomic(&path, |w| std::io::Write::write_all(w, page.html.as_bytes()))
        .map_err(ReportError::new)?;
    Ok((page, path))
}

/// The page's style sheet.
const CSS: &str = r#"
:root{--fg:#1f2328;--muted:#59636e;--line:#d1d9e0;--card:#f6f8fa}
*{box-sizing:border-box}
body{margin:0;font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif;color:var(--fg);background:#fff}
main{max-width:1260px;margin:0 auto;padding:18px 22px 40px}
h1{font-size:22px;margin:0 0 4px}
h2{font-size:17px;margin:26px 0 10px;padding-bottom:4px;border-bottom:1px solid var(--line)}
h3{font-size:14px;margin:16px 0 6px}
p{margin:4px 0}
a{color:#0b62c4;text-decoration:none}
.meta,.note{color:var(--muted)}
nav{margin:10px 0 0;font-size:13px}
nav a{margin-right:14px}
.banner{border-radius:6px;padding:8px 12px;margin:10px 0;border:1px solid}
.banner.bad{background:#fff1f0;border-color:#f4b8b3;color:#8c1d18}
.banner.warn{background:#fff8db;border-color:#f0d98c;color:#6b5200}
.cards{display:grid;grid-template-columns:repeat(auto-fill,minmax(175px,1fr));gap:8px;margin:8px 0}
.card{background:var(--card);border:1px solid var(--line);border-radius:6px;padding:7px 10px}
.card .k{color:var(--muted);font-size:12px}
.card .v{font-size:19px;font-weight:600;font-variant-numeric:tabular-nums}
.card .s{color:var(--muted);font-size:12px}
.scroll{overflow-x:auto}
table{border-collapse:collapse;font-variant-numeric:tabular-nums;margin:6px 0 10px;font-size:13px}
th,td{padding:3px 10px;border-bottom:1px solid var(--line);text-align:right;white-space:nowrap}
th{font-weight:600;background:var(--card)}
th:first-child,td:first-child{text-align:left}
td.t,th.t{text-align:left}
td.wrap{white-space:normal;min-width:160px;max-width:320px}
.charts{display:grid;grid-template-columns:repeat(auto-fill,minmax(540px,1fr));gap:14px}
.charts.small{grid-template-columns:repeat(auto-fill,minmax(360px,1fr));gap:10px}
figure.chart{margin:0;border:1px solid var(--line);border-radius:6px;padding:8px 10px;min-width:0}
figcaption{font-weight:600;font-size:13.5px}
figcaption .sub{display:block;font-weight:400;color:var(--muted);font-size:12px}
figure.chart svg{width:100%;height:auto;display:block;margin-top:4px}
svg text{font:11px system-ui,-apple-system,"Segoe UI",Roboto,Arial,sans-serif;fill:#444}
svg text.label{font-size:12px;fill:#222}
svg text.value{fill:#222}
.grid line{stroke:#e8ebee}
.frame{fill:none;stroke:#c5ccd3}
line.ref{stroke:#8c959f;stroke-dasharray:4 3}
text.ref{fill:#57606a}
.legend{list-style:none;padding:0;margin:6px 0 0;display:flex;flex-wrap:wrap;gap:3px 14px;font-size:12px}
.sw{display:inline-block;width:16px;height:3px;background:var(--c);vertical-align:middle;margin-right:5px}
.sw.block{width:11px;height:11px;border-radius:2px;vertical-align:-1px}
.sw.dashed{background:repeating-linear-gradient(90deg,var(--c) 0 5px,transparent 5px 8px)}
.missing{color:#6b5200;background:#fff8db;border:1px solid #f0d98c;padding:8px 12px;border-radius:6px}
details{margin:8px 0}
summary{cursor:pointer;color:#0b62c4}
footer{margin-top:30px;color:var(--muted);font-size:12px}
"#;

/// The page around `body`: head, style sheet, `<main>`.
fn document(title: &str, body: &str) -> String {
    let mut s = String::with_capacity(body.len() + 4096);
    s.push_str("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n");
    s.push_str("<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n");
    let _ = writeln!(s, "<title>{}</title>", esc(title));
    s.push_str("<style>");
    s.push_str(CSS.trim_start());
    s.push_str("</style>\n</head>\n<body>\n<main>\n");
    s.push_str(body);
    s.push_str("</main>\n</body>\n</html>\n");
    s
}

/// A chart: `<figure class="chart" data-chart="{name}">` with its caption,
/// its SVG and an optional legend.
fn figure(name: &str, title: &str, sub: &str, svg: &str, legend: &str) -> String {
    let sub = if sub.is_empty() { String::new() } else { format!("<span class=\"sub\">{}</span>", esc(sub)) };
    format!(
        "<figure class=\"chart\" data-chart=\"{}\" id=\"chart-{}\"><figcaption>{}{sub}</figcaption>{svg}{legend}</figure>\n",
        esc(name),
        slug(name),
        esc(title)
    )
}

/// A note in place of charts whose file is missing.
fn missing(file: &str, what: &str) -> String {
    format!("<p class=\"missing\" data-missing=\"{}\">{}</p>\n", esc(file), esc(what))
}

/// `n` with thousands separators (a `u128` for sums of `u64` counts,
/// which can overflow a `u64` in a hostile report.json).
fn int(n: impl Into<u128>) -> String {
    let n: u128 = n.into();
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A number for a table or a card: three or four significant digits,
/// thousands separators above 10,000, `–` when not finite.
fn num(x: f64) -> String {
    if !x.is_finite() {
        return "–".to_owned();
    }
    let a = x.abs();
    if a >= 10_000.0 {
        let r = x.round();
        let s = int(r.abs() as u64);
        return if r < 0.0 { format!("-{s}") } else { s };
    }
    let d = if a >= 100.0 {
        1
    } else if a >= 1.0 {
        2
    } else if a == 0.0 {
        0
    } else {
        3
    };
    format!("{x:.d$}")
}

/// A share as a percentage with one decimal.
fn pct(x: f64) -> String {
    if x.is_finite() { format!("{:.1} %", 100.0 * x) } else { "–".to_owned() }
}

/// A slug for an id: letters, digits, `_`, `.`, `-`; anything else `_`.
fn slug(s: &str) -> String {
    s.chars().map(|c| if c.is_ascii_alphanumeric() || "_.-".contains(c) { c } else { '_' }).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_format_for_people() {
        assert_eq!(int(4_029_129u64), "4,029,129");
        assert_eq!(int(999u64), "999");
        assert_eq!(num(31.2913), "31.29");
        assert_eq!(num(755.603), "755.6");
        assert_eq!(num(43775.13), "43,775");
        assert_eq!(num(0.0), "0");
        assert_eq!(num(0.01234), "0.012");
        assert_eq!(num(f64::NAN), "–");
        assert_eq!(pct(0.99987), "100.0 %");
        assert_eq!(slug("kv_used_blocks[full attention]"), "kv_used_blocks_full_attention_");
    }
}
