//! A parsed conversation request of any dialect: the client's bytes, its body with every field in order, and the
//! neutral messages the context engine plans on.

use super::{Conversion, Dialect};
use crate::error::GatewayError;
use bytes::Bytes;
use serde_json::{Map, Value};
use std::borrow::Cow;
use std::sync::{Arc, OnceLock};

/// The body as a JSON object, or a 400 saying why it is not one. Elements of its conversation seen before are
/// not parsed again ([`super::parse_memo`]).
pub fn json_object(raw: &[u8]) -> Result<Map<String, Value>, GatewayError> {
    json_object_scanned(raw).map(|(body, _)| body)
}

/// [`json_object`], with the xxh3 of each `messages` element's bytes when the parse's scan found them (see
/// [`Request::item_hashes`]).
pub fn json_object_scanned(raw: &[u8]) -> Result<super::parse_memo::Scanned, GatewayError> {
    if let Some(scanned) = super::parse_memo::object(raw) {
        return Ok(scanned);
    }
    whole(raw).map(|body| (body, None))
}

fn whole(raw: &[u8]) -> Result<Map<String, Value>, GatewayError> {
    let value: Value = serde_json::from_slice(raw).map_err(|e| GatewayError::BadRequest {
        message: format!("request body is not valid JSON: {e}"),
        param: None,
    })?;
    match value {
        Value::Object(body) => Ok(body),
        _ => Err(GatewayError::bad_request(
            "request body must be a JSON object",
        )),
    }
}

/// A 400 naming the field `param`.
pub fn bad(message: String, param: &'static str) -> GatewayError {
    GatewayError::BadRequest {
        message,
        param: Some(param),
    }
}

/// `model` is required: a string of at most `MAX_MODEL_LEN` bytes (it is matched against the model table, used as
/// a metric label and logged); `stream`, when given, a boolean or null.
pub fn check_model_and_stream(body: &Map<String, Value>) -> Result<(), GatewayError> {
    use crate::context::models::MAX_MODEL_LEN;
    match body.get("model") {
        Some(Value::String(m)) if m.len() <= MAX_MODEL_LEN => {}
        None => return Err(bad("missing required parameter: `model`".into(), "model")),
        Some(_) => {
            return Err(bad(
                format!("`model` must be a string of at most {MAX_MODEL_LEN} bytes"),
                "model",
            ))
        }
    }
    if body
        .get("stream")
        .is_some_and(|s| !s.is_boolean() && !s.is_null())
    {
        return Err(bad("`stream` must be a boolean".into(), "stream"));
    }
    Ok(())
}

/// Whether the client's `tools` leave room for ctxgate's (named in `names`): an array (or none) in which no tool
/// has one of their names (`name` reads a tool's name in the dialect's shape).
pub fn tools_leave_room(
    tools: Option<&Value>,
    names: &super::InjectedNames,
    name: impl Fn(&Value) -> Option<&str>,
) -> Result<(), &'static str> {
    match tools {
        None | Some(Value::Null) => Ok(()),
        Some(Value::Array(tools)) => {
            if tools
                .iter()
                .any(|t| name(t).is_some_and(|n| names.is_injected(n)))
            {
                Err("a client tool has the same name")
            } else {
                Ok(())
            }
        }
        Some(_) => Err("client tools are not an array"),
    }
}

/// Where a conversation request was sent: the path the client called (from the root) and its query. Most
/// dialects read nothing of it (their model and stream flag are in the body); Gemini's model and method are in the
/// path.
#[derive(Debug, Clone, Copy, Default)]
pub struct Call<'a> {
    /// The path the client called (`/v1/chat/completions`, `/v1beta/models/gemini-2.5-pro:generateContent`).
    pub path: &'a str,
    /// Its query string, if any (without `?`).
    pub query: Option<&'a str>,
}

