//! Writing output files without harm to anything else.
//!
//! Every file pdsim writes (a run's files, replicas' and sweeps' CSVs, a
//! point's report.json, report.html, `calibrate --out`) goes through
//! [`TempFile`]: the bytes go to `NAME.partial` beside the file, created
//! new (never opened through a symbolic link, a pipe or a device already
//! there), and the whole file is renamed onto `NAME`. What is at an output
//! name is replaced only when it is a regular file: a symbolic link, a
//! folder, a device, a pipe or a socket there is refused with an error
//! naming it ([`check_target`]), never written through, replaced or
//! removed. Folders pdsim makes inside an output folder (`replica-<k>`,
//! `points/<point>`) must be real folders ([`own_dir`]), not links to
//! folders elsewhere. So no command writes outside the folder it was
//! given, and none deletes or replaces what it did not write.
//!
//! Errors are one line naming the path (`cannot write out/sweep.csv: …`):
//! bad input or an unwritable output, exit status 2.

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

/// What kind of thing is at a path, in words, for a refusal; `None` for
/// a regular file.
fn odd_kind(t: std::fs::FileType) -> Option<&'static str> {
    if t.is_file() {
        return None;
    }
    if t.is_symlink() {
        return Some("a symbolic link");
    }
    if t.is_dir() {
        return Some("a folder");
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if t.is_char_device() {
            return Some("a character device");
        } else if t.is_block_device() {
            return Some("a block device");
        } else if t.is_fifo() {
            return Some("a named pipe");
        } else if t.is_socket() {
            return Some("a socket");
        }
    }
    Some("a special file")
}

/// The refusal of an output name held by something that is not a regular
/// file.
fn refusal(path: &Path, kind: &str) -> String {
    format!(
        "cannot write {}: {kind} is in its place, and pdsim replaces only regular files at its output names \
         (move it away, or write elsewhere)",
        path.display()
    )
}

/// An I/O error on `path`, as one line.
pub fn io_error(path: &Path, e: &std::io::Error) -> String {
    format!("cannot write {}: {e}", path.display())
}

/// Checks that `path` may be (re)written: nothing is there, or a regular
/// file. A symbolic link (to anything, or dangling), a folder, a device,
/// a pipe or a socket is refused.
///
/// # Errors
/// The refusal, naming `path`; or the error of looking at it.
pub fn check_target(path: &Path) -> Result<(), String> {
    match std::fs::symlink_metadata(path) {
        Ok(meta) => match odd_kind(meta.file_type()) {
            None => Ok(()),
            Some(kind) => Err(refusal(path, kind)),
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io_error(path, &e)),
    }
}

/// Removes `path` if it is a regular file (a file pdsim wrote under one
/// of its names); nothing there is fine; anything else is refused as
/// [`check_target`] refuses it, and left.
///
/// # Errors
/// The refusal, or the error of removing it, naming `path`.
pub fn remove_file(path: &Path) -> Result<(), String> {
    check_target(path)?;
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io_error(path, &e)),
        _ => Ok(()),
    }
}

/// Removes `path` if it is a regular file, and leaves anything else
/// (a folder or a link of the user's under a name pdsim also uses) as it
/// is. For names pdsim clears but will not write in this command.
///
/// # Errors
/// The error of removing a regular file, naming it.
pub fn remove_file_if_own(path: &Path) -> Result<(), String> {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_file() => std::fs::remove_file(path).map_err(|e| io_error(path, &e)),
        _ => Ok(()),
    }
}

