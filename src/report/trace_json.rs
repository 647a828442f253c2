//! `trace.json`: the run as Chrome trace events (Perfetto opens it), one
//! slice a step or transfer and one counter a timeline sample.

use super::*;
use sim_core::SimDuration;

/// Writes `trace.json` in the Chrome trace-event format (JSON object form),
/// for Perfetto (ui.perfetto.dev) or chrome://tracing.
///
/// - One process per rank and per link (`process_name` and `thread_name`
///   metadata, in report order), so each gets its own track.
/// - Per request, async slices (`ph` `b`/`e`, `id` = the request id in
///   hex, `cat` and `name` = the stage, the request id in `args`): `prefill` on its prefill rank (from the first prefill
///   step to the end of the prefill; on an aggregated rank, to the first
///   token), `transfer` on its link (from the start to the end of the
///   transfer; none when nothing moved), `decode` on its decode rank (from
///   the first decode step to the end; on an aggregated rank, from the
///   first token to the end; a request's first token and end as its rank
///   made them, before the API server's way out). Overlapping requests get their own rows
///   under the rank's track. A request that failed mid-stage ends that
///   stage at its failure. Slice args carry the request's numbers.
/// - Counters (`ph` `C`), one per timeline row of the series shown (so at
///   each change, with the instant's final value): per rank `kv
///   used_blocks`, `seqs waiting`, `seqs running`, `requests in_system` and
///   `state busy`; per link `transfers active`, `bytes in_flight`,
///   `requests in_system` and `state busy`.
///
/// Timestamps are simulated microseconds.
///
/// # Errors
/// Writing fails.
pub fn write_trace_json(
    w: &mut impl Write,
    scenario_label: &str,
    run: &Run,
    topology: LinkTopology,
    disaggregated: bool,
    way_out: SimDuration,
) -> io::Result<()> {
    let out = &run.output;
    let entities: Vec<String> =
        out.ranks.iter().map(|r| r.name.clone()).chain(out.links.iter().map(|l| l.name.clone())).collect();
    write_trace_head(w, scenario_label, run.seed, out.digest, &entities)?;
    let mut buf = Vec::new();
    let mut slices = TraceSlices::new(&entities, topology, disaggregated, way_out);
    for chunk in out.records.chunks(1024) {
        buf.clear();
        for r in chunk {
            slices.push(&mut buf, r);
        }
        w.write_all(&buf)?;
    }
    let no_groups: Vec<String> = Vec::new();
    let timelines =
        out.ranks.iter().map(|r| (&r.timeline, &r.groups)).chain(out.links.iter().map(|l| (&l.timeline, &no_groups)));
    for (i, (tl, groups)) in timelines.enumerate() {
        for chunk in tl.samples.chunks(4096) {
            buf.clear();
            for sample in chunk {
                trace_counter(&mut buf, i as u32, sample, groups);
            }
            w.write_all(&buf)?;
        }
    }
    w.write_all(TRACE_TAIL)
}

/// The end of `trace.json`.
pub const TRACE_TAIL: &[u8] = b"\n]}\n";

