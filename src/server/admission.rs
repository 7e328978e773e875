//! Admission of a conversation request, before it takes an in-flight slot: its body read whole (a slow or idle
//! body holds no slot, only its connection), counted from its bytes (`dialect::census`), refused when it holds more
//! elements than `server.max_messages`, and its memory reserved from `server.request_memory_bytes` — the body as it
//! arrives (a compressed one, as it is decoded: `decode`), then the estimate of what managing it costs — until its
//! answer has been sent.

use super::decode::{Codings, Decoding};
use crate::dialect::census::{self, Census};
use crate::error::GatewayError;
use axum::body::Body;
use bytes::{Bytes, BytesMut};
use http_body_util::BodyExt;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Seconds a client refused for memory is told to wait.
pub const RETRY_AFTER_SECS: u64 = 1;

/// What managing a request costs in memory beyond its body, measured on the release build (docs/operations.md,
/// "Memory"): per byte of body (the parsed values, the neutral copy, what is sent upstream)…
const PER_BYTE: u64 = 4;
/// …per conversation element (its parsed object, neutral message, tree node and store row, token count)…
const PER_ELEMENT: u64 = 2_560;
/// …and per other JSON container (a parsed object or array).
const PER_CONTAINER: u64 = 256;

/// The memory a request of `c` is expected to hold while it is managed, its body included.
pub fn estimate(c: &Census) -> u64 {
    let others = c.containers.saturating_sub(c.elements);
    c.bytes
        .saturating_mul(PER_BYTE + 1)
        .saturating_add(c.elements.saturating_mul(PER_ELEMENT))
        .saturating_add(others.saturating_mul(PER_CONTAINER))
}

/// The memory budget of requests in flight, counted in KiB (`None`: no limit).
#[derive(Clone)]
pub struct Memory {
    kib: Option<Arc<Semaphore>>,
    limit: u64,
}

impl Memory {
    /// A budget of `bytes` (0: no limit).
    pub fn new(bytes: u64) -> Self {
        let kib = bytes / 1024;
        let permits = usize::try_from(kib)
            .unwrap_or(Semaphore::MAX_PERMITS)
            .min(Semaphore::MAX_PERMITS);
        Self {
            kib: (bytes > 0).then(|| Arc::new(Semaphore::new(permits.max(1)))),
            limit: bytes,
        }
    }

    /// Bytes of the budget not reserved now (the whole limit when there is none).
    #[cfg(test)]
    pub fn available(&self) -> u64 {
        match &self.kib {
            Some(s) => s.available_permits() as u64 * 1024,
            None => self.limit,
        }
    }
}

/// Memory reserved for one request; given back when dropped (with its response body).
#[derive(Default)]
pub struct Reserved {
    permit: Option<OwnedSemaphorePermit>,
    kib: u64,
}

impl Reserved {
    /// Grows the reservation to `bytes` (never shrinks it): `false` when the budget does not have it now.
    fn grow_to(&mut self, memory: &Memory, bytes: u64) -> bool {
        let Some(sem) = &memory.kib else {
            return true;
        };
        let want = bytes.div_ceil(1024);
        if want <= self.kib {
            return true;
        }
        let Ok(more) = u32::try_from(want - self.kib) else {
            return false;
        };
        match sem.clone().try_acquire_many_owned(more) {
            Ok(p) => {
                match &mut self.permit {
                    Some(have) => have.merge(p),
                    None => self.permit = Some(p),
                }
                self.kib = want;
                true
            }
            Err(_) => false,
        }
    }
}

/// The limits a conversation request is admitted under (`[server]`).
pub struct Rules {
    /// `server.max_body_bytes`.
    pub max_body_bytes: u64,
    /// `server.body_read_timeout_secs`.
    pub body_timeout: Duration,
    /// `server.max_messages` (0: no limit).
    pub max_messages: u64,
}

