//! Where scenario text comes from (the disk, a string, the embedded
//! default) and the path arithmetic of includes and dotted field paths.

use super::*;

/// The default scenario and every file it includes.
pub(super) const EMBEDDED: &[(&str, &str)] = &[
    ("scenarios/default.toml", include_str!("../../scenarios/default.toml")),
    ("scenarios/llama-3.1-8b-1p1d.toml", include_str!("../../scenarios/llama-3.1-8b-1p1d.toml")),
    (
        "scenarios/steptimes/llama-3.1-8b-h200-tp4.toml",
        include_str!("../../scenarios/steptimes/llama-3.1-8b-h200-tp4.toml"),
    ),
];

/// Where scenario text comes from: the disk, or files held in memory.
pub(super) trait Files {
    /// The text of `path`, or why it cannot be read.
    fn read(&self, path: &Path) -> Result<String, String>;
    /// A key equal for two paths to the same file (for cycle detection).
    fn identity(&self, path: &Path) -> PathBuf;
    /// Whether the paths name files on the disk.
    fn on_disk(&self) -> bool {
        false
    }
}

pub(super) struct Disk;

impl Files for Disk {
    fn read(&self, path: &Path) -> Result<String, String> {
        crate::files::read_text(path, crate::files::MAX_TEXT_BYTES)
    }
    fn identity(&self, path: &Path) -> PathBuf {
        std::fs::canonicalize(path).unwrap_or_else(|_| normalize(path))
    }
    fn on_disk(&self) -> bool {
        true
    }
}

/// A scenario's text held in memory, including files from the disk.
pub(super) struct Text {
    pub(super) root: PathBuf,
    pub(super) text: String,
}

impl Files for Text {
    fn read(&self, path: &Path) -> Result<String, String> {
        if normalize(path) == self.root { Ok(self.text.clone()) } else { Disk.read(path) }
    }
    fn identity(&self, path: &Path) -> PathBuf {
        if normalize(path) == self.root { self.root.clone() } else { Disk.identity(path) }
    }
}

pub(super) struct Embedded(pub(super) Vec<(String, String)>);

impl Files for Embedded {
    fn read(&self, path: &Path) -> Result<String, String> {
        let want = normalize(path);
        self.0
            .iter()
            .find(|(p, _)| Path::new(p) == want)
            .map(|(_, t)| t.clone())
            .ok_or_else(|| "not among the embedded files".to_owned())
    }
    fn identity(&self, path: &Path) -> PathBuf {
        normalize(path)
    }
}

/// `a/./b/../c` → `a/c`, lexically (a leading `..` stays).
pub(super) fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                if matches!(out.components().next_back(), Some(Component::Normal(_))) {
                    out.pop();
                } else {
                    out.push("..");
                }
            }
            other => out.push(other.as_os_str()),
        }
    }
    out
}

/// `path` (from the current folder) as seen from the folder `dir` (also
/// from the current folder), by their names: `sc` and `sc/t.jsonl` give
/// `t.jsonl`, `sc` and `data/t.jsonl` give `../data/t.jsonl`. An absolute
/// `path` stays; where the names cannot say (`dir` climbs out with `..`
/// where `path` does not), the absolute path, or `path` as it is when
/// the file cannot be found.
pub(super) fn relative_path(dir: &Path, path: &Path) -> PathBuf {
    let absolute = |p: &Path| {
        if p.is_absolute() {
            normalize(p)
        } else {
            std::env::current_dir().map_or_else(|_| normalize(p), |cwd| normalize(&cwd.join(p)))
        }
    };
    let (d, p) = if dir.is_absolute() || path.is_absolute() {
        (absolute(dir), absolute(path))
    } else {
        (normalize(dir), normalize(path))
    };
    let dc: Vec<Component<'_>> = d.components().collect();
    let pc: Vec<Component<'_>> = p.components().collect();
    let common = dc.iter().zip(&pc).take_while(|(a, b)| a == b).count();
    // Nothing in common past the root: the absolute path says more.
    if d.is_absolute() && common <= 1 {
        return p;
    }
    if dc[common..].iter().any(|c| !matches!(c, Component::Normal(_))) {
        return std::fs::canonicalize(&p).unwrap_or(p);
    }
    let mut out = PathBuf::new();
    for _ in common..dc.len() {
        out.push("..");
    }
    for c in &pc[common..] {
        out.push(c.as_os_str());
    }
    out
}

