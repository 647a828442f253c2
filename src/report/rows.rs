//! `requests.csv` and `timeline.csv`: one row a request, one row a
//! sample, written with integer-only number formatting (exact fixed-point
//! decimals) so the files are the same bytes on every machine.

use super::*;

/// The columns of `requests.csv`.
pub const REQUEST_COLUMNS: &[&str] = &[
    "id",
    "outcome",
    "fail_reason",
    "prompt_tokens",
    "output_tokens",
    "generated_tokens",
    "prefill_rank",
    "decode_rank",
    "transferred_tokens",
    "transfer_bytes",
    "prefill_hit_tokens",
    "decode_hit_tokens",
    "preemptions",
    "arrival_ms",
    "prefill_queued_ms",
    "prefill_started_ms",
    "prefill_done_ms",
    "reserve_requested_ms",
    "reserved_ms",
    "transfer_started_ms",
    "transfer_done_ms",
    "decode_started_ms",
    "first_token_ms",
    "last_token_ms",
    "finished_ms",
    "prefill_queue_ms",
    "prefill_time_ms",
    "transfer_wait_ms",
    "transfer_time_ms",
    "decode_queue_ms",
    "ttft_ms",
    "tpot_ms",
    "e2e_ms",
    "max_itl_ms",
    "priority",
];

/// The derived spans of a request, in requests.csv's order: prefill queue,
/// prefill, transfer wait, transfer, decode queue (each `None` for a stage
/// never reached), TTFT, TPOT, E2E and the longest inter-token gap (with
/// two tokens or more). The CSV and the Python columns share them.
pub fn derived_spans(r: &Request) -> [Option<sim_core::SimDuration>; 9] {
    let s = &r.t;
    let span = |a: Option<SimTime>, b: Option<SimTime>| a.zip(b).map(|(a, b)| b.saturating_since(a));
    let queued = s.prefill_queued.map(|_| s.arrival);
    [
        span(queued, s.prefill_started),
        span(s.prefill_started, s.prefill_done),
        span(s.prefill_done, s.transfer_started),
        span(s.transfer_started, s.transfer_done),
        span(s.transfer_done, s.decode_started),
        r.ttft(),
        r.tpot(),
        r.e2e(),
        (r.generated.get() >= 2).then_some(r.max_itl),
    ]
}

/// Writes `requests.csv`: one row per request, by id. Times in ms with six
/// decimals; a stage never reached is an empty cell. The derived spans are
/// those of the summary: prefill queue from arrival to the first prefill
/// step, prefill time to the end of the prefill, transfer wait to the start
/// of the transfer (routing and reservation), transfer time on the link,
/// decode queue from the end of the transfer to the first decode step.
///
/// # Errors
/// Writing fails.
pub fn write_requests_csv(w: &mut impl Write, records: &[Request], disaggregated: bool) -> io::Result<()> {
    let mut rows = RequestRows::new(disaggregated);
    w.write_all(rows.header())?;
    for r in records {
        w.write_all(rows.row(r))?;
    }
    Ok(())
}

/// The lines of `requests.csv`, formatted into one fixed buffer (a failed
/// request's line into a second, its reason spliced in; digits written by hand, no allocation or UTF-8 check per field), so
/// that rows can be written as requests end ([`write_requests_csv`] is
/// the same rows over a slice).
pub struct RequestRows {
    first_role: Role,
    /// The line as written, its failure reason left out ([`Line`]).
    buf: Box<[u8; LINE_ROOM]>,
    /// The header, or a line with its failure reason spliced in.
    line: Vec<u8>,
}

impl RequestRows {
    /// Rows of a run with (`disaggregated`) or without a handoff.
    pub fn new(disaggregated: bool) -> Self {
        RequestRows {
            first_role: if disaggregated { Role::Prefill } else { Role::Aggregated },
            buf: Box::new([0; LINE_ROOM]),
            line: Vec::new(),
        }
    }

    /// The header line, on its own.
    pub fn header_bytes(&self) -> Vec<u8> {
        let mut h = REQUEST_COLUMNS.join(",").into_bytes();
        h.push(b'\n');
        h
    }

