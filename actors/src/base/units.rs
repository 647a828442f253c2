//! Units in types: [`Tokens`], [`Blocks`], [`Bytes`] and [`Bandwidth`]
//! ([`BlockSize`]: a block size whose divisions are cheap).
//!
//! Each quantity is a newtype over `u64`. Arithmetic stays inside one type
//! (`Tokens + Tokens`, never `Tokens + Blocks`); a change of unit is a named
//! function that takes what the change needs — the block size, the bytes of
//! one block or token, the bandwidth — so a reviewer never has to ask "is this
//! in tokens or blocks?".
//!
//! ```
//! use actors::units::{Blocks, Bytes, Tokens};
//!
//! let block = Tokens::new(2_176);
//! let blocks = Tokens::new(999).blocks_ceil(block);
//! assert_eq!(blocks, Blocks::new(1));
//! assert_eq!(blocks.bytes(Bytes::new(13_045_120)), Bytes::new(13_045_120));
//! ```
//!
//! `+` and `-` behave like integer `+` and `-`: they panic on overflow in debug
//! builds. Code that handles numbers from input uses the `checked_*` and
//! `saturating_*` forms instead.

use std::fmt;
use std::iter::Sum;
use std::num::NonZeroU64;
use std::ops::{Add, AddAssign, Sub, SubAssign};

use serde::{Deserialize, Serialize};
use sim_core::SimDuration;

macro_rules! quantity {
    ($(#[$doc:meta])* $name:ident, $one:literal, $many:literal) => {
        $(#[$doc])*
        #[derive(
            Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
        )]
        #[serde(transparent)]
        pub struct $name(u64);

        impl $name {
            /// Zero of this unit.
            pub const ZERO: $name = $name(0);

            /// `n` of this unit.
            pub const fn new(n: u64) -> Self {
                $name(n)
            }
            /// The bare count.
            pub const fn get(self) -> u64 {
                self.0
            }
            /// Whether this is zero.
            pub const fn is_zero(self) -> bool {
                self.0 == 0
            }
            /// `self - other`, or zero when `other` is larger.
            pub const fn saturating_sub(self, other: Self) -> Self {
                $name(self.0.saturating_sub(other.0))
            }
            /// `self + other`, saturating at `u64::MAX`.
            pub const fn saturating_add(self, other: Self) -> Self {
                $name(self.0.saturating_add(other.0))
            }
            /// `self + other`, or `None` on overflow.
            pub const fn checked_add(self, other: Self) -> Option<Self> {
                match self.0.checked_add(other.0) {
                    Some(n) => Some($name(n)),
                    None => None,
                }
            }
            /// `self - other`, or `None` when `other` is larger.
            pub const fn checked_sub(self, other: Self) -> Option<Self> {
                match self.0.checked_sub(other.0) {
                    Some(n) => Some($name(n)),
                    None => None,
                }
            }
        }

        impl Add for $name {
            type Output = $name;
            fn add(self, o: $name) -> $name {
                $name(self.0 + o.0)
            }
        }
        impl AddAssign for $name {
            fn add_assign(&mut self, o: $name) {
                self.0 += o.0;
            }
        }
        impl Sub for $name {
            type Output = $name;
            fn sub(self, o: $name) -> $name {
                $name(self.0 - o.0)
            }
        }
        impl SubAssign for $name {
            fn sub_assign(&mut self, o: $name) {
                self.0 -= o.0;
            }
        }
        impl Sum for $name {
            fn sum<I: Iterator<Item = $name>>(iter: I) -> $name {
                iter.fold($name::ZERO, |a, b| a + b)
            }
        }
        impl<'a> Sum<&'a $name> for $name {
            fn sum<I: Iterator<Item = &'a $name>>(iter: I) -> $name {
                iter.fold($name::ZERO, |a, b| a + *b)
            }
        }
        /// Writes the count and the unit: `1 block`, `64 blocks`.
        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                if self.0 == 1 {
                    write!(f, "1 {}", $one)
                } else {
                    write!(f, "{} {}", self.0, $many)
                }
            }
        }
    };
}

quantity!(
    /// A count of tokens (prompt tokens, computed tokens, a window, a block size).
    Tokens,
    "token",
    "tokens"
);
quantity!(
    /// A count of KV-cache blocks of one cache group.
    Blocks,
    "block",
    "blocks"
);
quantity!(
    /// A count of bytes.
    Bytes,
    "byte",
    "bytes"
);

impl Tokens {
    /// The blocks of `block_size` tokens that hold `self` tokens, a partly
    /// filled last block included: `cdiv(self, block_size)`.
    ///
    /// 999 tokens in blocks of 2,176 take 1 block; 2,177 take 2.
    ///
    /// # Panics
    /// If `block_size` is zero; validated cache groups never have one.
    pub const fn blocks_ceil(self, block_size: Tokens) -> Blocks {
        Blocks(self.0.div_ceil(block_size.0))
    }

