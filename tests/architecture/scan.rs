//! Reading the production sources: which top-level module each `crate::` path (and each `super::` path that
//! climbs to the crate root) names, with the file and line it is on. Test code is left out: `#[cfg(test)]` items
//! and the files only they declare.

use regex::Regex;
use std::collections::BTreeMap;
use std::sync::LazyLock;

/// One use of another top-level module: `from` names `to` at `file:line`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Edge {
    pub from: String,
    pub to: String,
    pub file: String,
    pub line: usize,
}

/// The crate as read: its top-level modules and every use of one by another, in file order.
#[derive(Debug, Default)]
pub struct Crate {
    pub modules: Vec<String>,
    pub edges: Vec<Edge>,
    /// Declared modules whose file is missing (`mod x;` with neither `x.rs` nor `x/mod.rs`).
    pub missing: Vec<String>,
}

static MOD_DECL: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"(?:pub(?:\s*\([^)]*\))?\s+)?\bmod\s+(\w+)\s*;").expect("pattern")
});
static CFG_TEST: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"#\s*\[\s*cfg\s*\(\s*test\s*\)\s*\]").expect("pattern"));
static CRATE_PATH: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"\bcrate\s*::\s*(\{|\w+)").expect("pattern"));
static SUPER_PATH: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"\b((?:super\s*::\s*)+)(\{|\w+)").expect("pattern"));
static PATH_ATTR: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r#"#\s*\[\s*path\s*=\s*"([^"]+)"\s*\]\s*$"#).expect("pattern"));
static IDENT: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"^\s*(\w+)").expect("pattern"));

/// Reads the crate rooted at `root` (e.g. `src/lib.rs`) out of `files` (path → source, paths with `/`).
pub fn read(files: &BTreeMap<String, String>, root: &str) -> Crate {
    let mut out = Crate::default();
    let Some(text) = files.get(root) else {
        out.missing.push(root.to_string());
        return out;
    };
    let code = without_tests(&blank_comments_and_literals(text));
    let dir = parent(root);
    for (name, path_attr, _) in module_decls(text, &code) {
        out.modules.push(name.clone());
        match child_file(files, &dir, &name, path_attr.as_deref()) {
            Some((file, is_dir_owner)) => walk(files, &file, is_dir_owner, &[name], &mut out),
            None => out.missing.push(format!("{root}: mod {name}")),
        }
    }
    out
}

/// Reads one module file and the non-test modules it declares; `dir_owner`: the file owns its directory
/// (`mod.rs`), so its children sit beside it rather than in a folder of its own name.
fn walk(
    files: &BTreeMap<String, String>,
    file: &str,
    dir_owner: bool,
    path: &[String],
    out: &mut Crate,
) {
    let Some(text) = files.get(file) else {
        out.missing.push(file.to_string());
        return;
    };
    let code = without_tests(&blank_comments_and_literals(text));
    let top = &path[0];
    for (to, offset) in named_modules(&code, path.len()) {
        if &to != top && to != "self" && to != "super" && to != "crate" {
            out.edges.push(Edge {
                from: top.clone(),
                to,
                file: file.to_string(),
                line: line_of(&code, offset),
            });
        }
    }
    let dir = if dir_owner {
        parent(file)
    } else {
        file.trim_end_matches(".rs").to_string()
    };
    for (name, path_attr, _) in module_decls(text, &code) {
        // `#[path]` is relative to the directory of the declaring file.
        let base = if path_attr.is_some() {
            parent(file)
        } else {
            dir.clone()
        };
        match child_file(files, &base, &name, path_attr.as_deref()) {
            Some((child, owner)) => {
                let mut p = path.to_vec();
                p.push(name);
                walk(files, &child, owner, &p, out);
            }
            None => out.missing.push(format!("{file}: mod {name}")),
        }
    }
}

