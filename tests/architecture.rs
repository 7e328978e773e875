//! The architecture the tests enforce: every `crate::` path of the production code (test modules left out) is a
//! dependency between top-level modules that ARCHITECTURE.md's rules block allows, and no two top-level modules
//! depend on each other, directly or around a cycle.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "architecture/rules.rs"]
mod rules;
#[path = "architecture/scan.rs"]
mod scan;

use std::collections::BTreeMap;
use std::path::Path;

/// Every `.rs` file under `src/`, keyed by its path from the repository root (`src/…`, with `/`).
fn sources() -> BTreeMap<String, String> {
    sources_of(Path::new(env!("CARGO_MANIFEST_DIR")))
}

fn sources_of(root: &Path) -> BTreeMap<String, String> {
    fn visit(dir: &Path, root: &Path, out: &mut BTreeMap<String, String>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir)
            .expect("read src")
            .flatten()
            .collect();
        entries.sort_by_key(|e| e.path());
        for e in entries {
            let p = e.path();
            if p.is_dir() {
                visit(&p, root, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                let rel = p.strip_prefix(root).expect("under root");
                let key = rel.to_string_lossy().replace('\\', "/");
                out.insert(key, std::fs::read_to_string(&p).expect("read source"));
            }
        }
    }
    let mut out = BTreeMap::new();
    visit(&root.join("src"), root, &mut out);
    out
}

fn architecture_md() -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("ARCHITECTURE.md"))
        .expect("ARCHITECTURE.md")
}

#[test]
fn production_code_keeps_to_the_rules_and_has_no_module_cycle() {
    let krate = scan::read(&sources(), "src/lib.rs");
    assert!(
        krate.modules.len() > 10,
        "lib.rs declares the top-level modules"
    );
    assert!(!krate.edges.is_empty(), "the modules use each other");
    let rules = rules::parse(&architecture_md()).expect("ARCHITECTURE.md's rules block");
    let problems = rules::check(&krate, &rules);
    assert!(
        problems.is_empty(),
        "{} architecture problem(s):\n{}",
        problems.len(),
        problems.join("\n")
    );
}

/// Prints the top-level module graph (`cargo test --test architecture -- --ignored --nocapture graph`), of this
/// checkout or of the one `ARCH_ROOT` names.
#[test]
#[ignore = "prints the module graph; run by hand"]
fn graph() {
    let root = std::env::var("ARCH_ROOT").unwrap_or_else(|_| env!("CARGO_MANIFEST_DIR").into());
    let krate = scan::read(&sources_of(Path::new(&root)), "src/lib.rs");
    let mut g: BTreeMap<&str, std::collections::BTreeSet<&str>> = BTreeMap::new();
    for e in &krate.edges {
        g.entry(e.from.as_str()).or_default().insert(e.to.as_str());
    }
    let count: usize = g.values().map(|s| s.len()).sum();
    for (from, to) in &g {
        println!(
            "{from} -> {}",
            to.iter().copied().collect::<Vec<_>>().join(" ")
        );
    }
    let graph: BTreeMap<&str, BTreeMap<&str, ()>> = g
        .iter()
        .map(|(a, to)| (*a, to.iter().map(|b| (*b, ())).collect()))
        .collect();
    println!(
        "{count} edges; cycles: {:?}; tied together: {:?}",
        rules::cycles(&graph),
        rules::knots(&graph)
    );
}

// The checker itself, on small synthetic crates.

fn files(list: &[(&str, &str)]) -> BTreeMap<String, String> {
    list.iter()
        .map(|(p, t)| (p.to_string(), t.to_string()))
        .collect()
}

fn problems(list: &[(&str, &str)], rules_block: &str) -> Vec<String> {
    let doc = format!("# A\n\n{}\n{rules_block}\n```\n", rules::FENCE);
    let rules = rules::parse(&doc).expect("rules");
    rules::check(&scan::read(&files(list), "src/lib.rs"), &rules)
}

const LAYERS: &str = "app: store message\nstore: message\nmessage:";

#[test]
fn a_layered_crate_passes() {
    let p = problems(
        &[
            (
                "src/lib.rs",
                "pub mod app;\npub mod message;\npub mod store;\n",
            ),
            ("src/app.rs", "use crate::{store::Store, message};\n"),
            ("src/store/mod.rs", "mod rows;\nuse crate::message::M;\n"),
            (
                "src/store/rows.rs",
                "fn f() { let _ = crate::message::new(); }\n",
            ),
            ("src/message.rs", "pub struct M;\n"),
        ],
        LAYERS,
    );
    assert_eq!(p, Vec::<String>::new());
}