    /// The whole blocks of `block_size` tokens in `self` tokens:
    /// `floor(self / block_size)`. A prefix cache hits in whole blocks only.
    ///
    /// # Panics
    /// If `block_size` is zero; validated cache groups never have one.
    pub const fn blocks_floor(self, block_size: Tokens) -> Blocks {
        Blocks(self.0 / block_size.0)
    }

    /// The bytes of `self` tokens at `per_token` bytes each, saturating at
    /// `u64::MAX`; see [`Tokens::checked_bytes`].
    pub const fn bytes(self, per_token: Bytes) -> Bytes {
        Bytes(self.0.saturating_mul(per_token.0))
    }

    /// The bytes of `self` tokens at `per_token` bytes each, or `None` on
    /// overflow.
    pub const fn checked_bytes(self, per_token: Bytes) -> Option<Bytes> {
        match self.0.checked_mul(per_token.0) {
            Some(n) => Some(Bytes(n)),
            None => None,
        }
    }

    /// The smaller of two counts.
    pub const fn min(self, other: Tokens) -> Tokens {
        if self.0 <= other.0 { self } else { other }
    }
}

/// A block size whose divisions are cheap: `cdiv(t, B)` by a shift when
/// `B` is a power of two, as block sizes nearly always are. A hot path that
/// divides by one block size over and over holds one of these rather than
/// the [`Tokens`] (a division is tens of cycles, a shift one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockSize {
    tokens: Tokens,
    /// `log2(tokens)` if it is a power of two, else [`BlockSize::NO_SHIFT`].
    shift: u32,
}

impl BlockSize {
    const NO_SHIFT: u32 = u32::MAX;

    /// Blocks of `tokens` tokens.
    ///
    /// # Panics
    /// If `tokens` is zero; validated cache groups never have one.
    pub const fn new(tokens: Tokens) -> Self {
        assert!(tokens.0 > 0, "a block holds at least one token");
        let shift = if tokens.0.is_power_of_two() { tokens.0.trailing_zeros() } else { Self::NO_SHIFT };
        BlockSize { tokens, shift }
    }

    /// Its tokens.
    pub const fn tokens(self) -> Tokens {
        self.tokens
    }

    /// [`Tokens::blocks_ceil`] in blocks of this size.
    #[inline]
    pub const fn blocks_ceil(self, t: Tokens) -> Blocks {
        if self.shift == Self::NO_SHIFT {
            t.blocks_ceil(self.tokens)
        } else {
            // (t + B - 1) / B without the overflow of the sum.
            Blocks((t.0 >> self.shift) + ((t.0 & (self.tokens.0 - 1) != 0) as u64))
        }
    }

    /// `cdiv(t, B) × B`: `t` rounded up to a whole number of blocks.
    #[inline]
    pub const fn round_up(self, t: Tokens) -> Tokens {
        Tokens(self.blocks_ceil(t).0 * self.tokens.0)
    }
}

impl Blocks {
    /// The tokens that `self` full blocks of `block_size` tokens hold,
    /// saturating at `u64::MAX`: 2 blocks of 16 tokens hold 32 tokens.
    pub const fn tokens(self, block_size: Tokens) -> Tokens {
        Tokens(self.0.saturating_mul(block_size.0))
    }

    /// The bytes of `self` blocks at `per_block` bytes each, saturating at
    /// `u64::MAX`; see [`Blocks::checked_bytes`].
    ///
    /// 4 blocks at 13,045,120 bytes: 52,180,480 bytes.
    pub const fn bytes(self, per_block: Bytes) -> Bytes {
        Bytes(self.0.saturating_mul(per_block.0))
    }

    /// The bytes of `self` blocks at `per_block` bytes each, or `None` on
    /// overflow.
    pub const fn checked_bytes(self, per_block: Bytes) -> Option<Bytes> {
        match self.0.checked_mul(per_block.0) {
            Some(n) => Some(Bytes(n)),
            None => None,
        }
    }

    /// The smaller of two counts.
    pub const fn min(self, other: Blocks) -> Blocks {
        if self.0 <= other.0 { self } else { other }
    }

    /// The larger of two counts.
    pub const fn max(self, other: Blocks) -> Blocks {
        if self.0 >= other.0 { self } else { other }
    }
}

impl Bytes {
    /// The bytes of one block of `block_size` tokens at `per_token` bytes per
    /// token, saturating at `u64::MAX`: 16 tokens at 2,048 bytes make a
    /// 32,768-byte block.
    pub const fn per_block(per_token: Bytes, block_size: Tokens) -> Bytes {
        Bytes(per_token.0.saturating_mul(block_size.0))
    }
}

