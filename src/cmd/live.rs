//! The files `pdsim run` writes while it simulates, so that a run of any
//! length holds only what is in flight: requests.csv a row per request as
//! it ends (in id order), timeline.csv in slices of simulated time, and
//! trace.json from two spill files (its request slices in id order; its
//! counters, which the file lists entity by entity, in blocks per entity
//! with an index) joined under the header once the digest is known. Every
//! file is written under `NAME.partial` and renamed when whole.

use std::cell::RefCell;
use std::fs::File;
use std::io::{BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::rc::Rc;

use actors::config::LinkTopology;
use actors::metrics::EntitySample;
use actors::records::RecordSink;
use pdsim::report::{self, RequestRows, TimelineRows, TraceSlices};
use pdsim::runner::{Run, SampleSinkFactory};
use sim_core::SimDuration;

use pdsim::output::{self, TempFile};

use super::{CmdError, write_error};

/// Spill files of a streamed trace (removed when the trace is whole, and by
/// `clear_dir` if a run left them).
pub const TRACE_SPILLS: [&str; 2] = ["trace.json.slices.partial", "trace.json.counters.partial"];

/// Bytes of counter events buffered (over every entity) before they go to
/// the spill file.
const COUNTER_BUDGET: usize = 8 << 20;

/// A file being written; the first error is kept and later bytes dropped.
struct Out {
    path: PathBuf,
    w: BufWriter<File>,
    written: u64,
    error: Option<std::io::Error>,
}

impl Out {
    fn create(path: PathBuf, named: &Path) -> Result<Self, CmdError> {
        let file = output::create_new(&path, named).map_err(CmdError::BadInput)?;
        Ok(Out { path, w: BufWriter::with_capacity(1 << 20, file), written: 0, error: None })
    }

    fn write(&mut self, bytes: &[u8]) {
        if self.error.is_none() {
            match self.w.write_all(bytes) {
                Ok(()) => self.written += bytes.len() as u64,
                Err(e) => self.error = Some(e),
            }
        }
    }

    /// Flushes; the first error, if any.
    fn done(&mut self) -> std::io::Result<()> {
        match self.error.take() {
            Some(e) => Err(e),
            None => self.w.flush(),
        }
    }
}

/// Removes what a [`Live`] in `dir` makes before its files are in place:
/// requests.csv's, timeline.csv's and trace.json's `.partial` files and
/// the trace's spills (the folder was cleared before, so they are its).
fn remove_partials(dir: &Path) {
    // Only regular files: what is refused there (a link, a folder) is
    // not the run's.
    for name in ["requests.csv", "timeline.csv", "trace.json"] {
        let _ = output::remove_file_if_own(&partial(&dir.join(name)));
    }
    for s in TRACE_SPILLS {
        let _ = output::remove_file_if_own(&dir.join(s));
    }
}

fn partial(path: &Path) -> PathBuf {
    output::partial_name(path)
}

struct Trace {
    slices: Out,
    counters: Out,
    fmt: Option<TraceSlices>,
    /// Per entity, counter events not yet spilled.
    pending: Vec<Vec<u8>>,
    /// Per entity, its cache groups' names (for their counters).
    groups: Vec<Vec<String>>,
    pending_bytes: usize,
    /// (entity, offset, length) of each spilled block, in spill order.
    index: Vec<(u32, u64, u64)>,
    topology: LinkTopology,
    disaggregated: bool,
    way_out: SimDuration,
}

impl Trace {
    fn spill(&mut self) {
        for (e, buf) in self.pending.iter_mut().enumerate() {
            if !buf.is_empty() {
                self.index.push((e as u32, self.counters.written, buf.len() as u64));
                self.counters.write(buf);
                buf.clear();
            }
        }
        self.pending_bytes = 0;
    }
}

struct Files {
    requests: Out,
    rows: RequestRows,
    timeline: Option<(Out, Option<TimelineRows>)>,
    trace: Option<Trace>,
    buf: Vec<u8>,
}

/// The files of one run, written as it goes.
pub struct Live {
    dir: PathBuf,
    files: Rc<RefCell<Files>>,
}

impl Live {
    /// Opens requests.csv (and timeline.csv, and the trace's spill files,
    /// when wanted) in `dir`, which has been cleared; when one cannot be
    /// opened, those already made are removed.
    pub fn create(
        dir: &Path,
        (disaggregated, topology, way_out): (bool, LinkTopology, SimDuration),
        timeline: bool,
        trace: bool,
    ) -> Result<Self, CmdError> {
        Self::open(dir, (disaggregated, topology, way_out), timeline, trace).inspect_err(|_| remove_partials(dir))
    }

    fn open(
        dir: &Path,
        (disaggregated, topology, way_out): (bool, LinkTopology, SimDuration),
        timeline: bool,
        trace: bool,
    ) -> Result<Self, CmdError> {
        let named = |f: &str| dir.join(f);
        let rows = RequestRows::new(disaggregated);
        let mut requests = Out::create(partial(&named("requests.csv")), &named("requests.csv"))?;
        requests.write(&rows.header_bytes());
        let timeline = if timeline {
            let mut out = Out::create(partial(&named("timeline.csv")), &named("timeline.csv"))?;
            out.write(TimelineRows::HEADER);
            Some((out, None))
        } else {
            None
        };
        let trace = if trace {
            Some(Trace {
                slices: Out::create(dir.join(TRACE_SPILLS[0]), &named("trace.json"))?,
                counters: Out::create(dir.join(TRACE_SPILLS[1]), &named("trace.json"))?,
                fmt: None,
                pending: Vec::new(),
                groups: Vec::new(),
                pending_bytes: 0,
                index: Vec::new(),
                topology,
                disaggregated,
                way_out,
            })
        } else {
            None
        };
        let files = Files { requests, rows, timeline, trace, buf: Vec::new() };
        Ok(Live { dir: dir.to_owned(), files: Rc::new(RefCell::new(files)) })
    }

    /// The record sink: a requests.csv row and the trace's slices.
    pub fn record_sink(&self) -> RecordSink {
        let files = Rc::clone(&self.files);
        Box::new(move |r| {
            let f = &mut *files.borrow_mut();
            f.requests.write(f.rows.row(r));
            if let Some(t) = &mut f.trace
                && let Some(fmt) = &mut t.fmt
            {
                f.buf.clear();
                fmt.push(&mut f.buf, r);
                t.slices.write(&f.buf);
            }
        })
    }

    /// The sample sink (when a timeline or a trace is written): timeline
    /// rows, and the trace's counters.
    pub fn sample_sink(&self) -> Option<SampleSinkFactory> {
        {
            let f = self.files.borrow();
            if f.timeline.is_none() && f.trace.is_none() {
                return None;
            }
        }
        let files = Rc::clone(&self.files);
        Some(Box::new(move |entities| {
            {
                let f = &mut *files.borrow_mut();
                if let Some((_, rows)) = &mut f.timeline {
                    *rows = Some(TimelineRows::new(entities));
                }
                if let Some(t) = &mut f.trace {
                    let names: Vec<String> = entities.iter().map(|(n, _)| n.clone()).collect();
                    t.fmt = Some(TraceSlices::new(&names, t.topology, t.disaggregated, t.way_out));
                    t.pending = vec![Vec::new(); names.len()];
                    t.groups = entities.iter().map(|(_, g)| g.clone()).collect();
                }
            }
            Box::new(move |samples: &[EntitySample]| {
                let f = &mut *files.borrow_mut();
                if let Some((out, Some(rows))) = &mut f.timeline {
                    for chunk in samples.chunks(4096) {
                        f.buf.clear();
                        for s in chunk {
                            rows.push(&mut f.buf, s);
                        }
                        out.write(&f.buf);
                    }
                }
                if let Some(t) = &mut f.trace {
                    for s in samples {
                        if let Some(buf) = t.pending.get_mut(s.entity as usize) {
                            let before = buf.len();
                            let groups = t.groups.get(s.entity as usize).map_or(&[][..], Vec::as_slice);
                            report::trace_counter(buf, s.entity, &s.sample, groups);
                            t.pending_bytes += buf.len() - before;
                        }
                    }
                    if t.pending_bytes >= COUNTER_BUDGET {
                        t.spill();
                    }
                }
            })
        }))
    }

    /// Removes every file it made that is not in place yet (the run
    /// failed, or its files could not be finished): the `.partial` files
    /// and the trace's spills.
    pub fn discard(self) {
        remove_partials(&self.dir);
    }

    /// Finishes the files of `run` (labelled `label`), each still under
    /// its partial name (the trace joined from its spills under its
    /// header), then `last`'s files (made from the whole requests.csv,
    /// given under its partial name: vllm-bench.json, then report.json),
    /// then moves them into place, `last`'s after the others, in order. When one cannot be finished or placed, none of the run's
    /// files is left: neither a `.partial` file nor a spill, nor a file
    /// already placed, so the folder holds no part of a failed run.
    pub fn finish(
        self,
        label: &str,
        run: &Run,
        last: impl FnOnce(&Path) -> Result<Vec<TempFile>, CmdError>,
    ) -> Result<(), CmdError> {
        let mut placed = Vec::new();
        let finished = self.place_all(label, run, last, &mut placed);
        if finished.is_err() {
            for p in &placed {
                let _ = std::fs::remove_file(p);
            }
            self.discard();
        }
        finished
    }

    fn place_all(
        &self,
        label: &str,
        run: &Run,
        last: impl FnOnce(&Path) -> Result<Vec<TempFile>, CmdError>,
        placed: &mut Vec<PathBuf>,
    ) -> Result<(), CmdError> {
        let dir = &self.dir;
        let mut f = self.files.borrow_mut();
        let f = &mut *f;
        // Every file whole under its partial name first.
        let done = |out: &mut Out, name: &str| out.done().map_err(|e| write_error(&dir.join(name), &e));
        done(&mut f.requests, "requests.csv")?;
        let mut ready = vec![(f.requests.path.clone(), dir.join("requests.csv"))];
        if let Some((out, _)) = &mut f.timeline {
            done(out, "timeline.csv")?;
            ready.push((out.path.clone(), dir.join("timeline.csv")));
        }
        if let Some(t) = &mut f.trace {
            let target = dir.join("trace.json");
            join_trace(t, dir, &target, label, run)?;
            for s in TRACE_SPILLS {
                let _ = std::fs::remove_file(dir.join(s));
            }
            ready.push((partial(&target), target));
        }
        // The files made from these, whole (their partial names given).
        let last = last(&f.requests.path)?;
        // Then each into place, report.json last.
        for (from, to) in ready {
            output::check_target(&to).map_err(CmdError::BadInput)?;
            std::fs::rename(&from, &to).map_err(|e| write_error(&to, &e))?;
            placed.push(to);
        }
        for file in last {
            let target = file.target().to_path_buf();
            file.commit().map_err(CmdError::BadInput)?;
            placed.push(target);
        }
        Ok(())
    }
}

/// Writes trace.json: the header, the slices' spill, the counters entity
/// by entity from their spilled blocks, the tail.
fn join_trace(t: &mut Trace, dir: &Path, target: &Path, label: &str, run: &Run) -> Result<(), CmdError> {
    let tmp = partial(target);
    let file = output::create_new(&tmp, target).map_err(CmdError::BadInput)?;
    write_trace(t, dir, file, label, run).map_err(|e| write_error(target, &e))
}

/// trace.json's bytes into `file` (its partial file).
fn write_trace(t: &mut Trace, dir: &Path, file: File, label: &str, run: &Run) -> std::io::Result<()> {
    t.spill();
    t.slices.done()?;
    t.counters.done()?;
    let out = &run.output;
    let entities: Vec<String> =
        out.ranks.iter().map(|r| r.name.clone()).chain(out.links.iter().map(|l| l.name.clone())).collect();
    let mut w = BufWriter::with_capacity(1 << 20, file);
    report::write_trace_head(&mut w, label, run.seed, out.digest, &entities)?;
    std::io::copy(&mut File::open(dir.join(TRACE_SPILLS[0]))?, &mut w)?;
    let mut counters = File::open(dir.join(TRACE_SPILLS[1]))?;
    // Blocks by entity, each entity's in spill order.
    let mut order: Vec<usize> = (0..t.index.len()).collect();
    order.sort_by_key(|&i| t.index[i].0);
    let mut block = Vec::new();
    for i in order {
        let (_, offset, len) = t.index[i];
        counters.seek(SeekFrom::Start(offset))?;
        block.resize(usize::try_from(len).unwrap_or(usize::MAX), 0);
        counters.read_exact(&mut block)?;
        w.write_all(&block)?;
    }
    w.write_all(report::TRACE_TAIL)?;
    w.flush()
}