#[test]
fn an_upward_import_fails_naming_file_and_line() {
    let p = problems(
        &[
            (
                "src/lib.rs",
                "pub mod app;\npub mod message;\npub mod store;\n",
            ),
            ("src/app.rs", "use crate::message::M;\n"),
            ("src/store/mod.rs", "mod rows;\n"),
            // the store reaches up into the app: in a group, on line 3
            (
                "src/store/rows.rs",
                "//! rows\n\nuse crate::{message::M, app::AppState};\n",
            ),
            ("src/message.rs", ""),
        ],
        LAYERS,
    );
    assert_eq!(p.len(), 1, "{p:?}");
    assert!(
        p[0].starts_with("src/store/rows.rs:3: `store` uses `crate::app`"),
        "{p:?}"
    );
}

#[test]
fn a_cycle_fails_even_where_the_rules_would_allow_each_edge() {
    let p = problems(
        &[
            ("src/lib.rs", "pub mod a;\npub mod b;\npub mod c;\n"),
            ("src/a.rs", "use crate::b;\n"),
            ("src/b.rs", "fn f() { crate::c::g(); }\n"),
            ("src/c/mod.rs", "mod deep;\n"),
            ("src/c/deep.rs", "\n\nuse super::super::a::A;\n"),
        ],
        "a: b\nb: c\nc: a",
    );
    assert!(
        p.iter().any(|m| m.starts_with(
            "cycle between top-level modules a -> b -> c -> a: a -> b at src/a.rs:1; \
             b -> c at src/b.rs:1; c -> a at src/c/deep.rs:3"
        )),
        "{p:?}"
    );
    assert!(
        p.iter()
            .any(|m| m.starts_with("ARCHITECTURE.md rules allow a cycle")),
        "{p:?}"
    );
}

#[test]
fn test_code_comments_and_strings_are_not_dependencies() {
    let p = problems(
        &[
            (
                "src/lib.rs",
                "pub mod app;\npub mod message;\npub mod store;\n",
            ),
            ("src/app.rs", ""),
            ("src/message.rs", ""),
            (
                "src/store/mod.rs",
                "//! Unlike [`crate::app`], …\n\
                 const S: &str = \"crate::app\";\n\
                 const R: &str = r#\"use crate::app;\"#;\n\
                 fn f<'a>(c: char) -> bool { c == '{' }\n\
                 /* crate::app::X */\n\
                 #[cfg(test)]\nmod tests { use crate::app::AppState; fn g() { crate::app::h(); } }\n\
                 #[cfg(test)]\n#[path = \"store_tests.rs\"]\nmod more;\n\
                 #[cfg(test)]\nuse crate::{app, message};\n",
            ),
            ("src/store/store_tests.rs", "use crate::app::AppState;\n"),
            ("src/store/tests/props.rs", "use crate::app::AppState;\n"),
        ],
        LAYERS,
    );
    assert_eq!(p, Vec::<String>::new());
}

#[test]
fn a_module_without_a_rule_and_a_rule_without_a_module_fail() {
    let p = problems(
        &[
            (
                "src/lib.rs",
                "pub mod app;\npub mod message;\npub mod store;\npub mod extra;\n",
            ),
            ("src/app.rs", ""),
            ("src/message.rs", ""),
            ("src/store.rs", ""),
            ("src/extra.rs", ""),
        ],
        "app: store message\nstore: message sesion\nmessage:",
    );
    assert!(p.iter().any(|m| m.contains("`extra` has no line")), "{p:?}");
    assert!(
        p.iter()
            .any(|m| m.contains("`sesion` (in `store`'s line) is no module")),
        "{p:?}"
    );
}

#[test]
fn the_real_checker_sees_a_known_edge() {
    // Guards the scanner against reading nothing: `pipeline` plainly uses `dialect`.
    let krate = scan::read(&sources(), "src/lib.rs");
    assert!(krate
        .edges
        .iter()
        .any(|e| e.from == "pipeline" && e.to == "dialect" && e.file.starts_with("src/pipeline/")));
    assert!(krate.missing.is_empty(), "{:?}", krate.missing);
}
