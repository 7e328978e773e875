//! Time-to-first-byte added by ctxgate to a streaming conversation request, in each dialect (chat completions,
//! Anthropic Messages, the Responses API): the same SSE request sent straight to the mock upstream and through the gateway,
//! alternately; prints median and p99 of both and their difference.
//! Run: `cargo bench --bench ttfb` (release build).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use ctxgate::app::AppState;
use ctxgate::config::{Config, StoreBackend};
use ctxgate::mock::MockUpstream;
use futures_util::StreamExt;
use std::time::{Duration, Instant};

async fn ttfb(client: &reqwest::Client, url: &str, body: &'static str) -> Duration {
    let started = Instant::now();
    let resp = client
        .post(url)
        .header("authorization", "Bearer sk-bench")
        .header("anthropic-version", "2023-06-01")
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    let mut s = resp.bytes_stream();
    let _first = s.next().await.unwrap().unwrap();
    let t = started.elapsed();
    while s.next().await.is_some() {}
    t
}

fn pct(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mock = MockUpstream::start().await.unwrap();
        let mut cfg = Config::default();
        cfg.upstream.base_url = mock.base_url();
        cfg.anthropic.base_url = mock.base_url();
        cfg.store.backend = StoreBackend::Memory;
        let state = AppState::new(cfg).unwrap();
        let server = ctxgate::server::Server::bind(state, "127.0.0.1:0".parse().unwrap()).await.unwrap();
        let addr = server.local_addr().unwrap();
        tokio::spawn(server.run(std::future::pending()));
        let client = reqwest::Client::builder().no_proxy().build().unwrap();
        let chat = r#"{"model":"gpt-4o","stream":true,"messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"Say hello"}]}"#;
        let anthropic = r#"{"model":"claude-sonnet-4-5","max_tokens":64,"stream":true,"system":"You are a helpful assistant.","messages":[{"role":"user","content":"Say hello"}]}"#;
        let n = 3000;
        println!("streaming TTFB over {n} requests each (release build, loopback, mock upstream)");
        let responses = r#"{"model":"gpt-5","stream":true,"instructions":"You are a helpful assistant.","input":[{"type":"message","role":"user","content":[{"type":"input_text","text":"Say hello"}]}]}"#;
        for (dialect, path, body) in [
            ("chat completions", "chat/completions", chat),
            ("anthropic messages", "messages", anthropic),
            ("responses", "responses", responses),
        ] {
            let direct = format!("{}/{path}", mock.base_url());
            let via = format!("http://{addr}/v1/{path}");
            for _ in 0..200 {
                ttfb(&client, &direct, body).await;
                ttfb(&client, &via, body).await;
            }
            let (mut d, mut g) = (Vec::with_capacity(n), Vec::with_capacity(n));
            for _ in 0..n {
                d.push(ttfb(&client, &direct, body).await);
                g.push(ttfb(&client, &via, body).await);
            }
            let (d50, g50) = (pct(&mut d, 0.5), pct(&mut g, 0.5));
            let (d99, g99) = (pct(&mut d, 0.99), pct(&mut g, 0.99));
            println!("{dialect}:");
            println!("  direct to mock : p50 {:>8.1} µs   p99 {:>8.1} µs", d50.as_secs_f64() * 1e6, d99.as_secs_f64() * 1e6);
            println!("  through ctxgate: p50 {:>8.1} µs   p99 {:>8.1} µs", g50.as_secs_f64() * 1e6, g99.as_secs_f64() * 1e6);
            println!(
                "  added by ctxgate: p50 {:>7.1} µs   p99 {:>8.1} µs",
                (g50.as_secs_f64() - d50.as_secs_f64()) * 1e6,
                (g99.as_secs_f64() - d99.as_secs_f64()) * 1e6
            );
        }
    });
}
