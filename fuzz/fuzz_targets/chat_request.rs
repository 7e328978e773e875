//! Fuzzes the chat request parser and the pure stages that follow it: arbitrary bytes as a chat-completions body.
//!
//! For an accepted body: the raw per-message hashes, the session identity (fingerprint), run loops, the message
//! tree (a request appended twice, with and without the prefix index, gives the same nodes), the planner on the
//! messages as sent (any JSON shapes) and the rewritten body's bytes. Invariants: no panic; the tree's prefix index
//! changes nothing but speed; a valid history is planned into a valid one; the rewritten body is the JSON it claims.
#![no_main]

use bytes::Bytes;
use ctxgate::config::{ContextConfig, PruneConfig, SessionConfig, Strategy};
use ctxgate::context::tokens::{Encoding, TokenCounter};
use ctxgate::context::units::check_sequence;
use ctxgate::context::{plan, splice_messages, Plan, PlanInput, RewrittenBody};
use ctxgate::dialect::Dialect;
use ctxgate::dialect::naming::{chat_fingerprint, model_family};
use ctxgate::message::canonical_json;
use ctxgate::pipeline::identity::identify;
use ctxgate::session::identity::IdSource;
use ctxgate::session::TenantKey;
use ctxgate::context::runloop::run_loops;
use ctxgate::message::message_text;
use ctxgate::session::tree::{raw_message_hashes, Tree};
use ctxgate::dialect::chat::MessageAssembler;
use http::{HeaderMap, HeaderValue};
use libfuzzer_sys::fuzz_target;
use serde_json::{json, Value};
use std::sync::LazyLock;

static COUNTER: LazyLock<TokenCounter> = LazyLock::new(TokenCounter::new);
static KEY: LazyLock<TenantKey> = LazyLock::new(|| {
    TenantKey::from_bytes([7; 32]).unwrap_or_else(|e| panic!("a fixed tenant key: {e:?}"))
});

fuzz_target!(|data: &[u8]| {
    let Ok(chat) = Dialect::Chat.parse(Bytes::copy_from_slice(data)) else {
        return;
    };
    let messages = chat.messages();
    let hashes = raw_message_hashes(&chat.raw);
    assert!(
        hashes.is_empty() || hashes.len() == messages.len(),
        "{} hashes for {} messages",
        hashes.len(),
        messages.len()
    );

    // Identity: a fingerprint of the opening, namespaced by the credential.
    let mut headers = HeaderMap::new();
    headers.insert("authorization", HeaderValue::from_static("Bearer sk-fuzz"));
    let cfg = SessionConfig::default();
    let id = identify(&headers, &cfg, &KEY, Dialect::Chat, &chat.body);
    let again = identify(&headers, &cfg, &KEY, Dialect::Chat, &chat.body);
    assert_eq!(id, again);
    let Some(id) = id else {
        panic!("a caller with a credential always has a session");
    };
    assert_eq!(id.source, IdSource::Fingerprint);
    let as_anthropic = identify(&headers, &cfg, &KEY, Dialect::Anthropic, &chat.body);
    assert!(as_anthropic.is_some_and(|a| a.tenant == id.tenant));
    let _ = (chat_fingerprint(&chat.body), model_family(&chat.model));

    // Run loops: ordered, disjoint, within the list; results point at tool messages.
    let loops = run_loops(messages, None);
    let mut end = 0;
    for l in &loops.loops {
        assert!(
            end <= l.start && l.start < l.end && l.end <= messages.len(),
            "{l:?}"
        );
        end = l.end;
        for c in &l.tool_calls {
            if let Some(r) = c.result {
                assert!(r < messages.len());
            }
        }
    }
    for m in messages {
        let _ = (message_text(m), canonical_json(m));
    }

    // The tree: the prefix index only saves work.
    let mut indexed = Tree::new();
    let mut plain = Tree::new();
    let a = indexed.append_request(messages, &hashes, 1);
    let b = plain.append_request(messages, &[], 1);
    assert_eq!(a, b, "the prefix index changed the nodes");
    let again = indexed.append_request(messages, &hashes, 2);
    assert!(
        again.created.is_empty(),
        "a resend created {:?}",
        again.created
    );
    assert_eq!(again.known, messages.len());
    assert_eq!(again.leaf, a.leaf);
    let reply = MessageAssembler::from_completion_body(data).message;
    let (r, _) = indexed.append_reply(a.leaf.clone(), reply, false, 3);
    assert_eq!(indexed.head(), Some(&r));
    assert_eq!(
        indexed.history().len(),
        indexed.get(&r).map_or(0, |n| n.position as usize + 1)
    );

    // The planner on the messages as sent, under a small window.
    let window = [600, 2_000, 8_000][data.len() % 3];
    let tools = chat.body.get("tools");
    let input = PlanInput {
        messages,
        tools,
        first_seen: None,
        now: 1_000_000,
        encoding: Encoding::for_model(&chat.model),
        ratio: 1.0,
        strategy: Strategy::Prune,
        window,
        recall_tool: Some("recall_tool_call"),
        reserve: 0,
        summaries: None,
        precompute_at: 0.6,
        strict_roles: true,
    };
    let p = plan(
        &input,
        &ContextConfig::default(),
        &PruneConfig::default(),
        &COUNTER,
    );
    let Plan::Rewrite(rw) = p else {
        return;
    };
    let out = rw.owned_messages();
    assert_eq!(
        rw.estimate,
        COUNTER.request_tokens(input.encoding, &out, tools)
    );
    if check_sequence(messages).is_ok() {
        if let Err(e) = check_sequence(&out) {
            panic!("a valid history was rewritten into an invalid one: {e}");
        }
    }
    let body = RewrittenBody::new(&chat.body, rw.messages, rw.sources);
    let Ok((bytes, close)) = body.to_vec() else {
        panic!("a rewritten body failed to serialise");
    };
    let parsed: Value = serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(parsed, Value::Object(body.to_map()));
    if !out.is_empty() {
        let extra = json!({"role": "tool", "tool_call_id": "x", "content": "y"});
        let spliced = splice_messages(&bytes, close, std::slice::from_ref(&extra))
            .unwrap_or_else(|| panic!("no splice at {close}"));
        let v: Value = serde_json::from_slice(&spliced).unwrap_or_else(|e| panic!("{e}"));
        let mut want = out.clone();
        want.push(extra);
        assert_eq!(v["messages"], Value::Array(want));
    }
});
