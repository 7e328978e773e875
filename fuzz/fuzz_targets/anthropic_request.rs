//! Fuzzes the Anthropic Messages dialect end to end on raw bodies: parse, convert to the neutral form, plan under a
//! small window with the recall tools offered, render back.
//!
//! Invariants: no panic; rendering is deterministic; when the client's conversation is valid for the API
//! (`validate::check_sequence`), the body sent is valid too and keeps what a rewrite may not touch
//! (`validate::check_rewrite`: system, the client's tools as a prefix, signed thinking, cache_control markers,
//! every other field); a request the planner forwards is the client's own bytes.
#![no_main]

use bytes::Bytes;
use ctxgate::config::{Config, Strategy};
use ctxgate::context::decide::{self, Decision};
use ctxgate::context::tokens::{Encoding, TokenCounter};
use ctxgate::dialect::anthropic::validate::{check_rewrite, check_sequence};
use ctxgate::dialect::Dialect;
use ctxgate::recall::Offer;
use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use std::sync::LazyLock;

static COUNTER: LazyLock<TokenCounter> = LazyLock::new(TokenCounter::new);
static CONFIG: LazyLock<Config> = LazyLock::new(Config::default);

fuzz_target!(|data: &[u8]| {
    let Some((&knob, body)) = data.split_first() else {
        return;
    };
    let Ok(request) = Dialect::Anthropic.parse(Bytes::copy_from_slice(body)) else {
        return;
    };
    let client = Value::Object(request.body.clone());
    let valid = check_sequence(request.native()).is_ok();
    let cfg = &*CONFIG;
    let strategy = [Strategy::Prune, Strategy::Hybrid, Strategy::Summarize][usize::from(knob % 3)];
    let req = decide::Request {
        body: &request.body,
        messages: request.messages(),
        key: Dialect::Anthropic.conversation_key(),
        raw_len: request.raw.len(),
        encoding: Encoding::Cl100k,
        window: 200 + u64::from(knob) * 40,
        ratio: 1.0,
        strategy,
        first_seen: None,
        now: 0,
        summarizer: false,
        strict_roles: false,
    };
    let offer = Offer::new(Dialect::Anthropic, &request.body, &cfg.recall);
    let render = || {
        let plan = decide::plan_cuts(&req, None, cfg, &offer, &COUNTER);
        let serialise = |b: &ctxgate::context::RewrittenBody<'_>| Dialect::Anthropic.render(&request, b);
        decide::render(&req, plan, (cfg, &offer), &COUNTER, &serialise)
            .unwrap_or_else(|e| panic!("serialising: {e}"))
    };
    let (first, second) = (render(), render());
    let bytes = |d: &Decision| match d {
        Decision::Rewrite(rw) => Some(rw.body.clone()),
        _ => None,
    };
    assert_eq!(bytes(&first), bytes(&second), "deterministic");
    let Decision::Rewrite(rw) = first else {
        return;
    };
    let sent: Value = serde_json::from_slice(&rw.body).unwrap_or_else(|e| panic!("not JSON: {e}"));
    if valid {
        let messages = sent["messages"].as_array().map(Vec::as_slice).unwrap_or_default();
        if let Err(e) = check_sequence(messages).and_then(|()| check_rewrite(&client, &sent)) {
            panic!("an invalid rewrite of a valid conversation: {e}\nclient: {client}\nsent: {sent}");
        }
    }
});
