//! Which label combinations can occur, per family layout: only those get series (see `series`). The rules follow
//! the callers: conversation requests (route `chat`) always have a dialect; passthrough and admin requests have
//! none, except the count requests (`POST /v1/messages/count_tokens`, Gemini's `:countTokens`), passthroughs in
//! their dialect; admin requests never go upstream nor stream; rewrites never happen with strategy `off`, and
//! strategy `prune` never summarises; only Responses requests can be unmanaged.

/// When a combination's series is created.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum When {
    /// At start-up: it occurs routinely, and dashboards and alerts expect it from the start.
    Start,
    /// When it first occurs: possible but rare.
    Rare,
    /// Never: it cannot occur.
    Never,
}

const CONVERSATION: [&str; 4] = ["chat", "anthropic", "responses", "gemini"];

fn conversation(dialect: &str) -> bool {
    CONVERSATION.contains(&dialect)
}

/// Whether `route` serves requests in `dialect`.
pub(crate) fn route_dialect(route: &str, dialect: &str) -> bool {
    match route {
        "chat" => conversation(dialect),
        // Everything relayed untouched, and the count requests: Anthropic's count_tokens, Gemini's countTokens.
        "passthrough" => matches!(dialect, "none" | "anthropic" | "gemini"),
        _ => dialect == "none",
    }
}

fn start_if(possible: bool) -> When {
    if possible {
        When::Start
    } else {
        When::Never
    }
}

/// `[route, dialect]`: in-flight gauge, request duration.
pub(crate) fn route_and_dialect(l: &[&str]) -> When {
    start_if(route_dialect(l[0], l[1]))
}

/// `[route, dialect]` of requests that went upstream: upstream wait and overhead (admin requests never do).
pub(crate) fn upstream_route(l: &[&str]) -> When {
    start_if(l[0] != "admin" && route_dialect(l[0], l[1]))
}

/// `[route, dialect, status, stream]`: finished requests. Only chat and passthrough answers stream, and only
/// conversations and the plain passthrough (not count_tokens); 1xx and 3xx final answers are rare (an upstream's
/// redirect, relayed).
pub(crate) fn request(l: &[&str]) -> When {
    let (route, dialect, status, stream) = (l[0], l[1], l[2], l[3]);
    let streams = matches!((route, dialect), ("chat", _) | ("passthrough", "none"));
    if !route_dialect(route, dialect) || (stream == "true" && !streams) {
        When::Never
    } else if matches!(status, "1xx" | "3xx") {
        When::Rare
    } else {
        When::Start
    }
}

/// `[route, dialect, reason]`: refusals. Overload is decided before any body is read (conversation endpoints by
/// their dialect, everything else `passthrough`/`none`); body timeouts are counted by the conversation pipeline.
pub(crate) fn rejected(l: &[&str]) -> When {
    let (route, dialect, reason) = (l[0], l[1], l[2]);
    start_if(match route {
        "chat" => conversation(dialect),
        "passthrough" => dialect == "none" && reason == "overloaded",
        _ => false,
    })
}

/// `[dialect, reason]`: unmanaged requests (only the Responses API keeps history upstream).
pub(crate) fn unmanaged(l: &[&str]) -> When {
    start_if(l[0] == "responses")
}

/// `[dialect, ...]`: families of conversation requests only (first byte, recall rounds and calls, tokens).
pub(crate) fn conversation_only(l: &[&str]) -> When {
    start_if(conversation(l[0]))
}

/// `[dialect, strategy, outcome]`: rewrites. `off` never rewrites nor refuses; `prune` never summarises.
pub(crate) fn rewrite(l: &[&str]) -> When {
    let (dialect, strategy, outcome) = (l[0], l[1], l[2]);
    start_if(
        conversation(dialect)
            && strategy != "off"
            && !(strategy == "prune" && outcome == "summarized"),
    )
}

/// `[route, dialect, class]`: upstream failures, counted by the conversation pipeline and the plain passthrough.
pub(crate) fn upstream_error(l: &[&str]) -> When {
    start_if(match l[0] {
        "chat" => conversation(l[1]),
        "passthrough" => l[1] == "none",
        _ => false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rules() {
        assert_eq!(route_and_dialect(&["chat", "none"]), When::Never);
        assert_eq!(route_and_dialect(&["admin", "chat"]), When::Never);
        assert_eq!(
            route_and_dialect(&["passthrough", "anthropic"]),
            When::Start
        );
        assert_eq!(
            route_and_dialect(&["passthrough", "responses"]),
            When::Never
        );
        assert_eq!(upstream_route(&["admin", "none"]), When::Never);
        assert_eq!(upstream_route(&["chat", "chat"]), When::Start);
        assert_eq!(request(&["admin", "none", "2xx", "true"]), When::Never);
        assert_eq!(
            request(&["passthrough", "anthropic", "2xx", "true"]),
            When::Never
        );
        assert_eq!(
            request(&["passthrough", "none", "3xx", "false"]),
            When::Rare
        );
        assert_eq!(request(&["chat", "responses", "5xx", "true"]), When::Start);
        assert_eq!(
            rejected(&["passthrough", "none", "body_timeout"]),
            When::Never
        );
        assert_eq!(
            rejected(&["chat", "anthropic", "body_timeout"]),
            When::Start
        );
        assert_eq!(unmanaged(&["chat", "conversation"]), When::Never);
        assert_eq!(rewrite(&["none", "prune", "cleared"]), When::Never);
        assert_eq!(rewrite(&["chat", "off", "rejected"]), When::Never);
        assert_eq!(rewrite(&["chat", "prune", "summarized"]), When::Never);
        assert_eq!(rewrite(&["chat", "summarize", "pruned"]), When::Start);
        assert_eq!(upstream_error(&["admin", "none", "5xx"]), When::Never);
        assert_eq!(
            upstream_error(&["passthrough", "anthropic", "5xx"]),
            When::Never
        );
        assert_eq!(conversation_only(&["none"]), When::Never);
    }
}
