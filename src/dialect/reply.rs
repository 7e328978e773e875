//! What the upstream answered, reduced to the assistant message (in the dialect's own shape) and its metadata:
//! what every dialect's assembler produces and the pipeline records.

use serde_json::Value;

/// Adds the numbers of usage object `b` into `a`, nested objects too (`prompt_tokens_details`,
/// `server_tool_use`); a field `a` lacks, or holds as `null`, is taken from `b`; other values keep their first form.
pub fn add_numbers(a: &mut Value, b: &Value) {
    match (a, b) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, bv) in b {
                match a.get_mut(k) {
                    Some(av) => add_numbers(av, bv),
                    None => {
                        a.insert(k.clone(), bv.clone());
                    }
                }
            }
        }
        (a @ Value::Null, b) => *a = b.clone(),
        (a @ Value::Number(_), Value::Number(bn)) => {
            if let (Some(x), Some(y)) = (a.as_u64(), bn.as_u64()) {
                *a = Value::from(x + y);
            }
        }
        _ => {}
    }
}

/// A final answer after recall rounds with the rounds' totals: `usage` (when given) and the first round's `id`
/// (the one the client first saw).
pub fn with_round_totals(
    mut answer: Value,
    usage: Option<Value>,
    first_id: Option<Value>,
) -> Value {
    if let Some(o) = answer.as_object_mut() {
        if let Some(id) = first_id {
            o.insert("id".into(), id);
        }
        if let Some(u) = usage {
            o.insert("usage".into(), u);
        }
    }
    answer
}

/// Largest message an assembler builds (16 MiB of text); a bigger reply is relayed but not assembled.
pub const MAX_ASSEMBLED_BYTES: usize = 16 * 1024 * 1024;

/// What the upstream answered, reduced to the assistant message and its metadata.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct AssembledReply {
    /// The assistant message as an OpenAI message object (`role`, `content`, and `tool_calls`/`refusal` when any).
    pub message: Value,
    /// `finish_reason` of the first choice.
    pub finish_reason: Option<String>,
    /// The `usage` object, when the upstream sent one.
    pub usage: Option<Value>,
    /// The completion's `id`.
    pub id: Option<String>,
    /// The `model` the upstream reported.
    pub model: Option<String>,
    /// An `error` object sent by the upstream (inside a 200 stream, or as an error body).
    pub error: Option<Value>,
    /// The reply ended properly: `[DONE]` or a `finish_reason` was seen and no error event, or a whole JSON body
    /// was parsed.
    pub complete: bool,
    /// Number of `data:` events that carried a chunk.
    pub chunks: usize,
    /// The `usage` of every upstream answer behind this reply, in order, when recall rounds made it of several
    /// (`usage` is then what the client is told); empty when the reply is one upstream answer.
    pub round_usage: Vec<Value>,
}

/// The prompt tokens a `usage` object reports: `prompt_tokens` (chat) or Gemini's `promptTokenCount`, else
/// `input_tokens` plus Anthropic's `cache_read_input_tokens` and `cache_creation_input_tokens` (Responses'
/// `input_tokens` already holds its cached tokens).
pub fn usage_prompt_tokens(u: &Value) -> Option<u64> {
    if let Some(n) = u.get("prompt_tokens").or_else(|| u.get("promptTokenCount")) {
        return n.as_u64();
    }
    let parts = [
        "input_tokens",
        "cache_read_input_tokens",
        "cache_creation_input_tokens",
    ]
    .map(|k| u.get(k).and_then(Value::as_u64));
    parts
        .iter()
        .any(Option::is_some)
        .then(|| parts.iter().flatten().sum())
}

/// The prompt tokens a `usage` object reports as read from the provider's prompt cache: chat
/// `prompt_tokens_details.cached_tokens`, Responses `input_tokens_details.cached_tokens`, Anthropic
/// `cache_read_input_tokens`, Gemini `cachedContentTokenCount`.
pub fn usage_cached_tokens(u: &Value) -> Option<u64> {
    // `get` twice rather than `Value::pointer`, which allocates two strings per path segment (~1,700
    // instructions a call, 3 % of a small chat's under callgrind).
    let details = |k: &str| u.get(k).and_then(|d| d.get("cached_tokens"));
    details("prompt_tokens_details")
        .or_else(|| details("input_tokens_details"))
        .or_else(|| u.get("cache_read_input_tokens"))
        .or_else(|| u.get("cachedContentTokenCount"))
        .and_then(Value::as_u64)
}

