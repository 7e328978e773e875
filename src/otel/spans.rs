//! The spans of a conversation request's stages, with the GenAI semantic conventions (`gen_ai.*`) and ctxgate's
//! own `ctxgate.*` attributes. Nothing here reads message content unless `otel.capture_content` is on.

use super::Tracing;
use crate::error::GatewayError;
use opentelemetry::trace::{Link, SpanContext, SpanKind, Status, TraceContextExt, Tracer};
use opentelemetry::{Array, Context, KeyValue, StringValue, Value as OtelValue};
use serde_json::Value;
use std::sync::Arc;

/// What an upstream answer tells its span, as its dialect reads it (`dialect::AssembledReply::answer`): `otel/`
/// reads no wire format.
#[derive(Debug, Default, Clone, Copy)]
pub struct Answer<'a> {
    /// The model the upstream reported.
    pub model: Option<&'a str>,
    /// The completion's id.
    pub id: Option<&'a str>,
    /// Why it stopped.
    pub finish_reason: Option<&'a str>,
    /// The prompt's tokens, as the upstream counted them.
    pub input_tokens: Option<u64>,
    /// The completion's tokens.
    pub output_tokens: Option<u64>,
    /// The prompt's tokens read from the provider's cache.
    pub cached_tokens: Option<u64>,
    /// The assistant message, when it has content (recorded only when `otel.capture_content` is on).
    pub message: Option<&'a Value>,
    /// The type of an error event inside a successful stream (`upstream_error` when it names none).
    pub error: Option<&'a str>,
}

/// A request's trace: the context whose active span is the one new spans go under (the server span, or the plan
/// span for what planning starts). Travels in the request's extensions.
#[derive(Clone)]
pub struct RequestTrace {
    t: Arc<Tracing>,
    cx: Context,
}

impl RequestTrace {
    pub(super) fn new(t: Arc<Tracing>, cx: Context) -> Self {
        RequestTrace { t, cx }
    }

    /// Whether message content may go into spans.
    pub fn captures_content(&self) -> bool {
        self.t.capture_content
    }

    /// The context whose active span is this trace's current one (for a `traceparent`).
    pub fn context(&self) -> &Context {
        &self.cx
    }

    fn child(&self, name: String, kind: SpanKind, attrs: Vec<KeyValue>) -> Context {
        let span = self
            .t
            .tracer
            .span_builder(name)
            .with_kind(kind)
            .with_attributes(attrs)
            .start_with_context(&self.t.tracer, &self.cx);
        self.cx.with_span(span)
    }

    /// Opens the `ctxgate.plan` span (counting, and rewriting when over budget).
    pub fn plan(&self) -> PlanSpan {
        let cx = self.child("ctxgate.plan".into(), SpanKind::Internal, Vec::new());
        PlanSpan(RequestTrace {
            t: self.t.clone(),
            cx,
        })
    }

    /// Opens the client span of upstream round `round` (0: the request itself), named `chat <model>`;
    /// `input`: the messages sent, recorded only with `otel.capture_content`.
    pub fn chat(&self, start: &ChatStart, round: u32, input: Option<&[Value]>) -> ChatSpan {
        let mut attrs = start.attrs.clone();
        attrs.push(KeyValue::new("ctxgate.round", i64::from(round)));
        if let (true, Some(m)) = (self.t.capture_content, input) {
            attrs.push(KeyValue::new(
                "gen_ai.input.messages",
                serde_json::to_string(m).unwrap_or_default(),
            ));
        }
        ChatSpan {
            cx: self.child(start.name.clone(), SpanKind::Client, attrs),
            capture: self.t.capture_content,
        }
    }

    /// Opens the `execute_tool <name>` span of a recall call ctxgate answers itself.
    pub fn tool(&self, name: &str, call_id: &str) -> ToolSpan {
        ToolSpan(self.child(
            format!("execute_tool {name}"),
            SpanKind::Internal,
            vec![
                KeyValue::new("gen_ai.operation.name", "execute_tool"),
                KeyValue::new("gen_ai.tool.name", name.to_owned()),
                KeyValue::new("gen_ai.tool.call.id", call_id.to_owned()),
                KeyValue::new("gen_ai.tool.type", "function"),
            ],
        ))
    }

