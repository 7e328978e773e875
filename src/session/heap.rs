//! What a cached session costs in memory: heap bytes of the structures it holds (parsed messages, node structs,
//! hash tables, ids), each allocation rounded up to the allocator's size class, so the cache's weigher and thus
//! `store.cache_max_bytes` bound the real footprint (checked against a counting allocator in the tests below and a
//! heap profile, docs/operations.md).

use serde_json::Value;
use std::mem::size_of;

/// Bytes the allocator (mimalloc) hands out for a request of `n` bytes: 8, then multiples of 16 up to 64, then
/// four size classes per power of two (80, 96, 112, 128, 160, …; measured with `mi_usable_size` in the tests).
pub const fn alloc(n: usize) -> usize {
    if n == 0 {
        return 0;
    }
    if n <= 8 {
        return 8;
    }
    if n <= 64 {
        return (n + 15) & !15;
    }
    let bits = usize::BITS - (n - 1).leading_zeros(); // n - 1 < 2^bits
    let step = 1usize << (bits - 3);
    (n + step - 1) & !(step - 1)
}

/// Buckets of a hashbrown table that grew to hold `items` by inserting them one at a time (or was cloned from
/// one): the least power of two, at least 4, whose capacity (7/8 of it, or one less below 8) fits them.
pub const fn table_buckets(items: usize) -> usize {
    if items == 0 {
        return 0;
    }
    let mut b = 4;
    while capacity_of(b) < items {
        b *= 2;
    }
    b
}

/// Items a hashbrown table of `buckets` buckets holds before it grows.
const fn capacity_of(buckets: usize) -> usize {
    if buckets < 8 {
        buckets - 1
    } else {
        buckets / 8 * 7
    }
}

/// Bytes of a hashbrown table (std's `HashMap`, indexmap's index) with `capacity` (what `HashMap::capacity`
/// reports) and slots of `slot` bytes: one allocation of the slots, a control byte per bucket and a group's worth
/// (16) more.
pub const fn table(capacity: usize, slot: usize) -> usize {
    if capacity == 0 {
        return 0;
    }
    let buckets = table_buckets(capacity);
    let data = (buckets * slot + 15) & !15;
    alloc(data + buckets + 16)
}

/// Bytes of a `Vec`'s buffer of `capacity` elements of `elem` bytes.
pub const fn vec(capacity: usize, elem: usize) -> usize {
    alloc(capacity * elem)
}

/// One entry of a `serde_json::Map` (indexmap, `preserve_order`): the hash, the key and the value.
const MAP_ENTRY: usize = size_of::<usize>() + size_of::<String>() + size_of::<Value>();

/// Heap bytes a JSON value owns (not counting the `Value` itself, which lives in its parent): strings, arrays'
/// buffers, objects' entry vectors and index tables, and everything below them.
pub fn value(v: &Value) -> usize {
    match v {
        Value::Null | Value::Bool(_) | Value::Number(_) => 0,
        Value::String(s) => alloc(s.capacity()),
        Value::Array(a) => {
            vec(a.capacity(), size_of::<Value>()) + a.iter().map(value).sum::<usize>()
        }
        Value::Object(o) => {
            // `serde_json::Map` has no `capacity()`: parsed and cloned maps grow their index one insert at a time,
            // and their entries to the index's capacity.
            let cap = capacity_of(table_buckets(o.len()));
            let own = if o.is_empty() {
                0
            } else {
                table(cap, size_of::<usize>()) + vec(cap, MAP_ENTRY)
            };
            own + o
                .iter()
                .map(|(k, v)| alloc(k.capacity()) + value(v))
                .sum::<usize>()
        }
    }
}

/// Heap bytes of an `Arc<T>` (two counters and the value) beyond the pointer.
pub const fn arc<T>() -> usize {
    alloc(2 * size_of::<usize>() + size_of::<T>())
}

/// Heap bytes of an `Arc<str>` of `len` bytes.
pub const fn arc_str(len: usize) -> usize {
    alloc(2 * size_of::<usize>() + len)
}

#[cfg(test)]
pub(crate) mod counting {
    //! A global allocator for the library's tests: mimalloc, counting per thread the bytes it hands out (its
    //! usable size, so size-class rounding is counted) minus those given back.

    use std::alloc::{GlobalAlloc, Layout};
    use std::cell::Cell;

    pub struct Counting;

    thread_local! {
        static NET: Cell<isize> = const { Cell::new(0) };
    }

    fn usable(p: *mut u8) -> isize {
        #[expect(
            unsafe_code,
            reason = "asks the allocator that made `p` how large it is"
        )]
        // SAFETY: `p` is a live block of mimalloc's (every block of this allocator is).
        let n = unsafe { libmimalloc_sys::mi_usable_size(p.cast()) };
        n as isize
    }

    fn add(d: isize) {
        // `try_with`: a thread being torn down frees after its locals are gone.
        let _ = NET.try_with(|c| c.set(c.get() + d));
    }

    #[expect(unsafe_code, reason = "a global allocator delegating to mimalloc")]
    // SAFETY: every call forwards to mimalloc's own `GlobalAlloc` with the same arguments.
    unsafe impl GlobalAlloc for Counting {
        unsafe fn alloc(&self, l: Layout) -> *mut u8 {
            // SAFETY: forwarded as is.
            let p = unsafe { mimalloc::MiMalloc.alloc(l) };
            if !p.is_null() {
                add(usable(p));
            }
            p
        }
        unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
            // SAFETY: forwarded as is.
            let p = unsafe { mimalloc::MiMalloc.alloc_zeroed(l) };
            if !p.is_null() {
                add(usable(p));
            }
            p
        }
        unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
            add(-usable(p));
            // SAFETY: forwarded as is.
            unsafe { mimalloc::MiMalloc.dealloc(p, l) }
        }
        unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
            let before = usable(p);
            // SAFETY: forwarded as is.
            let q = unsafe { mimalloc::MiMalloc.realloc(p, l, n) };
            if !q.is_null() {
                add(usable(q) - before);
            }
            q
        }
    }

    #[global_allocator]
    static GLOBAL: Counting = Counting;

    /// Net bytes this thread allocated while `f` ran (blocks `f` keeps, minus blocks it freed), and its result.
    pub fn measure<T>(f: impl FnOnce() -> T) -> (isize, T) {
        let start = NET.with(Cell::get);
        let out = f();
        (NET.with(Cell::get) - start, out)
    }
}

