//! The plan stage: counts a chat request against its model's window and, when it is over budget, rewrites its
//! messages and offers the recall tools; otherwise the client's own bytes go upstream.

use super::ChatRequest;
use crate::app::AppState;
use crate::config::Strategy;
use crate::context::tokens::Encoding;
use crate::context::{self, CompressionRecord, Plan, PlanInput, PrunedCall};
use crate::error::GatewayError;
use crate::recall::{self, Injection, Recallable};
use bytes::Bytes;
use http::HeaderMap;
use serde_json::{Map, Value};

/// Request header choosing the strategy for one request.
pub const STRATEGY_HEADER: &str = "x-ctxgate-strategy";

/// What goes upstream.
pub struct Outgoing {
    /// The body to send.
    pub body: Bytes,
    /// Set when the messages were rewritten.
    pub rewrite: Option<Rewritten>,
    /// Estimated tokens of what is sent (uncalibrated), when counted; for calibration against `usage`.
    pub estimate: Option<u64>,
    /// Estimated (calibrated) tokens of the client's request, when counted.
    pub client_tokens: Option<u64>,
}

/// A rewritten request.
pub struct Rewritten {
    /// What the rewrite did.
    pub record: CompressionRecord,
    /// The calls whose results were left out.
    pub pruned: Vec<PrunedCall>,
    /// The recall tools were added (their calls must be answered by ctxgate).
    pub injected: bool,
    /// The outgoing body as JSON, for recall rounds to extend.
    pub body: Map<String, Value>,
}

/// The strategy for this request: the header's, else the config's. A header naming no strategy is a 400.
pub fn strategy(headers: &HeaderMap, default: Strategy) -> Result<Strategy, GatewayError> {
    let Some(v) = headers.get(STRATEGY_HEADER) else {
        return Ok(default);
    };
    v.to_str().ok().and_then(Strategy::parse).ok_or_else(|| {
        GatewayError::bad_request(format!(
            "header {STRATEGY_HEADER} must be one of off, prune, summarize, hybrid"
        ))
    })
}

/// Plans the request. `first_seen` are the messages' first-seen times from the session, when known.
pub fn plan_request(
    state: &AppState,
    strategy: Strategy,
    chat: &ChatRequest,
    first_seen: Option<&[i64]>,
    now: i64,
) -> Result<Outgoing, GatewayError> {
    let cfg = &state.config;
    let forward = |estimate: Option<u64>, client_tokens: Option<u64>| Outgoing {
        body: chat.raw.clone(),
        rewrite: None,
        estimate,
        client_tokens,
    };
    let window = state.models.context_window(&chat.model);
    let ratio = state.counter.ratio(&chat.model);
    // Every token covers at least one byte of the body and an image part's JSON is over half its flat price, so
    // a body under half the threshold (in bytes) cannot be over it: no need to count.
    let threshold = cfg.context.threshold * window as f64;
    if strategy == Strategy::Off || (chat.raw.len() as f64) * 2.0 * ratio <= threshold {
        return Ok(forward(None, None));
    }
    let recall_ok = recall::can_inject(&chat.body, &cfg.recall).is_ok();
    let input = PlanInput {
        messages: chat.messages(),
        tools: chat.body.get("tools"),
        first_seen,
        now,
        encoding: Encoding::for_model(&chat.model),
        ratio,
        strategy,
        window,
        recall_tool: recall_ok.then_some(cfg.recall.tool_name.as_str()),
        reserve: if recall_ok {
            recall::reserve_tokens(&cfg.recall)
        } else {
            0
        },
    };
    let rw = match context::plan(&input, &cfg.context, &cfg.prune, &state.counter) {
        Plan::Forward { tokens } => {
            let raw = tokens.map(|t| (t as f64 / ratio) as u64);
            return Ok(forward(raw, tokens));
        }
        Plan::Reject { tokens, limit, window } => {
            return Err(GatewayError::ContextLengthExceeded {
                message: format!(
                    "this conversation needs about {tokens} tokens even after ctxgate dropped all it could \
                     (system prompt and newest turn kept); the limit is {limit} tokens ({} of the model's \
                     {window}-token window, context.hard_limit)",
                    cfg.context.hard_limit
                ),
            })
        }
        Plan::Rewrite(rw) => *rw,
    };
    let mut body = Map::with_capacity(chat.body.len() + 1);
    let mut messages = Some(rw.messages);
    for (k, v) in &chat.body {
        let v = match (k.as_str(), messages.take()) {
            ("messages", Some(m)) => Value::Array(m),
            (_, m) => {
                messages = m;
                v.clone()
            }
        };
        body.insert(k.clone(), v);
    }
    let recallable: Vec<Recallable> = rw
        .pruned
        .iter()
        .map(|p| Recallable {
            call_id: p.call_id.clone(),
            tool_name: p.tool_name.clone(),
            digest: p.digest.clone(),
        })
        .collect();
    let injected = inject(&mut body, &recallable, state);
    let estimate = state.counter.request_tokens(
        input.encoding,
        body.get("messages")
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or_default(),
        body.get("tools"),
    );
    let bytes = serde_json::to_vec(&body)
        .map_err(|e| GatewayError::Internal(format!("serialising the rewrite: {e}")))?;
    Ok(Outgoing {
        body: Bytes::from(bytes),
        estimate: Some(estimate),
        client_tokens: Some(rw.record.tokens_before),
        rewrite: Some(Rewritten {
            record: rw.record,
            pruned: rw.pruned,
            injected,
            body,
        }),
    })
}

fn inject(body: &mut Map<String, Value>, recallable: &[Recallable], state: &AppState) -> bool {
    match recall::inject(body, recallable, &state.config.recall) {
        Injection::Injected => true,
        Injection::Skipped(why) => {
            if !recallable.is_empty() {
                tracing::debug!(reason = why, "recall: tools not offered with this rewrite");
            }
            false
        }
    }
}