/// The `mod name;` declarations left in `code` (tests already blanked), with a `#[path]` attribute's value read
/// from the original `text` right before the declaration.
fn module_decls(text: &str, code: &str) -> Vec<(String, Option<String>, usize)> {
    MOD_DECL
        .captures_iter(code)
        .map(|c| {
            let start = c.get(0).map_or(0, |m| m.start());
            let before = &text[..start];
            let line_start = before.rfind('\n').map_or(0, |i| i + 1);
            let prev = before[..line_start.saturating_sub(1)]
                .rfind('\n')
                .map_or(0, |i| i + 1);
            let attr = PATH_ATTR
                .captures(before[prev..].trim_end())
                .map(|a| a[1].to_string());
            (c[1].to_string(), attr, start)
        })
        .collect()
}

/// The file of module `name` declared in directory `dir`: `#[path]` if given, else `name.rs` (not a directory
/// owner) or `name/mod.rs` (one).
fn child_file(
    files: &BTreeMap<String, String>,
    dir: &str,
    name: &str,
    path_attr: Option<&str>,
) -> Option<(String, bool)> {
    if let Some(p) = path_attr {
        let f = join(dir, p);
        return files.contains_key(&f).then_some((f, true));
    }
    let flat = join(dir, &format!("{name}.rs"));
    if files.contains_key(&flat) {
        return Some((flat, false));
    }
    let owner = join(dir, &format!("{name}/mod.rs"));
    files.contains_key(&owner).then_some((owner, true))
}

/// The top-level modules `code` names, with the offset of each path: `crate::a`, each head of `crate::{a, b::c}`,
/// and `super::…::a` when the `super`s climb from a module `depth` deep to the crate root.
fn named_modules(code: &str, depth: usize) -> Vec<(String, usize)> {
    let mut found = Vec::new();
    for c in CRATE_PATH.captures_iter(code) {
        let head = c.get(1).map_or(0, |m| m.start());
        found.extend(heads(code, head));
    }
    for c in SUPER_PATH.captures_iter(code) {
        let supers = c[1].matches("super").count();
        if supers >= depth {
            let head = c.get(2).map_or(0, |m| m.start());
            found.extend(heads(code, head));
        }
    }
    found.sort_by_key(|(_, offset)| *offset);
    found
}

/// The module names at `at`: one identifier, or the first identifier of each item of a `{…}` group.
fn heads(code: &str, at: usize) -> Vec<(String, usize)> {
    let rest = &code[at..];
    if !rest.starts_with('{') {
        return IDENT
            .captures(rest)
            .map(|c| vec![(c[1].to_string(), at)])
            .unwrap_or_default();
    }
    let mut out = Vec::new();
    let mut depth = 0usize;
    let mut item_start = at + 1;
    for (i, ch) in rest.char_indices() {
        match ch {
            '{' => depth += 1,
            '}' | ',' if depth == 1 => {
                if let Some(c) = IDENT.captures(&code[item_start..at + i]) {
                    out.push((c[1].to_string(), item_start));
                }
                item_start = at + i + 1;
                if ch == '}' {
                    break;
                }
            }
            '}' => depth -= 1,
            _ => {}
        }
    }
    out
}

/// `code` with every `#[cfg(test)]` item blanked (newlines kept, so offsets and lines still match): up to the
/// `;` that ends it, or the `}` that closes its first block (a `use` always ends at its `;`).
pub fn without_tests(code: &str) -> String {
    let mut bytes = code.as_bytes().to_vec();
    for m in CFG_TEST.find_iter(code) {
        let end = item_end(code, m.end());
        for b in &mut bytes[m.start()..end] {
            if *b != b'\n' {
                *b = b' ';
            }
        }
    }
    String::from_utf8(bytes).unwrap_or_default()
}

/// Where the item starting at `from` ends (exclusive).
fn item_end(code: &str, from: usize) -> usize {
    let rest = &code[from..];
    let is_use = {
        let t = rest.trim_start();
        let t = t.strip_prefix("pub").map_or(t, str::trim_start);
        t.starts_with("use ")
    };
    let mut depth = 0i32;
    for (i, ch) in rest.char_indices() {
        match ch {
            '{' | '(' | '[' => depth += 1,
            '}' | ')' | ']' => {
                depth -= 1;
                if depth == 0 && ch == '}' && !is_use {
                    return from + i + 1;
                }
            }
            ';' if depth == 0 => return from + i + 1,
            _ => {}
        }
    }
    code.len()
}