#[cfg(test)]
mod tests {
    use super::counting::measure;
    use super::*;
    use crate::alone::alone;
    use serde_json::json;

    #[test]
    fn size_classes_round_up_like_the_allocator() {
        for (n, want) in [
            (1, 8),
            (9, 16),
            (24, 32),
            (33, 48),
            (64, 64),
            (65, 80),
            (81, 96),
            (129, 160),
            (1000, 1024),
        ] {
            assert_eq!(alloc(n), want, "alloc({n})");
        }
        // Checked against the allocator itself: its usable size for each request.
        for n in [
            1usize, 7, 9, 33, 65, 100, 200, 513, 1000, 5000, 70_000, 600_000,
        ] {
            let (got, v) = measure(|| Vec::<u8>::with_capacity(n));
            assert_eq!(got as usize, alloc(n), "a block of {n}");
            drop(v);
        }
    }

    #[test]
    fn table_bytes_are_what_a_hash_map_allocates() {
        for n in [1usize, 3, 4, 7, 8, 20, 100, 1000] {
            let (got, m) = measure(|| {
                let mut m = std::collections::HashMap::new();
                for i in 0..n as u64 {
                    m.insert(i, [0u64; 2]);
                }
                m
            });
            // An aligned block (16 bytes) sometimes comes from the next size class up.
            let ratio = table(m.capacity(), 24) as f64 / got as f64;
            assert!((0.8..=1.2).contains(&ratio), "{n} items: {got} allocated");
        }
    }

    /// Parsed messages of every shape the history holds, small and large: the estimate is the allocation within
    /// a few percent.
    #[test]
    fn value_bytes_are_what_parsing_allocates() {
        let cases = [
            json!({"role": "user", "content": "hi"}),
            json!({"role": "system", "content": "You are a helpful assistant."}),
            json!({"role": "assistant", "content": null, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "read_file", "arguments": "{\"path\":\"src/lib.rs\"}"}},
                {"id": "call_2", "type": "function", "function": {"name": "grep", "arguments": "{\"q\":\"fn main\"}"}}]}),
            json!({"role": "tool", "tool_call_id": "call_1", "content": "fn item() -> u32 { 42 }\n".repeat(400)}),
            json!({"role": "user", "content": [{"type": "text", "text": "look"},
                {"type": "image_url", "image_url": {"url": "https://example.com/a.png", "detail": "low"}}]}),
            json!({"a": 1, "b": 2, "c": 3, "d": 4, "e": 5, "f": 6, "g": 7, "h": 8, "i": [1, 2, 3, 4, 5]}),
        ];
        for v in cases {
            let text = v.to_string();
            let (got, parsed) = measure(|| serde_json::from_str::<Value>(&text).unwrap());
            let cloned = parsed.clone();
            let (got_clone, c) = measure(|| cloned.clone());
            for (what, got, v) in [("parsed", got, &parsed), ("cloned", got_clone, &c)] {
                let est = value(v) as f64;
                let ratio = est / got as f64;
                assert!(
                    (0.9..=1.1).contains(&ratio),
                    "{what} {text:.60}: estimated {est}, allocated {got}"
                );
            }
        }
    }

    /// Bytes one entry of the token-count memo holds.
    const TOKEN_MEMO_ENTRY_BYTES: usize = 256;

    /// The per-message token counts (`context::tokens`, at most 500,000 entries) cost about
    /// [`TOKEN_MEMO_ENTRY_BYTES`] each: the figure docs/operations.md sizes containers with.
    #[test]
    fn a_token_count_memo_entry_costs_what_the_docs_say() {
        alone(
            "session::heap::tests::a_token_count_memo_entry_costs_what_the_docs_say",
            measure_the_token_memo,
        );
    }

    fn measure_the_token_memo() {
        let counter = crate::context::tokens::TokenCounter::new();
        let enc = crate::context::tokens::Encoding::O200k;
        let texts: Vec<String> = (0..20_000).map(|i| format!("message number {i}")).collect();
        // The tokenizer's tables are built on first use: not the memo's.
        counter.text_tokens(enc, "warm up");
        let (got, ()) = measure(|| {
            for t in &texts {
                counter.text_tokens(enc, t);
            }
        });
        let per_entry = got as f64 / texts.len() as f64;
        eprintln!("token memo: {per_entry:.0} bytes per entry");
        let ratio = per_entry / TOKEN_MEMO_ENTRY_BYTES as f64;
        // A band wider than the weights' 20 %: moka's bookkeeping grows in steps.
        assert!(
            (0.7..=1.3).contains(&ratio),
            "{per_entry:.0} bytes per memo entry"
        );
    }
}
