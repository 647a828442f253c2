//! Small, deterministic SVG charts for `report.html`: x–y charts (lines,
//! step functions, dots) on linear, logarithmic or categorical axes with
//! "nice" ticks, and horizontal (stacked) bar charts.
//!
//! Everything is a pure function of its inputs: coordinates are written
//! with one decimal (a tenth of a pixel), labels with a fixed number of
//! decimals chosen from the tick step, logarithms and powers come from
//! `libm` (not the platform's maths library), and no randomness or clock
//! is involved, so the same data give the same bytes on every machine. Text is laid out with an
//! estimated character width (no font files are read); the page's CSS
//! picks the system's sans-serif font.
//!
//! Long series are thinned to what the plot can show: after mapping to
//! pixels, consecutive points in one pixel column are reduced to the first,
//! lowest, highest and last of them ([`thin`]), so a line keeps its
//! envelope whatever the number of points, and a chart stays a few
//! kilobytes.
//!
//! Every drawn data element has the class `mark` (the browser test counts
//! them).

use std::fmt::Write as _;

/// Colours of the series, in order (Tableau 10); series past the tenth
/// reuse them.
pub const PALETTE: [&str; 10] =
    ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"];

/// The colour of series `i`.
pub fn color(i: usize) -> &'static str {
    PALETTE[i % PALETTE.len()]
}

/// Estimated width of one character of tick text (11 px sans-serif), px.
const CHAR_W: f64 = 6.4;

/// Escapes text for HTML or SVG content and attribute values.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// A pixel coordinate with one decimal, without a trailing `.0`.
fn px(v: f64) -> String {
    let v = if v.is_finite() { v } else { 0.0 };
    let s = format!("{v:.1}");
    let s = s.strip_suffix(".0").map_or(s.clone(), str::to_owned);
    if s == "-0" { "0".to_owned() } else { s }
}

/// How an axis maps values.
#[derive(Clone, Debug, PartialEq)]
pub enum Scale {
    /// Linear.
    Linear,
    /// Base-10 logarithmic (values ≤ 0 are not drawn).
    Log,
    /// Named positions 0, 1, …, n − 1, one per category, in this order.
    Categories(Vec<String>),
}

/// One axis: its label, scale and range.
#[derive(Clone, Debug)]
pub struct Axis {
    label: String,
    scale: Scale,
    range: Option<(f64, f64)>,
    from_zero: bool,
    suffix: &'static str,
    ticks: Option<Vec<(f64, String)>>,
}

impl Axis {
    /// A linear axis whose range covers the data, extended to nice ticks.
    pub fn linear(label: impl Into<String>) -> Self {
        Axis { label: label.into(), scale: Scale::Linear, range: None, from_zero: false, suffix: "", ticks: None }
    }

    /// A logarithmic axis over the positive data.
    pub fn log(label: impl Into<String>) -> Self {
        Axis { scale: Scale::Log, ..Axis::linear(label) }
    }

    /// A categorical axis.
    pub fn categories(label: impl Into<String>, names: Vec<String>) -> Self {
        Axis { scale: Scale::Categories(names), ..Axis::linear(label) }
    }

    /// The range always includes 0 (counts, shares).
    #[must_use]
    pub fn from_zero(mut self) -> Self {
        self.from_zero = true;
        self
    }

    /// A fixed range (not extended to ticks).
    #[must_use]
    pub fn range(mut self, lo: f64, hi: f64) -> Self {
        if lo.is_finite() && hi.is_finite() && hi > lo {
            self.range = Some((lo, hi));
        }
        self
    }

    /// Ticks at these values with these labels (a sweep axis's values), the
    /// range spanning them with a margin; linear and log axes only.
    #[must_use]
    pub fn ticks_at(mut self, ticks: Vec<(f64, String)>) -> Self {
        let ticks: Vec<(f64, String)> =
            ticks.into_iter().filter(|t| t.0.is_finite() && (self.scale != Scale::Log || t.0 > 0.0)).collect();
        if !ticks.is_empty() {
            self.ticks = Some(ticks);
        }
        self
    }

    /// Text after each tick label (`%`).
    #[must_use]
    pub fn suffix(mut self, suffix: &'static str) -> Self {
        self.suffix = suffix;
        self
    }

    /// The axis's label.
    pub fn label(&self) -> &str {
        &self.label
    }
}

/// How a series is drawn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Style {
    /// Straight segments between the points.
    Line,
    /// A step function: each point's y holds until the next point's x.
    Step,
    /// A dot per point.
    Dots,
    /// Segments and a dot per point (few points: sweeps).
    LineDots,
    /// Small, faint dots (individual observations behind a line).
    FaintDots,
    /// A translucent band between a low and a high value per x (see
    /// [`Series::band`]).
    Band,
}

/// Strokes (width px, dash pattern) that keep lines drawn over one
/// another apart, by line index: wide and solid under narrow and dashed,
/// so two lines on the same points show both.
pub const LINE_STROKES: [(f64, Option<&str>); 4] = [(3.4, None), (2.4, Some("7 3")), (1.6, None), (1.2, Some("2 2"))];

