//! The access log's figures: every duration (`upstream_ms`, `total_ms`) rounded to 0.01 ms, on conversation and
//! passthrough lines alike.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;
use common::Logged;

use common::Harness;
use serde_json::{json, Value};

/// The digits after the point of the number `field` has on `line` (the JSON text as written).
fn decimals(line: &str, field: &str) -> Option<usize> {
    let at = line.find(&format!("\"{field}\":"))? + field.len() + 3;
    let number: String = line[at..]
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.' || *c == 'e' || *c == '-')
        .collect();
    assert!(!number.contains('e'), "{field} in {line}");
    Some(number.split_once('.').map_or(0, |(_, d)| d.len()))
}

#[tokio::test]
async fn durations_are_logged_rounded_to_a_hundredth_of_a_millisecond() {
    let (logged, _log) = Logged::json();
    let h = Harness::start().await;
    let chat = json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]});
    for stream in [false, true] {
        let mut body = chat.clone();
        body["stream"] = json!(stream);
        let r = h.post_chat(body.to_string()).await;
        assert_eq!(r.status(), 200);
        r.text().await.unwrap();
    }
    let r = h.client.get(h.url("/v1/models")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    r.text().await.unwrap();
    h.state.drain().await;

    let text = String::from_utf8(logged.0.lock().unwrap().clone()).unwrap();
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| {
            serde_json::from_str::<Value>(l).is_ok_and(|v| v["target"] == "ctxgate::access")
        })
        .collect();
    let (mut conversations, mut passthrough) = (0, 0);
    for line in &lines {
        let upstream = decimals(line, "upstream_ms").unwrap_or_else(|| panic!("{line}"));
        assert!(upstream <= 2, "upstream_ms: {line}");
        if line.contains("\"message\":\"conversation\"") {
            conversations += 1;
            let total = decimals(line, "total_ms").unwrap_or_else(|| panic!("{line}"));
            assert!(total <= 2, "total_ms: {line}");
        } else if line.contains("\"message\":\"passthrough\"") {
            passthrough += 1;
        }
    }
    assert_eq!((conversations, passthrough), (2, 1), "{text}");
}
