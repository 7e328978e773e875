//! Memory back to the system after a burst: runtime workers that have rested hand mimalloc's retained pages back.
//!
//! mimalloc keeps what a thread freed, and the blocks of that thread's pages that other threads freed (a request
//! is often read on one worker and finished on another), with that thread until it next allocates enough to
//! collect them. A gateway's workers go quiet after a spike and would keep the spike's memory indefinitely (scenario
//! 4 of docs/benchmarks.md: ~80 MB after a burst of 200 kB conversations). So a worker that ran tasks collects
//! (`mi_collect(true)`: merges the cross-thread frees, frees empty pages, purges them to the OS) as it goes back to
//! sleep after a sleep of at least [`INTERVAL`]: never in the middle of traffic, where a collection would hold up
//! the requests behind it and the memory is about to be used again. A worker that goes to sleep without having
//! rested asks the `ctxgate-alloc` thread to wake the workers one interval later; one that slept through it then
//! collects. An idle gateway is never woken for this.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// How long a worker sleeps before its next wake-up counts as the end of a burst (a collection walks the thread's
/// whole heap, and the next allocations fault their pages in again).
pub const INTERVAL: Duration = Duration::from_secs(1);

/// Collections run so far, all threads (tests read it).
static COLLECTIONS: AtomicU64 = AtomicU64::new(0);
/// Where a worker that has to wait for its next collection asks for a wake-up.
static WAKER: OnceLock<SyncSender<()>> = OnceLock::new();

thread_local! {
    /// This thread ran tasks since its last collection.
    static DIRTY: Cell<bool> = const { Cell::new(false) };
    /// When this thread last went to sleep.
    static PARKED_AT: Cell<Option<Instant>> = const { Cell::new(None) };
    /// The sleep this thread last woke from lasted [`INTERVAL`] or more.
    static RESTED: Cell<bool> = const { Cell::new(false) };
    /// When this thread last collected.
    static LAST: Cell<Option<Instant>> = const { Cell::new(None) };
}

/// Hooks a multi-thread runtime's workers: they collect when they go idle.
pub fn hook(builder: &mut tokio::runtime::Builder) -> &mut tokio::runtime::Builder {
    builder.on_thread_unpark(unparked).on_thread_park(parking)
}

/// Starts the thread that wakes the runtime's workers for a collection they had to put off. Call once, inside
/// the runtime built with [`hook`]; later calls do nothing.
pub fn start(handle: tokio::runtime::Handle) -> std::io::Result<()> {
    if WAKER.get().is_some() {
        return Ok(());
    }
    let (tx, rx) = sync_channel::<()>(1);
    if WAKER.set(tx).is_err() {
        return Ok(());
    }
    let workers = handle.metrics().num_workers();
    std::thread::Builder::new()
        .name("ctxgate-alloc".into())
        .spawn(move || {
            while rx.recv().is_ok() {
                std::thread::sleep(INTERVAL);
                while rx.try_recv().is_ok() {}
                // A task from outside the runtime wakes a sleeping worker; each one woken collects as it goes
                // back to sleep.
                for _ in 0..workers {
                    drop(handle.spawn(async {}));
                }
            }
        })
        .map(drop)
}

/// Collections run so far by all threads.
pub fn collections() -> u64 {
    COLLECTIONS.load(Ordering::Relaxed)
}

fn unparked() {
    let now = Instant::now();
    RESTED.set(
        PARKED_AT
            .get()
            .is_some_and(|t| now.duration_since(t) >= INTERVAL),
    );
    DIRTY.set(true);
}

fn parking() {
    let now = Instant::now();
    PARKED_AT.set(Some(now));
    if !DIRTY.get() {
        return;
    }
    if RESTED.get() {
        collect();
        LAST.set(Some(now));
        DIRTY.set(false);
    } else if let Some(tx) = WAKER.get() {
        // Full: a wake-up is already asked for.
        let _ = tx.try_send(());
    }
}

/// Hands this thread's free memory back to the allocator's arenas and the arenas' free pages to the OS.
pub fn collect() {
    #[expect(
        unsafe_code,
        reason = "FFI into the linked allocator; mi_collect takes no pointers and is safe from any thread"
    )]
    // SAFETY: `mi_collect` only walks the calling thread's own heap and the shared arenas under mimalloc's locks.
    unsafe {
        libmimalloc_sys::mi_collect(true);
    }
    COLLECTIONS.fetch_add(1, Ordering::Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::sync::Mutex;
    use std::thread::ThreadId;

    /// Every worker that ran a task collects after its last one (none does while tasks keep coming): the wake-up
    /// reaches each of them, and they all go quiet again.
    #[test]
    fn every_busy_worker_collects_after_its_last_task() {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        b.worker_threads(2).enable_all();
        let rt = hook(&mut b).build().unwrap();
        rt.block_on(async { start(tokio::runtime::Handle::current()) })
            .unwrap();
        let seen: std::sync::Arc<Mutex<HashMap<ThreadId, Instant>>> = Default::default();
        // Traffic for two intervals, spread over both workers: nobody rests, so nobody collects.
        let start_count = collections();
        let traffic = Instant::now();
        while traffic.elapsed() < INTERVAL * 2 {
            rt.block_on(async {
                let tasks: Vec<_> = (0..64)
                    .map(|_| {
                        let seen = seen.clone();
                        tokio::spawn(async move {
                            let v = vec![7u8; 256 * 1024];
                            tokio::task::yield_now().await;
                            seen.lock()
                                .unwrap()
                                .insert(std::thread::current().id(), Instant::now());
                            v.len()
                        })
                    })
                    .collect();
                for t in tasks {
                    t.await.unwrap();
                }
            });
        }
        assert_eq!(
            collections(),
            start_count,
            "collected in the middle of traffic"
        );
        let before = collections();
        std::thread::sleep(INTERVAL * 3);
        // Each worker that ran a task has collected since (the only collections of this test binary's threads
        // are this runtime's: `LAST` is per thread, so ask each worker when it last collected).
        let worked: HashMap<ThreadId, Instant> = seen.lock().unwrap().clone();
        assert!(!worked.is_empty());
        let lasts = rt.block_on(async {
            let mut out = HashMap::new();
            // Probe the workers: tasks land on both over a few rounds.
            for _ in 0..50 {
                let (id, last) = tokio::spawn(async { (std::thread::current().id(), LAST.get()) })
                    .await
                    .unwrap();
                out.insert(id, last);
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            out
        });
        let mut checked = 0;
        for (w, task_end) in &worked {
            if let Some(last) = lasts.get(w) {
                let last = last.expect("a worker that ran tasks has collected");
                assert!(
                    last >= *task_end,
                    "worker {w:?} has not collected since its last task"
                );
                checked += 1;
            }
        }
        assert!(checked > 0, "no worker probed");
        assert!(collections() > before, "nothing collected after the bursts");
        // Quiet: with no work, nothing more is collected (the probes' own wake-ups settle within two intervals).
        std::thread::sleep(INTERVAL * 4);
        let quiet = collections();
        std::thread::sleep(INTERVAL * 2);
        assert_eq!(collections(), quiet, "an idle runtime keeps collecting");
    }
}
