//! Replays every recorded conversation in `../shared/traces/` (or the directory in `CTXGATE_TRACES`) through the
//! planner with a 16k window: every request sent stays valid, none is refused, none exceeds the window, and every
//! request above the threshold is rewritten smaller; with summaries off (the default config) and simulated. Also
//! the traces of the other dialects (`tests/traces/`: an Anthropic Messages and a Responses agent run), the prompt
//! cache figures against a recount of the bytes sent, and `ctxgate replay --compare`.
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
    let dir = std::env::var_os("CTXGATE_TRACES").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/traces"),
        PathBuf::from,
    );
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
                if s.stages == ["offered"] {
                    // the recall tools offered beside the client's own, its messages untouched: the tools' tokens more
                    assert_eq!(
                        recount, s.client_tokens,
                        "{at}: an offered request keeps its messages"
                    );
                    assert!(s.upstream_tokens > s.client_tokens, "{at}");
                } else {
                    assert!(
                        s.upstream_tokens < s.client_tokens,
                        "{at}: a rewrite must save tokens: client {} -> {}",
                        s.client_tokens,
                        s.upstream_tokens
                    );
                }
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
    assert_eq!(overall.over_window, 0, "no request sent above the window");
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

fn fixture(name: &str) -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/traces")
        .join(name);
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

use ctxgate::config::Strategy;
use ctxgate::context::tokens::{count_text, Encoding};
use ctxgate::replay::compare::{self, Settings};
use ctxgate::replay::{replay_requests, Counters};
use serde_json::{json, Value};

const FIXTURES: [(&str, &str, usize); 2] = [
    ("anthropic_agent.json", "anthropic", 10),
    ("responses_agent.json", "responses", 9),
];

fn opts(window: u64, strategy: Strategy) -> ReplayOptions {
    ReplayOptions {
        window: Some(window),
        strategy: Some(strategy),
        summaries: true,
        ..Default::default()
    }
}

/// The Anthropic and Responses fixtures are detected and replayed in their own dialect: a request per answer of
/// the model, each valid under that API's rules, the later ones rewritten in a small window.
#[test]
fn traces_of_the_other_dialects_replay_in_their_own() {
    let cfg = Config::default();
    for (file, format, answers) in FIXTURES {
        let trace = fixture(file);
        for strategy in [
            Strategy::Off,
            Strategy::Prune,
            Strategy::Hybrid,
            Strategy::Summarize,
        ] {
            let r = replay_trace(&trace, &opts(4000, strategy), &cfg).unwrap();
            let at = format!("{file} {}", strategy.as_str());
            assert_eq!((r.format, r.dialect), (format, format), "{at}");
            assert_eq!(r.steps.len(), answers, "{at}");
            for s in &r.steps {
                assert!(s.valid, "{at} step {}: {:?}", s.index, s.problem);
                assert_ne!(s.outcome, Outcome::Reject, "{at} step {}", s.index);
                let rewrites = strategy != Strategy::Off;
                assert!(
                    !(rewrites && s.over_window),
                    "{at} step {}: the additions fit",
                    s.index
                );
            }
            if strategy == Strategy::Off {
                assert_eq!(r.totals.cache_cost, Some(1.0), "{at}");
            } else {
                assert!(r.totals.rewritten > 0, "{at}");
                assert!(r.totals.upstream_tokens < r.totals.client_tokens, "{at}");
            }
        }
        // Clearing all but the newest result never reaches into the newest message (parallel results of one
        // Anthropic user message stay whole), and nothing sent is over the window.
        let mut keep_one = Config::default();
        keep_one.prune.keep_tool_results = 1;
        let r = replay_trace(&trace, &opts(4000, Strategy::Prune), &keep_one).unwrap();
        for s in &r.steps {
            assert!(s.valid, "{file} keep 1, step {}: {:?}", s.index, s.problem);
            assert!(!s.over_window, "{file} keep 1, step {}", s.index);
        }
        // they do not convert to another dialect
        let chat = ReplayOptions {
            dialect: Some(Dialect::Chat),
            ..Default::default()
        };
        let e = replay_trace(&trace, &chat, &cfg).unwrap_err();
        assert!(e.contains(&format!("replays as {format} only")), "{e}");
    }
}

