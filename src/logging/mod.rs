//! The log writer: each line is appended to a shared buffer and one thread writes the buffer out a moment after
//! its first line, so that a request pays neither a system call nor a thread wake-up per line (one per batch).
//!
//! Nothing is dropped: when the buffer is full (the output cannot keep up) a line waits for room. Dropping the
//! [`LogGuard`] writes what is left and stops the thread.

mod clock;
mod fields;

pub use clock::Clock;
pub use fields::PlainFields;
use parking_lot::{Condvar, Mutex};
use std::io::Write;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// How long the writer waits after the first line of a batch for more lines to join it.
pub const GATHER: Duration = Duration::from_millis(2);
/// Bytes in the buffer at which the writer starts at once.
const HIGH: usize = 256 * 1024;
/// Bytes in the buffer at which a line waits for room.
const FULL: usize = 8 * 1024 * 1024;

#[derive(Default)]
struct State {
    buf: Vec<u8>,
    closed: bool,
}

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    /// The writer waits here for a first line (or the end).
    work: Condvar,
    /// Lines wait here for room.
    room: Condvar,
}

/// A duration as a log field in milliseconds, rounded to 0.01 ms: `upstream_ms=0.5`, not `0.49734599999999995`.
pub fn millis(d: Duration) -> f64 {
    // Hundredths of a millisecond, rounded half up; one division of an integer, so the value prints short.
    let hundredths = (d.as_nanos() + 5_000) / 10_000;
    hundredths as f64 / 100.0
}

/// The producer side, a `tracing_subscriber` writer: cheap to clone, one per event.
#[derive(Clone)]
pub struct LogSink {
    shared: Arc<Shared>,
}

/// Stops the writer thread when dropped, after every line given so far is written.
pub struct LogGuard {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

/// A sink writing to `out` from its own thread named `name`.
pub fn sink<W: Write + Send + 'static>(out: W, name: &str) -> std::io::Result<(LogSink, LogGuard)> {
    let shared = Arc::new(Shared::default());
    let writer = Arc::clone(&shared);
    let thread = std::thread::Builder::new()
        .name(name.into())
        .spawn(move || write_out(&writer, out))?;
    Ok((
        LogSink {
            shared: Arc::clone(&shared),
        },
        LogGuard {
            shared,
            thread: Some(thread),
        },
    ))
}

fn write_out<W: Write>(shared: &Shared, mut out: W) {
    loop {
        let batch = {
            let mut st = shared.state.lock();
            while st.buf.is_empty() && !st.closed {
                shared.work.wait(&mut st);
            }
            if st.buf.is_empty() && st.closed {
                return;
            }
            if st.buf.len() < HIGH && !st.closed {
                // Let the lines of the next moment join this write.
                shared.work.wait_for(&mut st, GATHER);
            }
            shared.room.notify_all();
            std::mem::take(&mut st.buf)
        };
        // A failing output (closed pipe) loses its lines, as a write to it would; logging goes on.
        let _ = out.write_all(&batch).and_then(|()| out.flush());
    }
}

impl Write for LogSink {
    fn write(&mut self, line: &[u8]) -> std::io::Result<usize> {
        let mut st = self.shared.state.lock();
        while st.buf.len() >= FULL && !st.closed {
            self.shared.room.wait(&mut st);
        }
        let first = st.buf.is_empty();
        st.buf.extend_from_slice(line);
        if first || st.buf.len() >= HIGH {
            self.shared.work.notify_one();
        }
        Ok(line.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LogSink {
    type Writer = LogSink;

    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

impl Drop for LogGuard {
    fn drop(&mut self) {
        self.shared.state.lock().closed = true;
        self.shared.work.notify_one();
        self.shared.room.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn durations_are_logged_rounded_to_a_hundredth_of_a_millisecond() {
        use super::millis;
        use std::time::Duration;
        for (nanos, shown) in [
            (497_345, "0.5"),
            (497_346_000, "497.35"),
            (4_999, "0.0"),
            (5_000, "0.01"),
            (1_234_567_891, "1234.57"),
            (44_722_938, "44.72"),
            (3_000_000_000_000, "3000000.0"),
        ] {
            assert_eq!(
                format!("{:?}", millis(Duration::from_nanos(nanos))),
                shown,
                "{nanos} ns"
            );
        }
    }

    use super::*;
    use std::time::Instant;

    /// An output that records what it was given and in how many writes.
    #[derive(Clone, Default)]
    struct Out(Arc<Mutex<(Vec<u8>, usize)>>);

    impl Write for Out {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            let mut o = self.0.lock();
            o.0.extend_from_slice(b);
            o.1 += 1;
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn every_line_is_written_in_order_in_few_writes_and_the_guard_flushes() {
        let out = Out::default();
        let (sink, guard) = sink(out.clone(), "log-test").unwrap();
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let mut s = sink.clone();
                std::thread::spawn(move || {
                    for i in 0..2000 {
                        s.write_all(format!("t{t} line {i}\n").as_bytes()).unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        drop(guard);
        let (bytes, writes) = out.0.lock().clone();
        let text = String::from_utf8(bytes).unwrap();
        for t in 0..4 {
            let mine: Vec<usize> = text
                .lines()
                .filter_map(|l| l.strip_prefix(&format!("t{t} line ")))
                .map(|n| n.parse().unwrap())
                .collect();
            assert_eq!(
                mine,
                (0..2000).collect::<Vec<_>>(),
                "thread {t}: all, in order"
            );
        }
        assert!(writes < 8000 / 4, "batched: {writes} writes for 8000 lines");
    }

    #[test]
    fn a_lone_line_is_written_within_moments() {
        let out = Out::default();
        let (mut sink, _guard) = sink(out.clone(), "log-test").unwrap();
        sink.write_all(b"hello\n").unwrap();
        let t = Instant::now();
        while out.0.lock().0.is_empty() {
            assert!(t.elapsed() < Duration::from_secs(5), "never written");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(out.0.lock().0, b"hello\n");
    }
}
