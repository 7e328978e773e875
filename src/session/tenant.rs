//! The tenant of a request: an HMAC-SHA256, under a per-install secret, of every credential header it carries
//! (name and value); `anonymous` when it carries none. Without the secret, stored tenant hashes cannot be
//! brute-forced back to API keys.

use crate::config::{StoreBackend, StoreConfig};
use hmac::{Hmac, Mac};
use http::HeaderMap;
use parking_lot::Mutex;
use sha2::Sha256;
use std::collections::HashMap;
use std::fmt;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The headers that authenticate a caller, in the fixed order they are hashed: OpenAI's `authorization`,
/// Anthropic's `x-api-key`, Azure OpenAI's `api-key`, Google's `x-goog-api-key`.
pub const CREDENTIAL_HEADERS: &[&str] =
    &["authorization", "x-api-key", "api-key", "x-goog-api-key"];

/// The tenant of callers that send no credential header (e.g. clients of a gateway that adds `upstream.api_key`
/// for them). Never a hex hash, so no keyed tenant can take it, nor its id prefix.
pub const ANONYMOUS: &str = "anonymous";

/// The secret's file name, beside the SQLite database.
pub const SECRET_FILE: &str = "ctxgate.secret";

/// Bytes of secret.
const SECRET_LEN: usize = 32;

/// The per-install secret that keys tenant hashes (held as the HMAC state it keys), with the tenants of the
/// credentials seen lately: a caller sends the same key on every request, and its HMAC is then a map lookup.
#[derive(Clone)]
pub struct TenantKey {
    mac: Hmac<Sha256>,
    seen: Arc<Mutex<HashMap<Box<[u8]>, String>>>,
}

/// Most credential sets whose tenant is remembered; the memo starts over when it is full. Process memory only:
/// credentials are never stored, logged or exported.
const SEEN_MAX: usize = 4096;

impl fmt::Debug for TenantKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("TenantKey(***)")
    }
}

/// Why the secret could not be read or created.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    /// The operating system's random source failed.
    #[error("no randomness for the tenant secret: {0}")]
    Random(String),
    /// The key was refused by HMAC (never, for HMAC takes keys of any length).
    #[error("tenant secret unusable: {0}")]
    Key(String),
    /// Reading or creating the secret shared in Redis failed.
    #[error("tenant secret in Redis: {0}")]
    Shared(String),
    /// Reading, creating or writing the file failed.
    #[error("tenant secret {path}: {message}")]
    File {
        /// The secret's path.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
}

impl TenantKey {
    /// A key from known bytes (the secret file's, or fixed ones in tests and benchmarks).
    pub fn from_bytes(secret: [u8; SECRET_LEN]) -> Result<Self, SecretError> {
        // HMAC takes keys of any length; the error cannot happen, but is not unwrapped.
        let mac =
            Hmac::<Sha256>::new_from_slice(&secret).map_err(|e| SecretError::Key(e.to_string()))?;
        Ok(TenantKey {
            mac,
            seen: Arc::default(),
        })
    }

    /// A fresh random key.
    pub fn random() -> Result<Self, SecretError> {
        let mut secret = [0u8; SECRET_LEN];
        getrandom::fill(&mut secret).map_err(|e| SecretError::Random(e.to_string()))?;
        Self::from_bytes(secret)
    }

    /// The key of a store: for SQLite, read from [`SECRET_FILE`] beside the database (created on first start);
    /// for Redis, kept in Redis and shared by every instance; for the memory backend, whose sessions die with the process, a random key per process.
    pub fn for_store(store: &StoreConfig) -> Result<Self, SecretError> {
        match store.backend {
            StoreBackend::Memory => Self::random(),
            StoreBackend::Sqlite => Self::load_or_create(&secret_path(&store.path)),
            StoreBackend::Redis => Self::shared_in_redis(store),
        }
    }

    /// The secret every instance on one Redis shares (so that they agree on tenants and session ids), kept in Redis
    /// beside the sessions it keys: created by the first instance to start.
    fn shared_in_redis(store: &StoreConfig) -> Result<Self, SecretError> {
        let mut fresh = [0u8; SECRET_LEN];
        getrandom::fill(&mut fresh).map_err(|e| SecretError::Random(e.to_string()))?;
        let text = crate::store::RedisStore::shared_secret(store, &hex::encode(fresh))
            .map_err(|e| SecretError::Shared(e.to_string()))?;
        Self::from_bytes(parse_secret(text.as_bytes()).map_err(|m| SecretError::Shared(m.into()))?)
    }