    /// The header line.
    pub fn header(&mut self) -> &[u8] {
        self.line = self.header_bytes();
        &self.line
    }

    /// The line of `r`.
    pub fn row(&mut self, r: &Request) -> &[u8] {
        let mut l = Line { buf: &mut self.buf, len: 0 };
        let s = &r.t;
        l.u64(r.id);
        l.byte(b',');
        l.bytes(outcome_name(&r.outcome).as_bytes());
        l.byte(b',');
        // (A failed request's reason goes here: spliced in below. Any
        // other's is `none`, so that the column is text to a reader that
        // guesses types, pandas' read_csv among them, even in a run with
        // no failure.)
        let reason_at = l.len;
        if !matches!(r.outcome, Outcome::Failed(_)) {
            l.bytes(NO_FAILURE.as_bytes());
        }
        l.byte(b',');
        for v in [r.prompt.get(), r.output.get(), r.generated.get()] {
            l.u64(v);
            l.byte(b',');
        }
        for (role, index) in [(self.first_role, r.prefill_rank), (Role::Decode, r.decode_rank)] {
            if let Some(i) = index {
                l.bytes(role.as_str().as_bytes());
                l.u64(u64::from(i));
            }
            l.byte(b',');
        }
        for v in [
            r.transferred_tokens.get(),
            r.transfer_bytes.get(),
            r.prefill_hit.get(),
            r.decode_hit.get(),
            u64::from(r.preemptions),
        ] {
            l.u64(v);
            l.byte(b',');
        }
        for x in s.in_order() {
            if let Some(t) = x {
                l.ms6(t.as_nanos());
            }
            l.byte(b',');
        }
        let spans = derived_spans(r);
        for (i, x) in spans.into_iter().enumerate() {
            if i > 0 {
                l.byte(b',');
            }
            if let Some(d) = x {
                l.ms6(d.as_nanos());
            }
        }
        // vLLM's request priority (0 unless a trace, a workload mix or a
        // served request gave one).
        l.byte(b',');
        if r.priority < 0 {
            l.byte(b'-');
        }
        l.u64(u64::from(r.priority.unsigned_abs()));
        l.byte(b'\n');
        let n = l.len;
        // (Offsets are masked, the length is not: a line past the room
        // would have wrapped onto its own start.)
        assert!(n <= ROW_MAX, "a requests.csv line stays within ROW_MAX");
        let Outcome::Failed(why) = r.outcome else { return &self.buf[..n] };
        self.line.clear();
        self.line.extend_from_slice(&self.buf[..reason_at]);
        self.line.extend_from_slice(csv_field(&why.to_string()).as_bytes());
        self.line.extend_from_slice(&self.buf[reason_at..n]);
        &self.line
    }
}

/// `requests.csv`'s `fail_reason` of a request that did not fail.
pub const NO_FAILURE: &str = "none";

/// Room for a `requests.csv` line without its failure reason: 9 counts of
/// at most 20 digits, 21 times in ms of at most 21 bytes (14 digits, a
/// point, 6 decimals), two ranks (a role name and a `u32`, 20 bytes), the
/// outcome (9), [`NO_FAILURE`] (4), the priority (a sign and 10 digits),
/// 34 commas and the newline, and the 7 bytes past the end that storing a
/// number as a word may write: 727 bytes at most ([`ROW_MAX`]). A power
/// of two, so that [`Line`] can mask its offsets.
pub(super) const ROW_ROOM: usize = 1024;

/// The most a `requests.csv` line without its failure reason writes (see
/// [`ROW_ROOM`]).
pub(super) const ROW_MAX: usize = 727;
const _: () = assert!(ROW_MAX <= ROW_ROOM && ROW_ROOM.is_power_of_two());

/// A line's buffer: [`ROW_ROOM`] and the word a number stores past the
/// last offset a line can reach.
pub(super) const LINE_ROOM: usize = ROW_ROOM + 8;

