//! The response relay: upstream bytes go to the client as they arrive, while a tap beside it assembles the reply.
//!
//! The tap runs a finisher (record the turn, log, metrics) exactly once: when the reply is complete — before the
//! stream's last event that carries content or usage (`[DONE]` for chat, whose usage chunk follows the
//! `finish_reason`; Anthropic's closing `message_delta`; Responses' `response.completed`: see
//! [`crate::dialect::Assemble::on_event`]) or the last body chunk (JSON) is released, so that a turn the client
//! has received is recorded even by a client that stops reading there — or, when the client goes away, from the
//! relay's `Drop` with the reply as far as it got (whole if everything that carries content had gone out).

use crate::dialect::{Assemble, AssembledReply, Dialect};
use crate::error::GatewayError;
use crate::sse::SseParser;
use crate::upstream::{map_client_error, BodyError};
use bytes::{Bytes, BytesMut};
use futures_util::future::BoxFuture;
use futures_util::stream::{BoxStream, Stream, StreamExt};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// How a relayed reply ended.
#[derive(Debug, Clone)]
pub struct RelayOutcome {
    /// The assembled reply (partial unless `reply.complete`).
    pub reply: AssembledReply,
    /// The client went away before the end.
    pub client_disconnected: bool,
    /// The upstream body failed or stalled (message for logs; never content).
    pub upstream_error: Option<String>,
    /// Body bytes relayed to the client.
    pub bytes: u64,
    /// When the first body byte arrived from the upstream.
    pub first_byte_at: Option<Instant>,
}

/// Work to run once when the reply ends; its future is awaited before the last bytes are released.
pub type Finisher = Box<dyn FnOnce(RelayOutcome) -> BoxFuture<'static, ()> + Send>;

/// Largest non-streaming body the tap keeps for assembling (16 MiB, far above any real completion; bigger bodies
/// are relayed whole but neither assembled nor recorded).
pub const MAX_TAPPED_JSON: usize = 16 * 1024 * 1024;

enum Tap {
    Sse(Box<(SseParser, Box<dyn Assemble>)>),
    Json {
        buf: BytesMut,
        overflow: bool,
        dialect: Dialect,
    },
}

impl Tap {
    /// Feeds a chunk; `Some(at)` when it made the reply whole (see [`crate::dialect::Assemble::on_event`]): that
    /// event's bytes start at `at` in the chunk (0 when an earlier chunk holds their start).
    fn feed(&mut self, chunk: &[u8]) -> Option<usize> {
        match self {
            Tap::Sse(sse) => {
                let (parser, assembler) = &mut **sse;
                let mut done = None;
                let mut start = 0;
                for (ev, end) in parser.feed_with_ends(chunk) {
                    if assembler.on_event(&ev) && done.is_none() {
                        done = Some(start);
                    }
                    start = end;
                }
                done
            }
            Tap::Json { buf, overflow, .. } => {
                if !*overflow {
                    if buf.len() + chunk.len() > MAX_TAPPED_JSON {
                        *overflow = true;
                        *buf = BytesMut::new();
                    } else {
                        buf.extend_from_slice(chunk);
                    }
                }
                None
            }
        }
    }

    /// The reply so far; `at_end`: the stream is over (ended, broken, or the client left), so an event left
    /// without its closing blank line is taken in (mid-stream, the parser keeps it for the bytes to come).
    fn reply(&mut self, at_end: bool) -> AssembledReply {
        match self {
            Tap::Sse(sse) => {
                let (parser, assembler) = &mut **sse;
                if let Some(ev) = at_end.then(|| parser.finish()).flatten() {
                    assembler.on_event(&ev);
                }
                if parser.dropped() > 0 {
                    tracing::warn!(
                        dropped = parser.dropped(),
                        "relay: SSE events over the line bound were relayed but not assembled"
                    );
                }
                assembler.finish()
            }
            Tap::Json { overflow: true, .. } => {
                tracing::warn!(
                    limit = MAX_TAPPED_JSON,
                    "relay: a reply body over the bound was relayed but not assembled"
                );
                AssembledReply::default()
            }
            Tap::Json { buf, dialect, .. } => dialect.reply_from_body(buf),
        }
    }