/// A hand-made chat agent run: system, two user turns with tool loops (results of ~`words` words), answers.
fn chat_trace(words: usize) -> Value {
    let mut m = vec![json!({"role":"system","content":"You are a coding agent."})];
    for task in 0..2 {
        m.push(json!({"role":"user","content":format!("Task {task}: fix the failing test.")}));
        for i in 0..8 {
            let id = format!("call_{task}_{i}");
            m.push(json!({"role":"assistant","content":null,"tool_calls":[{"id":id,"type":"function",
                "function":{"name":"read_file","arguments":format!("{{\"path\":\"src/t{task}/f{i}.rs\"}}")}}]}));
            let text: Vec<String> = (0..words).map(|w| format!("word{}", w * 7 + i)).collect();
            m.push(json!({"role":"tool","tool_call_id":id,"content":text.join(" ")}));
        }
        m.push(json!({"role":"assistant","content":format!("Task {task} is fixed.")}));
    }
    let tools = json!([{"type":"function","function":{"name":"read_file","description":"Read a file.",
        "parameters":{"type":"object","properties":{"path":{"type":"string"}}}}}]);
    json!({"id":"chat","model":"gpt-4o","tools":tools,"messages":m})
}

/// A chat trace replayed as Anthropic (or Responses) requests and the same conversation recorded natively in
/// that dialect replay alike: the same requests, decisions and figures, step for step.
#[test]
fn a_chat_trace_and_its_native_recording_replay_alike() {
    use ctxgate::dialect::anthropic::from_chat::chat_to_anthropic;
    use ctxgate::dialect::responses::from_chat::chat_to_responses;
    let chat = chat_trace(120);
    let body = json!({"model":"gpt-4o","messages":chat["messages"],"tools":chat["tools"]});
    let body = body.as_object().unwrap();
    let cfg = Config::default();
    for (dialect, native) in [
        (Dialect::Anthropic, chat_to_anthropic(body)),
        (Dialect::Responses, chat_to_responses(body)),
    ] {
        let mut native = Value::Object(native);
        native["id"] = json!("native");
        let converted = ReplayOptions {
            dialect: Some(dialect),
            ..opts(3000, Strategy::Prune)
        };
        let (a, ra) = replay_requests(&chat, &converted, &cfg).unwrap();
        let (b, rb) = replay_requests(&native, &opts(3000, Strategy::Prune), &cfg).unwrap();
        assert_eq!(b.format, dialect.as_str());
        assert_eq!(a.steps.len(), b.steps.len(), "{dialect:?}");
        assert!(a.totals.rewritten > 0);
        for ((x, y), (rx, ry)) in a.steps.iter().zip(&b.steps).zip(ra.iter().zip(&rb)) {
            assert_eq!(
                rx.client_body, ry.client_body,
                "{dialect:?} step {}",
                x.index
            );
            assert_eq!(
                rx.upstream_body, ry.upstream_body,
                "{dialect:?} step {}",
                x.index
            );
            let figures = |s: &ctxgate::replay::ReplayStep| {
                (
                    s.outcome,
                    s.client_tokens,
                    s.upstream_tokens,
                    s.wire_tokens,
                    s.wire_cached,
                    s.task_whole,
                )
            };
            assert_eq!(figures(x), figures(y), "{dialect:?} step {}", x.index);
        }
        assert_eq!(a.totals, b.totals);
    }
}

/// The prefix items of a body, recounted here: `tools`, the system field of the dialect, the conversation.
fn items(dialect: Dialect, body: &Value) -> Vec<Value> {
    let field = |k: &str| body.get(k).cloned().unwrap_or(Value::Null);
    let mut out = vec![field("tools")];
    match dialect {
        Dialect::Chat => {}
        Dialect::Anthropic => out.push(field("system")),
        Dialect::Responses => out.push(field("instructions")),
        Dialect::Gemini => out.push(field("systemInstruction")),
    }
    out.extend(
        body[dialect.conversation_key()]
            .as_array()
            .unwrap()
            .iter()
            .cloned(),
    );
    out
}