/// A line written in place into a fixed buffer, its failure reason left
/// out (the caller splices it in), so that no number checks or grows a
/// capacity or calls `memcpy` for a few digits (the outcome and a role name
/// are copied as slices). Offsets are masked to [`ROW_ROOM`], which a line
/// never reaches ([`ROW_MAX`]): the mask changes nothing, but it lets the
/// compiler see that a byte or a word stored at one is inside the buffer,
/// so that those stores check no bounds (slices of other lengths, the
/// outcome, a role name, a number of 10^8 or more, still do). The length
/// is not masked: a line that did pass the room (a column added without
/// raising [`ROW_MAX`]) is caught where it ends ([`RequestRows::row`]
/// asserts it), in release builds too.
pub(super) struct Line<'a> {
    buf: &'a mut [u8; LINE_ROOM],
    len: usize,
}

impl Line<'_> {
    /// The offset of the next byte.
    #[inline(always)]
    fn at(&self) -> usize {
        debug_assert!(self.len < ROW_ROOM, "a line stays within ROW_MAX");
        self.len & (ROW_ROOM - 1)
    }

    #[inline]
    fn byte(&mut self, b: u8) {
        let i = self.at();
        self.buf[i] = b;
        self.len += 1;
    }

    #[inline]
    fn bytes(&mut self, b: &[u8]) {
        let i = self.at();
        self.buf[i..i + b.len()].copy_from_slice(b);
        self.len += b.len();
    }

    /// `v` in decimal. Below 10^8 (nearly every count and time in ms) the
    /// digits are made the same way whatever their number, eight at once
    /// ([`eight_digits`]), and stored as one word whose leading zeros are
    /// shifted out: no loop whose length the processor must guess at every
    /// field, and no digit count to work out apart.
    #[inline(always)]
    fn u64(&mut self, v: u64) {
        if v < 100_000_000 {
            let raw = eight_digits(v as u32);
            // Leading zeros are the low bytes (the first in memory); one
            // digit stays for 0.
            let zeros = (raw.trailing_zeros() / 8).min(7) as usize;
            let word = (raw | ASCII_ZEROS) >> (8 * zeros);
            let i = self.at();
            self.buf[i..i + 8].copy_from_slice(&word.to_le_bytes());
            self.len += 8 - zeros;
        } else {
            let width = v.ilog10() as usize + 1;
            let i = self.at();
            digits_into(&mut self.buf[i..i + width], v);
            self.len += width;
        }
    }

    /// `ns` as milliseconds with six decimals.
    #[inline(always)]
    fn ms6(&mut self, ns: u64) {
        self.u64(ns / 1_000_000);
        let frac = (ns % 1_000_000) as u32;
        // ".dddddd": the point, then the last six of eight digits.
        let word = ((eight_digits(frac) | ASCII_ZEROS) & !0xffff) | u64::from(b'.') << 8;
        let i = self.at();
        self.buf[i..i + 8].copy_from_slice(&(word >> 8).to_le_bytes());
        self.len += 7;
    }
}

/// `'0'` in every byte of a word.
pub(super) const ASCII_ZEROS: u64 = 0x3030_3030_3030_3030;

/// The eight decimal digits of `v` (below 10^8), zero-padded, as the bytes
/// of a little-endian word, the first digit lowest (values 0 to 9; add
/// [`ASCII_ZEROS`] for text). All eight at once, in lanes of one `u64`: the
/// two halves of four digits in 32-bit lanes, each split into pairs by a
/// multiply-shift division by 100 (exact below 10^4), the pairs in 16-bit
/// lanes split into digits by one by 10 (exact below 179). No lane's product
/// reaches the next lane: 9,999 x 10,486 < 2^27 and 99 x 103 < 2^16.
#[inline]
pub(super) fn eight_digits(v: u32) -> u64 {
    debug_assert!(v < 100_000_000);
    let x = u64::from(v / 10_000) | u64::from(v % 10_000) << 32;
    let hundreds = ((x * 10_486) >> 20) & 0x0000_007f_0000_007f;
    let pairs = hundreds | (x - hundreds * 100) << 16;
    let tens = ((pairs * 103) >> 10) & 0x000f_000f_000f_000f;
    tens | (pairs - tens * 10) << 8
}

