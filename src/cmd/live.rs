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
        let file = File::create(&path).map_err(|e| write_error(named, &e))?;
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
    for name in ["requests.csv", "timeline.csv", "trace.json"] {
        let _ = std::fs::remove_file(partial(&dir.join(name)));
    }
    for s in TRACE_SPILLS {
        let _ = std::fs::remove_file(dir.join(s));
    }
}

fn partial(path: &Path) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(".partial");
    PathBuf::from(p)
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
        disaggregated: bool,
        topology: LinkTopology,
        timeline: bool,
        trace: bool,
    ) -> Result<Self, CmdError> {
        Self::open(dir, disaggregated, topology, timeline, trace).inspect_err(|_| remove_partials(dir))
    }

    fn open(
        dir: &Path,
        disaggregated: bool,
        topology: LinkTopology,
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
                    t.fmt = Some(TraceSlices::new(&names, t.topology, t.disaggregated));
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

    /// Finishes the files of `run` (labelled `label`) and moves them into
    /// place; the trace is joined from its spills under its header. When
    /// one cannot be finished, no `.partial` file or spill is left behind
    /// (the files already in place stay; report.json, written last, is
    /// not, so the folder does not pass for a whole run).
    pub fn finish(self, label: &str, run: &Run) -> Result<(), CmdError> {
        let finished = self.place_all(label, run);
        if finished.is_err() {
            self.discard();
        }
        finished
    }

    fn place_all(&self, label: &str, run: &Run) -> Result<(), CmdError> {
        let dir = &self.dir;
        let mut f = self.files.borrow_mut();
        let f = &mut *f;
        let place = |out: &mut Out, name: &str| -> Result<(), CmdError> {
            let target = dir.join(name);
            out.done().and_then(|()| std::fs::rename(&out.path, &target)).map_err(|e| write_error(&target, &e))
        };
        place(&mut f.requests, "requests.csv")?;
        if let Some((out, _)) = &mut f.timeline {
            place(out, "timeline.csv")?;
        }
        if let Some(t) = &mut f.trace {
            let target = dir.join("trace.json");
            join_trace(t, dir, &target, label, run).map_err(|e| write_error(&target, &e))?;
            for s in TRACE_SPILLS {
                let _ = std::fs::remove_file(dir.join(s));
            }
        }
        Ok(())
    }
}

/// Writes trace.json: the header, the slices' spill, the counters entity
/// by entity from their spilled blocks, the tail.
fn join_trace(t: &mut Trace, dir: &Path, target: &Path, label: &str, run: &Run) -> std::io::Result<()> {
    t.spill();
    t.slices.done()?;
    t.counters.done()?;
    let out = &run.output;
    let entities: Vec<String> =
        out.ranks.iter().map(|r| r.name.clone()).chain(out.links.iter().map(|l| l.name.clone())).collect();
    let tmp = partial(target);
    let mut w = BufWriter::with_capacity(1 << 20, File::create(&tmp)?);
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
    w.flush()?;
    drop(w);
    std::fs::rename(&tmp, target)
}