/// `(tokens, cached, appends)` of each body after the one before.
fn cache_walk(dialect: Dialect, enc: Encoding, bodies: &[Value]) -> Vec<(u64, u64, Option<bool>)> {
    let mut prev: Option<Vec<Value>> = None;
    let mut out = Vec::new();
    for b in bodies {
        let cur = items(dialect, b);
        let weight = |v: &Value| count_text(enc, &serde_json::to_string(v).unwrap());
        let tokens = cur.iter().map(weight).sum();
        let (cached, appends) = match &prev {
            None => (0, None),
            Some(p) => {
                let shared = cur.iter().zip(p).take_while(|(a, b)| a == b).count();
                let cached = cur[..shared].iter().map(weight).sum();
                (cached, Some(shared == p.len() && p.len() <= cur.len()))
            }
        };
        out.push((tokens, cached, appends));
        prev = Some(cur);
    }
    out
}

/// The client's first user message opening a turn, as its own item.
fn first_task(dialect: Dialect, client: &Value) -> Option<Value> {
    let conv = client[dialect.conversation_key()].as_array().unwrap();
    conv.iter()
        .find(|m| {
            let user = m["role"] == "user";
            match dialect {
                Dialect::Chat => user,
                Dialect::Anthropic => {
                    user && !m["content"]
                        .as_array()
                        .is_some_and(|b| b.iter().any(|b| b["type"] == "tool_result"))
                }
                Dialect::Responses => user && (m["type"] == "message" || m.get("type").is_none()),
                Dialect::Gemini => {
                    user && !m["parts"]
                        .as_array()
                        .is_some_and(|ps| ps.iter().any(|p| p.get("functionResponse").is_some()))
                }
            }
        })
        .cloned()
}

/// The prefix-stable pairs, the cache cost and the task figures agree with a recount from the bytes of every
/// request sent (items compared as JSON values, weighed from their text).
#[test]
fn cache_and_task_figures_agree_with_a_recount_of_the_bytes_sent() {
    let cfg = Config::default();
    let mut cases = vec![(chat_trace(120), Dialect::Chat)];
    for (file, format, _) in FIXTURES {
        cases.push((fixture(file), Dialect::named(format)));
    }
    for (trace, dialect) in cases {
        for strategy in [Strategy::Off, Strategy::Prune, Strategy::Hybrid] {
            let (r, reqs) = replay_requests(&trace, &opts(3500, strategy), &cfg).unwrap();
            let at = format!("{} {}", r.id, strategy.as_str());
            let enc = Encoding::for_model(&r.model);
            let parse = |b: &[u8]| serde_json::from_slice::<Value>(b).unwrap();
            let clients: Vec<Value> = reqs.iter().map(|q| parse(&q.client_body)).collect();
            let sent: Vec<(usize, Value)> = reqs
                .iter()
                .enumerate()
                .filter_map(|(i, q)| q.upstream_body.as_deref().map(|b| (i, parse(b))))
                .collect();
            let client_walk = cache_walk(dialect, enc, &clients);
            let bodies: Vec<Value> = sent.iter().map(|(_, b)| b.clone()).collect();
            let sent_walk = cache_walk(dialect, enc, &bodies);
            let (mut billed, mut client_billed, mut pairs, mut stable) = (0.0, 0.0, 0, 0);
            for ((i, body), (tokens, cached, appends)) in sent.iter().zip(&sent_walk) {
                let s = &r.steps[*i];
                assert_eq!(
                    (s.wire_tokens, s.wire_cached, s.prefix_stable),
                    (*tokens, *cached, *appends),
                    "{at} step {}",
                    s.index
                );
                let (ct, cc, _) = client_walk[*i];
                assert_eq!(
                    (s.client_wire_tokens, s.client_wire_cached),
                    (ct, cc),
                    "{at} step {}",
                    s.index
                );
                billed += *tokens as f64 - 0.9 * *cached as f64;
                client_billed += ct as f64 - 0.9 * cc as f64;
                pairs += usize::from(appends.is_some());
                stable += usize::from(*appends == Some(true));
                let task = first_task(dialect, &clients[*i]);
                let whole = task.is_none_or(|t| {
                    body[dialect.conversation_key()]
                        .as_array()
                        .unwrap()
                        .contains(&t)
                });
                let expected = (s.outcome == Outcome::Rewrite).then_some(whole);
                assert_eq!(s.task_whole, expected, "{at} step {}", s.index);
            }
            let t = &r.totals;
            assert_eq!(
                (t.prefix_pairs, t.prefix_stable_pairs),
                (pairs, stable),
                "{at}"
            );
            assert!(
                (t.billed - billed).abs() < 1e-6 && (t.client_billed - client_billed).abs() < 1e-6,
                "{at}"
            );
            assert_eq!(t.cache_cost, Some(billed / client_billed), "{at}");
            if strategy != Strategy::Off {
                assert!(
                    stable < pairs,
                    "{at}: the first rewrite adds the recall tools"
                );
            }
        }
    }
}