    /// What a background job started now needs to trace itself: a link to the current span.
    pub fn job(&self) -> JobTrace {
        JobTrace {
            t: self.t.clone(),
            link: self.cx.span().span_context().clone(),
        }
    }
}

/// What planning found, for the plan span and the upstream spans.
#[derive(Debug, Clone, Copy)]
pub struct Planned<'a> {
    /// The strategy the request was planned with.
    pub strategy: &'a str,
    /// Whether what goes upstream was rewritten.
    pub rewritten: bool,
    /// The rewrite's stages, in order.
    pub stages: &'a [&'static str],
    /// Tokens of the client's request, when counted.
    pub tokens_before: Option<u64>,
    /// Tokens of what goes upstream, when counted.
    pub tokens_after: Option<u64>,
    /// The model's context window.
    pub window: u64,
    /// Whether the recall tools were offered.
    pub recall_offered: bool,
}

impl Planned<'_> {
    fn attributes(&self) -> Vec<KeyValue> {
        let mut a = vec![
            KeyValue::new("ctxgate.strategy", self.strategy.to_owned()),
            KeyValue::new("ctxgate.rewritten", self.rewritten),
            KeyValue::new("ctxgate.context_window", to_i64(self.window)),
        ];
        if self.rewritten {
            let stages: Vec<StringValue> =
                self.stages.iter().map(|s| StringValue::from(*s)).collect();
            a.push(KeyValue::new(
                "ctxgate.stages",
                OtelValue::Array(Array::String(stages)),
            ));
            a.push(KeyValue::new("ctxgate.recall_offered", self.recall_offered));
        }
        if let Some(t) = self.tokens_before {
            a.push(KeyValue::new("ctxgate.tokens.before", to_i64(t)));
        }
        if let Some(t) = self.tokens_after {
            a.push(KeyValue::new("ctxgate.tokens.after", to_i64(t)));
        }
        a
    }
}

/// The `ctxgate.plan` span; its trace is where jobs started while planning link to.
pub struct PlanSpan(RequestTrace);

impl PlanSpan {
    /// The trace with this span active.
    pub fn trace(&self) -> &RequestTrace {
        &self.0
    }

    /// Ends the span with what planning decided.
    pub fn finish(self, planned: &Planned<'_>) {
        let span = self.0.cx.span();
        span.set_attributes(planned.attributes());
        span.end();
    }

    /// Ends the span with the error that refused the request.
    pub fn fail(self, e: &GatewayError) {
        end_with_error(&self.0.cx, e);
    }
}

/// The attributes every upstream span of one request shares: `gen_ai.*` of the request, `ctxgate.*` of its plan.
#[derive(Clone)]
pub struct ChatStart {
    name: String,
    attrs: Vec<KeyValue>,
}

impl ChatStart {
    /// The request to `provider` (`openai`, `anthropic`) for `model` at `url`, in session `session` (when known).
    pub fn new(provider: &'static str, model: &str, session: Option<&str>, url: &str) -> ChatStart {
        let mut attrs = vec![
            KeyValue::new("gen_ai.operation.name", "chat"),
            KeyValue::new("gen_ai.provider.name", provider),
            KeyValue::new("gen_ai.request.model", model.to_owned()),
        ];
        if let Some(s) = session.filter(|s| !s.is_empty()) {
            attrs.push(KeyValue::new("gen_ai.conversation.id", s.to_owned()));
        }
        if let Ok(uri) = url.parse::<http::Uri>() {
            if let Some(host) = uri.host() {
                attrs.push(KeyValue::new("server.address", host.to_owned()));
            }
            let port = uri.port_u16().or(match uri.scheme_str() {
                Some("https") => Some(443),
                Some("http") => Some(80),
                _ => None,
            });
            if let Some(p) = port {
                attrs.push(KeyValue::new("server.port", i64::from(p)));
            }
        }
        let name = match model {
            "" => "chat".to_owned(),
            m => format!("chat {m}"),
        };
        ChatStart { name, attrs }
    }