/// Reads `body` whole within `rules`, reserving its bytes from `memory` as they arrive, decodes it from `codings`
/// (within `server.max_body_bytes`, reserving the decoded bytes too), then counts it and reserves what managing it
/// costs. The (decoded) body and the reservation, or the error to answer with.
pub async fn admit(
    body: Body,
    codings: Option<Codings>,
    rules: &Rules,
    memory: &Memory,
) -> Result<(Bytes, Reserved), GatewayError> {
    let mut reserved = Reserved::default();
    let raw = match tokio::time::timeout(
        rules.body_timeout,
        read(body, rules.max_body_bytes, memory, &mut reserved),
    )
    .await
    {
        Ok(r) => r?,
        Err(_) => {
            return Err(GatewayError::RequestTimeout {
                secs: rules.body_timeout.as_secs(),
            })
        }
    };
    let raw = match codings {
        None => raw,
        Some(codings) => {
            let (decoded, r) = decode(raw, codings, rules.max_body_bytes, memory, reserved).await?;
            reserved = r;
            decoded
        }
    };
    let c = census::count(&raw);
    if rules.max_messages > 0 && c.elements > rules.max_messages {
        return Err(GatewayError::TooLarge {
            message: format!(
                "the request holds {} messages and content blocks; ctxgate manages at most {} (server.max_messages)",
                c.elements, rules.max_messages
            ),
        });
    }
    let need = estimate(&c);
    if memory.kib.is_some() && need > memory.limit {
        return Err(GatewayError::TooLarge {
            message: format!(
                "managing this request would take ~{} MiB ({} bytes, {} messages and content blocks, {} JSON containers), more than the {} MiB of server.request_memory_bytes",
                need >> 20,
                c.bytes,
                c.elements,
                c.containers,
                memory.limit >> 20
            ),
        });
    }
    if !reserved.grow_to(memory, need) {
        return Err(busy(memory, need));
    }
    Ok((raw, reserved))
}

fn busy(memory: &Memory, need: u64) -> GatewayError {
    GatewayError::MemoryBusy {
        need_mib: need.div_ceil(1 << 20),
        limit_mib: memory.limit >> 20,
        retry_after_secs: RETRY_AFTER_SECS,
    }
}

/// A compressed body of at most this many bytes starts decoding on the runtime…
const INLINE_RAW: usize = 16 * 1024;
/// …for at most this many decoded bytes: a small chat turn is decoded in tens of microseconds, without a trip to
/// the blocking pool. What is left is decoded there, where a large body (32 MiB: 0.2–0.5 s of one core, by
/// coding) or a stack of codings holds no runtime thread.
const INLINE_DECODED: usize = 16 * 1024;

/// `raw` decoded from `codings` into at most `limit` bytes, the decoded bytes reserved from `memory` (beside the
/// compressed ones, held until the end of the decoding) as they come out.
async fn decode(
    raw: Bytes,
    codings: Codings,
    limit: u64,
    memory: &Memory,
    mut reserved: Reserved,
) -> Result<(Bytes, Reserved), GatewayError> {
    let compressed = raw.len() as u64;
    let grow = move |reserved: &mut Reserved, memory: &Memory, decoded: u64| {
        let size = compressed + decoded;
        if reserved.grow_to(memory, size) {
            Ok(())
        } else if memory.kib.is_some() && size > memory.limit {
            Err(GatewayError::TooLarge {
                message: format!(
                    "decoding this request body takes more than the {} MiB of server.request_memory_bytes",
                    memory.limit >> 20
                ),
            })
        } else {
            Err(busy(memory, size))
        }
    };
    let inline = raw.len() <= INLINE_RAW;
    let mut decoding = Decoding::new(raw, codings, limit)?;
    if inline && decoding.single() {
        let done = decoding.run(INLINE_DECODED, &mut |n| grow(&mut reserved, memory, n))?;
        if done {
            return Ok((decoding.finish(), reserved));
        }
    }
    let memory = memory.clone();
    tokio::task::spawn_blocking(move || {
        decoding.run(usize::MAX, &mut |n| grow(&mut reserved, &memory, n))?;
        Ok((decoding.finish(), reserved))
    })
    .await
    .map_err(|e| GatewayError::Internal(format!("decoding the request body: {e}")))?
}