/// Two decimal digits of every number below 100.
pub(super) const PAIRS: &[u8; 200] = b"\
0001020304050607080910111213141516171819\
2021222324252627282930313233343536373839\
4041424344454647484950515253545556575859\
6061626364656667686970717273747576777879\
8081828384858687888990919293949596979899";

/// Writes the last `buf.len()` decimal digits of `v`, zero-padded, into `buf`:
/// four digits a division of `v` (half the chain of dependent divisions of
/// two at a time), each four as two pairs apart.
#[inline]
pub(super) fn digits_into(buf: &mut [u8], mut v: u64) {
    let mut k = buf.len();
    while k >= 4 {
        let c = (v % 10_000) as u32;
        v /= 10_000;
        let (hi, lo) = ((c / 100) as usize * 2, (c % 100) as usize * 2);
        buf[k - 4..k - 2].copy_from_slice(&PAIRS[hi..hi + 2]);
        buf[k - 2..k].copy_from_slice(&PAIRS[lo..lo + 2]);
        k -= 4;
    }
    if k >= 2 {
        let r = (v % 100) as usize * 2;
        v /= 100;
        buf[k - 2..k].copy_from_slice(&PAIRS[r..r + 2]);
        k -= 2;
    }
    if k == 1 {
        buf[0] = b'0' + (v % 10) as u8;
    }
}

/// Appends `v` in decimal. The digits are copied as the whole fixed-size
/// buffer and the tail cut off: a copy of constant length is a few moves,
/// one of the digits' length a call of `memcpy`.
#[inline]
pub(super) fn bytes_u64(out: &mut Vec<u8>, v: u64) {
    let width = if v == 0 { 1 } else { v.ilog10() as usize + 1 };
    let mut buf = [0u8; 20];
    digits_into(&mut buf[..width], v);
    let end = out.len() + width;
    out.extend_from_slice(&buf);
    out.truncate(end);
}

/// Appends `v / 10^decimals` with exactly `decimals` (at most 19) decimals,
/// in one copy (the divisions by a constant `decimals` where it is inlined).
#[inline(always)]
pub(super) fn bytes_fixed(out: &mut Vec<u8>, v: u64, decimals: u32) {
    let scale = 10u64.pow(decimals);
    let (whole, frac) = (v / scale, v % scale);
    let width = if whole == 0 { 1 } else { whole.ilog10() as usize + 1 };
    let n = decimals as usize;
    let mut buf = [0u8; 40];
    digits_into(&mut buf[..width], whole);
    buf[width] = b'.';
    digits_into(&mut buf[width + 1..width + 1 + n], frac);
    // (As in `bytes_u64`: the whole buffer, then the tail cut off.)
    let end = out.len() + width + 1 + n;
    out.extend_from_slice(&buf);
    out.truncate(end);
}

/// Writes `timeline.csv` in long format, `time_ms,entity,metric,value`:
/// every sample of every rank and link, ordered by time, then entity (ranks
/// in report order, then links), then the order the entity recorded them.
///
/// # Errors
/// Writing fails.
pub fn write_timeline_csv(w: &mut impl Write, ranks: &[RankReport], links: &[LinkReport]) -> io::Result<()> {
    let entities: Vec<(String, Vec<String>)> = ranks
        .iter()
        .map(|r| (r.name.clone(), r.groups.clone()))
        .chain(links.iter().map(|l| (l.name.clone(), Vec::new())))
        .collect();
    let timelines: Vec<&actors::metrics::Timeline> =
        ranks.iter().map(|r| &r.timeline).chain(links.iter().map(|l| &l.timeline)).collect();
    // (time, entity, position in the entity's samples): a total order.
    let mut rows: Vec<(u64, usize, usize)> = Vec::new();
    for (e, tl) in timelines.iter().enumerate() {
        rows.extend(tl.samples.iter().enumerate().map(|(i, s)| (s.time.as_nanos(), e, i)));
    }
    rows.sort_unstable();
    let mut out = TimelineRows::new(&entities);
    w.write_all(TimelineRows::HEADER)?;
    let mut buf = Vec::new();
    for chunk in rows.chunks(4096) {
        buf.clear();
        for &(_, e, i) in chunk {
            out.push(&mut buf, &EntitySample { entity: e as u32, sample: timelines[e].samples[i] });
        }
        w.write_all(&buf)?;
    }
    Ok(())
}

