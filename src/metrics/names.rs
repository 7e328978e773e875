//! Every exported metric's name, in one place (the dashboards and alert rules in `dashboards/` use these).
//! Prometheus conventions: `ctxgate_` prefix, base units in the name (seconds, bytes), `_total` for counters.

/// Counter: finished requests by `route`, `status` class and `stream` flag.
pub const REQUESTS_TOTAL: &str = "ctxgate_requests_total";
/// Gauge: requests being handled (streams included until their last byte), by `route`.
pub const REQUESTS_IN_FLIGHT: &str = "ctxgate_requests_in_flight";
/// Gauge: responses being streamed (SSE) to clients right now.
pub const ACTIVE_STREAMS: &str = "ctxgate_active_streams";
/// Counter: requests ctxgate refused before handling them, by `route` and `reason` (overloaded: beyond
/// `server.max_in_flight`, answered 503; body_timeout: body not received within `server.body_read_timeout_secs`,
/// answered 408; too_large: more elements than `server.max_messages` or more memory than `server.request_memory_bytes`,
/// answered 413; memory: `server.request_memory_bytes` held by requests in flight, answered 503). They are counted
/// in `ctxgate_requests_total` too.
pub const REQUESTS_REJECTED_TOTAL: &str = "ctxgate_requests_rejected_total";
/// Counter: conversation requests passed through without being managed, by `dialect` and `reason`
/// (previous_response_id, conversation, compaction_trigger). They are counted in `ctxgate_requests_total` too.
pub const UNMANAGED_REQUESTS_TOTAL: &str = "ctxgate_unmanaged_requests_total";
/// Histogram: request arrival to the end of the response, by `route`.
pub const REQUEST_DURATION_SECONDS: &str = "ctxgate_request_duration_seconds";
/// Histogram: time spent waiting on the upstream (sending to its last byte), by `route`.
pub const UPSTREAM_DURATION_SECONDS: &str = "ctxgate_upstream_duration_seconds";
/// Histogram: time ctxgate itself added (total minus upstream), by `route`.
pub const OVERHEAD_SECONDS: &str = "ctxgate_overhead_seconds";
/// Histogram: request arrival to the first upstream byte of a streamed chat answer.
pub const STREAM_FIRST_BYTE_SECONDS: &str = "ctxgate_stream_first_byte_seconds";
/// Counter: prompt tokens of the chat requests clients sent, by `model`.
pub const CLIENT_PROMPT_TOKENS_TOTAL: &str = "ctxgate_client_prompt_tokens_total";
/// Counter: prompt tokens sent upstream (as the upstream reported them), by `model`.
pub const UPSTREAM_PROMPT_TOKENS_TOTAL: &str = "ctxgate_upstream_prompt_tokens_total";
/// Counter: prompt tokens the upstream reported as read from its prompt cache, by `model` and `dialect` (of
/// `ctxgate_upstream_prompt_tokens_total`: their ratio is the prompt cache hit ratio).
pub const UPSTREAM_CACHED_TOKENS_TOTAL: &str = "ctxgate_upstream_cached_tokens_total";
/// Counter: completion tokens the upstream reported, by `model`.
pub const UPSTREAM_COMPLETION_TOKENS_TOTAL: &str = "ctxgate_upstream_completion_tokens_total";
/// Counter: prompt tokens removed by rewriting, by `model`.
pub const SAVED_TOKENS_TOTAL: &str = "ctxgate_saved_tokens_total";
/// Counter: US dollars the upstream's answers cost, by `model` and `dialect`: the usage each reported (every recall
/// round's) at the model's `[models] price` (uncached input, cache reads, cache writes, output). Unpriced models
/// add nothing.
pub const SPEND_DOLLARS_TOTAL: &str = "ctxgate_spend_dollars_total";
/// Counter: US dollars rewriting saved, by `model` and `dialect`: the prompt tokens a rewrite removed
/// (`ctxgate_saved_tokens_total`'s figure) at the turn's input price per token (its input spend over its prompt
/// tokens, so the cached share the provider reported applies). See docs/how-it-works.md, "Money".
pub const SAVED_DOLLARS_TOTAL: &str = "ctxgate_saved_dollars_total";
/// Counter: prompt tokens of turns that missed the provider's prompt cache, by `model`, `dialect` and `cause`
/// (`gap`, `model`, `tools`, `recut`, `client`): the uncached prompt tokens the provider reported for the turn
/// (its first upstream round), else the estimate of those sent from the first difference with the session's
/// previous turn on. See docs/how-it-works.md, "Why a turn missed the cache".
pub const CACHE_MISS_TOKENS_TOTAL: &str = "ctxgate_cache_miss_tokens_total";
/// Gauge: calibration of the token estimate (upstream count / estimate), by `model`.
pub const TOKEN_ESTIMATE_RATIO: &str = "ctxgate_token_estimate_ratio";
/// Counter: rewrites by `strategy` and `outcome`.
pub const REWRITES_TOTAL: &str = "ctxgate_rewrites_total";
/// Counter: summary calls by `outcome`.
pub const SUMMARIZER_CALLS_TOTAL: &str = "ctxgate_summarizer_calls_total";
/// Histogram: duration of summary calls.
pub const SUMMARIZER_CALL_DURATION_SECONDS: &str = "ctxgate_summarizer_call_duration_seconds";
/// Counter: background pre-compactions started.
pub const PRECOMPACTIONS_STARTED_TOTAL: &str = "ctxgate_precompactions_started_total";
/// Counter: background pre-compactions finished (whatever their outcome).
pub const PRECOMPACTIONS_FINISHED_TOTAL: &str = "ctxgate_precompactions_finished_total";
/// Counter: injected recall/search calls answered, by `tool` and `outcome`.
pub const RECALL_CALLS_TOTAL: &str = "ctxgate_recall_calls_total";
/// Counter: extra upstream round trips made to answer recall/search calls.
pub const RECALL_ROUNDS_TOTAL: &str = "ctxgate_recall_rounds_total";
/// Gauge: sessions in the in-memory cache.
pub const SESSIONS_CACHED: &str = "ctxgate_sessions_cached";
/// Gauge: bytes of memory the sessions in the in-memory cache hold (its weigher's figure).
pub const SESSION_CACHE_BYTES: &str = "ctxgate_session_cache_bytes";
/// Counter: session cache lookups by `result` (hit, miss).
pub const SESSION_CACHE_LOOKUPS_TOTAL: &str = "ctxgate_session_cache_lookups_total";
/// Histogram: store operation latency by `backend` and `operation`.
pub const STORE_OPERATION_DURATION_SECONDS: &str = "ctxgate_store_operation_duration_seconds";
/// Counter: failed store operations by `backend` and `operation`.
pub const STORE_ERRORS_TOTAL: &str = "ctxgate_store_errors_total";
/// Gauge: 1 while the store's circuit breaker is open — a store operation timed out or failed and the background
/// probe has not found the store healthy yet, so requests do not wait on the store —, else 0.
pub const STORE_CIRCUIT_OPEN: &str = "ctxgate_store_circuit_open";
/// Counter: upstream failures by `route` and `class` (4xx, 5xx, unreachable, timeout, interrupted).
pub const UPSTREAM_ERRORS_TOTAL: &str = "ctxgate_upstream_errors_total";
/// Counter: conversation requests sent upstream (first round), by `upstream` (its name: `default`, `anthropic`,
/// or an `[upstreams.<name>]`), `dialect` and `outcome` (answered, 4xx, 5xx, unreachable, timeout).
pub const UPSTREAM_REQUESTS_TOTAL: &str = "ctxgate_upstream_requests_total";
/// Counter: requests sent to their model's fallback (`context.on_overflow = "fallback"`), by `model` and
/// `fallback` (the model that answered), both model labels.
pub const FALLBACKS_TOTAL: &str = "ctxgate_fallbacks_total";
/// Counter: config reloads (SIGHUP, `POST /admin/config/reload`) by `outcome` (applied, rejected).
pub const CONFIG_RELOADS_TOTAL: &str = "ctxgate_config_reloads_total";
/// Counter: idle-session webhook attempts by `outcome` (delivered, retried, failed).
pub const HOOK_DELIVERIES_TOTAL: &str = "ctxgate_hook_deliveries_total";
/// Gauge: idle sessions whose webhook is due and not delivered yet (as of the last sweep).
pub const HOOK_PENDING_DELIVERIES: &str = "ctxgate_hook_pending_deliveries";
/// Gauge: always 1, labelled with the running `version`.
pub const BUILD_INFO: &str = "ctxgate_build_info";

