//! Virtual time: integer nanoseconds, never floats in the event order.

use std::fmt;
use std::ops::{Add, AddAssign, Sub};

/// An instant of virtual time, in nanoseconds since the start of the run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SimTime(u64);

/// A span of virtual time, in nanoseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SimDuration(u64);

impl SimTime {
    /// The start of every run.
    pub const ZERO: SimTime = SimTime(0);
    /// The latest representable instant; `run_until(SimTime::MAX)` runs to completion.
    pub const MAX: SimTime = SimTime(u64::MAX);

    /// An instant `ns` nanoseconds after the start.
    pub const fn from_nanos(ns: u64) -> Self {
        SimTime(ns)
    }
    /// Nanoseconds since the start.
    pub const fn as_nanos(self) -> u64 {
        self.0
    }
    /// Milliseconds since the start, for display and reports only.
    pub fn as_millis_f64(self) -> f64 {
        self.0 as f64 / 1e6
    }
    /// Seconds since the start, for display and reports only.
    pub fn as_secs_f64(self) -> f64 {
        self.0 as f64 / 1e9
    }
    /// The span from `earlier` to `self`, or zero if `earlier` is later.
    pub const fn saturating_since(self, earlier: SimTime) -> SimDuration {
        SimDuration(self.0.saturating_sub(earlier.0))
    }
    /// `self + d`, saturating at [`SimTime::MAX`].
    pub const fn saturating_add(self, d: SimDuration) -> SimTime {
        SimTime(self.0.saturating_add(d.0))
    }
}

impl SimDuration {
    /// No time at all.
    pub const ZERO: SimDuration = SimDuration(0);
    /// The longest representable span.
    pub const MAX: SimDuration = SimDuration(u64::MAX);

    /// `ns` nanoseconds.
    pub const fn from_nanos(ns: u64) -> Self {
        SimDuration(ns)
    }
    /// `us` microseconds.
    pub const fn from_micros(us: u64) -> Self {
        SimDuration(us * 1_000)
    }
    /// `ms` milliseconds.
    pub const fn from_millis(ms: u64) -> Self {
        SimDuration(ms * 1_000_000)
    }
    /// `s` seconds.
    pub const fn from_secs(s: u64) -> Self {
        SimDuration(s * 1_000_000_000)
    }
    /// The nearest whole nanosecond to `secs` seconds (negative and NaN give zero).
    ///
    /// For turning sampled floats (exponential inter-arrival times, say) into
    /// engine time; the rounding happens once, here, so the event order never
    /// sees a float.
    pub fn from_secs_f64(secs: f64) -> Self {
        let ns = (secs * 1e9).round();
        if ns.is_nan() || ns <= 0.0 {
            SimDuration(0)
        } else if ns >= u64::MAX as f64 {
            SimDuration(u64::MAX)
        } else {
            SimDuration(ns as u64)
        }
    }
    /// The nearest whole nanosecond to `ms` milliseconds (negative and NaN give zero).
    pub fn from_millis_f64(ms: f64) -> Self {
        Self::from_secs_f64(ms / 1e3)
    }
    /// Nanoseconds.
    pub const fn as_nanos(self) -> u64 {
        self.0
    }
    /// Milliseconds, for display and reports only.
    pub fn as_millis_f64(self) -> f64 {
        self.0 as f64 / 1e6
    }
    /// Seconds, for display and reports only.
    pub fn as_secs_f64(self) -> f64 {
        self.0 as f64 / 1e9
    }
    /// `self + other`, saturating.
    pub const fn saturating_add(self, other: SimDuration) -> SimDuration {
        SimDuration(self.0.saturating_add(other.0))
    }
    /// `self - other`, or zero.
    pub const fn saturating_sub(self, other: SimDuration) -> SimDuration {
        SimDuration(self.0.saturating_sub(other.0))
    }
    /// `self * k`, saturating.
    pub const fn saturating_mul(self, k: u64) -> SimDuration {
        SimDuration(self.0.saturating_mul(k))
    }
}

impl Add<SimDuration> for SimTime {
    type Output = SimTime;
    /// Panics on overflow in debug builds, like integer `+`; use
    /// [`SimTime::saturating_add`] where the sum may pass `SimTime::MAX`.
    fn add(self, d: SimDuration) -> SimTime {
        SimTime(self.0 + d.0)
    }
}
impl AddAssign<SimDuration> for SimTime {
    fn add_assign(&mut self, d: SimDuration) {
        self.0 += d.0;
    }
}
impl Sub<SimTime> for SimTime {
    type Output = SimDuration;
    fn sub(self, earlier: SimTime) -> SimDuration {
        SimDuration(self.0 - earlier.0)
    }
}
impl Add for SimDuration {
    type Output = SimDuration;
    fn add(self, o: SimDuration) -> SimDuration {
        SimDuration(self.0 + o.0)
    }
}
impl AddAssign for SimDuration {
    fn add_assign(&mut self, o: SimDuration) {
        self.0 += o.0;
    }
}
impl Sub for SimDuration {
    type Output = SimDuration;
    fn sub(self, o: SimDuration) -> SimDuration {
        SimDuration(self.0 - o.0)
    }
}

/// Writes nanoseconds as milliseconds with up to six decimals, or as seconds
/// past 10 s: `49.972608ms`, `12.5s`.
fn fmt_nanos(ns: u64, f: &mut fmt::Formatter<'_>) -> fmt::Result {
    if ns >= 10_000_000_000 {
        let s = ns / 1_000_000_000;
        let frac = ns % 1_000_000_000;
        if frac == 0 {
            write!(f, "{s}s")
        } else {
            let digits = format!("{frac:09}");
            write!(f, "{s}.{}s", digits.trim_end_matches('0'))
        }
    } else {
        let ms = ns / 1_000_000;
        let frac = ns % 1_000_000;
        if frac == 0 {
            write!(f, "{ms}ms")
        } else {
            let digits = format!("{frac:06}");
            write!(f, "{ms}.{}ms", digits.trim_end_matches('0'))
        }
    }
}

impl fmt::Display for SimTime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt_nanos(self.0, f)
    }
}
impl fmt::Display for SimDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt_nanos(self.0, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_in_ms_then_s() {
        assert_eq!(SimDuration::from_nanos(49_972_608).to_string(), "49.972608ms");
        assert_eq!(SimDuration::from_millis(3).to_string(), "3ms");
        assert_eq!(SimTime::from_nanos(12_500_000_000).to_string(), "12.5s");
        assert_eq!(SimDuration::from_secs(480).to_string(), "480s");
    }

    #[test]
    fn float_conversion_rounds_once() {
        assert_eq!(SimDuration::from_secs_f64(0.049972608).as_nanos(), 49_972_608);
        assert_eq!(SimDuration::from_secs_f64(-1.0), SimDuration::ZERO);
        assert_eq!(SimDuration::from_secs_f64(f64::NAN), SimDuration::ZERO);
        assert_eq!(SimDuration::from_millis_f64(1.5).as_nanos(), 1_500_000);
    }
}
