//! The access-log line of a conversation request (target `ctxgate::access`): one writer for a turn the upstream
//! answered and for ctxgate's own error answer, with the same fields in the same order.

use super::turn::Seen;
use crate::dialect::{Dialect, Request};
use crate::error::GatewayError;
use crate::relay::RelayOutcome;
use crate::session::SessionIdentity;
use std::time::{Duration, Instant};

/// The request a line is about, as far as it is known when the line is written.
pub(super) struct Logged<'a> {
    pub dialect: Dialect,
    /// When the request arrived.
    pub started: Instant,
    /// The request's model (empty before it was parsed).
    pub model: &'a str,
    pub stream: bool,
    /// The session's id, once known (logged empty when none is kept).
    pub session: Option<&'a str>,
}

impl<'a> Logged<'a> {
    /// A request that could not be read or parsed.
    pub fn unparsed(dialect: Dialect, started: Instant) -> Logged<'static> {
        Logged {
            dialect,
            started,
            model: "",
            stream: false,
            session: None,
        }
    }

    /// A parsed request, of `session` when known.
    pub fn of(
        request: &'a Request,
        started: Instant,
        session: Option<&'a SessionIdentity>,
    ) -> Logged<'a> {
        Logged {
            dialect: request.dialect,
            started,
            model: &request.model,
            stream: request.stream,
            session: session.map(|s| s.id.as_str()),
        }
    }
}

/// How the request ended.
pub(super) enum End<'a> {
    /// The upstream answered with `status` after `upstream_wait`; `outcome` is what was relayed.
    Answered {
        status: u16,
        upstream_wait: Duration,
        outcome: &'a RelayOutcome,
    },
    /// ctxgate answered with its own error.
    Failed(&'a GatewayError),
}

/// Writes the line: `info` with the message `conversation` for an answered turn, `warn` with `conversation
/// request failed in ctxgate` (and the error) for our own error. `seen`: the rewrite and recall rounds, when
/// planned. Fields that do not apply to the end are left out.
pub(super) fn write(req: &Logged<'_>, seen: Option<&Seen>, end: End<'_>) {
    let (stages, tokens_client, tokens_sent, recall_rounds) = match seen {
        Some(s) => (
            s.stages.as_str(),
            s.tokens_client,
            s.tokens_sent,
            s.recall_rounds.load(std::sync::atomic::Ordering::Relaxed),
        ),
        None => ("", None, None, 0),
    };
    let fallback = seen.and_then(|s| s.fallback.as_deref());
    let (status, upstream_ms, outcome, error) = match end {
        End::Answered {
            status,
            upstream_wait,
            outcome,
        } => (
            status,
            Some(crate::logging::millis(upstream_wait)),
            Some(outcome),
            None,
        ),
        End::Failed(e) => (e.status().as_u16(), None, None, Some(e)),
    };
    // One field list for both levels (a level is part of an event's static callsite).
    macro_rules! line {
        ($level:ident, $message:literal) => {
            tracing::$level!(
                target: "ctxgate::access",
                method = "POST",
                path = req.dialect.client_path(),
                dialect = req.dialect.as_str(),
                status,
                model = req.model,
                fallback,
                stream = req.stream,
                session = req.session.unwrap_or(""),
                rewritten = !stages.is_empty(),
                stages,
                tokens_client,
                tokens_sent,
                recall_rounds,
                upstream_ms,
                total_ms = crate::logging::millis(req.started.elapsed()),
                bytes = outcome.map(|o| o.bytes),
                complete = outcome.map(|o| o.reply.complete),
                client_disconnected = outcome.map(|o| o.client_disconnected),
                upstream_error = outcome.map(|o| o.upstream_error.as_deref().unwrap_or("")),
                error = error.map(tracing::field::display),
                $message
            )
        };
    }
    if error.is_some() {
        line!(warn, "conversation request failed in ctxgate");
    } else {
        line!(info, "conversation");
    }
}