    /// With the name of the upstream it goes to (`ctxgate.upstream`: `default`, `anthropic` or an
    /// `[upstreams.<name>]`).
    pub fn upstream(mut self, name: &str) -> ChatStart {
        self.attrs
            .push(KeyValue::new("ctxgate.upstream", name.to_owned()));
        self
    }

    /// With the plan's `ctxgate.*` attributes.
    pub fn planned(mut self, planned: &Planned<'_>) -> ChatStart {
        self.attrs.extend(planned.attributes());
        self
    }
}

/// The client span of one upstream round; ends when finished, failed or dropped.
pub struct ChatSpan {
    cx: Context,
    capture: bool,
}

impl ChatSpan {
    /// The context naming this span (for the upstream's `traceparent`).
    pub fn context(&self) -> &Context {
        &self.cx
    }

    /// Ends the span with the answer: `status` the upstream's, `answer` what it said.
    pub fn finish(self, status: u16, answer: &Answer<'_>) {
        let span = self.cx.span();
        let mut a = Vec::with_capacity(8);
        if let Some(m) = answer.model {
            a.push(KeyValue::new("gen_ai.response.model", m.to_string()));
        }
        if let Some(id) = answer.id {
            a.push(KeyValue::new("gen_ai.response.id", id.to_string()));
        }
        if let Some(f) = answer.finish_reason {
            let reasons = vec![StringValue::from(f.to_string())];
            a.push(KeyValue::new(
                "gen_ai.response.finish_reasons",
                OtelValue::Array(Array::String(reasons)),
            ));
        }
        if let Some(n) = answer.input_tokens {
            a.push(KeyValue::new("gen_ai.usage.input_tokens", to_i64(n)));
        }
        if let Some(n) = answer.output_tokens {
            a.push(KeyValue::new("gen_ai.usage.output_tokens", to_i64(n)));
        }
        if let Some(n) = answer.cached_tokens {
            a.push(KeyValue::new("ctxgate.tokens.cached", to_i64(n)));
        }
        if let (true, Some(message)) = (self.capture, answer.message) {
            a.push(KeyValue::new(
                "gen_ai.output.messages",
                serde_json::to_string(message).unwrap_or_default(),
            ));
        }
        a.push(KeyValue::new(
            "http.response.status_code",
            i64::from(status),
        ));
        if status >= 400 {
            a.push(KeyValue::new("error.type", status.to_string()));
            span.set_status(Status::error(""));
        } else if let Some(kind) = answer.error {
            // An error event inside a successful stream.
            a.push(KeyValue::new("error.type", kind.to_owned()));
            span.set_status(Status::error(""));
        }
        span.set_attributes(a);
        span.end();
    }

    /// Ends the span with the error that kept the upstream from answering.
    pub fn fail(self, e: &GatewayError) {
        end_with_error(&self.cx, e);
    }
}

/// The span of one recall call answered by ctxgate.
pub struct ToolSpan(Context);

impl ToolSpan {
    /// Ends the span: `outcome` is `found`, `not_found` or `error`.
    pub fn finish(self, outcome: &'static str) {
        let span = self.0.span();
        span.set_attribute(KeyValue::new("ctxgate.recall.outcome", outcome));
        if outcome == "error" {
            span.set_attribute(KeyValue::new("error.type", "tool_error"));
            span.set_status(Status::error(""));
        }
        span.end();
    }
}

/// A background job's tracing: its spans start a trace of their own, linked to the request that started it.
#[derive(Clone)]
pub struct JobTrace {
    t: Arc<Tracing>,
    link: SpanContext,
}

impl std::fmt::Debug for JobTrace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobTrace")
            .field("link", &self.link.span_id())
            .finish()
    }
}