/// The body's bytes, at most `limit` of them, each frame's reserved from `memory` before it is kept.
async fn read(
    mut body: Body,
    limit: u64,
    memory: &Memory,
    reserved: &mut Reserved,
) -> Result<Bytes, GatewayError> {
    let mut buf = BytesMut::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| {
            GatewayError::bad_request(format!("could not read the request body: {e}"))
        })?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        let size = buf.len() as u64 + data.len() as u64;
        if size > limit {
            return Err(GatewayError::PayloadTooLarge { limit });
        }
        if !reserved.grow_to(memory, size) {
            return Err(busy(memory, size));
        }
        if buf.is_empty() && http_body::Body::is_end_stream(&body) {
            // One frame, the whole body: kept as it came, no copy.
            return Ok(data);
        }
        buf.extend_from_slice(&data);
    }
    Ok(buf.freeze())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    fn rules(max_messages: u64) -> Rules {
        Rules {
            max_body_bytes: 1 << 20,
            body_timeout: Duration::from_secs(5),
            max_messages,
        }
    }

    fn tiny_messages(n: usize) -> String {
        let items: Vec<String> = (0..n)
            .map(|i| format!(r#"{{"role":"user","content":"m{i}"}}"#))
            .collect();
        format!(r#"{{"model":"m","messages":[{}]}}"#, items.join(","))
    }

    #[tokio::test]
    async fn more_messages_than_the_limit_is_413_naming_the_key() {
        let body = tiny_messages(101);
        let e = admit(Body::from(body.clone()), None, &rules(100), &Memory::new(0))
            .await
            .err()
            .unwrap();
        assert_eq!(e.status(), 413);
        assert!(e.to_string().contains("server.max_messages"), "{e}");
        assert!(e.to_string().contains("101"), "{e}");
        let (raw, _) = admit(Body::from(body.clone()), None, &rules(101), &Memory::new(0))
            .await
            .ok()
            .unwrap();
        assert_eq!(raw, body.as_bytes());
    }

    #[tokio::test]
    async fn memory_is_reserved_until_dropped_and_refused_when_spent() {
        let body = tiny_messages(200);
        let need = estimate(&census::count(body.as_bytes()));
        let memory = Memory::new(need * 3 / 2);
        let (_, held) = admit(Body::from(body.clone()), None, &rules(0), &memory)
            .await
            .ok()
            .unwrap();
        assert!(memory.available() < need, "the first holds its estimate");
        let e = admit(Body::from(body.clone()), None, &rules(0), &memory)
            .await
            .err()
            .unwrap();
        assert_eq!(e.status(), 503);
        assert!(e.to_string().contains("server.request_memory_bytes"), "{e}");
        drop(held);
        assert!(admit(Body::from(body), None, &rules(0), &memory)
            .await
            .is_ok());
    }

    #[tokio::test]
    async fn a_request_that_could_never_fit_is_413() {
        let body = tiny_messages(500);
        let need = estimate(&census::count(body.as_bytes()));
        let e = admit(Body::from(body), None, &rules(0), &Memory::new(need / 2))
            .await
            .err()
            .unwrap();
        assert_eq!(e.status(), 413);
        assert!(e.to_string().contains("server.request_memory_bytes"), "{e}");
    }

    fn gzip(data: &[u8]) -> Vec<u8> {
        use std::io::Write;
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    fn gzipped() -> Option<Codings> {
        let mut h = http::HeaderMap::new();
        h.insert("content-encoding", http::HeaderValue::from_static("gzip"));
        crate::server::decode::take_codings(&mut h).unwrap()
    }

    #[tokio::test]
    async fn a_compressed_body_is_admitted_decoded_small_or_large() {
        // Small: decoded on the runtime; large (past the inline budget): on the blocking pool.
        for n in [3, 5_000] {
            let body = tiny_messages(n);
            let memory = Memory::new(64 << 20);
            let (raw, held) = admit(
                Body::from(gzip(body.as_bytes())),
                gzipped(),
                &rules(0),
                &memory,
            )
            .await
            .ok()
            .unwrap();
            assert_eq!(raw, body.as_bytes(), "{n}");
            // What is held is the decoded body's estimate, not the compressed one's.
            let need = estimate(&census::count(body.as_bytes()));
            assert!(memory.available() <= (64 << 20) - need, "{n}");
            drop(held);
            assert_eq!(memory.available(), 64 << 20);
        }
    }

    #[tokio::test]
    async fn decoded_bytes_count_against_the_memory_budget() {
        // 2 MiB of JSON that compresses to a few KiB, under a budget of 1 MiB: refused while it is decoded.
        let body = format!(
            r#"{{"model":"m","messages":[{{"role":"user","content":"{}"}}]}}"#,
            "a".repeat(2 << 20)
        );
        let packed = gzip(body.as_bytes());
        assert!(packed.len() < 64 * 1024);
        let memory = Memory::new(1 << 20);
        let rules = Rules {
            max_body_bytes: 4 << 20,
            ..rules(0)
        };
        let e = admit(Body::from(packed), gzipped(), &rules, &memory)
            .await
            .err()
            .unwrap();
        assert_eq!(e.status(), 413);
        assert!(e.to_string().contains("server.request_memory_bytes"), "{e}");
        assert_eq!(memory.available(), 1 << 20, "all given back");
    }

    #[tokio::test]
    async fn a_bomb_is_413_and_holds_nothing_after() {
        let packed = gzip(&vec![0u8; 16 << 20]);
        let memory = Memory::new(8 << 20);
        let e = admit(Body::from(packed), gzipped(), &rules(0), &memory)
            .await
            .err()
            .unwrap();
        assert_eq!(e.status(), 413);
        assert!(e.to_string().contains("server.max_body_bytes"), "{e}");
        assert_eq!(memory.available(), 8 << 20);
    }

    #[tokio::test]
    async fn the_estimate_grows_with_elements_far_beyond_the_body() {
        let small = estimate(&census::count(tiny_messages(1000).as_bytes()));
        let body_only = tiny_messages(1000).len() as u64;
        assert!(small > 40 * body_only, "{small} vs {body_only}");
    }
}