/// One series of an [`XyChart`].
#[derive(Clone, Debug)]
pub struct Series {
    name: String,
    color: usize,
    style: Style,
    points: Vec<(f64, f64)>,
    /// A band's high values, one per point (its `points` hold the low ones).
    highs: Vec<f64>,
    dashed: bool,
    /// A stroke pattern other than solid or the plain dash (`6 2 1 2`).
    dash: Option<&'static str>,
    /// Stroke width of a line, px.
    width: f64,
    /// Stroke opacity of a line.
    opacity: f64,
    titles: Vec<String>,
    /// Dots drawn hollow (a ring), e.g. points of an overloaded run.
    hollow: bool,
}

impl Series {
    /// A series named `name` in colour `color` ([`color`]).
    pub fn new(name: impl Into<String>, color: usize, style: Style, points: Vec<(f64, f64)>) -> Self {
        Series {
            name: name.into(),
            color,
            style,
            points,
            highs: Vec::new(),
            dashed: false,
            dash: None,
            width: 1.6,
            opacity: 1.0,
            titles: Vec::new(),
            hollow: false,
        }
    }

    /// A band from `low` to `high` at each `x`: (x, low, high).
    pub fn band(name: impl Into<String>, color: usize, points: &[(f64, f64, f64)]) -> Self {
        let mut s = Series::new(name, color, Style::Band, points.iter().map(|p| (p.0, p.1)).collect());
        s.highs = points.iter().map(|p| p.2).collect();
        s
    }

    /// Drawn dashed.
    #[must_use]
    pub fn dashed(mut self) -> Self {
        self.dashed = true;
        self
    }

    /// A thin, faint line (an envelope behind the main lines).
    #[must_use]
    pub fn thin(mut self) -> Self {
        self.width = 0.9;
        self.opacity = 0.5;
        self
    }

    /// Stroked `width` px wide with the dash pattern `dash` (SVG's
    /// `stroke-dasharray`; `None` solid), so that lines drawn over one
    /// another stay apart: a wide one under a narrow dashed one.
    #[must_use]
    pub fn stroke(mut self, width: f64, dash: Option<&'static str>) -> Self {
        self.width = width;
        self.dash = dash;
        self
    }

    /// Its dots drawn as rings.
    #[must_use]
    pub fn hollow(mut self) -> Self {
        self.hollow = true;
        self
    }

    /// A hover text per point (dot styles only).
    #[must_use]
    pub fn titles(mut self, titles: Vec<String>) -> Self {
        self.titles = titles;
        self
    }

    /// Its name (the legend's text).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its colour index.
    pub fn color(&self) -> usize {
        self.color
    }
}

/// Nice tick steps: 1, 2 or 5 times a power of ten.
fn nice_step(raw: f64) -> f64 {
    if !(raw.is_finite() && raw > 0.0) {
        return 1.0;
    }
    let e = libm::log10(raw).floor();
    let base = libm::pow(10.0, e);
    let f = raw / base;
    let m = if f <= 1.0 + 1e-9 {
        1.0
    } else if f <= 2.0 + 1e-9 {
        2.0
    } else if f <= 5.0 + 1e-9 {
        5.0
    } else {
        10.0
    };
    m * base
}

/// The decimals a tick step needs (its power of ten, negated).
fn step_decimals(step: f64) -> usize {
    if !(step.is_finite() && step > 0.0) {
        return 0;
    }
    let e = (libm::log10(step) + 1e-9).floor();
    if e >= 0.0 { 0 } else { (-e) as usize }
}