/// `--compare` rows over the fixtures: the baseline sends everything (cache cost 1, every pair stable); each
/// strategy row runs with its settings.
#[test]
fn compare_runs_every_row_over_the_same_traces() {
    let traces: Vec<(String, Value)> = FIXTURES
        .iter()
        .map(|(f, _, _)| (f.to_string(), fixture(f)))
        .collect();
    let with = [Settings::parse("context.threshold=0.5").unwrap()];
    let rows = compare::rows(&Config::default(), &with).unwrap();
    let opts = ReplayOptions {
        window: Some(4000),
        ..Default::default()
    };
    let done = std::sync::atomic::AtomicUsize::new(0);
    let tick = || {
        done.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    };
    let out = compare::run(&traces, &opts, &rows, &Counters::default(), &tick).unwrap();
    assert_eq!(done.into_inner(), rows.len() * traces.len());
    let labels: Vec<&str> = out.iter().map(|r| r.label.as_str()).collect();
    assert_eq!(
        labels,
        [
            "off",
            "prune",
            "prune context.threshold=0.5",
            "hybrid",
            "hybrid context.threshold=0.5",
            "summarize",
            "summarize context.threshold=0.5"
        ]
    );
    let off = &out[0].totals;
    assert_eq!((off.rewritten, off.savings), (0, 0.0));
    assert_eq!((off.cache_cost, off.prefix_stable), (Some(1.0), Some(1.0)));
    assert!(off.over_window > 0);
    // each row is the replay of every trace with its strategy and config
    let cfg = Config::default();
    let mut half = cfg.clone();
    half.context.threshold = 0.5;
    for (row, strategy, config) in [
        (1, Strategy::Prune, &cfg),
        (2, Strategy::Prune, &half),
        (4, Strategy::Hybrid, &half),
    ] {
        let steps: Vec<_> = traces
            .iter()
            .flat_map(|(_, t)| {
                replay_trace(t, &self::opts(4000, strategy), config)
                    .unwrap()
                    .steps
            })
            .collect();
        assert_eq!(
            out[row].totals,
            ReplayTotals::of(&steps),
            "{}",
            out[row].label
        );
    }
    assert!(
        out[2].totals.above_threshold > out[1].totals.above_threshold,
        "the setting applies: a lower threshold puts more requests above it"
    );
    assert!(out[3].summaries && !out[1].summaries);
    let mut text = Vec::new();
    compare::write_table(&mut text, &out).unwrap();
    let text = String::from_utf8(text).unwrap();
    assert_eq!(text.lines().count(), 8);
    assert!(text.contains("CACHE") && text.contains("prune context.threshold=0.5"));
}