/// Writes the start of `trace.json`: the header (with the run's digest)
/// and the metadata events of every entity (`entities`: the ranks in report
/// order, then the links). Every event after them ([`TraceSlices`],
/// [`trace_counter`]) starts with its separator.
///
/// # Errors
/// Writing fails.
pub fn write_trace_head(
    w: &mut impl Write,
    label: &str,
    seed: u64,
    digest: u64,
    entities: &[String],
) -> io::Result<()> {
    let meta = json!({
        "pdsim_version": PDSIM_VERSION,
        "scenario": label,
        "seed": seed,
        "digest": digest_hex(digest),
        "time_unit": "simulated microseconds",
    });
    writeln!(w, "{{\"displayTimeUnit\":\"ms\",\"otherData\":{meta},\"traceEvents\":[")?;
    for (i, name) in entities.iter().enumerate() {
        let pid = i + 1;
        let name = serde_json::to_string(name)?;
        if i > 0 {
            w.write_all(b",\n")?;
        }
        write!(w, r#"{{"ph":"M","name":"process_name","pid":{pid},"tid":1,"args":{{"name":{name}}}}}"#)?;
        w.write_all(b",\n")?;
        write!(w, r#"{{"ph":"M","name":"process_sort_index","pid":{pid},"tid":1,"args":{{"sort_index":{pid}}}}}"#)?;
        w.write_all(b",\n")?;
        write!(w, r#"{{"ph":"M","name":"thread_name","pid":{pid},"tid":1,"args":{{"name":{name}}}}}"#)?;
    }
    Ok(())
}

/// The counter of each timeline metric in `trace.json`: (event name, arg
/// key); Perfetto names its track "`<event name> <arg key>`". Every
/// metric of timeline.csv has one, so the trace's counters are the
/// timeline's rows; a cache group's is `kv used_blocks[<group>]` (the
/// group named as timeline.csv names it, [`metric_name`]).
pub const TRACE_COUNTERS: [(Metric, &str, &str); 13] = [
    (Metric::KvUsed, "kv", "used_blocks"),
    (Metric::KvFree, "kv", "free_blocks"),
    (Metric::KvCachedFree, "kv", "cached_free_blocks"),
    (Metric::Waiting, "seqs", "waiting"),
    (Metric::Running, "seqs", "running"),
    (Metric::HeldSources, "handoffs", "held_sources"),
    (Metric::PendingReservations, "handoffs", "pending_reservations"),
    (Metric::Transferring, "handoffs", "transferring"),
    (Metric::ActiveTransfers, "transfers", "active"),
    (Metric::QueuedTransfers, "transfers", "queued"),
    (Metric::BytesInFlight, "bytes", "in_flight"),
    (Metric::Requests, "requests", "in_system"),
    (Metric::Busy, "state", "busy"),
];

/// Appends the counter event of one timeline row of entity `entity`
/// (pid `entity + 1`, whose cache groups are `groups`), as
/// [`TRACE_COUNTERS`] names it.
pub fn trace_counter(out: &mut Vec<u8>, entity: u32, sample: &actors::metrics::Sample, groups: &[String]) {
    let group_key;
    let (name, key): (&str, &str) = match sample.metric {
        Metric::KvGroupUsed(i) => {
            let g = groups.get(usize::from(i)).map_or_else(|| i.to_string(), Clone::clone);
            // A JSON string's inside: the group's name escaped.
            let quoted = serde_json::to_string(&format!("used_blocks[{g}]")).unwrap_or_default();
            group_key = quoted.trim_matches('"').to_owned();
            ("kv", &group_key)
        }
        m => match TRACE_COUNTERS.iter().find(|c| c.0 == m) {
            Some(&(_, name, key)) => (name, key),
            None => return,
        },
    };
    out.extend_from_slice(b",\n{\"ph\":\"C\",\"name\":\"");
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b"\",\"pid\":");
    bytes_u64(out, u64::from(entity) + 1);
    out.extend_from_slice(b",\"tid\":1,\"ts\":");
    bytes_fixed(out, sample.time.as_nanos(), 3);
    out.extend_from_slice(b",\"args\":{\"");
    out.extend_from_slice(key.as_bytes());
    out.extend_from_slice(b"\":");
    bytes_u64(out, sample.value);
    out.extend_from_slice(b"}}");
}

/// A stage of a request on a track: (stage, pid, start, end).
type Slice = (&'static str, Option<usize>, Option<SimTime>, Option<SimTime>);

/// The async slices of each request in `trace.json`, formatted by hand
/// (the args object's keys in the sorted order serde_json writes them).
pub struct TraceSlices {
    pid_of: BTreeMap<String, usize>,
    topology: LinkTopology,
    disaggregated: bool,
    /// The API server's way out: a request's output times are its client's,
    /// this much after the rank made them.
    way_out: SimDuration,
    name: String,
}

impl TraceSlices {
    /// Slices on these entities (the ranks in report order, then the links),
    /// of requests whose output times are `way_out` after their ranks made
    /// them (the API server's way out: the slices end at the rank's time).
    pub fn new(entities: &[String], topology: LinkTopology, disaggregated: bool, way_out: SimDuration) -> Self {
        let pid_of = entities.iter().enumerate().map(|(i, n)| (n.clone(), i + 1)).collect();
        TraceSlices { pid_of, topology, disaggregated, way_out, name: String::new() }
    }

    /// The pid of rank `index` of `role`, or of `r`'s link.
    fn pid(&mut self, what: Option<Role>, index: Option<u32>, r: &Request) -> Option<usize> {
        self.name.clear();
        match what {
            Some(role) => {
                self.name.push_str(role.as_str());
                push_u64(&mut self.name, u64::from(index?));
            }
            None => {
                let (p, d) = (r.prefill_rank?, r.decode_rank?);
                match self.topology {
                    LinkTopology::PerPair => {
                        self.name.push_str("link-p");
                        push_u64(&mut self.name, u64::from(p));
                        self.name.push_str("-d");
                        push_u64(&mut self.name, u64::from(d));
                    }
                    LinkTopology::Shared => self.name.push_str("link"),
                }
            }
        }
        self.pid_of.get(self.name.as_str()).copied()
    }

    /// Appends the slices of `r`.
    pub fn push(&mut self, out: &mut Vec<u8>, r: &Request) {
        let s = &r.t;
        // Output times at the rank (the records hold the client's).
        let at_rank =
            |t: Option<SimTime>| t.map(|t| SimTime::from_nanos(t.as_nanos().saturating_sub(self.way_out.as_nanos())));
        let (first_token, finished) = (at_rank(s.first_token), at_rank(s.finished));
        let end_or_failure = |end: Option<SimTime>| end.or(finished);
        // (stage, pid, start, end)
        let mut slices: [Slice; 3] = [("", None, None, None); 3];
        if self.disaggregated {
            slices[0] = (
                "prefill",
                self.pid(Some(Role::Prefill), r.prefill_rank, r),
                s.prefill_started,
                end_or_failure(s.prefill_done),
            );
            if r.transfer_bytes.get() > 0 {
                slices[1] = ("transfer", self.pid(None, None, r), s.transfer_started, end_or_failure(s.transfer_done));
            }
            slices[2] = ("decode", self.pid(Some(Role::Decode), r.decode_rank, r), s.decode_started, finished);
        } else {
            let pid = self.pid(Some(Role::Aggregated), r.prefill_rank, r);
            slices[0] = ("prefill", pid, s.prefill_started, end_or_failure(first_token));
            slices[1] = ("decode", pid, first_token, finished);
        }
        for (stage, pid, start, end) in slices {
            let (Some(pid), Some(start), Some(end)) = (pid, start, end) else { continue };
            let head = |out: &mut Vec<u8>, ph: &[u8]| {
                out.extend_from_slice(b",\n{\"ph\":\"");
                out.extend_from_slice(ph);
                out.extend_from_slice(b"\",\"cat\":\"");
                out.extend_from_slice(stage.as_bytes());
                out.extend_from_slice(b"\",\"name\":\"");
                out.extend_from_slice(stage.as_bytes());
                out.extend_from_slice(b"\",\"id\":\"0x");
                bytes_hex(out, r.id);
                out.extend_from_slice(b"\",\"pid\":");
                bytes_u64(out, pid as u64);
                out.extend_from_slice(b",\"tid\":1,\"ts\":");
            };
            head(out, b"b");
            bytes_fixed(out, start.as_nanos(), 3);
            out.extend_from_slice(b",\"args\":{\"decode_hit_tokens\":");
            bytes_u64(out, r.decode_hit.get());
            out.extend_from_slice(b",\"outcome\":\"");
            out.extend_from_slice(outcome_name(&r.outcome).as_bytes());
            out.extend_from_slice(b"\",\"output_tokens\":");
            bytes_u64(out, r.output.get());
            out.extend_from_slice(b",\"preemptions\":");
            bytes_u64(out, u64::from(r.preemptions));
            out.extend_from_slice(b",\"prefill_hit_tokens\":");
            bytes_u64(out, r.prefill_hit.get());
            out.extend_from_slice(b",\"prompt_tokens\":");
            bytes_u64(out, r.prompt.get());
            out.extend_from_slice(b",\"request\":");
            bytes_u64(out, r.id);
            out.extend_from_slice(b",\"transfer_bytes\":");
            bytes_u64(out, r.transfer_bytes.get());
            out.extend_from_slice(b",\"transferred_tokens\":");
            bytes_u64(out, r.transferred_tokens.get());
            out.extend_from_slice(b"}}");
            head(out, b"e");
            bytes_fixed(out, end.max(start).as_nanos(), 3);
            out.push(b'}');
        }
    }
}

/// Appends `v` in lower-case hexadecimal.
pub(super) fn bytes_hex(out: &mut Vec<u8>, mut v: u64) {
    let mut buf = [0u8; 16];
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b"0123456789abcdef"[(v & 15) as usize];
        v >>= 4;
        if v == 0 {
            break;
        }
    }
    out.extend_from_slice(&buf[i..]);
}
