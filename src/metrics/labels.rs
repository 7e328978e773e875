//! Label values: every label of every metric takes its values from one of these enums (or from the model
//! allowlist), so no request can create a new series.

/// Defines a label enum with its values, `ALL` (in declaration order) and `as_str`.
macro_rules! label_enum {
    ($(#[$meta:meta])* pub enum $name:ident { $($(#[$vmeta:meta])* $variant:ident => $value:literal),+ $(,)? }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name {
            $($(#[$vmeta])* $variant),+
        }

        impl $name {
            /// Every value, in declaration order (the order of pre-resolved series).
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            /// The label value as exported.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $value),+
                }
            }

            /// Position in `ALL`.
            pub const fn idx(self) -> usize {
                self as usize
            }
        }
    };
}

label_enum! {
    /// Which kind of endpoint served a request (`route`).
    pub enum Route {
        /// `POST /v1/chat/completions`.
        Chat => "chat",
        /// Any other `/v1/*` request, relayed untouched.
        Passthrough => "passthrough",
        /// `/admin/*`.
        Admin => "admin",
    }
}

label_enum! {
    /// The wire format a request was handled in (`dialect`): the conversation dialects by their names
    /// (`crate::dialect::Dialect::as_str`, which converts into this), `none` for requests outside any dialect
    /// (passthrough, admin, `/metrics`).
    pub enum DialectLabel {
        /// OpenAI chat completions.
        Chat => "chat",
        /// Anthropic Messages.
        Anthropic => "anthropic",
        /// OpenAI Responses.
        Responses => "responses",
        /// The Gemini API.
        Gemini => "gemini",
        /// No dialect: the request was not handled as a conversation.
        NoDialect => "none",
    }
}

label_enum! {
    /// Why ctxgate refused a request before handling it (`reason`).
    pub enum RejectReason {
        /// Beyond `server.max_in_flight`: 503 with `retry-after`.
        Overloaded => "overloaded",
        /// The body did not arrive within `server.body_read_timeout_secs`: 408.
        BodyTimeout => "body_timeout",
        /// More elements than `server.max_messages`, or more memory than `server.request_memory_bytes` could
        /// ever give: 413.
        TooLarge => "too_large",
        /// The memory for requests in flight (`server.request_memory_bytes`) is spent: 503 with `retry-after`.
        Memory => "memory",
    }
}

label_enum! {
    /// Why ctxgate passed a conversation request through without managing it (`reason`): its history is kept by
    /// the upstream, out of ctxgate's sight, or it asks the upstream for a compaction that must not be rewritten.
    pub enum UnmanagedReason {
        /// A Responses request continuing a stored response (`previous_response_id`).
        PreviousResponseId => "previous_response_id",
        /// A Responses request in a stored conversation (`conversation`).
        Conversation => "conversation",
        /// Codex's remote compaction: a `compaction_trigger` input item.
        CompactionTrigger => "compaction_trigger",
    }
}

label_enum! {
    /// What became of one attempt to deliver a webhook (`outcome`).
    pub enum HookOutcome {
        /// The receiver answered 2xx.
        Delivered => "delivered",
        /// It failed for a reason worth retrying (connection, timeout, 5xx, 429): tried again later.
        Retried => "retried",
        /// The receiver refused it (4xx but 429): not tried again for this idle period.
        Failed => "failed",
    }
}

label_enum! {
    /// How a config reload ended (`outcome`).
    pub enum ReloadOutcome {
        /// The new config is in force.
        Applied => "applied",
        /// The file had problems: the running config was kept.
        Rejected => "rejected",
    }
}

label_enum! {
    /// An HTTP status class (`status`).
    pub enum StatusClass {
        /// 1xx.
        Informational => "1xx",
        /// 2xx.
        Success => "2xx",
        /// 3xx.
        Redirection => "3xx",
        /// 4xx.
        ClientError => "4xx",
        /// 5xx (and anything above).
        ServerError => "5xx",
    }
}

impl StatusClass {
    /// The class of a status code.
    pub const fn of(status: u16) -> StatusClass {
        match status {
            0..=199 => StatusClass::Informational,
            200..=299 => StatusClass::Success,
            300..=399 => StatusClass::Redirection,
            400..=499 => StatusClass::ClientError,
            _ => StatusClass::ServerError,
        }
    }
}

