//! A passthrough request body, streamed to the upstream as it arrives, that takes its request's in-flight slot
//! (`server.max_in_flight`) only when it ends: a slow or idle body holds no slot. When none is free then, the body
//! ends with an error (the upstream request is abandoned) and the request is answered 503 like any other refusal.

use axum::body::Body;
use bytes::Bytes;
use http_body::{Frame, SizeHint};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The slot a request takes late, shared by its body (which takes it) and its response (which holds it).
pub struct LateSlot {
    slots: Arc<Semaphore>,
    permit: Mutex<Option<OwnedSemaphorePermit>>,
    refused: AtomicBool,
}

impl LateSlot {
    /// A slot to be taken from `slots`.
    pub fn new(slots: Arc<Semaphore>) -> Arc<Self> {
        Arc::new(Self {
            slots,
            permit: Mutex::new(None),
            refused: AtomicBool::new(false),
        })
    }

    /// Takes the slot (once); `false` when none was free.
    fn take(&self) -> bool {
        let Ok(mut held) = self.permit.lock() else {
            return false;
        };
        if held.is_some() {
            return true;
        }
        match self.slots.clone().try_acquire_owned() {
            Ok(p) => {
                *held = Some(p);
                true
            }
            Err(_) => {
                self.refused.store(true, Ordering::Relaxed);
                false
            }
        }
    }

    /// Whether the body ended when no slot was free (the request is then answered 503).
    pub fn refused(&self) -> bool {
        self.refused.load(Ordering::Relaxed)
    }
}

/// The request body: passed through frame by frame; at its end, the slot.
pub struct SlotAtEnd {
    inner: Body,
    slot: Arc<LateSlot>,
    done: bool,
}

impl SlotAtEnd {
    /// `inner`, taking `slot` when it ends.
    pub fn new(inner: Body, slot: Arc<LateSlot>) -> Self {
        Self {
            inner,
            slot,
            done: false,
        }
    }

    fn refusal() -> axum::Error {
        axum::Error::new(std::io::Error::other(
            "server.max_in_flight reached when the request body ended",
        ))
    }
}

impl http_body::Body for SlotAtEnd {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        if self.done {
            return Poll::Ready(None);
        }
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match polled {
            Poll::Ready(None) => {
                self.done = true;
                if self.slot.take() {
                    Poll::Ready(None)
                } else {
                    Poll::Ready(Some(Err(Self::refusal())))
                }
            }
            Poll::Ready(Some(Ok(frame))) => {
                // A body of known length ends with its last frame: the client of the upstream may not poll again.
                if self.inner.is_end_stream() {
                    self.done = true;
                    if !self.slot.take() {
                        return Poll::Ready(Some(Err(Self::refusal())));
                    }
                }
                Poll::Ready(Some(Ok(frame)))
            }
            other => other,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    #[tokio::test]
    async fn the_slot_is_taken_when_the_body_ends_and_refused_when_none_is_free() {
        let slots = Arc::new(Semaphore::new(1));
        let slot = LateSlot::new(slots.clone());
        let body = SlotAtEnd::new(Body::from("hello"), slot.clone());
        assert_eq!(slots.available_permits(), 1, "nothing taken before the end");
        let got = body.collect().await.unwrap().to_bytes();
        assert_eq!(got, "hello");
        assert_eq!(slots.available_permits(), 0, "taken at the end");
        assert!(!slot.refused());
        // the slot is gone: the next body ends with an error and says so
        let other = LateSlot::new(slots.clone());
        let e = SlotAtEnd::new(Body::from("x"), other.clone())
            .collect()
            .await;
        assert!(e.is_err());
        assert!(other.refused());
        drop(slot);
        assert_eq!(slots.available_permits(), 1, "given back with its holder");
    }

    #[tokio::test]
    async fn a_streamed_body_takes_its_slot_only_after_its_last_chunk() {
        let slots = Arc::new(Semaphore::new(1));
        let slot = LateSlot::new(slots.clone());
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(4);
        let stream = tokio_stream_of(rx);
        let mut body = SlotAtEnd::new(Body::from_stream(stream), slot.clone());
        tx.send(Ok(Bytes::from("a"))).await.unwrap();
        let f = body.frame().await.unwrap().unwrap();
        assert_eq!(f.into_data().unwrap(), "a");
        assert_eq!(
            slots.available_permits(),
            1,
            "still streaming: no slot held"
        );
        drop(tx);
        assert!(body.frame().await.is_none());
        assert_eq!(slots.available_permits(), 0);
    }

    fn tokio_stream_of(
        mut rx: tokio::sync::mpsc::Receiver<Result<Bytes, std::io::Error>>,
    ) -> impl futures_util::Stream<Item = Result<Bytes, std::io::Error>> {
        futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
    }
}
