//! Cost of planning the rewrite of a long agent conversation: ~400 messages, ~128k tokens, window 128k (above the
//! 0.8 threshold). "cold": a fresh token counter each time (every message counted for the first time); "warm": a
//! counter that has seen the history, for a request with one new message (a tool result of ~2,500 tokens, counted
//! each time); "warm_repeat": the same request again (every count cached: the planner's own work). These three plan
//! a chat request as the gateway does, keyed by the hashes of each message's bytes its parse computes (for the
//! session tree; computed here outside the timing); "warm_converted" is "warm" for a dialect the planner sees
//! converted (Anthropic, Responses, Gemini), whose messages it hashes by walking their JSON. Cold and warm
//! also forget the pieces of text the counter remembers per thread, so each text is tokenized as if never seen
//! (the worst case: in real traffic most words and indentation of a new tool result were seen before).
//! Run: `cargo bench --bench plan`.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::print_stdout
)]

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, SamplingMode};
use ctxgate::config::{ContextConfig, PruneConfig, RecallConfig, Strategy, SummaryConfig};
use ctxgate::context::tokens::{forget_pieces, Encoding, TokenCounter};
use ctxgate::context::{plan, Plan, PlanInput};
use serde_json::{json, Value};
use std::time::Duration;

const WINDOW: u64 = 128_000;
const WORDS: &[&str] = &[
    "fn",
    "let",
    "mut",
    "self",
    "return",
    "match",
    "Some(x)",
    "None",
    "Ok(())",
    "Err(e)",
    "=>",
    "{",
    "}",
    "&str",
    "Vec<u8>",
    "config",
    "request",
    "tokens",
    "window",
    "parse",
    "error:",
    "warning:",
    "src/lib.rs:42:7",
    "#[test]",
    "assert_eq!",
    "0x7f3a",
    "1024",
    "the",
    "value",
    "is",
    "not",
    "found",
    "in",
    "this",
    "scope",
];

/// Words of the tool results, in turn: mostly small and medium, now and then a large file or log.
const RESULT_WORDS: [usize; 10] = [15, 50, 120, 200, 250, 330, 1250, 75, 170, 360];

/// A deterministic pseudo-random stream (64-bit LCG), so every run plans the same conversation.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, n: usize) -> usize {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        ((self.0 >> 33) as usize) % n
    }

    /// `min` to `min + spread - 1` words of text.
    fn words(&mut self, min: usize, spread: usize) -> String {
        let n = min + self.next(spread);
        self.text(n)
    }

    /// About `words` words of code-like text in lines of 4-14 words.
    fn text(&mut self, words: usize) -> String {
        let mut out = String::with_capacity(words * 6);
        let mut line = 0;
        for _ in 0..words {
            out.push_str(WORDS[self.next(WORDS.len())]);
            line += 1;
            if line > 3 + self.next(11) {
                out.push('\n');
                line = 0;
            } else {
                out.push(' ');
            }
        }
        out
    }
}

/// System prompt, then 4 user turns, each answered by tool loops (results from ~15 to ~1,250 words) and a final
/// reply; at least `messages` messages, the last one a tool result.
fn conversation(messages: usize) -> Vec<Value> {
    let mut rng = Lcg(7);
    let mut out = vec![json!({"role": "system", "content": rng.text(400)})];
    let (mut call, mut turn) = (0, 0);
    while out.len() < messages || out.last().is_some_and(|m| m["role"] != "tool") {
        if turn < 4 && out.len() > turn * messages / 4 {
            if turn > 0 {
                out.push(json!({"role": "assistant", "content": rng.words(100, 200)}));
            }
            out.push(json!({"role": "user", "content": rng.words(60, 200)}));
            turn += 1;
        }
        let id = format!("call_{call}");
        call += 1;
        let cmd = json!({"cmd": rng.words(4, 12)}).to_string();
        out.push(
            json!({"role": "assistant", "content": rng.words(0, 40), "tool_calls": [{
            "id": id, "type": "function", "function": {"name": "run", "arguments": cmd}}]}),
        );
        let size = RESULT_WORDS[call % RESULT_WORDS.len()] + rng.next(20);
        out.push(json!({"role": "tool", "tool_call_id": id, "content": rng.text(size)}));
    }
    out
}

/// The hashes of each message's bytes that the gateway's parse of a chat request computes anyway (for the
/// session tree), which the planner keys its memos by: computed outside the timing, as the parse is not planning.
fn raw_hashes(messages: &[Value]) -> Vec<u64> {
    let body = serde_json::to_vec(&json!({ "messages": messages })).unwrap();
    ctxgate::session::tree::raw_message_hashes(&body)
}