    /// The next event's sequence number, for a dialect that numbers its events.
    fn sequence(&self) -> Option<u64> {
        match self {
            Tap::Sse(sse) => sse.1.next_sequence_number(),
            Tap::Json { .. } => None,
        }
    }

    /// The stream stopped inside an SSE event.
    fn mid_event(&self) -> bool {
        match self {
            Tap::Sse(sse) => sse.0.mid_event(),
            Tap::Json { .. } => false,
        }
    }
}

/// The SSE event that ends a chat stream the upstream broke: `data: {"error":{…}}` in OpenAI's error shape, after
/// a blank line closing the event the upstream left unfinished (when `mid_event`). No `[DONE]` follows: the reply
/// is not complete. (Other dialects: `Dialect::error_event`.)
pub fn error_event(err: &GatewayError, mid_event: bool) -> Bytes {
    Dialect::Chat.error_event(err, mid_event)
}

/// The shutdown's cut: once `token` is cancelled (the grace is over), a stream still waiting for its upstream ends
/// with the dialect's error event.
#[derive(Clone, Default)]
pub struct Cut {
    /// Cancelled when the shutdown grace runs out.
    pub token: CancellationToken,
    /// `server.shutdown_grace_secs`, for the error's message.
    pub grace_secs: u64,
}

struct Relay {
    upstream: BoxStream<'static, Result<Bytes, BodyError>>,
    cut: Cut,
    dialect: Dialect,
    tap: Tap,
    finisher: Option<Finisher>,
    idle: Duration,
    held: Option<Bytes>,
    /// The bytes of a stream's ending event, released once the finisher ran (what came before them in their
    /// chunk went out at once).
    tail: Option<Bytes>,
    ended: bool,
    bytes: u64,
    first_byte_at: Option<Instant>,
    tasks: TaskTracker,
}

impl Relay {
    async fn finish(&mut self, upstream_error: Option<String>) {
        if let Some(f) = self.finisher.take() {
            let outcome = self.outcome(false, upstream_error);
            // Spawned so that it completes even if the client goes away while we wait for it.
            let _ = self.tasks.spawn(f(outcome)).await;
        }
    }

    fn outcome(
        &mut self,
        client_disconnected: bool,
        upstream_error: Option<String>,
    ) -> RelayOutcome {
        let mut reply = self.tap.reply(self.ended || client_disconnected);
        // The client did not get the end of a body the upstream broke off, whatever the tap could assemble (a whole
        // JSON body whose `content-length` was then unmet never reached the client: its body is aborted); nor of a
        // JSON body it left before its last chunk, which is held back until the finisher ran. (A stream's chunks
        // went out as they came: what it saw is what the assembler says, whole once everything that carries
        // content went out, whether or not the events that follow it did.)
        let json = matches!(self.tap, Tap::Json { .. });
        if upstream_error.is_some() || (client_disconnected && json) {
            reply.complete = false;
        }
        RelayOutcome {
            reply,
            client_disconnected,
            upstream_error,
            bytes: self.bytes,
            first_byte_at: self.first_byte_at,
        }
    }