/// Makes the folder `path`, which pdsim names inside an output folder
/// (`replica-<k>`, `points/<point>`), and its parents up to an existing
/// one. A `path` (or parent within the output folder) that exists must be
/// a folder, not a symbolic link to one: pdsim writes nothing through a
/// link it did not make. `base` is the output folder the user named
/// (which may itself be a link); only the components below it are
/// checked.
///
/// # Errors
/// A link or a file in the way, or a folder that cannot be made, naming
/// it.
pub fn own_dir(base: &Path, path: &Path) -> Result<(), String> {
    let rel = path.strip_prefix(base).unwrap_or(path);
    let mut here = base.to_path_buf();
    for part in rel.components() {
        here.push(part);
        match std::fs::symlink_metadata(&here) {
            Ok(meta) if meta.file_type().is_dir() => {}
            Ok(meta) => {
                let kind = odd_kind(meta.file_type()).unwrap_or("a file");
                return Err(format!(
                    "cannot write into {}: {kind} is in its place, and pdsim writes only into folders it makes \
                     there (move it away, or write elsewhere)",
                    here.display()
                ));
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                std::fs::create_dir(&here).map_err(|e| format!("cannot create {}: {e}", here.display()))?;
            }
            Err(e) => return Err(format!("cannot create {}: {e}", here.display())),
        }
    }
    Ok(())
}

/// `path` with `.partial` appended: the name a file is written under
/// until it is whole.
pub fn partial_name(path: &Path) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(".partial");
    PathBuf::from(p)
}

/// Creates `path` new for writing: a regular file pdsim left there (an
/// interrupted earlier write) is removed first; anything else there is
/// refused. Never opens an existing file, so never writes through a link.
///
/// # Errors
/// The refusal, or the error of creating it; `named` is the path the
/// error names (the output the file is part of).
pub fn create_new(path: &Path, named: &Path) -> Result<File, String> {
    match std::fs::symlink_metadata(path) {
        Ok(meta) => match odd_kind(meta.file_type()) {
            None => std::fs::remove_file(path).map_err(|e| io_error(named, &e))?,
            Some(kind) => return Err(refusal(path, kind)),
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_error(named, &e)),
    }
    OpenOptions::new().write(true).create_new(true).open(path).map_err(|e| io_error(named, &e))
}

/// A file being written under `NAME.partial`, renamed onto `NAME` by
/// [`TempFile::commit`]; dropped without a commit, the partial file is
/// removed.
pub struct TempFile {
    target: PathBuf,
    tmp: PathBuf,
    w: Option<BufWriter<File>>,
}

impl TempFile {
    /// Starts writing `target`: checks that it may be replaced
    /// ([`check_target`]) and creates `target.partial` new.
    ///
    /// # Errors
    /// A refusal or an I/O error, naming `target`.
    pub fn create(target: &Path) -> Result<Self, String> {
        check_target(target)?;
        let tmp = partial_name(target);
        let file = create_new(&tmp, target)?;
        Ok(TempFile { target: target.to_owned(), tmp, w: Some(BufWriter::new(file)) })
    }

    /// The file's final name.
    pub fn target(&self) -> &Path {
        &self.target
    }

    /// The writer (buffered) of the partial file.
    pub fn writer(&mut self) -> &mut BufWriter<File> {
        self.w.as_mut().expect("a TempFile has its writer until it is committed")
    }

    /// Writes `bytes`; an error names the target.
    ///
    /// # Errors
    /// The I/O error, naming the target.
    pub fn write_all(&mut self, bytes: &[u8]) -> Result<(), String> {
        let target = self.target.clone();
        self.writer().write_all(bytes).map_err(|e| io_error(&target, &e))
    }

    /// Flushes what was written so far to the partial file.
    ///
    /// # Errors
    /// The I/O error, naming the target.
    pub fn flush(&mut self) -> Result<(), String> {
        let target = self.target.clone();
        self.writer().flush().map_err(|e| io_error(&target, &e))
    }