/// `before` and a variant of `newest` that no counter has seen (its text with ` (run <variant>)` added), as each
/// real request brings one new message.
fn with_variant(before: &[Value], newest: &Value, variant: u64) -> Vec<Value> {
    let mut m = newest.clone();
    m["content"] = json!(format!(
        "{} (run {variant})",
        newest["content"].as_str().unwrap()
    ));
    let mut r = before.to_vec();
    r.push(m);
    r
}

fn input<'a>(messages: &'a [Value], tools: &'a Value, hashes: Option<&'a [u64]>) -> PlanInput<'a> {
    PlanInput {
        messages,
        hashes,
        tools: Some(tools),
        first_seen: None,
        now: 1_700_000_000,
        encoding: Encoding::O200k,
        ratio: 1.0,
        strategy: Strategy::Hybrid,
        window: WINDOW,
        recall_tool: Some("recall_tool_call"),
        reserve: ctxgate::recall::reserve_tokens(&RecallConfig::default(), 200).min(WINDOW / 10),
        summaries: None,
        precompute_at: SummaryConfig::default().precompute_at,
        strict_roles: true,
    }
}

fn bench(c: &mut Criterion) {
    let (ctx, prune) = (ContextConfig::default(), PruneConfig::default());
    let tools = json!([{"type": "function", "function": {"name": "run", "description": "Run a shell command.",
        "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}}}]);
    let history = conversation(400);
    let (before, request) = (&history[..history.len() - 1], &history[..]);
    let (request_hashes, before_hashes) = (raw_hashes(request), raw_hashes(before));
    let counter = TokenCounter::new();
    let tokens = counter.request_tokens(Encoding::O200k, request, Some(&tools));
    let decision = plan(
        &input(request, &tools, Some(&request_hashes)),
        &ctx,
        &prune,
        &counter,
    );
    let Plan::Rewrite(rw) = &decision else {
        panic!("expected a rewrite of {tokens} tokens, got {decision:?}");
    };
    let newest = &history[history.len() - 1];
    println!(
        "plan: {} messages, {tokens} tokens (newest {}) -> {} messages, {} tokens ({:?})",
        request.len(),
        counter.message_tokens(Encoding::O200k, newest),
        rw.messages.len(),
        rw.record.tokens_after,
        rw.record.stages
    );

    let mut g = c.benchmark_group("plan_128k");
    g.sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4))
        .sampling_mode(SamplingMode::Flat);
    g.bench_function("cold", |b| {
        b.iter_batched(
            || {
                forget_pieces();
                TokenCounter::new()
            },
            |fresh| {
                let p = plan(
                    &input(request, &tools, Some(&request_hashes)),
                    &ctx,
                    &prune,
                    &fresh,
                );
                (p, fresh) // both dropped outside the timing
            },
            BatchSize::PerIteration,
        );
    });
    // Warm: the counter has seen everything but the newest tool result; each iteration's request ends with a
    // variant of it that the counter has never seen (as every real request brings one new message).
    let warm = TokenCounter::new();
    plan(
        &input(before, &tools, Some(&before_hashes)),
        &ctx,
        &prune,
        &warm,
    );
    let mut variant = 0u64;
    g.bench_function("warm", |b| {
        b.iter_batched_ref(
            || {
                variant += 1;
                let r = with_variant(before, newest, variant);
                let h = raw_hashes(&r);
                forget_pieces();
                (r, h)
            },
            // The plan borrows the request, so it is dropped inside the timing (the request is not).
            |(r, h)| {
                let p = plan(&input(r, &tools, Some(h)), &ctx, &prune, &warm);
                std::hint::black_box(&p);
            },
            BatchSize::PerIteration,
        );
    });
    // Warm, for a dialect the planner sees converted (Anthropic, Responses, Gemini): no parse hashes of the
    // planned messages, so each is hashed by walking its JSON.
    let converted = TokenCounter::new();
    plan(&input(before, &tools, None), &ctx, &prune, &converted);
    g.bench_function("warm_converted", |b| {
        b.iter_batched_ref(
            || {
                variant += 1;
                let r = with_variant(before, newest, variant);
                forget_pieces();
                r
            },
            |r| {
                let p = plan(&input(r, &tools, None), &ctx, &prune, &converted);
                std::hint::black_box(&p);
            },
            BatchSize::PerIteration,
        );
    });
    // The same request again: every count cached, so only the planner's own work is left.
    g.bench_function("warm_repeat", |b| {
        b.iter(|| {
            plan(
                &input(request, &tools, Some(&request_hashes)),
                &ctx,
                &prune,
                &warm,
            )
        });
    });
    // Of the planner's own work: finding when each tool result was last used (clearing by use).
    g.bench_function("usage", |b| {
        b.iter(|| ctxgate::context::usage::Usage::new(request));
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