/// The lines of `timeline.csv`, formatted by hand into a caller's buffer,
/// so that samples can be written as a run takes them (in the order
/// [`actors::sim::Built::set_sample_sink`] hands them over, which is the
/// file's) or all at once ([`write_timeline_csv`]).
pub struct TimelineRows {
    /// Entity names, CSV-quoted.
    names: Vec<String>,
    groups: Vec<Vec<String>>,
    metric_names: BTreeMap<(u32, Metric), String>,
}

impl TimelineRows {
    /// The header line.
    pub const HEADER: &'static [u8] = b"time_ms,entity,metric,value\n";

    /// Rows of these entities (name, cache-group names), in report order.
    pub fn new(entities: &[(String, Vec<String>)]) -> Self {
        TimelineRows {
            names: entities.iter().map(|(n, _)| csv_field(n)).collect(),
            groups: entities.iter().map(|(_, g)| g.clone()).collect(),
            metric_names: BTreeMap::new(),
        }
    }

    /// Appends the line of `s` to `out`.
    pub fn push(&mut self, out: &mut Vec<u8>, s: &EntitySample) {
        let e = s.entity as usize;
        let no_groups: &[String] = &[];
        let groups = self.groups.get(e).map_or(no_groups, Vec::as_slice);
        let metric = self
            .metric_names
            .entry((s.entity, s.sample.metric))
            .or_insert_with(|| csv_field(&metric_name(s.sample.metric, groups)));
        bytes_fixed(out, s.sample.time.as_nanos(), 6);
        out.push(b',');
        out.extend_from_slice(self.names.get(e).map_or("", String::as_str).as_bytes());
        out.push(b',');
        out.extend_from_slice(metric.as_bytes());
        out.push(b',');
        bytes_u64(out, s.sample.value);
        out.push(b'\n');
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::trace_json::*;

    #[test]
    fn fixed_point_is_exact() {
        assert_eq!(ms6(0), "0.000000");
        assert_eq!(ms6(7), "0.000007");
        assert_eq!(ms6(1_234_567_890), "1234.567890");
        assert_eq!(ms6(u64::MAX), "18446744073709.551615");
        let us3 = |ns| {
            let mut b = Vec::new();
            bytes_fixed(&mut b, ns, 3);
            String::from_utf8(b).unwrap()
        };
        assert_eq!(us3(1_000_001), "1000.001");
        assert_eq!(us3(999), "0.999");
        let mut b = Vec::new();
        bytes_fixed(&mut b, u64::MAX, 6);
        assert_eq!(b, ms6(u64::MAX).as_bytes());
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..10_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            for v in [x, x >> 20, x >> 40, x % 1000, x % 10] {
                let mut b = Vec::new();
                bytes_u64(&mut b, v);
                assert_eq!(b, v.to_string().as_bytes());
                b.clear();
                bytes_fixed(&mut b, v, 6);
                assert_eq!(b, format!("{}.{:06}", v / 1_000_000, v % 1_000_000).as_bytes());
                b.clear();
                bytes_fixed(&mut b, v, 3);
                assert_eq!(b, format!("{}.{:03}", v / 1_000, v % 1_000).as_bytes());
            }
        }
        // The row writer's own paths: below 10^8 (one word, shifted), at
        // and above it, and every width on either side.
        let mut buf = [0; LINE_ROOM];
        let mut l = Line { buf: &mut buf, len: 0 };
        let mut want = String::new();
        let mut edges: Vec<u64> = (0..20).flat_map(|e| [10u64.pow(e) - 1, 10u64.pow(e)]).collect();
        edges.extend([u64::MAX, 99_999_999, 100_000_000, 100_000_001]);
        for v in edges.into_iter().chain((0..200).map(|k| 0x9e37_79b9_7f4a_7c15u64.wrapping_mul(k + 1) >> (k % 64))) {
            if l.len > ROW_ROOM - 64 {
                assert_eq!(&l.buf[..l.len], want.as_bytes());
                l.len = 0;
                want.clear();
            }
            l.u64(v);
            l.byte(b',');
            l.ms6(v);
            l.byte(b',');
            want.push_str(&format!("{v},{}.{:06},", v / 1_000_000, v % 1_000_000));
        }
        assert_eq!(&l.buf[..l.len], want.as_bytes());
        // Every value below 10^6 and a stride through the rest below 10^8:
        // the eight lanes' digits are the number's.
        for v in (0..1_000_000).chain((1_000_000..100_000_000).step_by(9_973)).chain([99_999_999]) {
            let word = (eight_digits(v) | ASCII_ZEROS).to_le_bytes();
            assert_eq!(&word, format!("{v:08}").as_bytes(), "{v}");
        }
        let mut h = Vec::new();
        bytes_hex(&mut h, 0x1f);
        bytes_hex(&mut h, 0);
        assert_eq!(h, b"1f0");
    }