/// One step of a field path.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Seg {
    Key(String),
    Index(usize),
}

/// `model.cache_groups[2].page_bytes` → Key, Key, Index, Key.
pub(super) fn split_path(path: &str) -> Vec<Seg> {
    let mut out = Vec::new();
    for part in path.split('.') {
        let (key, mut rest) = part.split_once('[').map_or((part, ""), |(k, r)| (k, r));
        if !key.is_empty() {
            out.push(Seg::Key(key.to_owned()));
        }
        while let Some((idx, after)) = rest.split_once(']') {
            if let Ok(i) = idx.parse() {
                out.push(Seg::Index(i));
            }
            rest = after.strip_prefix('[').unwrap_or(after);
        }
    }
    out
}

/// The span of the deepest part of `path` under `value` that exists (a
/// key's span for a table entry, so that a `[table]` header points at its
/// own line).
pub(super) fn span_of(value: &Spanned<DeValue<'_>>, path: &[Seg]) -> Range<usize> {
    let Some((first, rest)) = path.split_first() else { return value.span() };
    match (first, value.get_ref()) {
        (Seg::Key(k), DeValue::Table(t)) => match t.get_key_value(k.as_str()) {
            Some((key, v)) if rest.is_empty() => key.span().start..v.span().end.max(key.span().end),
            Some((_, v)) => span_of(v, rest),
            None => value.span(),
        },
        (Seg::Index(i), DeValue::Array(a)) => match a.get(*i) {
            Some(v) => span_of(v, rest),
            None => value.span(),
        },
        _ => value.span(),
    }
}

/// Appends to `path` the keys (and indices) leading to the innermost value
/// under `value` whose key or value holds `offset`.
pub(super) fn path_at(value: &Spanned<DeValue<'_>>, offset: usize, path: &mut String) {
    match value.get_ref() {
        DeValue::Table(t) => {
            for (k, v) in t.iter() {
                if k.span().contains(&offset) {
                    path.push('.');
                    path.push_str(k.get_ref());
                    return;
                }
                if v.span().contains(&offset) {
                    path.push('.');
                    path.push_str(k.get_ref());
                    path_at(v, offset, path);
                    return;
                }
            }
        }
        DeValue::Array(a) => {
            for (i, v) in a.iter().enumerate() {
                if v.span().contains(&offset) {
                    path.push_str(&format!("[{i}]"));
                    path_at(v, offset, path);
                    return;
                }
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn paths_relative_to_a_folder() {
        use std::path::Path;
        let rel = |d: &str, p: &str| super::relative_path(Path::new(d), Path::new(p)).display().to_string();
        assert_eq!(rel("sc", "sc/t.jsonl"), "t.jsonl");
        assert_eq!(rel("sc", "data/t.jsonl"), "../data/t.jsonl");
        assert_eq!(rel("", "t.jsonl"), "t.jsonl");
        assert_eq!(rel("a/b", "a/c/../b/t.jsonl"), "t.jsonl");
        assert_eq!(rel("../x", "../x/t.jsonl"), "t.jsonl");
        assert_eq!(rel("/x/y", "/abs/t.jsonl"), "/abs/t.jsonl");
        assert_eq!(rel("/x/y", "/x/z/t.jsonl"), "../z/t.jsonl");
        assert_eq!(rel("/x/y", "/x/y/t.jsonl"), "t.jsonl");
    }

    use super::*;

    #[test]
    fn paths_split() {
        assert_eq!(
            split_path("model.cache_groups[2].page_bytes"),
            vec![
                Seg::Key("model".into()),
                Seg::Key("cache_groups".into()),
                Seg::Index(2),
                Seg::Key("page_bytes".into())
            ]
        );
        assert_eq!(split_path("a.points[1]"), vec![Seg::Key("a".into()), Seg::Key("points".into()), Seg::Index(1)]);
    }

    #[test]
    fn normalize_paths() {
        assert_eq!(normalize(Path::new("a/./b/../c.toml")), PathBuf::from("a/c.toml"));
        assert_eq!(normalize(Path::new("../x/../y")), PathBuf::from("../y"));
    }
}