/// A parsed request. `raw` is what the client sent; it is forwarded as is when no rewrite is needed.
#[derive(Debug, Clone)]
pub struct Request {
    /// Its dialect.
    pub dialect: Dialect,
    /// The original body bytes.
    pub raw: Bytes,
    /// The body, every field kept in its original order.
    pub body: Map<String, Value>,
    /// `stream: true` was asked for.
    pub stream: bool,
    /// The requested model (empty when absent).
    pub model: String,
    /// The upstream path of the request, below its upstream's base URL (the dialect's own, unless the request
    /// names it: see [`Request::with_path`]).
    pub path: Cow<'static, str>,
    /// The neutral form of the messages, for a dialect whose own messages are not already neutral: made when
    /// first asked for (a request clearly under its budget, the common case, never needs it).
    converted: OnceLock<Option<Arc<dyn Conversion>>>,
    /// The xxh3 of each `messages` element's bytes, when the parse's scan gave them.
    item_hashes: Option<Vec<u64>>,
}

impl Request {
    /// A parsed request.
    pub fn new(
        dialect: Dialect,
        raw: Bytes,
        body: Map<String, Value>,
        stream: bool,
        model: String,
    ) -> Self {
        Self {
            dialect,
            raw,
            body,
            stream,
            model,
            path: Cow::Borrowed(dialect.upstream_path()),
            converted: OnceLock::new(),
            item_hashes: None,
        }
    }

    /// The request with its own upstream path (a dialect whose path carries the model and method).
    pub fn with_path(mut self, path: String) -> Self {
        self.path = Cow::Owned(path);
        self
    }

    /// The request with the hashes of its `messages` elements' bytes that the parse's scan gave (`None`: none).
    pub fn with_item_hashes(mut self, hashes: Option<Vec<u64>>) -> Self {
        self.item_hashes = hashes;
        self
    }

    /// The xxh3 of each conversation item's bytes, as `session::tree::raw_item_hashes` reads them, when the parse
    /// already has them (a chat or Anthropic body the scan read); `None`: read them from `raw`.
    pub fn item_hashes(&self) -> Option<&[u64]> {
        self.item_hashes.as_deref()
    }

    /// Whether ctxgate manages the conversation: it carries its whole history (not a reference to history the
    /// upstream keeps) and asks for an ordinary answer. An unmanaged request is forwarded as sent.
    pub fn managed(&self) -> bool {
        self.dialect.managed(&self.body)
    }

    /// Why ctxgate does not manage the request, when it does not (see [`Request::managed`]).
    pub fn unmanaged_reason(&self) -> Option<crate::metrics::UnmanagedReason> {
        self.dialect.unmanaged_reason(&self.body)
    }

    /// The client's own messages, as sent (what the session keeps).
    pub fn native(&self) -> &[Value] {
        self.body
            .get(self.dialect.conversation_key())
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or_default()
    }

    /// The neutral messages the context engine plans on (the client's own for chat).
    pub fn messages(&self) -> &[Value] {
        match self.converted() {
            Some(c) => c.messages(),
            None => self.native(),
        }
    }

    /// The conversion of the client's messages, for a dialect that converts (made on first use).
    pub fn converted(&self) -> Option<&dyn Conversion> {
        self.converted
            .get_or_init(|| {
                let system = self.dialect.system_key().and_then(|k| self.body.get(k));
                self.dialect.convert(system, self.native())
            })
            .as_deref()
    }

    /// Index of the client message the neutral message `i` comes from; `None` for one that comes from elsewhere
    /// in the body (Anthropic's top-level `system`).
    pub fn native_index(&self, i: usize) -> Option<usize> {
        match self.converted() {
            Some(c) => c.native_index(i),
            None => Some(i),
        }
    }

    /// A summary of the first `n` neutral messages as `(n, client messages covered)`, when `n` ends on a client
    /// message's boundary (a summary covers whole client messages, the unit the session keeps).
    pub fn summary_boundary(&self, n: usize) -> Option<(usize, usize)> {
        if n == 0 {
            return None;
        }
        let native = match self.native_index(n) {
            Some(k) => k,
            None if n >= self.messages().len() => self.native().len(),
            None => return None,
        };
        (native > 0 && self.neutral_start(native) == n).then_some((n, native))
    }

    /// Number of neutral messages before the client message `native` (its first neutral message's index; the
    /// neutral length for `native` = the number of client messages).
    pub fn neutral_start(&self, native: usize) -> usize {
        match self.converted() {
            Some(c) => c.neutral_start(native),
            None => native,
        }
    }
}
