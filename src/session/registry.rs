//! The session entries in memory, by id: at most one live entry per session (racing first requests, reloads and
//! turns still holding an evicted entry all share it), and the entries whose writes the store refused, kept alive
//! (whatever the cache evicts) until they are rewritten.
//!
//! Lock order: `live`, then an entry's state, then `dirty`; neither is held across an `await` or a cache call.

use super::entry::SessionEntry;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::{Arc, Weak};

/// Fewest ids kept before dead ones are swept out.
const SWEEP_MIN: usize = 1024;

/// Every session entry still referenced (by the cache, a turn, a background job or the dirty set).
struct Live {
    entries: HashMap<String, Weak<SessionEntry>>,
    /// Size at which dead ids are swept out next (twice the live ones after the last sweep: amortised O(1)).
    sweep_at: usize,
}

impl Live {
    /// The live, not deleted entry for `id`.
    fn get(&self, id: &str) -> Option<Arc<SessionEntry>> {
        let e = self.entries.get(id)?.upgrade()?;
        let deleted = e.state.lock().deleted;
        (!deleted).then_some(e)
    }

    fn insert(&mut self, entry: &Arc<SessionEntry>) {
        if self.entries.len() >= self.sweep_at {
            self.entries.retain(|_, w| w.strong_count() > 0);
            self.sweep_at = (self.entries.len() * 2).max(SWEEP_MIN);
        }
        self.entries.insert(entry.id.clone(), Arc::downgrade(entry));
    }
}

/// Session entries in memory.
pub(super) struct Registry {
    live: Mutex<Live>,
    /// Sessions waiting for a whole rewrite after a refused write.
    dirty: Mutex<HashMap<String, Arc<SessionEntry>>>,
}

impl Registry {
    pub(super) fn new() -> Self {
        Self {
            live: Mutex::new(Live {
                entries: HashMap::new(),
                sweep_at: SWEEP_MIN,
            }),
            dirty: Mutex::new(HashMap::new()),
        }
    }

    /// The live entry of session `id` when it was admitted (loaded, or accepted by the upstream), e.g. one the
    /// cache evicted while a turn or a pending rewrite still holds it.
    pub(super) fn admitted(&self, id: &str) -> Option<Arc<SessionEntry>> {
        let e = self.live.lock().get(id)?;
        let admitted = e.state.lock().admitted;
        admitted.then_some(e)
    }

    /// The live entry of session `id`, or else the one `make` builds, registered as the session's entry (one lock
    /// around both, so two callers never create two entries). `None` when there is neither.
    pub(super) fn get_or_register(
        &self,
        id: &str,
        make: impl FnOnce() -> Option<SessionEntry>,
    ) -> Option<Arc<SessionEntry>> {
        let mut live = self.live.lock();
        if let Some(e) = live.get(id) {
            return Some(e);
        }
        let e = Arc::new(make()?);
        live.insert(&e);
        Some(e)
    }

    /// The live entry of session `id`, or else the one `make` builds, registered (as [`Registry::get_or_register`]).
    pub(super) fn get_or_create(
        &self,
        id: &str,
        make: impl FnOnce() -> SessionEntry,
    ) -> Arc<SessionEntry> {
        let mut live = self.live.lock();
        if let Some(e) = live.get(id) {
            return e;
        }
        let e = Arc::new(make());
        live.insert(&e);
        e
    }

    /// Marks the live entry of session `id` deleted and forgets it (a later request starts a new entry); returns
    /// it.
    pub(super) fn delete(&self, id: &str) -> Option<Arc<SessionEntry>> {
        let e = {
            let mut live = self.live.lock();
            let e = live.entries.remove(id).and_then(|w| w.upgrade());
            if let Some(e) = &e {
                e.state.lock().deleted = true;
            }
            e
        };
        self.dirty.lock().remove(id);
        e
    }

    /// Keeps `entry` (whose write was just refused) until its whole rewrite is queued. Call under its state lock.
    pub(super) fn keep_dirty(&self, entry: &Arc<SessionEntry>) {
        self.dirty.lock().insert(entry.id.clone(), entry.clone());
    }

    /// `entry` needs no rewrite any more (queued, or deleted). Call under its state lock.
    pub(super) fn clear_dirty(&self, entry: &SessionEntry) {
        let mut dirty = self.dirty.lock();
        if dirty
            .get(&entry.id)
            .is_some_and(|d| std::ptr::eq(Arc::as_ptr(d), entry))
        {
            dirty.remove(&entry.id);
        }
    }

    /// Whether some session waits for a rewrite.
    pub(super) fn has_dirty(&self) -> bool {
        !self.dirty.lock().is_empty()
    }

    /// The sessions waiting for a rewrite, cached or not.
    pub(super) fn dirty(&self) -> Vec<Arc<SessionEntry>> {
        self.dirty.lock().values().cloned().collect()
    }
}