/// Every name above, for tests and docs.
pub const ALL: &[&str] = &[
    REQUESTS_TOTAL,
    REQUESTS_IN_FLIGHT,
    ACTIVE_STREAMS,
    REQUESTS_REJECTED_TOTAL,
    UNMANAGED_REQUESTS_TOTAL,
    CONFIG_RELOADS_TOTAL,
    HOOK_DELIVERIES_TOTAL,
    HOOK_PENDING_DELIVERIES,
    REQUEST_DURATION_SECONDS,
    UPSTREAM_DURATION_SECONDS,
    OVERHEAD_SECONDS,
    STREAM_FIRST_BYTE_SECONDS,
    CLIENT_PROMPT_TOKENS_TOTAL,
    UPSTREAM_PROMPT_TOKENS_TOTAL,
    UPSTREAM_CACHED_TOKENS_TOTAL,
    UPSTREAM_COMPLETION_TOKENS_TOTAL,
    SAVED_TOKENS_TOTAL,
    SPEND_DOLLARS_TOTAL,
    SAVED_DOLLARS_TOTAL,
    CACHE_MISS_TOKENS_TOTAL,
    TOKEN_ESTIMATE_RATIO,
    REWRITES_TOTAL,
    SUMMARIZER_CALLS_TOTAL,
    SUMMARIZER_CALL_DURATION_SECONDS,
    PRECOMPACTIONS_STARTED_TOTAL,
    PRECOMPACTIONS_FINISHED_TOTAL,
    RECALL_CALLS_TOTAL,
    RECALL_ROUNDS_TOTAL,
    SESSIONS_CACHED,
    SESSION_CACHE_BYTES,
    SESSION_CACHE_LOOKUPS_TOTAL,
    STORE_OPERATION_DURATION_SECONDS,
    STORE_ERRORS_TOTAL,
    STORE_CIRCUIT_OPEN,
    UPSTREAM_ERRORS_TOTAL,
    UPSTREAM_REQUESTS_TOTAL,
    FALLBACKS_TOTAL,
    BUILD_INFO,
];