    /// Reads the secret at `path`, or creates it (32 random bytes, hex, mode 0600) when there is none. A file
    /// that exists but does not hold a secret is an error, never replaced: that would orphan every session.
    pub fn load_or_create(path: &Path) -> Result<Self, SecretError> {
        let fail = |message: String| SecretError::File {
            path: path.to_path_buf(),
            message,
        };
        match std::fs::read(path) {
            Ok(text) => return Self::from_bytes(parse_secret(&text).map_err(|m| fail(m.into()))?),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(fail(format!("cannot read it: {e}"))),
        }
        let mut secret = [0u8; SECRET_LEN];
        getrandom::fill(&mut secret).map_err(|e| SecretError::Random(e.to_string()))?;
        let key = Self::from_bytes(secret)?;
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)
                .map_err(|e| fail(format!("cannot create its folder: {e}")))?;
        }
        match write_new(path, &secret) {
            Ok(()) => {
                tracing::info!(path = %path.display(), "created the tenant secret (keep it with the database)");
                Ok(key)
            }
            // Another process created it first: use theirs.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                let text = std::fs::read(path).map_err(|e| fail(format!("cannot read it: {e}")))?;
                Self::from_bytes(parse_secret(&text).map_err(|m| fail(m.into()))?)
            }
            Err(e) => Err(fail(format!("cannot create it: {e}"))),
        }
    }

    /// The tenant of a request: `HMAC-SHA256(secret, credentials)` in hex over every [`CREDENTIAL_HEADERS`]
    /// value present (name and value, in that fixed order), or [`ANONYMOUS`] when there is none.
    pub fn tenant(&self, headers: &HeaderMap) -> String {
        // Length-prefixed fields: no two different header sets hash the same input.
        let mut input = Vec::new();
        for name in CREDENTIAL_HEADERS {
            for value in headers.get_all(*name) {
                for field in [name.as_bytes(), value.as_bytes()] {
                    input.extend_from_slice(&(field.len() as u64).to_be_bytes());
                    input.extend_from_slice(field);
                }
            }
        }
        if input.is_empty() {
            return ANONYMOUS.to_string();
        }
        if let Some(t) = self.seen.lock().get(input.as_slice()) {
            return t.clone();
        }
        let mut mac = self.mac.clone();
        mac.update(&input);
        let tenant = hex::encode(mac.finalize().into_bytes());
        let mut seen = self.seen.lock();
        if seen.len() >= SEEN_MAX {
            seen.clear();
        }
        seen.insert(input.into_boxed_slice(), tenant.clone());
        tenant
    }
}

/// The secret of a store, in hex (created when it has none yet), for moving its sessions to another store.
pub fn store_secret_hex(store: &StoreConfig) -> Result<String, SecretError> {
    match store.backend {
        StoreBackend::Memory => Err(SecretError::Key(
            "the memory store keeps no secret (nothing outlives the process)".into(),
        )),
        StoreBackend::Sqlite => {
            let path = secret_path(&store.path);
            TenantKey::load_or_create(&path)?;
            let text = std::fs::read(&path).map_err(|e| SecretError::File {
                path: path.clone(),
                message: format!("cannot read it: {e}"),
            })?;
            let secret = parse_secret(&text).map_err(|m| SecretError::File {
                path,
                message: m.into(),
            })?;
            Ok(hex::encode(secret))
        }
        StoreBackend::Redis => {
            let mut fresh = [0u8; SECRET_LEN];
            getrandom::fill(&mut fresh).map_err(|e| SecretError::Random(e.to_string()))?;
            crate::store::RedisStore::shared_secret(store, &hex::encode(fresh))
                .map_err(|e| SecretError::Shared(e.to_string()))
        }
    }
}

/// Gives `store` the secret `secret_hex` when it has none yet (sessions moved there keep their tenants and ids); an
/// error when it already has another one (its own sessions would no longer match their callers).
pub fn adopt_secret(store: &StoreConfig, secret_hex: &str) -> Result<(), SecretError> {
    let secret = parse_secret(secret_hex.as_bytes()).map_err(|m| SecretError::Key(m.into()))?;
    let other = || {
        SecretError::Key(
            "the target store already has another tenant secret: its sessions and the moved ones cannot share it \
             (move into an empty store)"
                .into(),
        )
    };
    match store.backend {
        StoreBackend::Memory => Err(SecretError::Key(
            "the memory store keeps nothing to move sessions into".into(),
        )),
        StoreBackend::Sqlite => {
            let path = secret_path(&store.path);
            if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::create_dir_all(dir).map_err(|e| SecretError::File {
                    path: path.clone(),
                    message: format!("cannot create its folder: {e}"),
                })?;
            }
            match write_new(&path, &secret) {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    let text = std::fs::read(&path).map_err(|e| SecretError::File {
                        path: path.clone(),
                        message: format!("cannot read it: {e}"),
                    })?;
                    match parse_secret(&text) {
                        Ok(s) if s == secret => Ok(()),
                        _ => Err(other()),
                    }
                }
                Err(e) => Err(SecretError::File {
                    path,
                    message: format!("cannot create it: {e}"),
                }),
            }
        }
        StoreBackend::Redis => {
            let kept = crate::store::RedisStore::shared_secret(store, secret_hex)
                .map_err(|e| SecretError::Shared(e.to_string()))?;
            match parse_secret(kept.as_bytes()) {
                Ok(s) if s == secret => Ok(()),
                _ => Err(other()),
            }
        }
    }
}

/// Where the secret of the SQLite database at `db` lives: [`SECRET_FILE`] in the same folder.
pub fn secret_path(db: &Path) -> PathBuf {
    match db.parent() {
        Some(dir) => dir.join(SECRET_FILE),
        None => PathBuf::from(SECRET_FILE),
    }
}