/// The shared traces through `--compare`'s rows: the baseline sends everything, the strategies rewrite validly.
#[test]
fn compare_over_the_shared_traces() {
    let Some(files) = trace_files() else { return };
    let traces: Vec<(String, Value)> = files
        .iter()
        .map(|p| {
            let t = serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap();
            (p.display().to_string(), t)
        })
        .collect();
    let rows = compare::rows(&Config::default(), &[]).unwrap();
    let opts = ReplayOptions {
        window: Some(16_000),
        ..Default::default()
    };
    let out = compare::run(&traces, &opts, &rows, &Counters::default(), &|| ()).unwrap();
    assert_eq!(out.len(), 4);
    assert_eq!(out[0].totals.cache_cost, Some(1.0));
    for r in &out[1..] {
        let t = &r.totals;
        println!(
            "{}: saved {:.3}, ratio {:?}, stable {:?}, cache {:?}, task {:?}",
            r.label,
            t.savings,
            t.mean_ratio_above,
            t.prefix_stable,
            t.cache_cost,
            t.task_whole_share
        );
        assert_eq!(
            (t.invalid, t.rejected, t.over_window),
            (0, 0, 0),
            "{}",
            r.label
        );
        assert!(t.savings > 0.0, "{}", r.label);
    }
}

/// The working set's counts add up: a row's totals are the sum of its traces', a trace's the sum of its steps';
/// shown ≤ facts and whole ≤ shown everywhere.
fn check_working_set(r: &compare::CompareRow) {
    let t = &r.totals;
    let sum = |f: fn(&compare::TraceFacts) -> usize| r.traces.iter().map(f).sum::<usize>();
    assert_eq!(
        (
            sum(|x| x.facts),
            sum(|x| x.shown),
            sum(|x| x.whole),
            sum(|x| x.fact_steps),
            sum(|x| x.fact_steps_shown)
        ),
        (
            t.facts,
            t.facts_shown,
            t.facts_whole,
            t.fact_steps,
            t.fact_steps_shown
        ),
        "{}",
        r.label
    );
    for x in &r.traces {
        let facts: usize = x.steps.iter().map(|s| s.working_set.facts).sum();
        let shown: usize = x.steps.iter().map(|s| s.working_set.shown).sum();
        let whole: usize = x.steps.iter().map(|s| s.working_set.whole).sum();
        assert_eq!(
            (facts, shown, whole),
            (x.facts, x.shown, x.whole),
            "{}",
            x.trace
        );
        for s in &x.steps {
            let ws = &s.working_set;
            assert!(ws.whole <= ws.shown && ws.shown <= ws.facts, "{}", x.trace);
            assert_eq!(ws.hidden.len(), ws.facts - ws.shown, "{}", x.trace);
        }
    }
    if t.facts > 0 {
        assert_eq!(t.shown_share, Some(t.facts_shown as f64 / t.facts as f64));
        assert_eq!(t.whole_share, Some(t.facts_whole as f64 / t.facts as f64));
    }
}

/// SHOWN and WHOLE over the shared traces, in every dialect they replay in: the facts of the answers are the same
/// whatever the dialect (found on the neutral form: chat `tool` messages, Anthropic `tool_result` blocks, Responses
/// `function_call_output` items); sending everything shows them all whole; a 16k window keeps them all in view
/// (chat), an 8k one hides some; the counts add up per trace and per step.
#[test]
fn compare_measures_the_working_set_in_every_dialect() {
    let Some(files) = trace_files() else { return };
    let traces: Vec<(String, Value)> = files
        .iter()
        .map(|p| {
            let t = serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap();
            (p.display().to_string(), t)
        })
        .collect();
    let rows = compare::rows(&Config::default(), &[]).unwrap();
    let mut facts = Vec::new();
    for dialect in [Dialect::Chat, Dialect::Anthropic, Dialect::Responses] {
        // 16k in chat only: the windows that keep everything in view need no second dialect to show it
        let windows: &[u64] = if dialect == Dialect::Chat {
            &[8000, 16_000]
        } else {
            &[8000]
        };
        for &window in windows {
            let opts = ReplayOptions {
                window: Some(window),
                dialect: Some(dialect),
                ..Default::default()
            };
            let out = compare::run(&traces, &opts, &rows, &Counters::default(), &|| ()).unwrap();
            let at = format!("{} {window}", dialect.as_str());
            for r in &out {
                check_working_set(r);
                println!(
                    "{at} {}: facts {}, shown {:?}, whole {:?}, steps all shown {}/{}",
                    r.label,
                    r.totals.facts,
                    r.totals.shown_share,
                    r.totals.whole_share,
                    r.totals.fact_steps_shown,
                    r.totals.fact_steps
                );
            }
            let off = &out[0].totals;
            assert!(off.facts > 0, "{at}");
            assert_eq!(off.facts_whole, off.facts, "{at}: sending everything");
            facts.push(off.facts);
            for r in &out[1..] {
                assert_eq!(r.totals.facts, off.facts, "{at} {}", r.label);
                if window == 16_000 {
                    assert_eq!(r.totals.facts_shown, r.totals.facts, "{at} {}", r.label);
                } else {
                    assert!(r.totals.facts_shown < r.totals.facts, "{at} {}", r.label);
                }
            }
            let mut text = Vec::new();
            compare::write_table(&mut text, &out).unwrap();
            let text = String::from_utf8(text).unwrap();
            let header = text.lines().next().unwrap();
            assert!(header.ends_with("SHOWN  WHOLE"), "{header}");
            assert!(
                text.lines().nth(1).unwrap().ends_with("100.0% 100.0%"),
                "{text}"
            );
        }
    }
    assert!(facts.windows(2).all(|w| w[0] == w[1]), "{facts:?}");
}