/// A tick label: `v` with the decimals its `step` needs, and a thousands
/// suffix (k, M, G, T) when the axis's largest tick (`magnitude`) is at
/// least ten thousand of it.
fn format_tick(v: f64, magnitude: f64, step: f64) -> String {
    let units = [(1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")];
    if v == 0.0 && (magnitude >= 1e4 || step_decimals(step) > MAX_DECIMALS) {
        return "0".to_owned();
    }
    // Past the largest suffix, or with more decimals than a reader counts,
    // plain digits would make labels tens of characters long (and push the
    // plot out of the chart): exponent form, with the digits the step needs.
    if magnitude >= 1e15 || step_decimals(step) > MAX_DECIMALS {
        // Digits from the axis's largest tick, so all labels have as many.
        let mag_v = if magnitude > 0.0 { libm::log10(magnitude).floor() } else { 0.0 };
        let mag_s = if step.is_finite() && step > 0.0 { libm::log10(step).floor() } else { mag_v };
        let digits = (mag_v - mag_s).clamp(0.0, 15.0) as usize;
        return format!("{v:.digits$e}");
    }
    let (x, dec, unit) = match units.iter().find(|(scale, _)| magnitude >= 10.0 * scale) {
        Some(&(scale, unit)) => (v / scale, step_decimals(step / scale), unit),
        None => (v, step_decimals(step), ""),
    };
    let s = format!("{x:.dec$}");
    // No "-0".
    let s = if s.starts_with('-') && s[1..].chars().all(|c| c == '0' || c == '.') { s[1..].to_owned() } else { s };
    s + unit
}

/// The most decimals a tick label is written with before it switches to
/// exponent form.
const MAX_DECIMALS: usize = 9;

/// Ticks of a linear range: (domain low, domain high, ticks, step).
fn linear_ticks(lo: f64, hi: f64, extend: bool, target: usize) -> (f64, f64, Vec<f64>, f64) {
    // Halves first: `hi - lo` overflows for ranges near ±f64::MAX.
    let step = nice_step((hi / 2.0 - lo / 2.0) / target.max(1) as f64 * 2.0);
    let (d0, d1) = if extend { ((lo / step).floor() * step, (hi / step).ceil() * step) } else { (lo, hi) };
    // Rounding outwards can overflow too; then the range stays as it is.
    let (d0, d1) = if d0.is_finite() && d1.is_finite() { (d0, d1) } else { (lo, hi) };
    let first = (d0 / step).ceil();
    let mut ticks = Vec::new();
    let mut k = first;
    while k * step <= d1 + step * 1e-9 && ticks.len() < 50 {
        ticks.push(k * step);
        k += 1.0;
    }
    (d0, d1, ticks, step)
}

/// The mapping of one axis onto pixels, with its ticks.
struct Mapped {
    scale: Scale,
    d0: f64,
    d1: f64,
    p0: f64,
    p1: f64,
    ticks: Vec<(f64, String)>,
}

impl Mapped {
    fn new(axis: &Axis, values: &[f64], p0: f64, p1: f64, target: usize) -> Mapped {
        let finite = values.iter().copied().filter(|v| v.is_finite());
        if let (Some(ticks), Scale::Linear | Scale::Log) = (&axis.ticks, &axis.scale) {
            let log = axis.scale == Scale::Log;
            let t = |v: f64| if log { libm::log10(v) } else { v };
            let lo = ticks.iter().map(|x| t(x.0)).fold(f64::INFINITY, f64::min);
            let hi = ticks.iter().map(|x| t(x.0)).fold(f64::NEG_INFINITY, f64::max);
            let pad = if hi > lo { (hi / 2.0 - lo / 2.0) * 0.12 } else { lo.abs().max(1.0) * 0.5 };
            let (mut d0, mut d1) = (lo - pad, hi + pad);
            if !(d0.is_finite() && d1.is_finite()) {
                // The margin overflows near ±f64::MAX: no margin.
                (d0, d1) = (lo, hi);
            }
            let ticks = ticks.iter().map(|(v, l)| (*v, format!("{l}{}", axis.suffix))).collect();
            return Mapped { scale: axis.scale.clone(), d0, d1, p0, p1, ticks };
        }
        match &axis.scale {
            Scale::Categories(names) => {
                let n = names.len().max(1) as f64;
                // At most about 50 ticks: every k-th name.
                let every = names.len().div_ceil(50).max(1);
                let ticks = names.iter().enumerate().step_by(every).map(|(i, s)| (i as f64, s.clone())).collect();
                Mapped { scale: axis.scale.clone(), d0: -0.5, d1: n - 0.5, p0, p1, ticks }
            }
            Scale::Log => {
                let pos: Vec<f64> = finite.filter(|v| *v > 0.0).collect();
                let (lo, hi) = match axis.range {
                    Some((a, b)) if a > 0.0 => (a, b),
                    _ => {
                        let lo = pos.iter().copied().fold(f64::INFINITY, f64::min);
                        let hi = pos.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                        if lo.is_finite() { (lo, hi) } else { (1.0, 10.0) }
                    }
                };
                let (e0, e1) = (libm::log10(lo).floor(), libm::log10(hi).ceil().max(libm::log10(lo).floor() + 1.0));
                let decades = (e1 - e0) as usize;
                let mults: &[f64] = if decades <= 2 { &[1.0, 2.0, 5.0] } else { &[1.0] };
                let every = decades.div_ceil(8).max(1);
                let mut ticks = Vec::new();
                for (i, e) in (e0 as i32..=e1 as i32).enumerate() {
                    if i % every != 0 {
                        continue;
                    }
                    for m in mults {
                        let v = m * libm::pow(10.0, f64::from(e));
                        if v >= libm::pow(10.0, e0) * (1.0 - 1e-9) && v <= libm::pow(10.0, e1) * (1.0 + 1e-9) {
                            ticks.push((v, format_tick(v, v, v) + axis.suffix));
                        }
                    }
                }
                Mapped { scale: Scale::Log, d0: e0, d1: e1, p0, p1, ticks }
            }
            Scale::Linear => {
                let vals: Vec<f64> = finite.collect();
                let (mut lo, mut hi, extend) = match axis.range {
                    Some((a, b)) => (a, b, false),
                    None => {
                        let lo = vals.iter().copied().fold(f64::INFINITY, f64::min);
                        let hi = vals.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                        if lo.is_finite() { (lo, hi, true) } else { (0.0, 1.0, true) }
                    }
                };
                if axis.from_zero {
                    lo = lo.min(0.0);
                    hi = hi.max(0.0);
                }
                if hi / 2.0 - lo / 2.0 <= f64::EPSILON / 2.0 * hi.abs().max(1.0) {
                    let pad = if hi == 0.0 { 1.0 } else { hi.abs() * 0.1 };
                    if !(axis.from_zero && lo == 0.0) {
                        lo -= pad;
                    }
                    hi += pad;
                }
                if !(lo.is_finite() && hi.is_finite()) {
                    // The pad overflowed (a value near ±f64::MAX).
                    (lo, hi) = (lo.max(f64::MIN), hi.min(f64::MAX));
                }
                let (d0, d1, ticks, step) = linear_ticks(lo, hi, extend, target);
                let mag = ticks.iter().fold(0f64, |m, t| m.max(t.abs()));
                let ticks = ticks.into_iter().map(|t| (t, format_tick(t, mag, step) + axis.suffix)).collect();
                Mapped { scale: Scale::Linear, d0, d1, p0, p1, ticks }
            }
        }
    }

    fn pos(&self, v: f64) -> Option<f64> {
        let t = match self.scale {
            Scale::Log => {
                if v.is_nan() || v <= 0.0 {
                    return None;
                }
                libm::log10(v)
            }
            _ => v,
        };
        if !t.is_finite() {
            return None;
        }
        // In halves: `d1 - d0` and `t - d0` overflow for a domain near
        // ±f64::MAX, and an infinite span would give NaN pixels.
        let span = self.d1 / 2.0 - self.d0 / 2.0;
        let f = if span > 0.0 && span.is_finite() { (t / 2.0 - self.d0 / 2.0) / span } else { 0.5 };
        let p = self.p0 + f * (self.p1 - self.p0);
        p.is_finite().then_some(p)
    }
}

/// Thins a polyline in pixels: consecutive points in one pixel column
/// become the first, lowest, highest and last of them (in their order), so
/// at most four points a column remain and the drawn envelope is the same.
/// Points with a non-finite coordinate are left out (a NaN is in no
/// column: comparing with it would never advance).
pub fn thin(points: &[(f64, f64)]) -> Vec<(f64, f64)> {
    let finite: Vec<(f64, f64)> = points.iter().copied().filter(|p| p.0.is_finite() && p.1.is_finite()).collect();
    let points = &finite[..];
    let mut out: Vec<(f64, f64)> = Vec::with_capacity(points.len().min(4096));
    let mut i = 0;
    while i < points.len() {
        let col = points[i].0.floor();
        let mut j = i;
        let (mut lo, mut hi) = (i, i);
        while j < points.len() && points[j].0.floor() == col {
            if points[j].1 < points[lo].1 {
                lo = j;
            }
            if points[j].1 > points[hi].1 {
                hi = j;
            }
            j += 1;
        }
        // Point i is in its own column, so j > i: the loop advances.
        debug_assert!(j > i);
        let mut keep = [i, lo, hi, j - 1];
        keep.sort_unstable();
        let mut last = usize::MAX;
        for k in keep {
            if k != last {
                out.push(points[k]);
                last = k;
            }
        }
        i = j;
    }
    out
}

/// An x–y chart.
#[derive(Clone, Debug)]
pub struct XyChart {
    x: Axis,
    y: Axis,
    series: Vec<Series>,
    width: f64,
    height: f64,
    hlines: Vec<(f64, String)>,
}

/// Margins of the plot area, px.
const TOP: f64 = 10.0;
const RIGHT: f64 = 14.0;
const BOTTOM: f64 = 40.0;

impl XyChart {
    /// A chart `width` × `height` (viewBox units, about pixels).
    pub fn new(x: Axis, y: Axis, width: f64, height: f64) -> Self {
        XyChart { x, y, series: Vec::new(), width, height, hlines: Vec::new() }
    }

    /// Adds a series.
    pub fn push(&mut self, s: Series) {
        self.series.push(s);
    }

    /// A labelled horizontal reference line at `y` (a capacity, a bound).
    pub fn hline(&mut self, y: f64, label: impl Into<String>) {
        self.hlines.push((y, label.into()));
    }

    /// The series, in drawing order.
    pub fn series(&self) -> &[Series] {
        &self.series
    }

    /// The chart as an `<svg>` element.
    pub fn svg(&self) -> String {
        let xs: Vec<f64> = self.series.iter().flat_map(|s| s.points.iter().map(|p| p.0)).collect();
        let mut ys: Vec<f64> = self.series.iter().flat_map(|s| s.points.iter().map(|p| p.1)).collect();
        ys.extend(self.series.iter().flat_map(|s| s.highs.iter().copied()));
        ys.extend(self.hlines.iter().map(|h| h.0));
        let (w, h) = (self.width, self.height);
        // The y ticks decide the left margin.
        let probe = Mapped::new(&self.y, &ys, h - BOTTOM, TOP, 5);
        let widest = probe.ticks.iter().map(|t| t.1.chars().count()).max().unwrap_or(1) as f64;
        // At most half the chart, whatever the labels.
        let left = (widest * CHAR_W + 26.0).max(40.0).min((w / 2.0).max(40.0));
        let x_target = (((w - left - RIGHT) / 75.0).floor() as usize).max(2);
        let xm = Mapped::new(&self.x, &xs, left, w - RIGHT, x_target);
        // x labels that would overlap go to a second row, or are left out.
        let mut rows_end = [f64::NEG_INFINITY; 2];
        let mut x_labels: Vec<(f64, usize, &str)> = Vec::new();
        for (v, label) in &xm.ticks {
            let Some(x) = xm.pos(*v) else { continue };
            let half = label.chars().count() as f64 * CHAR_W / 2.0;
            if let Some(row) = (0..2).find(|&r| x - half > rows_end[r] + 6.0) {
                rows_end[row] = x + half;
                x_labels.push((x, row, label));
            }
        }
        let two_rows = x_labels.iter().any(|l| l.1 == 1);
        let bottom = if two_rows { BOTTOM + 12.0 } else { BOTTOM };
        let ym = Mapped::new(&self.y, &ys, h - bottom, TOP, 5);
        let (pl, pr, pt, pb) = (left, w - RIGHT, TOP, h - bottom);
        let mut s = String::with_capacity(4096);
        let _ = write!(
            s,
            r#"<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {} {}" role="img" aria-label="{}">"#,
            px(w),
            px(h),
            esc(&format!("{} against {}", self.y.label, self.x.label))
        );
        // Grid and ticks.
        s.push_str(r#"<g class="grid">"#);
        for (v, _) in &ym.ticks {
            if let Some(y) = ym.pos(*v) {
                let _ = write!(s, r#"<line x1="{}" x2="{}" y1="{}" y2="{}"/>"#, px(pl), px(pr), px(y), px(y));
            }
        }
        for (v, _) in &xm.ticks {
            if let Some(x) = xm.pos(*v) {
                let _ = write!(s, r#"<line x1="{}" x2="{}" y1="{}" y2="{}"/>"#, px(x), px(x), px(pt), px(pb));
            }
        }
        s.push_str("</g>");
        let _ = write!(
            s,
            r#"<rect class="frame" x="{}" y="{}" width="{}" height="{}"/>"#,
            px(pl),
            px(pt),
            px(pr - pl),
            px(pb - pt)
        );
        s.push_str(r#"<g class="ticks">"#);
        for (v, label) in &ym.ticks {
            if let Some(y) = ym.pos(*v) {
                let _ = write!(
                    s,
                    r#"<text x="{}" y="{}" text-anchor="end">{}</text>"#,
                    px(pl - 4.0),
                    px(y + 3.5),
                    esc(label)
                );
            }
        }
        for (x, row, label) in &x_labels {
            let y = pb + 14.0 + 12.0 * *row as f64;
            let _ = write!(s, r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#, px(*x), px(y), esc(label));
        }
        s.push_str("</g>");
        let _ = write!(
            s,
            r#"<text class="label" x="{}" y="{}" text-anchor="middle">{}</text>"#,
            px((pl + pr) / 2.0),
            px(h - 6.0),
            esc(&self.x.label)
        );
        let _ = write!(
            s,
            r#"<text class="label" transform="translate(11,{}) rotate(-90)" text-anchor="middle">{}</text>"#,
            px((pt + pb) / 2.0),
            esc(&self.y.label)
        );
        for (y, label) in &self.hlines {
            if let Some(yp) = ym.pos(*y) {
                let _ = write!(
                    s,
                    r#"<line class="ref" x1="{}" x2="{}" y1="{}" y2="{}"/><text class="ref" x="{}" y="{}" text-anchor="end">{}</text>"#,
                    px(pl),
                    px(pr),
                    px(yp),
                    px(yp),
                    px(pr - 3.0),
                    px(yp - 3.0),
                    esc(label)
                );
            }
        }
        s.push_str(r#"<g class="data">"#);
        for series in &self.series {
            self.draw(&mut s, series, &xm, &ym, (pl, pr, pt, pb));
        }
        s.push_str("</g></svg>");
        s
    }

    fn draw(&self, s: &mut String, series: &Series, xm: &Mapped, ym: &Mapped, area: (f64, f64, f64, f64)) {
        let (pl, pr, pt, pb) = area;
        // max/min, not `clamp`: that panics when a narrow chart leaves pr < pl.
        let clamp = |(x, y): (f64, f64)| ((x.max(pl - 1.0)).min(pr + 1.0), (y.max(pt - 1.0)).min(pb + 1.0));
        let mut pts: Vec<(f64, f64)> = Vec::with_capacity(series.points.len());
        let mut keep_idx: Vec<usize> = Vec::with_capacity(series.points.len());
        // Where a line breaks: before the kept point at each index here (a
        // point that cannot be drawn, a missing value, is a gap).
        let mut breaks: Vec<usize> = Vec::new();
        for (i, &(x, y)) in series.points.iter().enumerate() {
            if let (Some(xp), Some(yp)) = (xm.pos(x), ym.pos(y)) {
                pts.push(clamp((xp, yp)));
                keep_idx.push(i);
            } else if breaks.last() != Some(&pts.len()) {
                breaks.push(pts.len());
            }
        }
        if pts.is_empty() {
            return;
        }
        let col = color(series.color);
        let title = esc(&series.name);
        if series.style == Style::Band {
            // Per pixel column, the lowest low and the highest high.
            let mut cols: Vec<(f64, f64, f64)> = Vec::new();
            for (k, &(x, lo)) in pts.iter().enumerate() {
                let Some(hi) = series.highs.get(keep_idx[k]).and_then(|&h| ym.pos(h)) else { continue };
                let hi = hi.max(pt - 1.0).min(pb + 1.0);
                // Pixel y grows downwards: the high value has the smaller y.
                let (top, bottom) = (hi.min(lo), hi.max(lo));
                match cols.last_mut() {
                    Some(c) if c.0.floor() == x.floor() => {
                        c.1 = c.1.min(top);
                        c.2 = c.2.max(bottom);
                    }
                    _ => cols.push((x, top, bottom)),
                }
            }
            if cols.is_empty() {
                return;
            }
            let mut d = String::with_capacity(cols.len() * 24);
            for (i, (x, top, _)) in cols.iter().enumerate() {
                d.push(if i == 0 { 'M' } else { 'L' });
                let _ = write!(d, "{} {}", px(*x), px(*top));
            }
            // At least 0.6 px thick, so that a flat stretch still shows.
            for (x, top, bottom) in cols.iter().rev() {
                let _ = write!(d, "L{} {}", px(*x), px(bottom.max(top + 0.6)));
            }
            d.push('Z');
            let _ = write!(
                s,
                r#"<path class="mark band" d="{d}" fill="{col}" fill-opacity="0.22" stroke="none"><title>{title}</title></path>"#
            );
            return;
        }
        let line = matches!(series.style, Style::Line | Style::Step | Style::LineDots);
        if line {
            let mut d = String::with_capacity(pts.len() * 12);
            let mut start = 0;
            for end in breaks.iter().copied().filter(|&b| b > 0 && b < pts.len()).chain([pts.len()]) {
                let piece = &pts[start..end];
                start = end;
                let poly: Vec<(f64, f64)> = if series.style == Style::Step {
                    let mut v = Vec::with_capacity(piece.len() * 2);
                    for (i, p) in piece.iter().enumerate() {
                        if i > 0 {
                            v.push((p.0, piece[i - 1].1));
                        }
                        v.push(*p);
                    }
                    v
                } else {
                    piece.to_vec()
                };
                let poly = thin(&poly);
                for (i, (x, y)) in poly.iter().enumerate() {
                    d.push(if i == 0 { 'M' } else { 'L' });
                    d.push_str(&px(*x));
                    d.push(' ');
                    d.push_str(&px(*y));
                }
                // A single point still shows: a short tick.
                if poly.len() == 1 {
                    d.push_str("h0.01");
                }
            }
            let dash = match (series.dash, series.dashed) {
                (Some(p), _) => format!(r#" stroke-dasharray="{p}""#),
                (None, true) => r#" stroke-dasharray="5 3""#.to_owned(),
                (None, false) => String::new(),
            };
            let opacity = if series.opacity < 1.0 {
                format!(r#" stroke-opacity="{}""#, px(series.opacity))
            } else {
                String::new()
            };
            let _ = write!(
                s,
                r#"<path class="mark" d="{d}" fill="none" stroke="{col}" stroke-width="{}" stroke-linejoin="round"{dash}{opacity}><title>{title}</title></path>"#,
                px(series.width)
            );
        }
        if matches!(series.style, Style::Dots | Style::LineDots | Style::FaintDots) {
            let (r, op) = if series.style == Style::FaintDots { (2.0, r#" fill-opacity="0.45""#) } else { (3.0, "") };
            for (k, (x, y)) in pts.iter().enumerate() {
                let t = series.titles.get(keep_idx[k]).map_or_else(|| title.clone(), |t| esc(t));
                let paint = if series.hollow {
                    format!(r##"fill="#fff" stroke="{col}" stroke-width="1.8""##)
                } else {
                    format!(r#"fill="{col}""#)
                };
                let r = if series.hollow { r + 1.0 } else { r };
                let _ = write!(
                    s,
                    r#"<circle class="mark" cx="{}" cy="{}" r="{}" {paint}{op}><title>{t}</title></circle>"#,
                    px(*x),
                    px(*y),
                    px(r)
                );
            }
        }
    }
}

/// One bar of a [`BarChart`]: a label and its segments' values.
#[derive(Clone, Debug)]
pub struct Bar {
    /// The label left of the bar.
    pub label: String,
    /// One value per segment, in the chart's segment order.
    pub values: Vec<f64>,
}

/// Horizontal bars, stacked when there are several segments.
#[derive(Clone, Debug)]
pub struct BarChart {
    unit: String,
    segments: Vec<String>,
    bars: Vec<Bar>,
    width: f64,
    decimals: usize,
}

impl BarChart {
    /// Bars with these segment names (the legend) measured in `unit` (the
    /// axis label), values printed with `decimals` decimals.
    pub fn new(unit: impl Into<String>, segments: Vec<String>, width: f64, decimals: usize) -> Self {
        BarChart { unit: unit.into(), segments, bars: Vec::new(), width, decimals }
    }

    /// Adds a bar.
    pub fn push(&mut self, bar: Bar) {
        self.bars.push(bar);
    }

    /// The segment names.
    pub fn segments(&self) -> &[String] {
        &self.segments
    }

    /// The chart as an `<svg>` element.
    pub fn svg(&self) -> String {
        const ROW: f64 = 24.0;
        const BAR: f64 = 16.0;
        let labels: Vec<String> = self
            .bars
            .iter()
            .map(|b| {
                if b.label.chars().count() > 34 {
                    b.label.chars().take(33).collect::<String>() + "…"
                } else {
                    b.label.clone()
                }
            })
            .collect();
        let widest = labels.iter().map(|l| l.chars().count()).max().unwrap_or(1) as f64;
        let left = widest * CHAR_W + 12.0;
        let totals: Vec<f64> = self.bars.iter().map(|b| b.values.iter().filter(|v| v.is_finite()).sum()).collect();
        let total_labels: Vec<String> = totals.iter().map(|t| format!("{t:.prec$}", prec = self.decimals)).collect();
        let widest_total = total_labels.iter().map(|l| l.chars().count()).max().unwrap_or(1) as f64;
        let right = widest_total * CHAR_W + 12.0;
        let (w, pl, pr) = (self.width, left, self.width - right);
        let pt = 6.0;
        let pb = pt + ROW * self.bars.len().max(1) as f64;
        let h = pb + 36.0;
        let max = totals.iter().copied().filter(|t| t.is_finite()).fold(0f64, f64::max);
        let axis = Axis::linear(self.unit.clone()).from_zero();
        let xm =
            Mapped::new(&axis, &[0.0, if max > 0.0 { max } else { 1.0 }], pl, pr, ((pr - pl) / 80.0).max(2.0) as usize);
        let mut s = String::with_capacity(2048);
        let _ = write!(
            s,
            r#"<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {} {}" role="img" aria-label="{}">"#,
            px(w),
            px(h),
            esc(&self.unit)
        );
        s.push_str(r#"<g class="grid">"#);
        for (v, _) in &xm.ticks {
            if let Some(x) = xm.pos(*v) {
                let _ = write!(s, r#"<line x1="{}" x2="{}" y1="{}" y2="{}"/>"#, px(x), px(x), px(pt), px(pb));
            }
        }
        s.push_str(r#"</g><g class="ticks">"#);
        for (v, label) in &xm.ticks {
            if let Some(x) = xm.pos(*v) {
                let _ = write!(
                    s,
                    r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#,
                    px(x),
                    px(pb + 14.0),
                    esc(label)
                );
            }
        }
        for (i, label) in labels.iter().enumerate() {
            let y = pt + ROW * i as f64 + ROW / 2.0 + 4.0;
            let _ = write!(s, r#"<text x="{}" y="{}" text-anchor="end">{}</text>"#, px(pl - 6.0), px(y), esc(label));
        }
        s.push_str("</g>");
        let _ = write!(
            s,
            r#"<text class="label" x="{}" y="{}" text-anchor="middle">{}</text>"#,
            px((pl + pr) / 2.0),
            px(h - 6.0),
            esc(&self.unit)
        );
        s.push_str(r#"<g class="data">"#);
        for (i, bar) in self.bars.iter().enumerate() {
            let y = pt + ROW * i as f64 + (ROW - BAR) / 2.0;
            let mut acc = 0.0;
            for (k, v) in bar.values.iter().enumerate() {
                if !(v.is_finite() && *v > 0.0) {
                    continue;
                }
                let (Some(x0), Some(x1)) = (xm.pos(acc), xm.pos(acc + v)) else { continue };
                acc += v;
                let seg = self.segments.get(k).map_or("", String::as_str);
                let t = if seg.is_empty() {
                    format!("{}: {v:.prec$} {}", bar.label, self.unit, prec = self.decimals)
                } else {
                    format!("{}, {seg}: {v:.prec$} {}", bar.label, self.unit, prec = self.decimals)
                };
                let _ = write!(
                    s,
                    r#"<rect class="mark" x="{}" y="{}" width="{}" height="{}" fill="{}"><title>{}</title></rect>"#,
                    px(x0),
                    px(y),
                    px((x1 - x0).max(0.5)),
                    px(BAR),
                    color(k),
                    esc(&t)
                );
            }
            if let Some(x) = xm.pos(acc) {
                let _ = write!(
                    s,
                    r#"<text class="value" x="{}" y="{}">{}</text>"#,
                    px(x + 4.0),
                    px(y + BAR / 2.0 + 4.0),
                    esc(&total_labels[i])
                );
            }
        }
        s.push_str("</g></svg>");
        s
    }
}

/// An HTML legend: a swatch and a name per entry (colour index, name,
/// dashed).
pub fn legend(entries: &[(usize, String, bool)]) -> String {
    let mut s = String::from(r#"<ul class="legend">"#);
    for (c, name, dashed) in entries {
        let class = if *dashed { "sw dashed" } else { "sw" };
        let _ = write!(s, r#"<li><span class="{class}" style="--c:{}"></span>{}</li>"#, color(*c), esc(name));
    }
    s.push_str("</ul>");
    s
}

/// An HTML legend of a [`BarChart`]'s segments: a square of each
/// segment's colour and its name.
pub fn block_legend(names: &[String]) -> String {
    let mut s = String::from(r#"<ul class="legend">"#);
    for (c, name) in names.iter().enumerate() {
        let _ = write!(s, r#"<li><span class="sw block" style="--c:{}"></span>{}</li>"#, color(c), esc(name));
    }
    s.push_str("</ul>");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nice_steps_and_decimals() {
        assert_eq!(nice_step(0.3), 0.5);
        assert_eq!(nice_step(7.0), 10.0);
        assert_eq!(nice_step(1.5), 2.0);
        assert_eq!(step_decimals(0.05), 2);
        assert_eq!(step_decimals(20.0), 0);
        let (d0, d1, ticks, step) = linear_ticks(0.3, 9.2, true, 5);
        assert_eq!((d0, d1, step), (0.0, 10.0, 2.0));
        assert_eq!(ticks, vec![0.0, 2.0, 4.0, 6.0, 8.0, 10.0]);
    }

    #[test]
    fn large_ticks_get_suffixes() {
        assert_eq!(format_tick(20_000.0, 40_000.0, 10_000.0), "20k");
        assert_eq!(format_tick(0.0, 40_000.0, 10_000.0), "0");
        assert_eq!(format_tick(2_500_000.0, 40_000_000.0, 500_000.0), "2.5M");
        assert_eq!(format_tick(0.25, 1.0, 0.05), "0.25");
        assert_eq!(format_tick(-0.0, 1.0, 0.1), "0.0");
        assert_eq!(format_tick(0.001, 0.001, 0.001), "0.001");
        // Long labels switch to exponent form.
        assert_eq!(format_tick(2e69, 1e70, 2e69), "2.0e69");
        assert_eq!(format_tick(1e70, 1e70, 2e69), "1.0e70");
        assert_eq!(format_tick(1.5e-60, 2.5e-60, 5e-61), "1.5e-60");
        assert_eq!(format_tick(0.0, 2.5e-60, 5e-61), "0");
    }

    #[test]
    fn thinning_keeps_the_envelope() {
        let pts: Vec<(f64, f64)> = (0..1000).map(|i| (i as f64 / 100.0, ((i * 37) % 11) as f64)).collect();
        let t = thin(&pts);
        assert!(t.len() <= 40, "{}", t.len());
        assert_eq!(t.first(), pts.first());
        assert_eq!(t.last(), pts.last());
        let max = t.iter().map(|p| p.1).fold(0.0, f64::max);
        assert_eq!(max, 10.0);
    }

    #[test]
    fn thinning_skips_points_that_are_not_numbers() {
        // A NaN is in no pixel column: this looped for ever, and a NaN first
        // point made `j - 1` wrap.
        let pts = [(f64::NAN, 1.0), (1.5, 2.0), (f64::NAN, 3.0), (1.7, 0.5), (f64::INFINITY, 1.0), (2.2, 4.0)];
        assert_eq!(thin(&pts), vec![(1.5, 2.0), (1.7, 0.5), (2.2, 4.0)]);
        assert!(thin(&[(f64::NAN, f64::NAN)]).is_empty());
    }

    #[test]
    fn charts_survive_ranges_near_the_largest_double() {
        for (xs, ys) in [
            (vec![-1e308, 7.9e307, 0.0], vec![1.0, 2.0, 3.0]),
            (vec![1e308, -1e308], vec![1.0, 2.0]),
            (vec![1.0, 2.0], vec![1e70, 2.0]),
            (vec![1.0, 2.0], vec![1e-60, 2e-60]),
        ] {
            let pts: Vec<(f64, f64)> = xs.into_iter().zip(ys).collect();
            let mut c = XyChart::new(Axis::linear("x"), Axis::linear("y"), 500.0, 240.0);
            c.push(Series::new("a", 0, Style::LineDots, pts.clone()));
            let svg = c.svg();
            assert!(!svg.contains("NaN") && !svg.contains("inf"), "{pts:?}");
            assert_eq!(svg.matches("class=\"mark\"").count(), pts.len() + 1, "{pts:?}");
            // A narrow chart with long labels: no `clamp` with min > max.
            let mut c = XyChart::new(Axis::linear("x"), Axis::linear("y"), 60.0, 100.0);
            c.push(Series::new("a", 0, Style::LineDots, pts.clone()));
            let _ = c.svg();
        }
    }

    #[test]
    fn pixels_have_one_decimal() {
        assert_eq!(px(12.0), "12");
        assert_eq!(px(12.34), "12.3");
        assert_eq!(px(-0.01), "0");
        assert_eq!(px(f64::NAN), "0");
    }

    #[test]
    fn charts_are_deterministic_and_marked() {
        let mut c = XyChart::new(Axis::linear("x (s)"), Axis::linear("y").from_zero(), 500.0, 240.0);
        c.push(Series::new("a", 0, Style::Step, vec![(0.0, 1.0), (1.0, 3.0), (2.0, 2.0)]));
        c.push(Series::new("b", 1, Style::LineDots, vec![(0.0, 0.5), (2.0, 1.5)]));
        let a = c.svg();
        assert_eq!(a, c.svg());
        assert_eq!(a.matches("class=\"mark\"").count(), 4);
        let mut b = BarChart::new("ms", vec!["one".into(), "two".into()], 500.0, 1);
        b.push(Bar { label: "mean".into(), values: vec![1.0, 2.0] });
        assert_eq!(b.svg().matches("class=\"mark\"").count(), 2);
    }
}
