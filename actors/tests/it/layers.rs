//! The crate's layers point one way: a module imports only from its own
//! layer or the layers below it (the order `lib.rs` lists), and names
//! another layer's items by their layer path (`crate::kv::…`), never by
//! the public re-exports. Any `crate::` path in code (comments aside) that
//! climbs counts, `use` or not.

use std::path::{Path, PathBuf};

/// The layers, lowest first (as `lib.rs` documents them).
const LAYERS: [&str; 9] = ["base", "models", "requests", "stats", "vllm", "kv", "scheduler", "serving", "deploy"];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The first segments of the `crate::` paths in `code`: `crate::a::b` gives
/// `a`, `crate::{a::b, c}` gives `a` and `c`.
fn crate_paths(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find("crate::") {
        let before = rest[..at].chars().next_back();
        rest = &rest[at + "crate::".len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        if let Some(inner) = rest.strip_prefix('{') {
            let (mut depth, mut item, mut first) = (0, String::new(), true);
            for c in inner.chars() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        first = true;
                        continue;
                    }
                    _ => {}
                }
                if depth == 0 && first {
                    if c.is_alphanumeric() || c == '_' {
                        item.push(c);
                        continue;
                    }
                    if !item.is_empty() {
                        out.push(std::mem::take(&mut item));
                        first = false;
                    }
                }
            }
            if !item.is_empty() {
                out.push(item);
            }
        } else {
            out.push(rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect());
        }
    }
    out
}

/// `line` without its comment (a `//` outside a string, roughly: the
/// crate's code puts no `//` in its strings).
fn code_of(line: &str) -> &str {
    line.find("//").map_or(line, |i| &line[..i])
}

#[test]
fn every_import_points_down() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    let mut wrong = Vec::new();
    for file in &files {
        let rel = file.strip_prefix(&src).unwrap();
        let first = rel.components().next().unwrap().as_os_str().to_str().unwrap().trim_end_matches(".rs");
        let own = LAYERS.iter().position(|&l| l == first);
        if own.is_none() {
            assert_eq!(first, "lib", "{}: a file outside the layers", rel.display());
            continue;
        }
        let text = std::fs::read_to_string(file).unwrap();
        for (n, line) in text.lines().enumerate() {
            for seg in crate_paths(code_of(line)) {
                match LAYERS.iter().position(|&l| l == seg) {
                    Some(layer) if layer <= own.unwrap() => {}
                    Some(_) => {
                        wrong.push(format!("{}:{}: imports from the higher layer `{seg}`", rel.display(), n + 1))
                    }
                    None => wrong.push(format!("{}:{}: `crate::{seg}` is not a layer path", rel.display(), n + 1)),
                }
            }
        }
    }
    assert!(wrong.is_empty(), "{} imports break the layering:\n{}", wrong.len(), wrong.join("\n"));
}

#[test]
fn the_path_reader_reads_nested_groups() {
    assert_eq!(crate_paths("use crate::kv::{Alloc, KvPool};"), ["kv"]);
    assert_eq!(crate_paths("use crate::{base::units::Tokens, kv::{A, B}, vllm};"), ["base", "kv", "vllm"]);
    assert_eq!(crate_paths("x: crate::a::B, y: my_crate::c"), ["a"]);
}