    /// Flushes the file and renames it onto its name (checked again: a
    /// link made there meanwhile is refused, not replaced). On an error
    /// the partial file is removed.
    ///
    /// # Errors
    /// A refusal or an I/O error, naming the target.
    pub fn commit(mut self) -> Result<(), String> {
        let mut w = self.w.take().expect("a TempFile is committed once");
        let flushed = w.flush().map_err(|e| io_error(&self.target, &e));
        drop(w);
        let placed = flushed
            .and_then(|()| check_target(&self.target))
            .and_then(|()| std::fs::rename(&self.tmp, &self.target).map_err(|e| io_error(&self.target, &e)));
        if placed.is_err() {
            let _ = std::fs::remove_file(&self.tmp);
        }
        placed
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        // Not committed: the work failed or stopped, and a cut-off file is
        // no use to anyone.
        if self.w.take().is_some() {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

/// Writes the file `path` through `write`, buffered, under its partial
/// name, and renames it into place when whole ([`TempFile`]).
///
/// # Errors
/// A refusal or an I/O error, naming `path`.
pub fn write_atomic(
    path: &Path,
    write: impl FnOnce(&mut BufWriter<File>) -> std::io::Result<()>,
) -> Result<(), String> {
    let mut file = TempFile::create(path)?;
    write(file.writer()).map_err(|e| io_error(path, &e))?;
    file.commit()
}

/// Whether a scenario's `name` can be a folder name: one plain path
/// component (not empty, not `.` or `..`, no `/`, `\` or NUL, no control
/// characters), so that `out/<name>` stays inside `out/`. `Err` says what
/// is wrong.
///
/// # Errors
/// What makes the name unusable.
pub fn plain_component(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("is empty".into());
    }
    if name == "." || name == ".." {
        return Err(format!("{name:?} names a folder relative to out/, not one inside it"));
    }
    if let Some(c) = name.chars().find(|c| matches!(c, '/' | '\\') || c.is_control()) {
        return Err(format!("{name:?} holds {c:?}"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("pdsim-output-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn a_link_at_an_output_name_is_refused_and_its_target_kept() {
        let dir = scratch("link");
        let precious = dir.join("precious.txt");
        std::fs::write(&precious, "mine").unwrap();
        let out = dir.join("out.csv");
        std::os::unix::fs::symlink(&precious, &out).unwrap();
        let e = write_atomic(&out, |w| w.write_all(b"x")).unwrap_err();
        assert!(e.contains("a symbolic link is in its place") && e.contains("out.csv"), "{e}");
        assert_eq!(std::fs::read_to_string(&precious).unwrap(), "mine");
        assert!(std::fs::symlink_metadata(&out).unwrap().file_type().is_symlink());
        // A link at the partial name is refused too, not written through.
        std::fs::remove_file(&out).unwrap();
        std::os::unix::fs::symlink(&precious, partial_name(&out)).unwrap();
        let e = write_atomic(&out, |w| w.write_all(b"x")).unwrap_err();
        assert!(e.contains("out.csv.partial"), "{e}");
        assert_eq!(std::fs::read_to_string(&precious).unwrap(), "mine");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_regular_file_is_replaced_and_a_left_partial_taken_over() {
        let dir = scratch("regular");
        let out = dir.join("a.txt");
        std::fs::write(&out, "old").unwrap();
        std::fs::write(partial_name(&out), "left by a stopped write").unwrap();
        write_atomic(&out, |w| w.write_all(b"new")).unwrap();
        assert_eq!(std::fs::read_to_string(&out).unwrap(), "new");
        assert!(!partial_name(&out).exists());
        // A write that fails leaves neither a partial file nor a change.
        let e = write_atomic(&out, |_| Err(std::io::Error::other("disk full"))).unwrap_err();
        assert!(e.contains("disk full"), "{e}");
        assert_eq!(std::fs::read_to_string(&out).unwrap(), "new");
        assert!(!partial_name(&out).exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn own_folders_are_not_links() {
        let dir = scratch("dirs");
        let elsewhere = dir.join("elsewhere");
        std::fs::create_dir_all(&elsewhere).unwrap();
        let base = dir.join("out");
        std::fs::create_dir_all(&base).unwrap();
        own_dir(&base, &base.join("points/a")).unwrap();
        assert!(base.join("points/a").is_dir());
        std::os::unix::fs::symlink(&elsewhere, base.join("replica-0")).unwrap();
        let e = own_dir(&base, &base.join("replica-0")).unwrap_err();
        assert!(e.contains("replica-0") && e.contains("a symbolic link"), "{e}");
    }

    #[test]
    fn plain_components() {
        for ok in ["glm-1p1d", "a b", "x.y", "...", "é"] {
            assert!(plain_component(ok).is_ok(), "{ok}");
        }
        for bad in ["", ".", "..", "../x", "/abs", "a/b", "a\\b", "a\nb", "a\0b"] {
            assert!(plain_component(bad).is_err(), "{bad:?}");
        }
    }
}