impl JobTrace {
    /// Opens the root span of a summary job: `model` writes the summary of the first `messages` messages of
    /// `session`.
    pub fn summary(
        &self,
        session: &str,
        model: &str,
        messages: usize,
        precomputed: bool,
    ) -> SummarySpan {
        let links = if self.link.is_valid() {
            vec![Link::with_context(self.link.clone())]
        } else {
            Vec::new()
        };
        let span = self
            .t
            .tracer
            .span_builder("ctxgate.summary")
            .with_kind(SpanKind::Internal)
            .with_links(links)
            .with_attributes([
                KeyValue::new("gen_ai.operation.name", "chat"),
                KeyValue::new("gen_ai.request.model", model.to_owned()),
                KeyValue::new("gen_ai.conversation.id", session.to_owned()),
                KeyValue::new("ctxgate.summary.messages", to_i64(messages as u64)),
                KeyValue::new("ctxgate.summary.precomputed", precomputed),
            ])
            .start_with_context(&self.t.tracer, &Context::new());
        SummarySpan(Context::new().with_span(span))
    }
}

/// The root span of a summary job.
pub struct SummarySpan(Context);

impl SummarySpan {
    /// Ends the span: `outcome` is `ok`, or how the job failed (`failed`, `timeout`, `empty`).
    pub fn finish(self, outcome: &'static str) {
        let span = self.0.span();
        span.set_attribute(KeyValue::new("ctxgate.summary.outcome", outcome));
        if outcome != "ok" {
            span.set_attribute(KeyValue::new("error.type", outcome));
            span.set_status(Status::error(""));
        }
        span.end();
    }
}

fn end_with_error(cx: &Context, e: &GatewayError) {
    let span = cx.span();
    let kind = e
        .code()
        .map_or_else(|| e.status().as_str().to_owned(), str::to_owned);
    span.set_attribute(KeyValue::new("error.type", kind));
    span.set_status(Status::error(""));
    span.end();
}

fn to_i64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// The upstream side of one request: a `chat <model>` span per round (the request, then each recall round's
/// follow-up), each named in the `traceparent` of the round it covers.
pub struct UpstreamTrace {
    trace: RequestTrace,
    start: ChatStart,
    current: Option<ChatSpan>,
    rounds: u32,
}

impl RequestTrace {
    /// The upstream side of this request, every round's span with `start`'s attributes.
    pub fn upstream(&self, start: ChatStart) -> UpstreamTrace {
        UpstreamTrace {
            trace: self.clone(),
            start,
            current: None,
            rounds: 0,
        }
    }
}

impl UpstreamTrace {
    /// Opens the next round's span and names it in `headers`' `traceparent` (replacing the client's);
    /// `input`: what is sent, recorded only with `otel.capture_content`.
    pub fn round(&mut self, headers: &mut http::HeaderMap, input: Option<&[Value]>) {
        let span = self.trace.chat(&self.start, self.rounds, input);
        super::inject(span.context(), headers);
        self.rounds += 1;
        self.current = Some(span);
    }

    /// Whether message content may go into spans.
    pub fn captures_content(&self) -> bool {
        self.trace.captures_content()
    }

    /// Ends the open round's span with its answer (see [`ChatSpan::finish`]); `body_error`: the upstream's body
    /// broke or stalled.
    pub fn answered(&mut self, status: u16, answer: &Answer<'_>, body_error: bool) {
        if let Some(span) = self.current.take() {
            if body_error {
                let s = span.cx.span();
                s.set_attribute(KeyValue::new("error.type", "upstream_body"));
                s.set_status(Status::error(""));
            }
            span.finish(status, answer);
        }
    }

    /// Ends the open round's span with the error that kept the upstream from answering.
    pub fn failed(&mut self, e: &GatewayError) {
        if let Some(span) = self.current.take() {
            span.fail(e);
        }
    }