label_enum! {
    /// The rewrite strategy in force (`strategy`).
    pub enum RewriteStrategy {
        /// Never rewrite.
        Off => "off",
        /// Clearing, pruning, hard limit.
        Prune => "prune",
        /// Summary, hard limit.
        Summarize => "summarize",
        /// Clearing, summary, hard limit.
        Hybrid => "hybrid",
    }
}

impl RewriteStrategy {
    /// From a strategy's config name; `None` for an unknown name.
    pub fn parse(name: &str) -> Option<RewriteStrategy> {
        RewriteStrategy::ALL
            .iter()
            .copied()
            .find(|s| s.as_str() == name)
    }
}

label_enum! {
    /// What a rewrite came to (`outcome`): the deepest stage it needed, or `rejected` when even the hard limit
    /// could not make the request fit.
    pub enum RewriteOutcome {
        /// Old tool results replaced by placeholders.
        Cleared => "cleared",
        /// Past run loops cut down or dropped.
        Pruned => "pruned",
        /// Older history replaced by an LLM summary.
        Summarized => "summarized",
        /// Whole old messages dropped by the hard limit.
        Truncated => "truncated",
        /// Refused with `context_length_exceeded`.
        Rejected => "rejected",
    }
}

impl RewriteOutcome {
    /// The deepest of a compression record's stages (`cleared` < `pruned` < `summarized` < `truncated`; steps
    /// `folded` inside a run count as `pruned`); `None` when no stage is known.
    pub fn deepest<'a>(stages: impl IntoIterator<Item = &'a str>) -> Option<RewriteOutcome> {
        stages
            .into_iter()
            .map(|s| if s == "folded" { "pruned" } else { s })
            .filter_map(|s| {
                [
                    RewriteOutcome::Cleared,
                    RewriteOutcome::Pruned,
                    RewriteOutcome::Summarized,
                    RewriteOutcome::Truncated,
                ]
                .into_iter()
                .find(|o| o.as_str() == s)
            })
            .max_by_key(|o| o.idx())
    }
}

label_enum! {
    /// How a summary call ended (`outcome`).
    pub enum SummaryOutcome {
        /// A usable summary came back.
        Ok => "ok",
        /// The request failed (network, non-2xx, unparsable answer).
        Failed => "failed",
        /// No answer within `summary.timeout_secs`.
        Timeout => "timeout",
        /// The answer was empty or too long to use.
        Empty => "empty",
    }
}

label_enum! {
    /// Which injected tool the model called (`tool`).
    pub enum RecallTool {
        /// `[recall] tool_name`: one pruned tool result by call id.
        Recall => "recall",
        /// `[recall] search_tool_name`: keyword search over the session's history.
        Search => "search",
    }
}

label_enum! {
    /// How ctxgate answered an injected call (`outcome`).
    pub enum RecallOutcome {
        /// The result (or at least one search match) was returned.
        Found => "found",
        /// No such call id, or no match.
        NotFound => "not_found",
        /// Bad arguments or an unknown tool.
        Error => "error",
    }
}

label_enum! {
    /// A session cache lookup's result (`result`).
    pub enum CacheResult {
        /// The session was in memory.
        Hit => "hit",
        /// It had to be loaded from the store (or did not exist).
        Miss => "miss",
    }
}

label_enum! {
    /// A durable store backend (`backend`).
    pub enum StoreBackend {
        /// Embedded SQLite.
        Sqlite => "sqlite",
        /// Process memory.
        Memory => "memory",
        /// Redis (shared by several instances).
        Redis => "redis",
    }
}

label_enum! {
    /// A store operation (`operation`).
    pub enum StoreOp {
        /// Committing queued writes (SQLite: one group commit).
        Write => "write",
        /// Loading one session.
        Load => "load",
        /// Listing sessions (admin API).
        List => "list",
        /// Deleting one session.
        Delete => "delete",
        /// Purging idle sessions.
        Purge => "purge",
        /// A health check: `/readyz`'s ping, or the circuit breaker's probe while the store is considered down.
        Probe => "probe",
    }
}

label_enum! {
    /// Why the upstream failed a request (`class`).
    pub enum UpstreamErrorClass {
        /// It answered 4xx.
        ClientError => "4xx",
        /// It answered 5xx.
        ServerError => "5xx",
        /// No connection, or the connection broke before response headers.
        Unreachable => "unreachable",
        /// No response headers within `upstream.timeout_secs`.
        Timeout => "timeout",
        /// The response body failed or stalled after it had started.
        Interrupted => "interrupted",
    }
}