    async fn next_chunk(&mut self) -> Option<Result<Bytes, std::io::Error>> {
        if let Some(tail) = self.tail.take() {
            self.finish(None).await;
            return Some(Ok(tail));
        }
        loop {
            if self.ended {
                return self.held.take().map(Ok);
            }
            let next = tokio::select! {
                biased;
                n = tokio::time::timeout(self.idle, self.upstream.next()) => n,
                () = self.cut.token.cancelled() => {
                    let err = GatewayError::ShuttingDown { grace_secs: self.cut.grace_secs };
                    return Some(self.fail(err).await);
                }
            };
            match next {
                Ok(Some(Ok(chunk))) => {
                    self.first_byte_at.get_or_insert_with(Instant::now);
                    self.bytes += chunk.len() as u64;
                    // Once the finisher ran, what follows (Anthropic's `message_stop`) is relayed as it comes.
                    let done = self.tap.feed(&chunk).filter(|_| self.finisher.is_some());
                    match self.tap {
                        Tap::Sse(_) => {
                            match done {
                                Some(at) if at > 0 => {
                                    self.tail = Some(chunk.slice(at..));
                                    return Some(Ok(chunk.slice(..at)));
                                }
                                Some(_) => self.finish(None).await,
                                None => {}
                            }
                            return Some(Ok(chunk));
                        }
                        Tap::Json { .. } => {
                            // Hold one chunk back so the last one is released only after the finisher ran.
                            if let Some(prev) = self.held.replace(chunk) {
                                return Some(Ok(prev));
                            }
                        }
                    }
                }
                Ok(None) => {
                    self.ended = true;
                    self.finish(None).await;
                }
                Ok(Some(Err(e))) => {
                    let err = map_client_error(&e, self.idle);
                    return Some(self.fail(err).await);
                }
                Err(_) => {
                    let err = GatewayError::UpstreamTimeout(self.idle.as_secs());
                    return Some(self.fail(err).await);
                }
            }
        }
    }

    /// The upstream body broke or stalled: finish the turn with the partial reply, then end a stream with an error
    /// event and a clean end (a JSON body cannot be mended: its connection is aborted).
    async fn fail(&mut self, err: GatewayError) -> Result<Bytes, std::io::Error> {
        self.ended = true;
        self.held = None;
        let mid_event = self.tap.mid_event();
        let msg = format!("upstream body: {err}");
        self.finish(Some(msg.clone())).await;
        match self.tap {
            Tap::Sse(_) => {
                let event = self
                    .dialect
                    .error_event_at(&err, mid_event, self.tap.sequence());
                self.bytes += event.len() as u64;
                Ok(event)
            }
            Tap::Json { .. } => Err(std::io::Error::other(msg)),
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        // The client went away (or the body was dropped) before the reply ended: record what we have.
        if let Some(f) = self.finisher.take() {
            let outcome = self.outcome(true, None);
            if tokio::runtime::Handle::try_current().is_ok() {
                self.tasks.spawn(f(outcome));
            }
        }
    }
}

/// Relays `upstream` to the client with a tap: SSE when `sse`, a whole JSON body otherwise. Dropping the returned
/// stream drops the upstream response (its connection is closed at once) and runs the finisher with the partial
/// reply. Finishers run on `tasks`, so that shutdown can wait for them.
pub fn relay(
    upstream: BoxStream<'static, Result<Bytes, BodyError>>,
    dialect: Dialect,
    sse: bool,
    idle: Duration,
    cut: Cut,
    tasks: TaskTracker,
    finisher: Finisher,
) -> impl Stream<Item = Result<Bytes, std::io::Error>> + Send + 'static {
    let tap = if sse {
        Tap::Sse(Box::new((SseParser::new(), dialect.assembler())))
    } else {
        Tap::Json {
            buf: BytesMut::new(),
            overflow: false,
            dialect,
        }
    };
    let state = Relay {
        upstream,
        cut,
        dialect,
        tap,
        finisher: Some(finisher),
        idle,
        held: None,
        tail: None,
        ended: false,
        bytes: 0,
        first_byte_at: None,
        tasks,
    };
    futures_util::stream::unfold(state, |mut s| async move {
        let item = s.next_chunk().await?;
        Some((item, s))
    })
}