/// The prompt tokens a `usage` object reports as written to the provider's prompt cache: Anthropic's
/// `cache_creation_input_tokens` (OpenAI's APIs report none).
pub fn usage_cache_write_tokens(u: &Value) -> Option<u64> {
    u.get("cache_creation_input_tokens").and_then(Value::as_u64)
}

/// The output tokens a `usage` object reports: `completion_tokens` (chat), `output_tokens` (Anthropic, Responses),
/// or Gemini's `candidatesTokenCount` plus `thoughtsTokenCount` (thoughts are billed as output).
pub fn usage_output_tokens(u: &Value) -> Option<u64> {
    if let Some(n) = u
        .get("completion_tokens")
        .or_else(|| u.get("output_tokens"))
    {
        return n.as_u64();
    }
    let parts =
        ["candidatesTokenCount", "thoughtsTokenCount"].map(|k| u.get(k).and_then(Value::as_u64));
    parts
        .iter()
        .any(Option::is_some)
        .then(|| parts.iter().flatten().sum())
}

/// What one `usage` object reports, read in one pass over its fields (each `Value::get` hashes its key; a usage
/// object has a handful of fields): the figures of [`usage_prompt_tokens`], [`usage_cached_tokens`],
/// [`usage_cache_write_tokens`] and the output tokens.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct UsageFigures {
    /// Prompt tokens, cached ones included.
    pub prompt: Option<u64>,
    /// Of them, read from the provider's prompt cache.
    pub cached: Option<u64>,
    /// Of them, written to the provider's prompt cache.
    pub cache_write: Option<u64>,
    /// Output tokens.
    pub output: Option<u64>,
}

impl UsageFigures {
    /// The figures of `u` (none when it is no object).
    pub fn of(u: &Value) -> UsageFigures {
        let Some(fields) = u.as_object() else {
            return UsageFigures::default();
        };
        let (mut prompt, mut input, mut read, mut write) = (None, None, None, None);
        let (mut details, mut input_details, mut completion, mut output) = (None, None, None, None);
        // Gemini's `usageMetadata`: its prompt count holds the cached tokens; thoughts are billed as output.
        let (mut gemini_cached, mut candidates, mut thoughts) = (None, None, None);
        for (k, v) in fields {
            match k.as_str() {
                "promptTokenCount" => prompt = Some(v.as_u64()),
                "cachedContentTokenCount" => gemini_cached = v.as_u64(),
                "candidatesTokenCount" => candidates = v.as_u64(),
                "thoughtsTokenCount" => thoughts = v.as_u64(),
                "prompt_tokens" => prompt = Some(v.as_u64()),
                "input_tokens" => input = v.as_u64(),
                "cache_read_input_tokens" => read = v.as_u64(),
                "cache_creation_input_tokens" => write = v.as_u64(),
                "prompt_tokens_details" => details = v.get("cached_tokens"),
                "input_tokens_details" => input_details = v.get("cached_tokens"),
                "completion_tokens" => completion = Some(v),
                "output_tokens" => output = Some(v),
                _ => {}
            }
        }
        let prompt = match prompt {
            Some(p) => p,
            None => (input.is_some() || read.is_some() || write.is_some())
                .then(|| input.unwrap_or(0) + read.unwrap_or(0) + write.unwrap_or(0)),
        };
        UsageFigures {
            prompt,
            cached: details
                .or(input_details)
                .and_then(Value::as_u64)
                .or_else(|| {
                    if details.or(input_details).is_some() {
                        None
                    } else {
                        read.or(gemini_cached)
                    }
                }),
            cache_write: write,
            output: completion.or(output).and_then(Value::as_u64).or_else(|| {
                (candidates.is_some() || thoughts.is_some())
                    .then(|| candidates.unwrap_or(0) + thoughts.unwrap_or(0))
            }),
        }
    }

    /// Each figure summed over `rounds`; `None` where no round reported it.
    fn sum<'a>(rounds: impl Iterator<Item = &'a Value>) -> UsageFigures {
        let add = |a: Option<u64>, b: Option<u64>| match (a, b) {
            (Some(a), Some(b)) => Some(a + b),
            (a, b) => a.or(b),
        };
        rounds
            .map(UsageFigures::of)
            .fold(UsageFigures::default(), |t, f| UsageFigures {
                prompt: add(t.prompt, f.prompt),
                cached: add(t.cached, f.cached),
                cache_write: add(t.cache_write, f.cache_write),
                output: add(t.output, f.output),
            })
    }
}

