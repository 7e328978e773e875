//! The mock's script: a queued reply, which requests it fits, and its JSON spec as `POST /_mock/script` takes it.

use super::{
    responses, AnthropicError, AnthropicReply, GeminiCall, GeminiError, GeminiReply, MockReply,
    RecordedRequest, ResponsesError, ResponsesReply,
};
use axum::http::Method;
use serde_json::Value;
use std::time::Duration;

/// One queued reply. A request takes the first queued reply that fits it (see [`Scripted::fits`]).
#[derive(Debug, Clone)]
pub struct Scripted {
    answer: Answer,
    /// Fits only requests whose body names this `model`.
    model: Option<String>,
}

#[derive(Debug, Clone)]
enum Answer {
    /// Sent as it is.
    Reply(MockReply),
    /// Rendered as JSON or SSE as the request asks.
    Anthropic(AnthropicReply),
    /// Rendered as JSON or SSE as the request asks.
    Responses(ResponsesReply),
    /// Rendered as one response, SSE or a JSON-array stream as the call asks.
    Gemini(GeminiReply),
}

impl Scripted {
    /// A reply sent as it is.
    pub fn reply(reply: MockReply) -> Scripted {
        Scripted {
            answer: Answer::Reply(reply),
            model: None,
        }
    }

    /// An Anthropic reply, for `POST …/messages` requests only.
    pub fn anthropic(reply: AnthropicReply) -> Scripted {
        Scripted {
            answer: Answer::Anthropic(reply),
            model: None,
        }
    }

    /// A Responses reply, for `POST …/responses` requests only.
    pub fn responses(reply: ResponsesReply) -> Scripted {
        Scripted {
            answer: Answer::Responses(reply),
            model: None,
        }
    }

    /// A Gemini reply, for `POST /{version}/models/{model}:generateContent` and `:streamGenerateContent` only.
    pub fn gemini(reply: GeminiReply) -> Scripted {
        Scripted {
            answer: Answer::Gemini(reply),
            model: None,
        }
    }

    /// The same reply, kept for requests whose body names `model` (or, for a Gemini call, whose path does).
    pub fn for_model(mut self, model: &str) -> Scripted {
        self.model = Some(model.to_string());
        self
    }

    /// Whether `rec` may take this reply: the model matches (when one is set); an Anthropic reply only answers
    /// `POST …/messages`, a Responses reply only `POST …/responses` (and a request ending with a
    /// `compaction_trigger` only when it has a `compaction` item), a Gemini reply only a Gemini
    /// `generateContent` or `streamGenerateContent` call, any other every request but `HEAD`, `…/count_tokens`,
    /// `…/input_tokens`, a Gemini call to another method (`:countTokens`), a WebSocket upgrade and
    /// `GET …/responses` (Codex's upgrade attempts, whose `Upgrade` header a proxy may drop).
    pub fn fits(&self, rec: &RecordedRequest) -> bool {
        let gemini = GeminiCall::of(rec);
        if let Some(model) = &self.model {
            let named = match &gemini {
                Some(call) => Some(call.model.clone()),
                None => rec
                    .json()
                    .get("model")
                    .and_then(Value::as_str)
                    .map(String::from),
            };
            if named.as_deref() != Some(model.as_str()) {
                return false;
            }
        }
        match &self.answer {
            Answer::Anthropic(_) => rec.method == Method::POST && rec.path().ends_with("/messages"),
            Answer::Responses(r) => {
                rec.method == Method::POST
                    && rec.path().ends_with("/responses")
                    && (r.compacts() || !responses::asks_compaction(&rec.json()))
            }
            Answer::Gemini(_) => gemini.is_some_and(|c| c.generates()),
            Answer::Reply(_) => {
                if gemini.is_some_and(|c| !c.generates()) {
                    return false;
                }
                let path = rec.path();
                let upgrade = rec.is_websocket()
                    || (rec.method == Method::GET && path.ends_with("/responses"));
                rec.method != Method::HEAD
                    && !path.ends_with("/count_tokens")
                    && !path.ends_with("/input_tokens")
                    && !upgrade
            }
        }
    }