    /// Opens the span of a recall call answered between two rounds.
    pub fn tool(&self, name: &str, call_id: &str) -> ToolSpan {
        self.trace.tool(name, call_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dialect::AssembledReply;
    use opentelemetry_sdk::error::OTelSdkResult;
    use opentelemetry_sdk::trace::{SdkTracerProvider, SpanData, SpanExporter};
    use parking_lot::Mutex;
    use serde_json::json;

    #[derive(Debug, Clone, Default)]
    struct Collect(Arc<Mutex<Vec<SpanData>>>);

    impl SpanExporter for Collect {
        async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
            self.0.lock().extend(batch);
            Ok(())
        }
    }

    fn traced(capture: bool) -> (RequestTrace, Collect) {
        let spans = Collect::default();
        let provider = SdkTracerProvider::builder()
            .with_simple_exporter(spans.clone())
            .build();
        let t = Arc::new(Tracing::with_provider(provider, capture));
        let server = t.tracer.start("POST /v1/chat/completions");
        let cx = Context::new().with_span(server);
        (RequestTrace::new(t, cx), spans)
    }

    fn attr<'a>(s: &'a SpanData, key: &str) -> Option<&'a OtelValue> {
        s.attributes
            .iter()
            .find(|kv| kv.key.as_str() == key)
            .map(|kv| &kv.value)
    }

    fn named<'a>(spans: &'a [SpanData], name: &str) -> &'a SpanData {
        spans
            .iter()
            .find(|s| s.name == name)
            .unwrap_or_else(|| panic!("no span {name}"))
    }

    #[test]
    fn an_upstream_round_carries_the_gen_ai_attributes_and_no_content() {
        let (trace, spans) = traced(false);
        let planned = Planned {
            strategy: "hybrid",
            rewritten: true,
            stages: &["cleared_tool_results", "summarized"],
            tokens_before: Some(9000),
            tokens_after: Some(3000),
            window: 8000,
            recall_offered: true,
        };
        let start = ChatStart::new(
            "anthropic",
            "claude-x",
            Some("s-1"),
            "https://api.anthropic.com/v1/messages",
        )
        .upstream("claude")
        .planned(&planned);
        let mut up = trace.upstream(start);
        let mut headers = http::HeaderMap::new();
        up.round(
            &mut headers,
            Some(&[json!({"role": "user", "content": "SECRET prompt"})]),
        );
        let reply = AssembledReply {
            message: json!({"role": "assistant", "content": "SECRET answer"}),
            finish_reason: Some("end_turn".into()),
            usage: Some(json!({"input_tokens": 10, "cache_read_input_tokens": 90,
                               "cache_creation_input_tokens": 5, "output_tokens": 7})),
            id: Some("msg_1".into()),
            model: Some("claude-x-2026".into()),
            complete: true,
            ..AssembledReply::default()
        };
        up.answered(200, &reply.answer(None), false);
        let spans = spans.0.lock();
        let chat = named(&spans, "chat claude-x");
        assert_eq!(chat.span_kind, SpanKind::Client);
        assert_eq!(
            attr(chat, "ctxgate.upstream"),
            Some(&OtelValue::from("claude")),
            "the upstream's name"
        );
        let traceparent = headers["traceparent"]
            .to_str()
            .unwrap_or_default()
            .to_owned();
        assert_eq!(
            traceparent,
            format!(
                "00-{}-{}-01",
                chat.span_context.trace_id(),
                chat.span_context.span_id()
            )
        );
        let int = |k: &str| match attr(chat, k) {
            Some(OtelValue::I64(n)) => *n,
            other => panic!("{k}: {other:?}"),
        };
        assert_eq!(
            int("gen_ai.usage.input_tokens"),
            105,
            "cached and cache-creation tokens count as input"
        );
        assert_eq!(int("gen_ai.usage.output_tokens"), 7);
        assert_eq!(int("ctxgate.tokens.cached"), 90);
        assert_eq!(int("ctxgate.tokens.before"), 9000);
        assert_eq!(int("ctxgate.tokens.after"), 3000);
        assert_eq!(int("server.port"), 443);
        assert_eq!(int("ctxgate.round"), 0);
        assert_eq!(
            attr(chat, "gen_ai.provider.name")
                .map(|v| v.as_str().into_owned())
                .as_deref(),
            Some("anthropic")
        );
        assert_eq!(
            attr(chat, "gen_ai.response.model")
                .map(|v| v.as_str().into_owned())
                .as_deref(),
            Some("claude-x-2026")
        );
        assert_eq!(
            attr(chat, "gen_ai.conversation.id")
                .map(|v| v.as_str().into_owned())
                .as_deref(),
            Some("s-1")
        );
        assert_eq!(
            attr(chat, "gen_ai.response.finish_reasons"),
            Some(&OtelValue::Array(Array::String(vec!["end_turn".into()])))
        );
        assert_eq!(
            attr(chat, "ctxgate.stages"),
            Some(&OtelValue::Array(Array::String(vec![
                "cleared_tool_results".into(),
                "summarized".into()
            ])))
        );
        assert!(
            !format!("{:?}", *spans).contains("SECRET"),
            "no content without capture_content"
        );
    }

    #[test]
    fn capture_content_adds_the_messages() {
        let (trace, spans) = traced(true);
        let mut up = trace.upstream(ChatStart::new("openai", "m", None, "http://127.0.0.1:9/v1"));
        up.round(
            &mut http::HeaderMap::new(),
            Some(&[json!({"role": "user", "content": "SECRET prompt"})]),
        );
        let reply = AssembledReply {
            message: json!({"role": "assistant", "content": "SECRET answer"}),
            ..AssembledReply::default()
        };
        up.answered(200, &reply.answer(None), false);
        let spans = spans.0.lock();
        let chat = named(&spans, "chat m");
        let input = attr(chat, "gen_ai.input.messages")
            .map(|v| v.as_str().into_owned())
            .unwrap_or_default();
        let output = attr(chat, "gen_ai.output.messages")
            .map(|v| v.as_str().into_owned())
            .unwrap_or_default();
        assert!(
            input.contains("SECRET prompt") && output.contains("SECRET answer"),
            "{input} {output}"
        );
        assert!(attr(chat, "gen_ai.conversation.id").is_none());
    }

    #[test]
    fn failures_mark_their_spans_as_errors() {
        let (trace, spans) = traced(false);
        let mut up = trace.upstream(ChatStart::new("openai", "m", None, "http://127.0.0.1:9/v1"));
        up.round(&mut http::HeaderMap::new(), None);
        up.failed(&GatewayError::UpstreamTimeout(30));
        up.round(&mut http::HeaderMap::new(), None);
        up.answered(429, &AssembledReply::default().answer(None), false);
        trace.tool("recall_tool_call", "c1").finish("error");
        let spans = spans.0.lock();
        let errors: Vec<String> = spans
            .iter()
            .map(|s| {
                assert!(matches!(s.status, Status::Error { .. }), "{}", s.name);
                attr(s, "error.type")
                    .map(|v| v.as_str().into_owned())
                    .unwrap_or_default()
            })
            .collect();
        assert_eq!(errors, ["upstream_timeout", "429", "tool_error"]);
    }

    #[test]
    fn a_summary_job_is_a_trace_of_its_own_linked_to_the_plan() {
        let (trace, spans) = traced(false);
        let plan = trace.plan();
        let job = plan.trace().job();
        plan.finish(&Planned {
            strategy: "summarize",
            rewritten: false,
            stages: &[],
            tokens_before: Some(100),
            tokens_after: Some(100),
            window: 8000,
            recall_offered: false,
        });
        job.summary("s-1", "gpt-mini", 12, true).finish("timeout");
        let spans = spans.0.lock();
        let plan = named(&spans, "ctxgate.plan");
        let summary = named(&spans, "ctxgate.summary");
        assert_ne!(
            summary.span_context.trace_id(),
            plan.span_context.trace_id()
        );
        assert_eq!(
            summary.parent_span_id,
            opentelemetry::trace::SpanId::INVALID
        );
        let link = &summary.links.links[0];
        assert_eq!(link.span_context.span_id(), plan.span_context.span_id());
        assert_eq!(link.span_context.trace_id(), plan.span_context.trace_id());
        assert!(matches!(summary.status, Status::Error { .. }));
        assert!(
            attr(plan, "ctxgate.stages").is_none(),
            "stages only on rewritten requests"
        );
    }
}