/// A link bandwidth in whole bytes per second (never zero).
///
/// Scenario files give GB/s as a float; [`Bandwidth::from_gb_per_s`] rounds
/// it once to whole bytes per second, so the event order never sees a float.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Bandwidth(NonZeroU64);

impl Bandwidth {
    /// `gb` GB/s with 1 GB = 10⁹ bytes, rounded to the nearest byte per
    /// second; `None` for zero, negative, NaN or infinite rates and for rates
    /// that round to zero or do not fit in `u64` bytes per second.
    ///
    /// ```
    /// use actors::units::Bandwidth;
    /// assert_eq!(Bandwidth::from_gb_per_s(1.0).unwrap().bytes_per_sec(), 1_000_000_000);
    /// assert!(Bandwidth::from_gb_per_s(0.0).is_none());
    /// assert!(Bandwidth::from_gb_per_s(f64::NAN).is_none());
    /// ```
    pub fn from_gb_per_s(gb: f64) -> Option<Bandwidth> {
        Self::parse_gb_per_s(gb).ok()
    }

    /// [`Bandwidth::from_gb_per_s`], saying what is wrong with `gb`.
    ///
    /// ```
    /// use actors::units::Bandwidth;
    /// let e = Bandwidth::parse_gb_per_s(1e-12).unwrap_err();
    /// assert_eq!(e, "0.000000000001 GB/s rounds to 0 bytes per second (the least is 1e-9 GB/s)");
    /// ```
    pub fn parse_gb_per_s(gb: f64) -> Result<Bandwidth, String> {
        if !gb.is_finite() || gb <= 0.0 {
            return Err(format!("must be a finite number > 0, got {gb}"));
        }
        let bps = (gb * 1e9).round();
        // 2^64 is exactly representable; anything at or past it does not fit.
        if bps >= 18_446_744_073_709_551_616.0 {
            return Err(format!("{gb} GB/s does not fit in 64-bit bytes per second"));
        }
        NonZeroU64::new(bps as u64)
            .map(Bandwidth)
            .ok_or_else(|| format!("{gb} GB/s rounds to 0 bytes per second (the least is 1e-9 GB/s)"))
    }

    /// `bps` bytes per second; `None` for zero.
    pub const fn from_bytes_per_sec(bps: u64) -> Option<Bandwidth> {
        match NonZeroU64::new(bps) {
            Some(n) => Some(Bandwidth(n)),
            None => None,
        }
    }

    /// Bytes per second.
    pub const fn bytes_per_sec(self) -> u64 {
        self.0.get()
    }

    /// GB/s (1 GB = 10⁹ bytes), for display and reports only.
    pub fn as_gb_per_s(self) -> f64 {
        self.0.get() as f64 / 1e9
    }
}

/// Writes GB/s: `1 GB/s`, `12.5 GB/s`.
impl fmt::Display for Bandwidth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} GB/s", self.as_gb_per_s())
    }
}

/// The time to move `bytes` at `bw` on an idle link:
/// `ceil(bytes × 10⁹ / bytes_per_sec)` nanoseconds, computed exactly in
/// `u128` and saturating at [`SimDuration::MAX`].
///
/// Rounding up means a transfer never finishes before its last byte could
/// have arrived.
///
/// ```
/// use actors::units::{transfer_time, Bandwidth, Bytes};
/// let gb1 = Bandwidth::from_gb_per_s(1.0).unwrap();
/// // 49,972,608 bytes at 10⁹ bytes/s: 49,972,608 ns = 49.972608 ms.
/// assert_eq!(transfer_time(Bytes::new(49_972_608), gb1).as_nanos(), 49_972_608);
/// ```
pub fn transfer_time(bytes: Bytes, bw: Bandwidth) -> SimDuration {
    let num = u128::from(bytes.get()) * 1_000_000_000;
    let ns = num.div_ceil(u128::from(bw.bytes_per_sec()));
    SimDuration::from_nanos(u64::try_from(ns).unwrap_or(u64::MAX))
}

/// The timing of one link: a fixed latency plus the time to move the bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Link {
    /// Paid once per transfer, before the first byte arrives.
    pub latency: SimDuration,
    /// Bytes per second when the link carries one transfer.
    pub bandwidth: Bandwidth,
}