/// Relays a passthrough body with the same idle timeout and no tap.
pub fn passthrough(
    upstream: BoxStream<'static, Result<Bytes, BodyError>>,
    idle: Duration,
) -> impl Stream<Item = Result<Bytes, std::io::Error>> + Send + 'static {
    futures_util::stream::unfold(Some(upstream), move |s| async move {
        let mut s = s?;
        match tokio::time::timeout(idle, s.next()).await {
            Ok(Some(Ok(b))) => Some((Ok(b), Some(s))),
            Ok(Some(Err(e))) => Some((Err(std::io::Error::other(e)), None)),
            Ok(None) => None,
            Err(_) => Some((
                Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "upstream body stalled",
                )),
                None,
            )),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_json_tap_is_bounded_and_an_over_limit_body_is_not_assembled() {
        let mut tap = Tap::Json {
            buf: BytesMut::new(),
            overflow: false,
            dialect: Dialect::Chat,
        };
        let mb = vec![b' '; 1024 * 1024];
        for _ in 0..20 {
            tap.feed(&mb);
            let Tap::Json { buf, .. } = &tap else {
                unreachable!()
            };
            assert!(buf.len() <= MAX_TAPPED_JSON);
        }
        let Tap::Json { buf, overflow, .. } = &tap else {
            unreachable!()
        };
        assert!(*overflow);
        assert_eq!(buf.capacity(), 0, "the buffer is let go");
        // even a valid completion ending the body is not assembled from a truncated buffer
        tap.feed(br#"{"choices":[{"message":{"role":"assistant","content":"x"}}]}"#);
        let reply = tap.reply(true);
        assert!(reply.is_empty() && !reply.complete);
    }

    #[test]
    fn the_error_event_is_openai_shaped_and_closes_an_open_event() {
        let err = GatewayError::UpstreamTimeout(3);
        for mid in [false, true] {
            let b = error_event(&err, mid);
            let before: &[u8] = if mid {
                b"data: {\"cho"
            } else {
                b"data: {}\n\n"
            };
            let events = SseParser::new().feed(&[before, &b].concat());
            let last: serde_json::Value =
                serde_json::from_str(&events.last().unwrap().data).unwrap();
            assert_eq!(last["error"]["code"], "upstream_timeout");
            assert_eq!(last["error"]["type"], "upstream_error");
            assert_eq!(events.len(), 2, "{events:?}");
        }
    }

    #[tokio::test]
    async fn a_stream_in_one_chunk_goes_out_at_once_but_its_end_only_after_the_finisher() {
        let body = concat!(
            "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"hi\"}}]}\n\n",
            "data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
            "data: [DONE]\n\n"
        );
        let finished = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        for chunks in [
            vec![body.to_string()],
            vec![body[..20].to_string(), body[20..].to_string()],
        ] {
            finished.store(false, std::sync::atomic::Ordering::SeqCst);
            let seen = std::sync::Arc::clone(&finished);
            let finisher: Finisher = Box::new(move |outcome: RelayOutcome| {
                Box::pin(async move {
                    assert!(outcome.reply.complete);
                    seen.store(true, std::sync::atomic::Ordering::SeqCst);
                })
            });
            let upstream =
                futures_util::stream::iter(chunks.into_iter().map(|c| Ok(Bytes::from(c)))).boxed();
            let out = relay(
                upstream,
                Dialect::Chat,
                true,
                Duration::from_secs(5),
                Cut::default(),
                TaskTracker::new(),
                finisher,
            );
            futures_util::pin_mut!(out);
            let mut got = Vec::new();
            while let Some(item) = out.next().await {
                let item = item.unwrap();
                let done = std::str::from_utf8(&item).unwrap().contains("[DONE]");
                assert_eq!(
                    done,
                    finished.load(std::sync::atomic::Ordering::SeqCst),
                    "the end only after the finisher"
                );
                if !done {
                    assert!(!item.is_empty());
                }
                got.extend_from_slice(&item);
            }
            assert_eq!(got, body.as_bytes(), "byte for byte");
            assert!(finished.load(std::sync::atomic::Ordering::SeqCst));
        }
    }

    /// Anthropic: the turn is recorded (whole, with `message_delta`'s usage) before `message_delta` goes out, for a
    /// client that stops reading there; `message_stop` follows as it comes.
    #[tokio::test]
    async fn an_anthropic_stream_is_recorded_before_its_closing_message_delta() {
        let event = |kind: &str, data: &str| format!("event: {kind}\ndata: {data}\n\n");
        let head = [
            event("message_start", r#"{"type":"message_start","message":{"id":"m","usage":{"input_tokens":4}}}"#),
            event("content_block_start", r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#),
            event("content_block_delta", r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"hi"}}"#),
            event("content_block_stop", r#"{"type":"content_block_stop","index":0}"#),
        ]
        .concat();
        let delta = event(
            "message_delta",
            r#"{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":2}}"#,
        );
        let stop = event("message_stop", r#"{"type":"message_stop"}"#);
        // the delta alone, after the blocks in one chunk, or split inside it; message_stop later
        for chunks in [
            vec![head.clone(), delta.clone(), stop.clone()],
            vec![format!("{head}{delta}"), stop.clone()],
            vec![
                format!("{head}{}", &delta[..9]),
                format!("{}{stop}", &delta[9..]),
            ],
        ] {
            let finished = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
            let seen = std::sync::Arc::clone(&finished);
            let finisher: Finisher = Box::new(move |outcome: RelayOutcome| {
                Box::pin(async move {
                    assert!(outcome.reply.complete && !outcome.client_disconnected);
                    assert_eq!(outcome.reply.usage.unwrap()["output_tokens"], 2);
                    seen.store(true, std::sync::atomic::Ordering::SeqCst);
                })
            });
            let upstream =
                futures_util::stream::iter(chunks.into_iter().map(|c| Ok(Bytes::from(c)))).boxed();
            let out = relay(
                upstream,
                Dialect::Anthropic,
                true,
                Duration::from_secs(5),
                Cut::default(),
                TaskTracker::new(),
                finisher,
            );
            futures_util::pin_mut!(out);
            let mut got = Vec::new();
            while let Some(item) = out.next().await {
                let item = item.unwrap();
                got.extend_from_slice(&item);
                let text = String::from_utf8_lossy(&got);
                if !text.contains("message_delta") {
                    assert!(
                        !finished.load(std::sync::atomic::Ordering::SeqCst),
                        "not before"
                    );
                } else {
                    assert!(
                        finished.load(std::sync::atomic::Ordering::SeqCst),
                        "before it went out"
                    );
                }
            }
            assert_eq!(
                got,
                [head.as_str(), &delta, &stop].concat().as_bytes(),
                "byte for byte"
            );
        }
    }

    #[tokio::test]
    async fn a_stream_cut_by_the_shutdown_ends_with_the_dialects_error_event() {
        for dialect in [Dialect::Chat, Dialect::Anthropic, Dialect::Responses] {
            let first: Result<Bytes, BodyError> = Ok(Bytes::from_static(b"data: {\"x\":1}\n\n"));
            // One event, then an upstream that never sends another.
            let upstream = futures_util::stream::iter([first])
                .chain(futures_util::stream::pending())
                .boxed();
            let cut = Cut {
                token: CancellationToken::new(),
                grace_secs: 7,
            };
            let outcome = std::sync::Arc::new(parking_lot::Mutex::new(None));
            let seen = outcome.clone();
            let finisher: Finisher = Box::new(move |o: RelayOutcome| {
                Box::pin(async move {
                    *seen.lock() = Some(o.upstream_error);
                })
            });
            let out = relay(
                upstream,
                dialect,
                true,
                Duration::from_secs(60),
                cut.clone(),
                TaskTracker::new(),
                finisher,
            );
            futures_util::pin_mut!(out);
            assert!(
                out.next().await.unwrap().is_ok(),
                "the first event goes out"
            );
            cut.token.cancel();
            let event = out.next().await.unwrap().unwrap();
            let text = std::str::from_utf8(&event).unwrap();
            assert!(text.contains("shutting down"), "{dialect:?}: {text}");
            assert!(text.contains("server.shutdown_grace_secs"), "{text}");
            assert!(out.next().await.is_none(), "then the stream ends");
            let recorded = outcome.lock().clone().unwrap();
            assert!(
                recorded.unwrap().contains("shutting down"),
                "the turn knows why"
            );
        }
    }
}
