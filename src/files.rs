//! Reading input files in bounded time and memory.
//!
//! Every file pdsim reads whole (scenarios, includes, sweep files, step
//! cases) goes through [`read_text`], and every trace is opened with
//! [`open_regular`]: a path that is not a regular file (a device such as
//! `/dev/zero`, a pipe, a folder) is refused before a byte is read, since
//! it may never end; a whole-read file is capped in size. A UTF-8
//! byte-order mark at the start (Excel and some Windows editors write one)
//! is dropped.

use std::fs::File;
use std::io::Read;
use std::path::Path;

/// The largest scenario, include, sweep or step-case file pdsim reads: far
/// above any real one, small enough to hold in memory at once.
pub const MAX_TEXT_BYTES: u64 = 16 << 20;

/// The UTF-8 byte-order mark.
pub const BOM: &str = "\u{feff}";

/// What kind of file `meta` describes, for a refusal.
fn kind(meta: &std::fs::Metadata) -> &'static str {
    let t = meta.file_type();
    if t.is_dir() {
        return "a folder";
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if t.is_char_device() {
            return "a character device";
        } else if t.is_block_device() {
            return "a block device";
        } else if t.is_fifo() {
            return "a named pipe";
        } else if t.is_socket() {
            return "a socket";
        }
    }
    "a special file"
}

/// Opens `path` for reading if it is a regular file (symbolic links
/// followed); the error says why not, without the path (the caller places
/// it).
///
/// # Errors
/// The file does not exist, cannot be opened, or is not a regular file.
pub fn open_regular(path: &Path) -> Result<(File, u64), String> {
    let meta = std::fs::metadata(path).map_err(|e| e.to_string())?;
    if !meta.is_file() {
        return Err(format!("not a regular file ({}), so it may never end", kind(&meta)));
    }
    let file = File::open(path).map_err(|e| e.to_string())?;
    Ok((file, meta.len()))
}

/// The text of the regular file `path`, at most `max` bytes, without a
/// leading byte-order mark.
///
/// # Errors
/// As [`open_regular`]; a file over `max` bytes; text that is not UTF-8.
pub fn read_text(path: &Path, max: u64) -> Result<String, String> {
    let (file, len) = open_regular(path)?;
    let too_big = |n: u64| format!("{n} bytes or more, over the {max} bytes pdsim reads from such a file");
    if len > max {
        return Err(too_big(len));
    }
    let mut bytes = Vec::new();
    // The file may grow after the size was read: read one byte past the cap.
    file.take(max + 1).read_to_end(&mut bytes).map_err(|e| e.to_string())?;
    if bytes.len() as u64 > max {
        return Err(too_big(bytes.len() as u64));
    }
    let text = String::from_utf8(bytes).map_err(|e| format!("not valid UTF-8 ({})", e.utf8_error()))?;
    Ok(match text.strip_prefix(BOM) {
        Some(rest) => rest.to_owned(),
        None => text,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_and_folders_are_refused() {
        let e = read_text(Path::new("/dev/zero"), MAX_TEXT_BYTES).unwrap_err();
        assert!(e.contains("a character device"), "{e}");
        let e = read_text(Path::new("/"), MAX_TEXT_BYTES).unwrap_err();
        assert!(e.contains("a folder"), "{e}");
    }

    #[test]
    fn a_bom_is_dropped_and_the_size_capped() {
        let dir = std::env::temp_dir().join(format!("pdsim-files-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("bom.toml");
        std::fs::write(&p, "\u{feff}seed = 1\n").unwrap();
        assert_eq!(read_text(&p, MAX_TEXT_BYTES).unwrap(), "seed = 1\n");
        let e = read_text(&p, 4).unwrap_err();
        assert!(e.contains("over the 4 bytes"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