impl Link {
    /// `latency + transfer_time(bytes, bandwidth)` for a transfer alone on
    /// the link, saturating at [`SimDuration::MAX`].
    ///
    /// ```
    /// use actors::units::{Bandwidth, Bytes, Link};
    /// use sim_core::SimDuration;
    /// let link = Link {
    ///     latency: SimDuration::from_micros(5),
    ///     bandwidth: Bandwidth::from_gb_per_s(1.0).unwrap(),
    /// };
    /// assert_eq!(link.delay(Bytes::new(1_000)).as_nanos(), 5_000 + 1_000);
    /// ```
    pub fn delay(&self, bytes: Bytes) -> SimDuration {
        self.latency.saturating_add(transfer_time(bytes, self.bandwidth))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_size_divides_as_the_tokens_do() {
        // Powers of two by a shift, the rest by a division: the same
        // blocks either way, at the boundaries and around them.
        for b in [1, 2, 3, 16, 48, 64, 100, 1 << 20, 2_176] {
            let size = BlockSize::new(Tokens::new(b));
            for t in [0, 1, b - 1, b, b + 1, 5 * b - 1, 5 * b, 5 * b + 1, u64::MAX - b, u64::MAX] {
                let t = Tokens::new(t);
                assert_eq!(size.blocks_ceil(t), t.blocks_ceil(Tokens::new(b)), "{t:?} in blocks of {b}");
            }
            assert_eq!(size.round_up(Tokens::new(b + 1)), Tokens::new(2 * b));
            assert_eq!(size.tokens(), Tokens::new(b));
        }
    }

    #[test]
    fn block_conversions() {
        let b = Tokens::new(16);
        assert_eq!(Tokens::new(0).blocks_ceil(b), Blocks::new(0));
        assert_eq!(Tokens::new(1).blocks_ceil(b), Blocks::new(1));
        assert_eq!(Tokens::new(16).blocks_ceil(b), Blocks::new(1));
        assert_eq!(Tokens::new(17).blocks_ceil(b), Blocks::new(2));
        assert_eq!(Tokens::new(17).blocks_floor(b), Blocks::new(1));
        assert_eq!(Tokens::new(u64::MAX).blocks_ceil(b).get(), u64::MAX / 16 + 1);
        assert_eq!(Blocks::new(2).tokens(b), Tokens::new(32));
        assert_eq!(Bytes::per_block(Bytes::new(2_048), b), Bytes::new(32_768));
        assert_eq!(Tokens::new(3).bytes(Bytes::new(7)), Bytes::new(21));
        assert_eq!(Blocks::new(u64::MAX).checked_bytes(Bytes::new(2)), None);
        assert_eq!(Blocks::new(u64::MAX).bytes(Bytes::new(2)).get(), u64::MAX);
    }

    #[test]
    fn arithmetic_stays_in_unit() {
        let mut t = Tokens::new(5) + Tokens::new(3);
        t -= Tokens::new(1);
        t += Tokens::new(2);
        assert_eq!(t, Tokens::new(9));
        assert_eq!(Tokens::new(1).saturating_sub(Tokens::new(2)), Tokens::ZERO);
        assert_eq!(Tokens::new(1).checked_sub(Tokens::new(2)), None);
        let s: Bytes = [Bytes::new(1), Bytes::new(2)].iter().sum();
        assert_eq!(s, Bytes::new(3));
    }

    #[test]
    fn display_names_unit() {
        assert_eq!(Blocks::new(1).to_string(), "1 block");
        assert_eq!(Blocks::new(64).to_string(), "64 blocks");
        assert_eq!(Tokens::new(0).to_string(), "0 tokens");
        assert_eq!(Bytes::new(22_528).to_string(), "22528 bytes");
        assert_eq!(Bandwidth::from_gb_per_s(12.5).unwrap().to_string(), "12.5 GB/s");
    }

    #[test]
    fn bandwidth_refuses_nonsense() {
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 1e-12, 1e11] {
            assert_eq!(Bandwidth::from_gb_per_s(bad), None, "{bad}");
        }
        assert_eq!(Bandwidth::from_gb_per_s(0.5).unwrap().bytes_per_sec(), 500_000_000);
        assert_eq!(Bandwidth::from_bytes_per_sec(0), None);
    }

    #[test]
    fn transfer_time_is_exact_and_rounds_up() {
        let gb1 = Bandwidth::from_gb_per_s(1.0).unwrap();
        assert_eq!(transfer_time(Bytes::new(49_972_608), gb1).as_nanos(), 49_972_608);
        assert_eq!(transfer_time(Bytes::ZERO, gb1), SimDuration::ZERO);
        let three = Bandwidth::from_bytes_per_sec(3).unwrap();
        // 1 byte at 3 B/s: 333,333,333.3 ns, rounded up.
        assert_eq!(transfer_time(Bytes::new(1), three).as_nanos(), 333_333_334);
        let slow = Bandwidth::from_bytes_per_sec(1).unwrap();
        assert_eq!(transfer_time(Bytes::new(u64::MAX), slow), SimDuration::MAX);
    }
}
