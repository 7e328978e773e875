//! The cost of recording one request's metrics, as the pipeline records them (goal: under 1 µs per request), and
//! of rendering a scrape. Run: `cargo bench --bench metrics`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use ctxgate::context::models::ModelTable;
use ctxgate::metrics::{
    CacheResult, DialectLabel, Metrics, RecallOutcome, RecallTool, RewriteOutcome, RewriteStrategy,
    Route, StoreBackend, StoreOp, TokenCounts, UpstreamErrorClass,
};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

fn metrics() -> Arc<Metrics> {
    let table = ModelTable::new(&BTreeMap::new(), 128_000).unwrap();
    Arc::new(Metrics::new(Box::new(move |m: &str| table.matching_entry(m))).unwrap())
}

/// Everything a chat turn records: in flight, session cache lookup, two store writes, the upstream wait, the
/// stream's first byte, tokens by model, then the request itself (count, duration, upstream, overhead).
fn chat_turn(m: &Arc<Metrics>, model: &str, stream: bool, status: u16) {
    let sessions = m.session_metrics();
    let store = m.store_metrics(StoreBackend::Sqlite);
    let started = Instant::now();
    chat_turn_with(m, &sessions, &store, model, stream, status, started);
}

fn chat_turn_with(
    m: &Arc<Metrics>,
    sessions: &ctxgate::metrics::SessionMetrics,
    store: &ctxgate::metrics::StoreMetrics,
    model: &str,
    stream: bool,
    status: u16,
    started: Instant,
) {
    let mut t = m.start(Route::Chat, DialectLabel::Chat, started);
    t.set_stream(stream);
    sessions.lookup(CacheResult::Hit);
    store.observe(StoreOp::Write, started, true);
    t.upstream_sent();
    if stream {
        t.streaming();
    }
    t.first_byte(Instant::now());
    t.upstream_ended();
    t.set_status(status);
    if let Some(class) = UpstreamErrorClass::of_status(status) {
        m.upstream_error(Route::Chat, DialectLabel::Chat, class);
    }
    m.tokens(
        model,
        DialectLabel::Chat,
        &TokenCounts {
            client_prompt: Some(1200),
            upstream_prompt: Some(1200),
            upstream_cached: Some(1000),
            completion: Some(80),
        },
    );
    store.observe(StoreOp::Write, started, true);
    drop(t);
}

fn bench(c: &mut Criterion) {
    let m = metrics();
    let sessions = m.session_metrics();
    let store = m.store_metrics(StoreBackend::Sqlite);
    // warm the model label cache, as a running gateway has it
    chat_turn(&m, "gpt-4o-2024-08-06", true, 200);
    chat_turn(&m, "my-local-model", false, 200);

    c.bench_function("record/chat_stream_known_model", |b| {
        b.iter(|| {
            chat_turn_with(
                &m,
                &sessions,
                &store,
                black_box("gpt-4o-2024-08-06"),
                true,
                200,
                Instant::now(),
            )
        })
    });
    c.bench_function("record/chat_json_unknown_model_5xx", |b| {
        b.iter(|| {
            chat_turn_with(
                &m,
                &sessions,
                &store,
                black_box("my-local-model"),
                false,
                502,
                Instant::now(),
            )
        })
    });
    c.bench_function("record/chat_rewritten_with_recall", |b| {
        b.iter(|| {
            let model = black_box("gpt-4o-2024-08-06");
            m.rewrite(
                DialectLabel::Chat,
                RewriteStrategy::Hybrid,
                RewriteOutcome::Pruned,
                model,
                40_000,
            );
            m.recall_round(DialectLabel::Chat);
            m.recall_call(DialectLabel::Chat, RecallTool::Recall, RecallOutcome::Found);
            m.recall_call(
                DialectLabel::Chat,
                RecallTool::Search,
                RecallOutcome::NotFound,
            );
            chat_turn_with(&m, &sessions, &store, model, true, 200, Instant::now())
        })
    });
    c.bench_function("record/passthrough", |b| {
        b.iter(|| {
            let mut t = m.start(Route::Passthrough, DialectLabel::NoDialect, Instant::now());
            t.upstream_sent();
            t.set_status(200);
            drop(t);
        })
    });
    // Not per request: the cost of one scrape.
    c.bench_function("scrape/render", |b| {
        b.iter(|| {
            m.set_session_cache(1000, 64 << 20);
            m.set_calibration(&[("gpt-4o".into(), 1.05), ("llama3".into(), 0.98)]);
            black_box(m.render().len())
        })
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