    /// A row as long as rows get (every count at its largest, both ranks,
    /// a failure, every stamp after the arrival at 2^64 − 1 ns, so the
    /// queue, TTFT and E2E spans too) stays within the bound [`ROW_ROOM`]
    /// states ([`ROW_MAX`], with the 7 a word store may write past its end),
    /// and has its fields where `format!` would put them.
    #[test]
    fn the_longest_row_fits_its_room() {
        use actors::request::FailReason;
        use actors::units::{Bytes, Tokens};
        use sim_core::SimDuration;
        let big = SimTime::from_nanos(u64::MAX);
        let mut r =
            Request::new(u64::MAX, Tokens::new(u64::MAX), Tokens::new(u64::MAX), Default::default(), SimTime::ZERO);
        let t = &mut r.t;
        for x in [
            &mut t.prefill_queued,
            &mut t.prefill_started,
            &mut t.prefill_done,
            &mut t.reserve_requested,
            &mut t.reserved,
            &mut t.transfer_started,
            &mut t.transfer_done,
            &mut t.decode_started,
            &mut t.first_token,
            &mut t.last_token,
        ] {
            *x = Some(big);
        }
        (r.prefill_rank, r.decode_rank) = (Some(u32::MAX), Some(u32::MAX));
        (r.transferred_tokens, r.transfer_bytes) = (Tokens::new(u64::MAX), Bytes::new(u64::MAX));
        (r.prefill_hit, r.decode_hit, r.preemptions) = (Tokens::new(u64::MAX), Tokens::new(u64::MAX), u32::MAX);
        (r.generated, r.max_itl) = (Tokens::new(u64::MAX), SimDuration::from_nanos(u64::MAX));
        r.priority = i32::MIN;
        r.fail(FailReason::DecodeAborted, big);
        let reason = csv_field(&FailReason::DecodeAborted.to_string());
        let mut rows = RequestRows::new(true);
        let line = rows.row(&r).to_vec();
        assert!(line.len() + 7 <= ROW_MAX + reason.len(), "{} bytes", line.len());
        let text = String::from_utf8(line).unwrap();
        let m = "18446744073709.551615";
        assert!(text.starts_with(&format!("{},failed,{reason},", u64::MAX)), "{text}");
        assert!(text.contains(&format!(",prefill{},decode{},", u32::MAX, u32::MAX)), "{text}");
        assert!(text.contains(&format!(",0.000000,{m},")), "{text}");
        assert!(text.ends_with(",-2147483648\n"), "{text}");
        assert_eq!(text.split(',').count(), REQUEST_COLUMNS.len());
    }

    #[test]
    fn csv_fields_are_quoted_when_needed() {
        assert_eq!(csv_field("plain"), "plain");
        assert_eq!(csv_field("a, b"), "\"a, b\"");
        assert_eq!(csv_field("say \"hi\""), "\"say \"\"hi\"\"\"");
    }
}