label_enum! {
    /// How an upstream answered a conversation request (`outcome` of `ctxgate_upstream_requests_total`).
    pub enum UpstreamOutcome {
        /// It answered with a status below 400.
        Answered => "answered",
        /// It answered 4xx.
        ClientError => "4xx",
        /// It answered 5xx.
        ServerError => "5xx",
        /// No connection, or the connection broke before response headers.
        Unreachable => "unreachable",
        /// No response headers within the upstream's timeout.
        Timeout => "timeout",
    }
}

label_enum! {
    /// Why a turn missed the provider's prompt cache (`cause` of `ctxgate_cache_miss_tokens_total`), in the order
    /// the causes are decided.
    pub enum CacheMissCause {
        /// The time since the session's previous turn passed the model's `cache_ttl`.
        Gap => "gap",
        /// The turn went to another model than the previous one.
        Model => "model",
        /// The client's tools changed.
        Tools => "tools",
        /// ctxgate's rewrite of the prefix changed (a re-cut, the recall tools offered or withdrawn).
        Recut => "recut",
        /// The client changed or dropped an earlier message, or its system prompt.
        Client => "client",
    }
}

impl CacheMissCause {
    /// The cause named `s`.
    pub fn parse(s: &str) -> Option<CacheMissCause> {
        CacheMissCause::ALL
            .iter()
            .copied()
            .find(|c| c.as_str() == s)
    }
}

impl UpstreamOutcome {
    /// The outcome of an answer with `status`.
    pub const fn of_status(status: u16) -> UpstreamOutcome {
        match status {
            400..=499 => UpstreamOutcome::ClientError,
            500.. => UpstreamOutcome::ServerError,
            _ => UpstreamOutcome::Answered,
        }
    }
}

impl UpstreamErrorClass {
    /// The class of an upstream answer's status; `None` when it is not an error.
    pub const fn of_status(status: u16) -> Option<UpstreamErrorClass> {
        match status {
            400..=499 => Some(UpstreamErrorClass::ClientError),
            500.. => Some(UpstreamErrorClass::ServerError),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_lists_every_value_in_index_order() {
        for (i, r) in Route::ALL.iter().enumerate() {
            assert_eq!(r.idx(), i);
        }
        for (i, o) in UpstreamErrorClass::ALL.iter().enumerate() {
            assert_eq!(o.idx(), i);
        }
        for (i, d) in DialectLabel::ALL.iter().enumerate() {
            assert_eq!(d.idx(), i);
        }
        assert_eq!(RewriteOutcome::ALL.len(), 5);
    }

    #[test]
    fn status_classes() {
        assert_eq!(StatusClass::of(200), StatusClass::Success);
        assert_eq!(StatusClass::of(204), StatusClass::Success);
        assert_eq!(StatusClass::of(301), StatusClass::Redirection);
        assert_eq!(StatusClass::of(429), StatusClass::ClientError);
        assert_eq!(StatusClass::of(503), StatusClass::ServerError);
        assert_eq!(StatusClass::of(999), StatusClass::ServerError);
        assert_eq!(UpstreamErrorClass::of_status(200), None);
        assert_eq!(
            UpstreamErrorClass::of_status(429),
            Some(UpstreamErrorClass::ClientError)
        );
        assert_eq!(
            UpstreamErrorClass::of_status(502),
            Some(UpstreamErrorClass::ServerError)
        );
    }

    #[test]
    fn deepest_stage_wins() {
        assert_eq!(
            RewriteOutcome::deepest(["cleared"]),
            Some(RewriteOutcome::Cleared)
        );
        assert_eq!(
            RewriteOutcome::deepest(["cleared", "folded"]),
            Some(RewriteOutcome::Pruned)
        );
        assert_eq!(
            RewriteOutcome::deepest(["truncated", "cleared", "pruned"]),
            Some(RewriteOutcome::Truncated)
        );
        assert_eq!(
            RewriteOutcome::deepest(["cleared", "summarized"]),
            Some(RewriteOutcome::Summarized)
        );
        assert_eq!(RewriteOutcome::deepest(["bogus"]), None);
        assert_eq!(RewriteOutcome::deepest([]), None);
        assert_eq!(
            RewriteStrategy::parse("hybrid"),
            Some(RewriteStrategy::Hybrid)
        );
        assert_eq!(RewriteStrategy::parse("nope"), None);
    }
}
