//! Per-request cost of session reconciliation + persistence (SQLite, WAL, group commit), identical resends, and
//! memory per cached session. Run: `cargo bench --bench session`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use ctxgate::config::{SessionConfig, StoreBackend, StoreConfig};
use ctxgate::dialect::Dialect;
use ctxgate::pipeline::identity::identify;
use ctxgate::session::tree::raw_message_hashes;
use ctxgate::session::{Sessions, TenantKey};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

fn message(i: usize) -> Value {
    let filler = "lorem ipsum dolor sit amet ".repeat(30); // ~800 bytes
    match i % 4 {
        0 => json!({"role":"user","content": format!("step {i}: {filler}")}),
        1 => {
            json!({"role":"assistant","content":null,"tool_calls":[{"id": format!("call_{i}"),"type":"function",
              "function":{"name":"read_file","arguments": format!("{{\"path\":\"src/f{i}.rs\"}}")}}]})
        }
        2 => {
            json!({"role":"tool","tool_call_id": format!("call_{}", i - 1),"content": format!("{filler}{filler}")})
        }
        _ => json!({"role":"assistant","content": format!("done {i}: {filler}")}),
    }
}

fn pct(v: &mut [Duration], p: f64) -> f64 {
    v.sort();
    v[((v.len() as f64 - 1.0) * p).round() as usize].as_secs_f64() * 1e6
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| {
            s.split_whitespace()
                .nth(1)
                .and_then(|p| p.parse::<u64>().ok())
        })
        .map(|pages| pages * 4)
        .unwrap_or(0)
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let cfg = StoreConfig {
            backend: StoreBackend::Sqlite,
            path: dir.path().join("bench.db"),
            ..Default::default()
        };
        let sessions = Sessions::new(ctxgate::store::open(&cfg).unwrap(), cfg.cache_max_bytes);
        let headers = http::HeaderMap::new();
        let mut history: Vec<Value> = (0..500).map(message).collect();
        let body = |h: &[Value]| json!({"model":"gpt-4o","messages":h}).to_string();
        let opening = json!({"model":"gpt-4o","messages":history});
        let ident = identify(&headers, &SessionConfig::default(), &TenantKey::from_bytes([0; 32]).unwrap(), Dialect::Chat, opening.as_object().unwrap()).unwrap();
        // warm: first sight of the 500 messages
        let raw = body(&history);
        let mark = sessions.record_request(&ident, &history, &raw_message_hashes(raw.as_bytes())).await.unwrap();
        sessions.record_reply(&mark, json!({"role":"assistant","content":"ok"}), false).await.unwrap();
        history.push(json!({"role":"assistant","content":"ok"}));

        // steady state: each turn adds a user message, then the reply is committed
        let mut times = Vec::new();
        for t in 0..300 {
            history.push(json!({"role":"user","content": format!("next {t}")}));
            let raw = body(&history);
            let started = Instant::now();
            let hashes = raw_message_hashes(raw.as_bytes());
            let mark = sessions.record_request(&ident, &history, &hashes).await.unwrap();
            let reply = json!({"role":"assistant","content": format!("reply {t}")});
            sessions.record_reply(&mark, reply.clone(), false).await.unwrap();
            times.push(started.elapsed());
            history.push(reply);
        }
        let (p50, p99) = (pct(&mut times, 0.5), pct(&mut times, 0.99));
        println!("steady state, {}..{} messages: reconcile + persist (commit awaited): p50 {p50:.0} µs, p99 {p99:.0} µs", 501, history.len());

        // 1000 identical resends
        let raw = body(&history);
        let before = sessions.view(&ident.id).await.unwrap().unwrap().message_count;
        let db_before = std::fs::metadata(&cfg.path).map(|m| m.len()).unwrap_or(0);
        let mut times = Vec::new();
        for _ in 0..1000 {
            let started = Instant::now();
            let hashes = raw_message_hashes(raw.as_bytes());
            let mark = sessions.record_request(&ident, &history, &hashes).await.unwrap();
            assert_eq!(mark.created, 0);
            times.push(started.elapsed());
        }
        sessions.flush().await.unwrap();
        let after = sessions.view(&ident.id).await.unwrap().unwrap().message_count;
        let db_after = std::fs::metadata(&cfg.path).map(|m| m.len()).unwrap_or(0);
        println!(
            "1000 identical resends of {} messages: p50 {:.0} µs, p99 {:.0} µs; nodes {before} -> {after}; db file {db_before} -> {db_after} bytes",
            history.len(), pct(&mut times, 0.5), pct(&mut times, 0.99)
        );

        // memory per cached session: 1000 sessions of 100 messages (~90 KB of JSON each)
        let rss0 = rss_kib();
        let msgs: Vec<Value> = (0..100).map(message).collect();
        let raw = body(&msgs);
        let hashes = raw_message_hashes(raw.as_bytes());
        for s in 0..1000 {
            let mut h = http::HeaderMap::new();
            h.insert("x-session-id", format!("mem-{s}").parse().unwrap());
            let ident = identify(&h, &SessionConfig::default(), &TenantKey::from_bytes([0; 32]).unwrap(), Dialect::Chat, &serde_json::Map::new()).unwrap();
            sessions.record_request(&ident, &msgs, &hashes).await.unwrap();
        }
        sessions.flush().await.unwrap();
        let rss1 = rss_kib();
        let (count, weighted) = sessions.cache_stats();
        println!(
            "memory: 1000 sessions x 100 messages ({} bytes of JSON each): RSS +{} KiB => {:.1} KiB per session; cache weigher: {count} entries, {:.1} KiB per session",
            raw.len(), rss1.saturating_sub(rss0), rss1.saturating_sub(rss0) as f64 / 1000.0, weighted as f64 / 1024.0 / count.max(1) as f64
        );
    });
}