/// A trace written in each dialect with one fact: the line number the agent read in a tool output and now
/// edits. Sent whole when everything is sent; in a small window, the output is cleared and the fact hidden.
#[test]
fn facts_are_found_in_the_tool_outputs_of_every_dialect() {
    let output = format!(
        "src/http/request.py:1096: raise ImproperlyConfigured\n{}",
        "filler line\n".repeat(400)
    );
    let chat = json!({"id":"chat","model":"gpt-4o","messages":[
        {"role":"system","content":"You fix bugs."},
        {"role":"user","content":"Fix the failing test."},
        {"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function",
            "function":{"name":"grep","arguments":"{\"pattern\":\"raise\"}"}}]},
        {"role":"tool","tool_call_id":"c1","content":output},
        {"role":"assistant","content":"Reading it.","tool_calls":[{"id":"c2","type":"function",
            "function":{"name":"read","arguments":"{\"path\":\"notes.txt\"}"}}]},
        {"role":"tool","tool_call_id":"c2","content":"filler ".repeat(600)},
        {"role":"assistant","content":null,"tool_calls":[{"id":"c3","type":"function",
            "function":{"name":"edit","arguments":"{\"line\":1096}"}}]}]});
    let anthropic = json!({"id":"anthropic","model":"claude-sonnet-4","system":"You fix bugs.","messages":[
        {"role":"user","content":"Fix the failing test."},
        {"role":"assistant","content":[{"type":"tool_use","id":"c1","name":"grep","input":{"pattern":"raise"}}]},
        {"role":"user","content":[{"type":"tool_result","tool_use_id":"c1","content":output}]},
        {"role":"assistant","content":[{"type":"text","text":"Reading it."},
            {"type":"tool_use","id":"c2","name":"read","input":{"path":"notes.txt"}}]},
        {"role":"user","content":[{"type":"tool_result","tool_use_id":"c2","content":"filler ".repeat(600)}]},
        {"role":"assistant","content":[{"type":"tool_use","id":"c3","name":"edit","input":{"line":1096}}]}]});
    let responses = json!({"id":"responses","model":"gpt-5","instructions":"You fix bugs.","input":[
        {"type":"message","role":"user","content":[{"type":"input_text","text":"Fix the failing test."}]},
        {"type":"function_call","call_id":"c1","name":"grep","arguments":"{\"pattern\":\"raise\"}"},
        {"type":"function_call_output","call_id":"c1","output":output},
        {"type":"message","role":"assistant","content":[{"type":"output_text","text":"Reading it."}]},
        {"type":"custom_tool_call","call_id":"c2","name":"read","input":"notes.txt"},
        {"type":"custom_tool_call_output","call_id":"c2","output":"filler ".repeat(600)},
        {"type":"function_call","call_id":"c3","name":"edit","arguments":"{\"line\":1096}"}]});
    let cfg = Config::default();
    for trace in [chat, anthropic, responses] {
        let id = trace["id"].as_str().unwrap().to_string();
        let off = replay_trace(&trace, &opts(100_000, Strategy::Off), &cfg).unwrap();
        let last = off.steps.last().unwrap();
        assert_eq!(
            (last.working_set.facts, last.working_set.whole),
            (1, 1),
            "{id}: {:?}",
            off.steps
        );
        // "ImproperlyConfigured" and the path are in the output but not in the answer: no facts
        assert_eq!(off.totals.facts, 1, "{id}");
        let tight = replay_trace(&trace, &opts(2000, Strategy::Prune), &cfg).unwrap();
        let last = tight.steps.last().unwrap();
        assert_eq!(last.outcome, Outcome::Rewrite, "{id}");
        assert_eq!(last.working_set.facts, 1, "{id}");
        assert_eq!(last.working_set.whole, 0, "{id}: the output was cleared");
        assert_eq!(
            last.working_set.hidden.len(),
            1 - last.working_set.shown,
            "{id}"
        );
    }
}