    /// What is sent to `rec`.
    pub fn answer(self, rec: &RecordedRequest) -> MockReply {
        match self.answer {
            Answer::Reply(reply) => reply,
            Answer::Anthropic(reply) => reply.render(&rec.json()),
            Answer::Responses(reply) => reply.render(&rec.json()),
            Answer::Gemini(reply) => reply.render(rec),
        }
    }

    /// A queued reply from its JSON spec. One of:
    ///
    /// - `{"anthropic": {…}}`: an Anthropic message (see [`AnthropicReply::from_spec`]), sent as JSON or as the
    ///   event stream as the request asks;
    /// - `{"anthropic_error": {"type", "message", "status"?}}`: an error answer in Anthropic's shape (the status
    ///   defaults to the one the API gives the type, e.g. 529 for `overloaded_error`);
    /// - `{"responses": {…}}`: an OpenAI Responses answer (see [`ResponsesReply::from_spec`]), sent as JSON or as
    ///   the event stream as the request asks;
    /// - `{"responses_error": {"code"?, "type"?, "message", "status"?}}`: an error answer in OpenAI's shape (the
    ///   status defaults from the code or type, e.g. 429 for `rate_limit_exceeded`);
    /// - `{"gemini": {…}}`: a Gemini answer (see [`GeminiReply::from_spec`]), sent as one response, as SSE or as
    ///   a JSON-array stream as the call asks;
    /// - `{"gemini_error": {"status"?, "code"?, "message"}}`: an error answer in Google's shape (the code
    ///   defaults from the status name, e.g. 429 for `RESOURCE_EXHAUSTED`, and the other way round);
    /// - any spec [`MockReply::from_spec`] takes (chat completions, raw JSON bodies, raw SSE).
    ///
    /// Each takes an optional `"model"` (fits only requests for that model) and `"delay_ms"` (before the answer,
    /// or between two stream events); error and JSON replies take `"headers": {"name": "value"}`.
    pub fn from_spec(spec: &Value) -> Result<Scripted, String> {
        let o = spec
            .as_object()
            .ok_or_else(|| format!("a reply spec must be an object, got {spec}"))?;
        let delay = Duration::from_millis(o.get("delay_ms").and_then(Value::as_u64).unwrap_or(0));
        let mut scripted = if let Some(a) = o.get("anthropic") {
            let mut reply = AnthropicReply::from_spec(a)?;
            reply.delay = delay;
            Scripted::anthropic(reply)
        } else if let Some(r) = o.get("responses") {
            let mut reply = ResponsesReply::from_spec(r)?;
            reply.delay = delay;
            Scripted::responses(reply)
        } else if let Some(g) = o.get("gemini") {
            let mut reply = GeminiReply::from_spec(g)?;
            reply.delay = delay;
            Scripted::gemini(reply)
        } else if let Some(e) = o.get("gemini_error") {
            let mut reply = GeminiError::from_spec(e)?.reply().delayed(delay);
            reply.add_headers(o.get("headers"))?;
            Scripted::reply(reply)
        } else if let Some(e) = o.get("responses_error") {
            let mut reply = ResponsesError::from_spec(e)?.reply().delayed(delay);
            reply.add_headers(o.get("headers"))?;
            Scripted::reply(reply)
        } else if let Some(e) = o.get("anthropic_error") {
            let mut reply = AnthropicError::from_spec(e)?.reply().delayed(delay);
            reply.add_headers(o.get("headers"))?;
            Scripted::reply(reply)
        } else {
            Scripted::reply(MockReply::from_spec(spec)?)
        };
        match o.get("model") {
            None => {}
            Some(Value::String(m)) => scripted = scripted.for_model(m),
            Some(other) => return Err(format!("\"model\" must be a string, got {other}")),
        }
        Ok(scripted)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use axum::http::HeaderMap;
    use bytes::Bytes;
    use serde_json::json;

    fn rec(method: Method, uri: &str, body: Value) -> RecordedRequest {
        RecordedRequest {
            method,
            uri: uri.into(),
            headers: HeaderMap::new(),
            body: Bytes::from(body.to_string()),
        }
    }

    #[test]
    fn replies_fit_their_endpoints_and_models() {
        let messages = rec(
            Method::POST,
            "/v1/messages?beta=true",
            json!({"model": "big"}),
        );
        let side = rec(Method::POST, "/v1/messages", json!({"model": "small"}));
        let count = rec(
            Method::POST,
            "/v1/messages/count_tokens",
            json!({"model": "big"}),
        );
        let chat = rec(
            Method::POST,
            "/v1/chat/completions",
            json!({"model": "big"}),
        );
        let head = rec(Method::HEAD, "/", Value::Null);

        let a = Scripted::from_spec(&json!({"anthropic": {"content": "hi"}})).unwrap();
        assert!(a.fits(&messages) && a.fits(&side));
        assert!(!a.fits(&count) && !a.fits(&chat) && !a.fits(&head));

        let big =
            Scripted::from_spec(&json!({"anthropic": {"content": "hi"}, "model": "big"})).unwrap();
        assert!(big.fits(&messages) && !big.fits(&side));

        let raw = Scripted::from_spec(&json!({"json": {}})).unwrap();
        assert!(raw.fits(&messages) && raw.fits(&chat));
        assert!(!raw.fits(&count) && !raw.fits(&head));

        let responses = rec(
            Method::POST,
            "/v1/responses",
            json!({"model": "big", "input": "x"}),
        );
        let trigger = rec(
            Method::POST,
            "/v1/responses",
            json!({"input": [{"role": "user", "content": "x"}, {"type": "compaction_trigger"}]}),
        );
        let upgrade = rec(Method::GET, "/v1/responses", Value::Null);
        let tokens = rec(Method::POST, "/v1/responses/input_tokens", json!({}));
        let r = Scripted::from_spec(&json!({"responses": {"output": "hi"}})).unwrap();
        assert!(r.fits(&responses) && !r.fits(&trigger));
        assert!(!r.fits(&chat) && !r.fits(&messages) && !r.fits(&upgrade) && !r.fits(&tokens));
        let compacting = Scripted::from_spec(
            &json!({"responses": {"output": [{"type": "compaction", "encrypted_content": "e"}]}}),
        )
        .unwrap();
        assert!(compacting.fits(&trigger));
        assert!(raw.fits(&responses) && !raw.fits(&upgrade) && !raw.fits(&tokens));
    }

    #[test]
    fn an_anthropic_error_spec_is_an_error_answer_with_its_headers() {
        let spec = json!({"anthropic_error": {"type": "rate_limit_error", "message": "slow"},
                          "headers": {"retry-after": "3"}});
        let reply = Scripted::from_spec(&spec).unwrap().answer(&rec(
            Method::POST,
            "/v1/messages",
            json!({}),
        ));
        let MockReply::Json {
            status,
            headers,
            body,
            ..
        } = reply
        else {
            panic!()
        };
        assert_eq!(status, 429);
        assert!(headers.contains(&("retry-after".into(), "3".into())));
        let body: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(body["type"], "error");
        assert_eq!(
            body["error"],
            json!({"type": "rate_limit_error", "message": "slow"})
        );
    }

    #[test]
    fn bad_specs_are_refused() {
        for bad in [
            json!({"anthropic": {"content": "x"}, "model": 3}),
            json!({"anthropic": {}}),
            json!({"anthropic_error": {"message": "no type"}}),
            json!({"anthropic_error": {"type": "x", "status": 200}}),
        ] {
            assert!(Scripted::from_spec(&bad).is_err(), "{bad}");
        }
    }
}
