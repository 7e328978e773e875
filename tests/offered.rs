//! A request forwarded with ctxgate's recall tools offered ahead of the first rewrite (`recall.offer_at`), its
//! messages as the client sent them: `x-ctxgate-rewrite` says that only the tools were added.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::Harness;
use serde_json::{json, Value};

#[tokio::test]
async fn the_header_of_an_offered_request_says_its_messages_went_unchanged() {
    let h = Harness::start_with(|c| {
        c.context.default_context_window = 8_000;
        c.recall.offer_at = 0.1;
    })
    .await;
    // ~2,000 tokens: past 0.1 of the threshold (640), well under the threshold (6,400): nothing to rewrite.
    let messages = json!([
        {"role": "system", "content": "You help travellers."},
        {"role": "user", "content": format!("plan my trip: {}", "many details ".repeat(600))},
    ]);
    let body = json!({"model": "mock-model", "messages": messages,
        "tools": [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]});
    let r = h.post_chat(body.to_string()).await;
    assert_eq!(r.status(), 200);
    let header = r.headers()["x-ctxgate-rewrite"]
        .to_str()
        .unwrap()
        .to_string();
    r.text().await.unwrap();
    let (stages, rest) = header.split_once("; tokens=").expect(&header);
    assert_eq!(stages, "offered", "{header}");
    let (tokens, note) = rest.split_once("; ").expect(&header);
    let (client, sent) = tokens.split_once("->").expect(&header);
    assert_eq!(client, sent, "{header}");
    assert!(client.parse::<u64>().unwrap() > 640, "{header}");
    assert_eq!(note, "messages=unchanged; added=recall-tools", "{header}");
    // What the header says: the client's messages went as they came, its tool first, the recall tools after.
    let sent = h.mock.requests()[0].json();
    assert_eq!(sent["messages"], messages);
    let tools: Vec<&str> = sent["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["function"]["name"].as_str())
        .collect();
    assert_eq!(tools[0], "lookup");
    assert!(tools.contains(&"recall_tool_call"), "{tools:?}");
    // A short request with tools, under `offer_at`: sent as it came, no header.
    let small = json!({"model": "mock-model", "messages": [{"role": "user", "content": "hi"}],
        "tools": body["tools"]});
    let r = h.post_chat(small.to_string()).await;
    assert!(r.headers().get("x-ctxgate-rewrite").is_none());
    let _: Value = r.json().await.unwrap();
}