fn ctxgate(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_ctxgate"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("RUST_BACKTRACE", "0")
        .output()
        .unwrap()
}

#[test]
fn the_compare_command_prints_one_row_per_strategy_and_setting() {
    let out = ctxgate(&[
        "replay",
        "--compare",
        "--json",
        "--window",
        "4000",
        "--with",
        "context.threshold=0.5",
        "--with",
        "prune.keep_tool_results=2,context.threshold=0.6",
        "tests/traces/anthropic_agent.json",
        "tests/traces/responses_agent.json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = doc["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 10);
    assert_eq!(
        rows[3]["label"],
        "prune prune.keep_tool_results=2,context.threshold=0.6"
    );
    assert_eq!(rows[0]["totals"]["cache_cost"], 1.0);
    assert!(rows[1]["totals"]["prefix_stable"].is_number());
    // the working set, per row, per trace and per step: the counts add up
    for row in rows {
        let traces = row["traces"].as_array().unwrap();
        assert_eq!(traces.len(), 2);
        for key in ["facts", "shown", "whole"] {
            let total = row["totals"][if key == "facts" {
                "facts".to_string()
            } else {
                format!("facts_{key}")
            }]
            .as_u64()
            .unwrap();
            let per_trace: u64 = traces.iter().map(|t| t[key].as_u64().unwrap()).sum();
            assert_eq!(per_trace, total, "{key}");
            for t in traces {
                let steps = t["steps"].as_array().unwrap();
                assert!(!steps.is_empty() && steps.iter().all(|s| s["index"].is_u64()));
                let per_step: u64 = steps.iter().map(|s| s[key].as_u64().unwrap()).sum();
                assert_eq!(per_step, t[key].as_u64().unwrap(), "{key}");
            }
        }
    }
    // text: a header and ten rows
    let out = ctxgate(&[
        "replay",
        "--compare",
        "--window",
        "4000",
        "tests/traces/anthropic_agent.json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(text.lines().count(), 5);
    assert!(
        text.lines().next().unwrap().ends_with(" SHOWN  WHOLE"),
        "{text}"
    );
}

#[test]
fn the_compare_command_refuses_unknown_settings_and_misplaced_options() {
    let file = "tests/traces/anthropic_agent.json";
    let out = ctxgate(&["replay", "--compare", "--with", "context.bogus=1", file]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("context.bogus=1") && err.contains("bogus"),
        "{err}"
    );
    let out = ctxgate(&[
        "replay",
        "--compare",
        "--with",
        "context.threshold=lots",
        file,
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("context.threshold=lots"));
    // --with needs --compare; --compare runs every strategy
    for args in [
        &["replay", "--with", "context.threshold=0.5", file][..],
        &["replay", "--compare", "--strategy", "prune", file][..],
        &["replay", "--compare", "--with", "nokeyvalue", file][..],
    ] {
        let out = ctxgate(args);
        assert!(!out.status.success(), "{args:?}");
    }
    // a trace of another dialect is not converted
    let out = ctxgate(&["replay", "--dialect", "chat", file]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("replays as anthropic only"));
}