impl AssembledReply {
    /// What the answer tells its trace span: `usage` this round's usage (the reply's own when `None`).
    pub fn answer<'a>(&'a self, usage: Option<&'a Value>) -> crate::otel::spans::Answer<'a> {
        let usage = usage.or(self.usage.as_ref());
        crate::otel::spans::Answer {
            model: self.model.as_deref(),
            id: self.id.as_deref(),
            finish_reason: self.finish_reason.as_deref(),
            input_tokens: usage.and_then(usage_prompt_tokens),
            output_tokens: usage.and_then(usage_output_tokens),
            cached_tokens: usage.and_then(usage_cached_tokens),
            message: (!self.is_empty()).then_some(&self.message),
            error: self.error.as_ref().map(|e| {
                e.get("type")
                    .and_then(Value::as_str)
                    .unwrap_or("upstream_error")
            }),
        }
    }

    /// `usage.prompt_tokens`, when reported; else Anthropic's whole prompt: `input_tokens` plus
    /// `cache_read_input_tokens` and `cache_creation_input_tokens`.
    pub fn prompt_tokens(&self) -> Option<u64> {
        UsageFigures::of(self.usage.as_ref()?).prompt
    }

    /// The prompt tokens of every upstream request behind the reply (each recall round's), as the upstream
    /// reported them ([`usage_prompt_tokens`]); `None` when it reported none.
    pub fn upstream_prompt_tokens(&self) -> Option<u64> {
        self.upstream_sum(usage_prompt_tokens)
    }

    /// Every figure of [`Self::upstream_prompt_tokens`], [`Self::upstream_cached_tokens`],
    /// [`Self::upstream_cache_write_tokens`] and [`Self::upstream_completion_tokens`] in one pass.
    pub fn upstream_figures(&self) -> UsageFigures {
        if self.round_usage.is_empty() {
            return self
                .usage
                .as_ref()
                .map(UsageFigures::of)
                .unwrap_or_default();
        }
        UsageFigures::sum(self.round_usage.iter())
    }

    /// Of [`Self::upstream_prompt_tokens`], those read from the provider's prompt cache
    /// ([`usage_cached_tokens`]); `None` when the upstream reported none.
    pub fn upstream_cached_tokens(&self) -> Option<u64> {
        self.upstream_sum(usage_cached_tokens)
    }

    /// Of [`Self::upstream_prompt_tokens`], those written to the provider's prompt cache
    /// ([`usage_cache_write_tokens`]); `None` when the upstream reported none.
    pub fn upstream_cache_write_tokens(&self) -> Option<u64> {
        self.upstream_sum(usage_cache_write_tokens)
    }

    /// The output tokens of every upstream answer behind the reply (each recall round's); `None` when the
    /// upstream reported none.
    pub fn upstream_completion_tokens(&self) -> Option<u64> {
        self.upstream_sum(usage_output_tokens)
    }

    fn upstream_sum(&self, of: fn(&Value) -> Option<u64>) -> Option<u64> {
        if self.round_usage.is_empty() {
            return self.usage.as_ref().and_then(of);
        }
        let counts: Vec<u64> = self.round_usage.iter().filter_map(of).collect();
        (!counts.is_empty()).then(|| counts.iter().sum())
    }

    /// The message says nothing: no text, no tool or function call, no refusal, no Gemini part (e.g. a bare `[DONE]`).
    pub fn is_empty(&self) -> bool {
        let Some(m) = self.message.as_object() else {
            return true;
        };
        let said = |k: &str| match m.get(k) {
            None | Some(Value::Null) => false,
            Some(Value::String(s)) => !s.is_empty(),
            Some(Value::Array(a)) => !a.is_empty(),
            Some(_) => true,
        };
        ![
            "content",
            "tool_calls",
            "function_call",
            "refusal",
            "audio",
            "output",
            "parts",
        ]
        .into_iter()
        .any(said)
    }