/// `text` with comments, string literals and character literals blanked (newlines kept), so that neither a doc
/// line nor a string that mentions `crate::x` counts as a use.
pub fn blank_comments_and_literals(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = b.to_vec();
    let blank = |out: &mut Vec<u8>, from: usize, to: usize| {
        for x in &mut out[from..to.min(b.len())] {
            if *x != b'\n' {
                *x = b' ';
            }
        }
    };
    let mut i = 0;
    while i < b.len() {
        let ident_before = i > 0 && (b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_');
        if b[i..].starts_with(b"//") {
            let end = text[i..].find('\n').map_or(b.len(), |n| i + n);
            blank(&mut out, i, end);
            i = end;
        } else if b[i..].starts_with(b"/*") {
            let mut depth = 0;
            let mut j = i;
            while j < b.len() {
                if b[j..].starts_with(b"/*") {
                    depth += 1;
                    j += 2;
                } else if b[j..].starts_with(b"*/") {
                    depth -= 1;
                    j += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    j += 1;
                }
            }
            blank(&mut out, i, j);
            i = j;
        } else if !ident_before && raw_string_start(&b[i..]).is_some() {
            let (open, hashes) = raw_string_start(&b[i..]).unwrap_or((0, 0));
            let close = format!("\"{}", "#".repeat(hashes));
            let end = text[i + open..]
                .find(&close)
                .map_or(b.len(), |n| i + open + n + close.len());
            blank(&mut out, i, end);
            i = end;
        } else if b[i] == b'"' {
            let mut j = i + 1;
            while j < b.len() && b[j] != b'"' {
                j += if b[j] == b'\\' { 2 } else { 1 };
            }
            blank(&mut out, i, j + 1);
            i = j + 1;
        } else if b[i] == b'\'' {
            // A character literal ('x', '\n', '\u{1F600}'); a lifetime ('a) has no closing quote right after.
            let len = char_literal_len(&text[i..]);
            blank(&mut out, i, i + len);
            i += len.max(1);
        } else {
            i += 1;
        }
    }
    String::from_utf8(out).unwrap_or_default()
}

/// `r"`, `r#"`, `br##"`…: the opening's length and its number of `#`.
fn raw_string_start(b: &[u8]) -> Option<(usize, usize)> {
    let mut i = usize::from(b.first() == Some(&b'b'));
    if b.get(i) != Some(&b'r') {
        return None;
    }
    i += 1;
    let hashes = b[i..].iter().take_while(|&&c| c == b'#').count();
    (b.get(i + hashes) == Some(&b'"')).then_some((i + hashes + 1, hashes))
}

/// The length of the character literal at the start of `s`, or 0 when it is a lifetime.
fn char_literal_len(s: &str) -> usize {
    let mut chars = s.char_indices().skip(1);
    match chars.next() {
        Some((_, '\\')) => s[1..].find('\'').map_or(0, |n| {
            // '\'' : the escaped quote is not the end
            if n == 1 {
                s[3..].find('\'').map_or(0, |m| m + 4)
            } else {
                n + 2
            }
        }),
        Some((_, c)) => {
            let after = 1 + c.len_utf8();
            if s[after..].starts_with('\'') {
                after + 1
            } else {
                0
            }
        }
        None => 0,
    }
}

fn line_of(code: &str, offset: usize) -> usize {
    code[..offset].matches('\n').count() + 1
}

fn parent(path: &str) -> String {
    path.rsplit_once('/')
        .map_or(String::new(), |(d, _)| d.to_string())
}

fn join(dir: &str, rel: &str) -> String {
    if dir.is_empty() {
        rel.to_string()
    } else {
        format!("{dir}/{rel}")
    }
}
