//! Replays every recorded conversation in `../shared/traces/` through the planner with a 16k window: every request
//! sent stays valid, none is refused, and every request above the threshold is rewritten smaller; with summaries
//! off (the default config) and simulated.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::print_stdout
)]

use ctxgate::config::Config;
use ctxgate::dialect::Dialect;
use ctxgate::replay::{replay_trace, Outcome, ReplayOptions, ReplayReport, ReplayTotals};
use std::path::{Path, PathBuf};

fn trace_files() -> Option<Vec<PathBuf>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/traces");
    if !dir.is_dir() {
        let required = std::env::var("CTXGATE_REQUIRE_EXTERNAL").is_ok_and(|v| v == "1");
        assert!(!required, "{} is missing", dir.display());
        println!(
            "note: {} not found; skipping the trace replay",
            dir.display()
        );
        return None;
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no traces in {}", dir.display());
    Some(files)
}

/// Replays every trace with a 16k window and checks what holds whatever the strategy: every request sent is
/// valid, none is refused, every request above the threshold is rewritten to fewer tokens, and the planner's
/// estimate of a rewrite equals a recount of it.
fn replay_all(summaries: bool) -> Option<Vec<ReplayReport>> {
    replay_all_in(summaries, Dialect::Chat)
}

/// [`replay_all`] with every request converted to `dialect` (for Anthropic, a rewrite must also pass the Messages
/// API's rules and keep what a rewrite may not touch: `dialect::anthropic::validate`).
fn replay_all_in(summaries: bool, dialect: Dialect) -> Option<Vec<ReplayReport>> {
    let files = trace_files()?;
    let opts = ReplayOptions {
        window: Some(16_000),
        summaries,
        dialect: Some(dialect),
        ..Default::default()
    };
    let cfg = Config::default();
    let mut all = Vec::new();
    for path in &files {
        let name = path.file_name().unwrap().to_string_lossy();
        let trace = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let report = replay_trace(&trace, &opts, &cfg).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(!report.steps.is_empty(), "{name}: nothing to replay");
        for s in &report.steps {
            let at = format!("{name} step {}", s.index);
            assert_ne!(s.outcome, Outcome::Reject, "{at}: {:?}", s.problem);
            assert!(s.valid, "{at}: {:?}", s.problem);
            if s.outcome == Outcome::Rewrite {
                // upstream tokens include the recall tools and note the gateway adds; the recount does not
                let recount = s.recounted_tokens.unwrap();
                assert!(recount <= s.upstream_tokens, "{at}");
                assert!(
                    s.upstream_tokens < s.client_tokens,
                    "{at}: a rewrite must save tokens: client {} -> {}",
                    s.client_tokens,
                    s.upstream_tokens
                );
            }
            if s.above_threshold && s.outcome == Outcome::Forward {
                println!("note: {at}: above the threshold but forwarded (a rewrite would save less than the recall tools cost)");
            }
        }
        println!(
            "{name}: {} steps, {} above threshold, {} rewritten, {} summarized, ratio {:?}",
            report.totals.steps,
            report.totals.above_threshold,
            report.totals.rewritten,
            report.totals.summarized,
            report.totals.mean_ratio_above
        );
        all.push(report);
    }
    let overall = ReplayTotals::of(all.iter().flat_map(|r| &r.steps));
    assert_eq!((overall.invalid, overall.rejected), (0, 0));
    assert!(
        overall.above_threshold > 0,
        "a 16k window should put some steps above the threshold"
    );
    println!(
        "overall: {} steps, {} above threshold, mean upstream/client above threshold {:?}",
        overall.steps, overall.above_threshold, overall.mean_ratio_above
    );
    Some(all)
}

#[test]
fn every_trace_replays_validly_in_a_16k_window() {
    if let Some(all) = replay_all(false) {
        assert!(all.iter().all(|r| r.totals.summarized == 0 && !r.summaries));
    }
}

#[test]
fn every_trace_replays_validly_as_anthropic_messages() {
    for summaries in [false, true] {
        if let Some(all) = replay_all_in(summaries, Dialect::Anthropic) {
            assert!(all.iter().all(|r| r.dialect == "anthropic"));
            if summaries {
                assert!(
                    all.iter().any(|r| r.totals.summarized > 0),
                    "summaries are used in the Anthropic dialect too"
                );
            }
        }
    }
}

#[test]
fn every_trace_replays_validly_as_responses_input_items() {
    for summaries in [false, true] {
        if let Some(all) = replay_all_in(summaries, Dialect::Responses) {
            assert!(all.iter().all(|r| r.dialect == "responses"));
        }
    }
}

#[test]
fn every_trace_replays_validly_with_simulated_summaries() {
    if let Some(all) = replay_all(true) {
        assert!(all.iter().all(|r| r.summaries));
    }
}

/// The fast counter agrees with tiktoken on every text of every trace (message contents, tool arguments, tool
/// schemas), in both encodings.
#[test]
fn every_text_in_the_traces_counts_as_tiktoken_does() {
    use ctxgate::context::tokens::{count_text, Encoding};
    use serde_json::Value;
    let Some(files) = trace_files() else { return };
    let encodings = [
        (Encoding::O200k, tiktoken_rs::o200k_base_singleton()),
        (Encoding::Cl100k, tiktoken_rs::cl100k_base_singleton()),
    ];
    let mut texts = 0;
    for path in &files {
        let name = path.file_name().unwrap().to_string_lossy();
        let trace: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let mut stack = vec![&trace];
        while let Some(v) = stack.pop() {
            match v {
                Value::String(s) if s.len() <= 128 * 1024 => {
                    texts += 1;
                    for (enc, bpe) in &encodings {
                        assert_eq!(
                            count_text(*enc, s),
                            bpe.encode_ordinary(s).len() as u64,
                            "{name}: {enc:?} {:?}",
                            s.chars().take(80).collect::<String>()
                        );
                    }
                }
                Value::Array(a) => stack.extend(a),
                Value::Object(o) => stack.extend(o.values()),
                _ => {}
            }
        }
    }
    println!("{texts} texts counted as tiktoken counts them");
}
