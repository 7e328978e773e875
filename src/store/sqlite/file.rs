//! The database file's exclusive lock and identity: an advisory `flock` on the database file itself, held as long
//! as a store has the file open, and the file's device and inode, by which the worker tells whether the file at
//! `store.path` is still the one it has open.
//!
//! The lock is taken on the database file, not on a `.lock` file beside it (`rm ctxgate.db*` would take that one
//! too). A lock lives on the inode: once the file is deleted it guards nothing, so the worker that writes the
//! database back locks the new file (`restore`). `flock` locks are apart from the POSIX record locks SQLite takes
//! on the same file; the descriptor holding one is only closed once the connection is (closing any descriptor of
//! a file drops the process's POSIX locks on it, SQLite's among them), and a file this process holds already is
//! not opened again: stores of one process opened on one file (a test restarting a gateway in-process) share its
//! lock. Where `flock` is not supported (some network or FUSE file systems) the store runs unlocked, with a
//! warning.

use super::err;
use crate::store::StoreError;
use std::fs::{File, Metadata, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};

/// A file's device and inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct FileId {
    dev: u64,
    ino: u64,
}

impl FileId {
    pub(super) fn of(m: &Metadata) -> FileId {
        #[cfg(unix)]
        {
            use std::os::unix::fs::MetadataExt;
            FileId {
                dev: m.dev(),
                ino: m.ino(),
            }
        }
        #[cfg(not(unix))]
        {
            // Elsewhere files are not told apart (an open file cannot be deleted on Windows): only a missing one.
            let _ = m;
            FileId { dev: 0, ino: 0 }
        }
    }
}

/// The locks this process holds, by file (entries of dropped locks are pruned as new ones are taken).
static HELD: parking_lot::Mutex<Vec<(FileId, Weak<File>)>> = parking_lot::Mutex::new(Vec::new());

/// A locked database file: its path, its identity, and the descriptor holding the lock (released when the last
/// store of this process holding it drops it).
pub(super) struct DbFile {
    path: PathBuf,
    id: FileId,
    _lock: Arc<File>,
}

/// What is at the path now.
pub(super) enum Presence {
    /// The file the store has open.
    Same,
    /// Nothing (the file, or a folder above it, is gone).
    Gone,
    /// Another file.
    Other,
    /// Cannot tell (say, a folder above it is not readable); nothing is done about it.
    Unknown(io::Error),
}

impl DbFile {
    /// Opens (creating it when missing) and locks the file at `path`; refused when another process holds it.
    pub(super) fn lock(path: &Path) -> Result<DbFile, StoreError> {
        let p = path.display();
        let mut held = HELD.lock();
        held.retain(|(_, w)| w.strong_count() > 0);
        // Held by this process already: shared, without opening (and later closing) another descriptor.
        if let Ok(m) = std::fs::metadata(path) {
            let id = FileId::of(&m);
            if let Some(lock) = held
                .iter()
                .find(|(i, _)| *i == id)
                .and_then(|(_, w)| w.upgrade())
            {
                return Ok(DbFile {
                    path: path.to_path_buf(),
                    id,
                    _lock: lock,
                });
            }
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(|e| err(format!("cannot open {p}: {e}")))?;
        let id = FileId::of(
            &file
                .metadata()
                .map_err(|e| err(format!("cannot read {p}: {e}")))?,
        );
        match try_lock(&file) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                return Err(err(format!(
                    "{p} is held by another process (another `ctxgate serve`, or a `ctxgate sessions` command \
                     that writes, on the same store.path): two gateways on one SQLite file would each serve its \
                     sessions from their own cache and overwrite each other's turns. Stop that process, or give \
                     this one a store.path of its own"
                )))
            }
            Err(e) => tracing::warn!(
                path = %p,
                error = %e,
                "store: the file system does not lock files; nothing keeps a second gateway off this database"
            ),
        }
        let lock = Arc::new(file);
        held.push((id, Arc::downgrade(&lock)));
        Ok(DbFile {
            path: path.to_path_buf(),
            id,
            _lock: lock,
        })
    }

    pub(super) fn path(&self) -> &Path {
        &self.path
    }

    pub(super) fn id(&self) -> FileId {
        self.id
    }

    /// What is at the path now: one `stat`.
    pub(super) fn presence(&self) -> Presence {
        match std::fs::metadata(&self.path) {
            Ok(m) if FileId::of(&m) == self.id => Presence::Same,
            Ok(_) => Presence::Other,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::NotFound | io::ErrorKind::NotADirectory
                ) =>
            {
                Presence::Gone
            }
            Err(e) => Presence::Unknown(e),
        }
    }
}

#[cfg(unix)]
fn try_lock(file: &File) -> io::Result<()> {
    rustix::fs::flock(file, rustix::fs::FlockOperation::NonBlockingLockExclusive)
        .map_err(io::Error::from)
}

#[cfg(not(unix))]
fn try_lock(_: &File) -> io::Result<()> {
    Err(io::Error::new(io::ErrorKind::Unsupported, "no flock here"))
}
