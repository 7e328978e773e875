//! The worker's eye on `store.path`: at most once a second it compares the file there with the one its connection
//! has open (one `stat`: device and inode). A deleted file is written back from the open connection, locked and
//! reopened; what cannot be mended (the copy cannot be written, another file stands there) is a failure the store
//! reports — pings, reads and barriers answer it, writes are held, not acknowledged — tried again every second
//! until it is mended.

use super::file::{DbFile, Presence};
use super::restore;
use rusqlite::Connection;
use std::path::Path;
use std::time::{Duration, Instant};

/// How often the file is looked at.
pub(super) const EVERY: Duration = Duration::from_secs(1);

/// The file and what became of it.
pub(super) struct Watch {
    /// The locked file the connection has open; once written back, the new one (even while not reopened yet).
    file: DbFile,
    /// When the file is next looked at.
    pub(super) next: Instant,
    state: State,
    /// Opens the database at a path as the store does (schema, settings).
    open: fn(&Path) -> Result<Connection, String>,
}

enum State {
    Healthy,
    /// Why the store cannot take writes; `detached`: the connection was closed (the data is in `file`, written
    /// back) and reopening it failed, so it answers nothing until it is reopened.
    Failed {
        reason: String,
        detached: bool,
    },
}

impl Watch {
    pub(super) fn new(file: DbFile, open: fn(&Path) -> Result<Connection, String>) -> Self {
        Watch {
            file,
            next: Instant::now() + EVERY,
            state: State::Healthy,
            open,
        }
    }

    /// Why the store cannot take writes now, if it cannot.
    pub(super) fn failure(&self) -> Option<&str> {
        match &self.state {
            State::Healthy => None,
            State::Failed { reason, .. } => Some(reason),
        }
    }

    /// Looks at the file and mends what it can; true when the store became healthy again.
    pub(super) fn check(&mut self, conn: &mut Connection) -> bool {
        self.next = Instant::now() + EVERY;
        let was_failed = self.failure().is_some();
        if let State::Failed { detached: true, .. } = self.state {
            self.reopen(conn);
            return was_failed && self.failure().is_none();
        }
        let path = self.file.path().to_path_buf();
        let p = path.display().to_string();
        match self.file.presence() {
            Presence::Same => {
                if was_failed {
                    tracing::warn!(path = %p, "store: the database file is back at store.path; writes go on");
                    self.state = State::Healthy;
                }
            }
            Presence::Unknown(e) => {
                tracing::debug!(path = %p, error = %e, "store: cannot look at the database file");
            }
            Presence::Other => {
                if !was_failed {
                    // Our WAL still bears the path's name: emptied (into the file we have open), so that whoever
                    // opens the file standing there now does not read our log as its own.
                    if let Err(e) =
                        conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
                    {
                        tracing::warn!(path = %p, error = %e, "store: cannot empty the write-ahead log");
                    }
                }
                self.fail(
                format!(
                    "{p} is no longer the database this gateway has open: another file stands there (moved \
                     there, or created by another process after the database was deleted); it is left alone and \
                     writes are held (not acknowledged) until it is moved aside, when the database is written \
                     back there"
                ),
                    false,
                );
            }
            Presence::Gone => {
                if !was_failed {
                    tracing::error!(
                        path = %p,
                        "store: the database file was deleted while the gateway had it open; restoring it from the \
                         open connection (look for what deleted it: a cleanup job, an `rm`, a volume replaced)"
                    );
                }
                match restore::write_back(conn, &path) {
                    Ok(file) => {
                        self.file = file;
                        self.reopen(conn);
                    }
                    Err(e) => self.fail(
                        format!(
                            "{p} was deleted and cannot be written back ({e}); writes are held (not \
                             acknowledged) and writing it back is tried again every second"
                        ),
                        false,
                    ),
                }
            }
        }
        was_failed && self.failure().is_none()
    }

    /// Closes the old connection and opens the written-back file.
    fn reopen(&mut self, conn: &mut Connection) {
        let path = self.file.path().to_path_buf();
        let p = path.display().to_string();
        match restore::reopen(conn, &path, self.open) {
            Ok(()) => {
                self.state = State::Healthy;
                tracing::warn!(
                    path = %p,
                    "store: the database file was restored at store.path from the open connection and locked \
                     again; nothing acknowledged was lost"
                );
            }
            Err(e) => self.fail(
                format!(
                    "{p} was written back but cannot be opened again ({e}); writes are held (not acknowledged) \
                     and opening it is tried again every second"
                ),
                true,
            ),
        }
    }

    /// Records the failure; logged when it is new.
    fn fail(&mut self, reason: String, detached: bool) {
        if self.failure() != Some(reason.as_str()) {
            tracing::error!(path = %self.file.path().display(), "store: {reason}");
        }
        self.state = State::Failed { reason, detached };
    }
}