fn parse_secret(text: &[u8]) -> Result<[u8; SECRET_LEN], &'static str> {
    let hex_text = std::str::from_utf8(text)
        .map_err(|_| "not a ctxgate secret (expected 64 hex digits)")?
        .trim();
    let bytes =
        hex::decode(hex_text).map_err(|_| "not a ctxgate secret (expected 64 hex digits)")?;
    let secret: [u8; SECRET_LEN] = bytes
        .try_into()
        .map_err(|_| "not a ctxgate secret (expected 64 hex digits)")?;
    Ok(secret)
}

/// Creates `path` (failing if it exists), readable by its owner only, holding the secret in hex.
fn write_new(path: &Path, secret: &[u8; SECRET_LEN]) -> std::io::Result<()> {
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
    let mut f = opts.open(path)?;
    let written = f
        .write_all(format!("{}\n", hex::encode(secret)).as_bytes())
        .and_then(|()| f.sync_all());
    if let Err(e) = written {
        // Never leave a half-written secret behind: the next start would refuse it.
        let _ = std::fs::remove_file(path);
        return Err(e);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use sha2::Digest;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        h
    }

    #[test]
    fn every_credential_header_counts_and_none_is_anonymous() {
        let k = TenantKey::from_bytes([7; 32]).unwrap();
        assert_eq!(k.tenant(&headers(&[("content-type", "x")])), ANONYMOUS);
        let mut seen = std::collections::HashSet::new();
        for name in CREDENTIAL_HEADERS {
            let a = k.tenant(&headers(&[(name, "key-a")]));
            let b = k.tenant(&headers(&[(name, "key-b")]));
            assert_ne!(a, b, "{name}: different keys, different tenants");
            assert_eq!(a, k.tenant(&headers(&[(name, "key-a")])), "{name}: stable");
            assert_eq!(a.len(), 64);
            assert!(seen.insert(a), "{name}: the header's name counts too");
        }
        // several credentials: all of them count, whatever order they came in
        let both = k.tenant(&headers(&[
            ("authorization", "Bearer x"),
            ("x-api-key", "y"),
        ]));
        let swapped = k.tenant(&headers(&[
            ("x-api-key", "y"),
            ("authorization", "Bearer x"),
        ]));
        assert_eq!(both, swapped);
        assert_ne!(both, k.tenant(&headers(&[("authorization", "Bearer x")])));
        assert_ne!(both, k.tenant(&headers(&[("x-api-key", "y")])));
        assert_ne!(
            both,
            k.tenant(&headers(&[
                ("authorization", "Bearer x"),
                ("x-api-key", "z")
            ]))
        );
    }

    #[test]
    fn remembered_tenants_are_the_computed_ones_and_the_memo_is_bounded() {
        let warm = TenantKey::from_bytes([9; 32]).unwrap();
        for i in 0..SEEN_MAX + 10 {
            let h = headers(&[("authorization", &format!("Bearer sk-{i}"))]);
            let first = warm.tenant(&h);
            assert_eq!(first, warm.tenant(&h), "a remembered tenant is the same");
            let cold = TenantKey::from_bytes([9; 32]).unwrap();
            if i % 997 == 0 {
                assert_eq!(
                    first,
                    cold.tenant(&h),
                    "the memo does not change the answer"
                );
            }
            assert!(warm.seen.lock().len() <= SEEN_MAX);
        }
        // a clone shares the memo; another secret has its own
        let h = headers(&[("x-api-key", "k")]);
        let t = warm.clone().tenant(&h);
        assert!(warm
            .seen
            .lock()
            .contains_key(b"\0\0\0\0\0\0\0\tx-api-key\0\0\0\0\0\0\0\x01k".as_slice()));
        assert_ne!(t, TenantKey::from_bytes([8; 32]).unwrap().tenant(&h));
    }

    #[test]
    fn the_hash_is_keyed() {
        let h = headers(&[("authorization", "Bearer sk-1")]);
        let a = TenantKey::from_bytes([1; 32]).unwrap().tenant(&h);
        let b = TenantKey::from_bytes([2; 32]).unwrap().tenant(&h);
        assert_ne!(a, b, "another install, another tenant hash");
        for plain in [&b"Bearer sk-1"[..], b"sk-1"] {
            assert_ne!(a, hex::encode(sha2::Sha256::digest(plain)));
        }
    }

    #[test]
    fn the_secret_file_is_created_private_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = secret_path(&dir.path().join("sub/ctx.db"));
        assert_eq!(path, dir.path().join("sub").join(SECRET_FILE));
        let h = headers(&[("x-api-key", "k")]);
        let first = TenantKey::load_or_create(&path).unwrap().tenant(&h);
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.trim().len(), 64);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        assert_eq!(TenantKey::load_or_create(&path).unwrap().tenant(&h), first);
        std::fs::write(&path, "garbage").unwrap();
        let e = TenantKey::load_or_create(&path).unwrap_err().to_string();
        assert!(e.contains("not a ctxgate secret"), "{e}");
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            "garbage",
            "never replaced"
        );
    }
}
