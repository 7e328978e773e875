//! Money (issue 39): `[models] price`, `ctxgate_spend_dollars_total` and `ctxgate_saved_dollars_total` counted
//! through the gateway against a hand computation from the usage the mock upstream reports (cached tokens and
//! Anthropic's cache writes included), each turn's and each session's dollars in the admin API, and check-config's
//! checks of prices.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{agent_history, Harness};
use ctxgate::config::{Config, ModelEntry, Price};
use ctxgate::metrics::names;
use ctxgate::mock::{AnthropicReply, MockReply};
use serde_json::{json, Value};

/// The price of docs/how-it-works.md's example, per million tokens.
const PRICE: Price = Price {
    input: Some(2.5),
    cached_input: Some(0.25),
    cache_write: Some(3.125),
    output: Some(10.0),
};

async fn harness() -> Harness {
    Harness::start_with(|c| {
        c.context.default_context_window = 8_000;
        c.models.insert(
            "priced-*".into(),
            ModelEntry {
                context_window: Some(6_000),
                price: Some(PRICE),
                ..ModelEntry::default()
            },
        );
    })
    .await
}

/// A per-model counter's value for `model`'s label and `dialect` (0 before its first increase).
fn counter(h: &Harness, name: &str, dialect: &str, model: &str) -> f64 {
    let label = h.state.metrics.model_label(model);
    let series = format!("{name}{{dialect=\"{dialect}\",model=\"{label}\"}} ");
    h.state
        .metrics
        .render()
        .lines()
        .find_map(|l| l.strip_prefix(&series))
        .map_or(0.0, |v| v.trim().parse().unwrap())
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

#[tokio::test]
async fn an_anthropic_turn_is_priced_with_its_cache_reads_and_writes() {
    let mut h = harness().await;
    // the example of docs/how-it-works.md: 1000 uncached, 6000 read, 2000 written, 500 out
    h.mock.push_anthropic(AnthropicReply {
        input_tokens: Some(1_000),
        cache_read_input_tokens: 6_000,
        cache_creation_input_tokens: 2_000,
        output_tokens: Some(500),
        ..AnthropicReply::text("ok")
    });
    let resp = h
        .post_json(
            "/v1/messages",
            &[
                ("x-api-key", "sk-ant-money"),
                ("anthropic-version", "2023-06-01"),
                ("x-session-id", "money-anthropic"),
            ],
            &json!({"model": "priced-claude", "max_tokens": 64,
                    "messages": [{"role": "user", "content": "hi"}]}),
        )
        .await;
    assert_eq!(resp.status(), 200);
    let session = common::session_header(&resp);
    resp.text().await.unwrap();
    h.next_turn().await;

    // 1000 × 2.5 + 6000 × 0.25 + 2000 × 3.125 + 500 × 10 = 15 250 dollars per million
    let spent = counter(&h, names::SPEND_DOLLARS_TOTAL, "anthropic", "priced-claude");
    assert!(close(spent, 0.015_25), "{spent}");
    // nothing was rewritten: nothing saved
    let saved = counter(&h, names::SAVED_DOLLARS_TOTAL, "anthropic", "priced-claude");
    assert_eq!(saved, 0.0);

    // the turn's record, the session and the session list say the same
    let turns = h
        .get_json(&format!("/admin/sessions/{session}/turns?messages=false"))
        .await;
    let turn = &turns["turns"][0];
    assert!(
        close(turn["dollars"]["spent"].as_f64().unwrap(), 0.015_25),
        "{turn}"
    );
    assert_eq!(turn["dollars"]["saved"], 0.0);
    let shown = h.get_json(&format!("/admin/sessions/{session}")).await;
    assert!(
        close(shown["spent_dollars"].as_f64().unwrap(), 0.015_25),
        "{shown}"
    );
    assert_eq!(shown["saved_dollars"], 0.0);
    let list = h.get_json("/admin/sessions").await;
    let row = list["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["id"] == session.as_str())
        .unwrap();
    assert!(
        close(row["spent_dollars"].as_f64().unwrap(), 0.015_25),
        "{row}"
    );
}

#[tokio::test]
async fn a_rewritten_chat_turn_saves_the_removed_tokens_at_its_input_price() {
    let mut h = harness().await;
    let model = "priced-gpt";
    // a history well over the 6000-token window: the gateway rewrites it
    let mut messages = agent_history(30, 120);
    messages.push(json!({"role": "user", "content": "Go on."}));
    h.mock.push(MockReply::json(
        200,
        json!({"id": "chatcmpl-m", "object": "chat.completion", "created": 1, "model": model,
               "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                            "finish_reason": "stop"}],
               "usage": {"prompt_tokens": 4_000, "completion_tokens": 100, "total_tokens": 4_100,
                         "prompt_tokens_details": {"cached_tokens": 3_000}}}),
    ));
    let saved_tokens = || counter(&h, names::SAVED_TOKENS_TOTAL, "chat", model);
    assert_eq!(saved_tokens(), 0.0);
    let resp = h
        .chat_as(
            "sk-money",
            Some("money-chat"),
            &json!({"model": model, "messages": messages}),
        )
        .await;
    assert_eq!(resp.status(), 200);
    assert!(resp.headers().contains_key("x-ctxgate-rewrite"));
    let session = common::session_header(&resp);
    resp.text().await.unwrap();
    h.next_turn().await;

    // spent: 1000 × 2.5 + 3000 × 0.25 + 100 × 10 = 4250 per million
    let spent = counter(&h, names::SPEND_DOLLARS_TOTAL, "chat", model);
    assert!(close(spent, 0.004_25), "{spent}");
    // saved: the removed tokens at the turn's input price per token, (1000 × 2.5 + 3000 × 0.25) / 4000 = 0.8125
    let removed = counter(&h, names::SAVED_TOKENS_TOTAL, "chat", model);
    assert!(removed > 1_000.0, "{removed}");
    let expected = removed * 0.812_5 / 1e6;
    let saved = counter(&h, names::SAVED_DOLLARS_TOTAL, "chat", model);
    assert!(close(saved, expected), "{saved} != {expected}");

    // the turn's record: its client and sent tokens are what was removed
    let turns = h
        .get_json(&format!("/admin/sessions/{session}/turns?messages=false"))
        .await;
    let turn: &Value = &turns["turns"][0];
    let tokens = &turn["tokens"];
    let recorded = tokens["client"].as_f64().unwrap() - tokens["sent"].as_f64().unwrap();
    assert_eq!(recorded, removed, "{turn}");
    assert!(
        close(turn["dollars"]["saved"].as_f64().unwrap(), expected),
        "{turn}"
    );
    let shown = h.get_json(&format!("/admin/sessions/{session}")).await;
    assert!(
        close(shown["saved_dollars"].as_f64().unwrap(), expected),
        "{shown}"
    );
    assert!(
        close(shown["spent_dollars"].as_f64().unwrap(), 0.004_25),
        "{shown}"
    );
}

#[tokio::test]
async fn an_unpriced_model_counts_no_money() {
    let mut h = harness().await;
    let (session, resp) = h
        .chat_ok(
            "sk-money",
            "money-unpriced",
            &json!({"model": "mock-model", "messages": [{"role": "user", "content": "hi"}]}),
        )
        .await;
    resp.text().await.unwrap();
    h.next_turn().await;
    let text = h.state.metrics.render();
    assert!(
        !text
            .lines()
            .any(|l| l.starts_with(names::SPEND_DOLLARS_TOTAL) && !l.ends_with(" 0")),
        "{text}"
    );
    let turns = h
        .get_json(&format!("/admin/sessions/{session}/turns?messages=false"))
        .await;
    assert!(turns["turns"][0].get("dollars").is_none(), "{turns}");
    let shown = h.get_json(&format!("/admin/sessions/{session}")).await;
    assert_eq!(shown["spent_dollars"], 0.0);
}

#[test]
fn check_config_validates_prices() {
    let problems = |text: &str| Config::from_toml_str(text).unwrap_err().0.join("\n");
    let all = problems("[models.\"m*\"]\nprice = { input = -1.0, output = nan }\n");
    assert!(all.contains("models.\"m*\".price.input"), "{all}");
    assert!(all.contains("models.\"m*\".price.output"), "{all}");
    let all = problems("[models.\"m*\"]\nprice = { cached_input = inf }\n");
    assert!(all.contains("models.\"m*\".price.cached_input"), "{all}");
    let all = problems("[models.\"m*\"]\nprice = { inputs = 1.0 }\n");
    assert!(all.contains("inputs"), "{all}");
    let all = problems("[models.\"m*\"]\nprice = { input = \"cheap\" }\n");
    assert!(all.contains("price") || all.contains("input"), "{all}");
    let c = Config::from_toml_str(
        "[models.\"m*\"]\nprice = { input = 2.5, cached_input = 0.25, cache_write = 3.125, output = 10 }\n",
    )
    .unwrap();
    assert_eq!(c.models["m*"].price, Some(PRICE));
    // the shipped table passes the same checks
    let shipped = ctxgate::context::models::ModelTable::shipped().unwrap();
    assert!(shipped.values().filter(|m| m.price.is_some()).count() > 20);
    let c = Config {
        models: shipped,
        ..Config::default()
    };
    c.validate().unwrap();
}