    /// The reply's output tokens, when reported ([`usage_output_tokens`]).
    pub fn completion_tokens(&self) -> Option<u64> {
        usage_output_tokens(self.usage.as_ref()?)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// The one-pass reading agrees with the functions reading one figure each, on every dialect's usage shapes
    /// and on odd ones (a figure that is no number, details without a count, no object at all).
    #[test]
    fn usage_figures_agree_with_each_figure_read_alone() {
        let shapes = [
            json!({"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13}),
            json!({"prompt_tokens": 10, "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 4}}),
            json!({"input_tokens": 7, "output_tokens": 2, "input_tokens_details": {"cached_tokens": 5}}),
            json!({"input_tokens": 7, "cache_read_input_tokens": 100, "cache_creation_input_tokens": 20, "output_tokens": 9}),
            json!({"cache_read_input_tokens": 100}),
            json!({"prompt_tokens": "ten", "completion_tokens": null}),
            json!({"prompt_tokens_details": {}, "cache_read_input_tokens": 6}),
            json!({"prompt_tokens_details": {"cached_tokens": "x"}, "cache_read_input_tokens": 6}),
            json!({"completion_tokens": "x", "output_tokens": 5}),
            json!({"promptTokenCount": 12, "candidatesTokenCount": 4, "thoughtsTokenCount": 6, "totalTokenCount": 22}),
            json!({"promptTokenCount": 12, "cachedContentTokenCount": 8, "candidatesTokenCount": 1}),
            json!({"promptTokenCount": 3}),
            json!({}),
            json!([1, 2]),
            json!(null),
        ];
        for u in &shapes {
            let alone = UsageFigures {
                prompt: usage_prompt_tokens(u),
                cached: usage_cached_tokens(u),
                cache_write: usage_cache_write_tokens(u),
                output: usage_output_tokens(u),
            };
            assert_eq!(UsageFigures::of(u), alone, "{u}");
        }
        let reply = AssembledReply {
            round_usage: shapes.to_vec(),
            ..AssembledReply::default()
        };
        let summed = reply.upstream_figures();
        assert_eq!(summed.prompt, reply.upstream_prompt_tokens());
        assert_eq!(summed.cached, reply.upstream_cached_tokens());
        assert_eq!(summed.cache_write, reply.upstream_cache_write_tokens());
        assert_eq!(summed.output, reply.upstream_completion_tokens());
    }
    use serde_json::json;

    #[test]
    fn prompt_and_cached_tokens_of_each_dialects_usage() {
        let chat = json!({"prompt_tokens": 1000, "completion_tokens": 5,
                          "prompt_tokens_details": {"cached_tokens": 800}});
        let anthropic = json!({"input_tokens": 100, "cache_creation_input_tokens": 200,
                               "cache_read_input_tokens": 700, "output_tokens": 9});
        let responses = json!({"input_tokens": 1000, "input_tokens_details": {"cached_tokens": 900},
                               "output_tokens": 9});
        for (u, prompt, cached) in [
            (&chat, 1000, 800),
            (&anthropic, 1000, 700),
            (&responses, 1000, 900),
        ] {
            assert_eq!(usage_prompt_tokens(u), Some(prompt), "{u}");
            assert_eq!(usage_cached_tokens(u), Some(cached), "{u}");
        }
        let bare = json!({"prompt_tokens": 10, "completion_tokens": 5});
        assert_eq!(usage_cached_tokens(&bare), None);
        assert_eq!(
            usage_cached_tokens(&json!({"cache_read_input_tokens": "many"})),
            None
        );
    }

    #[test]
    fn the_upstream_counts_sum_every_round_when_there_were_several() {
        let round =
            |input: u64, read: u64| json!({"input_tokens": input, "cache_read_input_tokens": read});
        // The client is told the last round's prompt figures; the upstream was sent both rounds.
        let mut reply = AssembledReply {
            usage: Some(round(80, 3000)),
            ..Default::default()
        };
        assert_eq!(reply.upstream_prompt_tokens(), Some(3080));
        assert_eq!(reply.upstream_cached_tokens(), Some(3000));
        reply.round_usage = vec![round(50, 2000), round(80, 3000)];
        assert_eq!(reply.upstream_prompt_tokens(), Some(5130));
        assert_eq!(reply.upstream_cached_tokens(), Some(5000));
        assert_eq!(reply.prompt_tokens(), Some(3080));
        // Rounds that reported nothing count nothing.
        reply.round_usage = vec![json!({}), json!({"output_tokens": 3})];
        assert_eq!(reply.upstream_prompt_tokens(), None);
        assert_eq!(reply.upstream_cached_tokens(), None);
    }
}
