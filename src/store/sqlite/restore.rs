//! Writing a deleted database file back: the open connection still reads the whole unlinked file and its WAL, so
//! `VACUUM INTO` copies it to a temporary file beside `store.path`, which is synced, linked into place (never over
//! a file that appeared there meanwhile) and locked; the worker then closes the old connection and opens the new
//! file ([`reopen`]).

use super::file::{DbFile, FileId};
use rusqlite::Connection;
use std::ffi::OsString;
use std::io;
use std::path::{Path, PathBuf};

/// `path` with `suffix` appended to its file name (`ctxgate.db` → `ctxgate.db-wal`).
pub(super) fn beside(path: &Path, suffix: &str) -> PathBuf {
    let mut p: OsString = path.as_os_str().to_owned();
    p.push(suffix);
    PathBuf::from(p)
}

/// Copies what `conn` holds to `path` (where nothing is) and locks it; says why not when it cannot.
pub(super) fn write_back(conn: &Connection, path: &Path) -> Result<DbFile, String> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    }
    let tmp = beside(path, ".restoring");
    remove_if_there(&tmp).map_err(|e| format!("cannot remove {}: {e}", tmp.display()))?;
    let linked = copy_to(conn, &tmp).and_then(|id| link(&tmp, path).map(|()| id));
    // The temporary name goes whatever happened (once linked, the file lives on under `path`).
    let _ = remove_if_there(&tmp);
    let id = linked?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        // The new name is durable too (best effort: not every system syncs a folder).
        let _ = std::fs::File::open(dir).and_then(|d| d.sync_all());
    }
    let file = DbFile::lock(path).map_err(|e| e.to_string())?;
    if file.id() != id {
        return Err(format!(
            "{} was replaced while it was being written back",
            path.display()
        ));
    }
    Ok(file)
}

/// `VACUUM INTO` `tmp`, synced; the new file's identity.
fn copy_to(conn: &Connection, tmp: &Path) -> Result<FileId, String> {
    let name = tmp
        .to_str()
        .ok_or_else(|| format!("{} is not a UTF-8 path", tmp.display()))?;
    conn.execute("VACUUM INTO ?1", [name])
        .map_err(|e| format!("cannot copy the open database to {name}: {e}"))?;
    let f = std::fs::File::open(tmp).map_err(|e| format!("cannot open {name}: {e}"))?;
    f.sync_all()
        .map_err(|e| format!("cannot sync {name}: {e}"))?;
    let m = f
        .metadata()
        .map_err(|e| format!("cannot read {name}: {e}"))?;
    Ok(FileId::of(&m))
}

/// Gives `tmp` the name `path` unless something is there: a hard link (atomic, refused over an existing file), or
/// where links are not supported a rename after checking that nothing is there.
fn link(tmp: &Path, path: &Path) -> Result<(), String> {
    let taken = || {
        format!(
            "another file appeared at {} meanwhile; it is left alone",
            path.display()
        )
    };
    match std::fs::hard_link(tmp, path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Err(taken()),
        Err(_) if std::fs::symlink_metadata(path).is_ok() => Err(taken()),
        Err(_) => std::fs::rename(tmp, path)
            .map_err(|e| format!("cannot move the copy to {}: {e}", path.display())),
    }
}

fn remove_if_there(p: &Path) -> io::Result<()> {
    match std::fs::remove_file(p) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Closes `conn` (the old file's connection, replaced by an in-memory placeholder) and opens `path` in its place,
/// with `open`. The old connection is closed first: closing it deletes `<path>-wal` and `<path>-shm` by name; any
/// left over are the old file's and are removed (the new file is locked by this process, so no other gateway uses
/// them) before the new file is opened, which would otherwise read the old file's log as its own.
pub(super) fn reopen(
    conn: &mut Connection,
    path: &Path,
    open: impl FnOnce(&Path) -> Result<Connection, String>,
) -> Result<(), String> {
    let placeholder = Connection::open_in_memory().map_err(|e| e.to_string())?;
    let old = std::mem::replace(conn, placeholder);
    if let Err((_, e)) = old.close() {
        tracing::warn!(error = %e, "store: closing the deleted database's connection failed");
    }
    for suffix in ["-wal", "-shm"] {
        let p = beside(path, suffix);
        remove_if_there(&p).map_err(|e| format!("cannot remove {}: {e}", p.display()))?;
    }
    *conn = open(path)?;
    Ok(())
}
