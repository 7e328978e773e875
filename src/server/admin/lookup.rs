//! Admin routes named by the id a client sent: `GET /admin/sessions/demo-2` finds `93050419df799ac3-demo-2` when
//! exactly one session has that raw id (any tenant, any dialect); otherwise a 404 listing the candidates or
//! pointing at `?q=`.

use super::failure::{store_error, AdminError};
use crate::app::AppState;
use crate::error::GatewayError;
use crate::session::identity::client_id_part;

/// Most candidates named in a 404.
const NAMED: usize = 10;

/// The stored session `id` names: `id` itself when it exists, else the one session whose id is a tenant's
/// prefix followed by `id` (as the gateway forms it: hashed when not plain, with a dialect's `.<dialect>`
/// scope allowed).
pub(super) async fn resolve(state: &AppState, id: String) -> Result<String, AdminError> {
    let store_error = |e| store_error(state, e);
    if state
        .sessions
        .entry(&id)
        .await
        .map_err(store_error)?
        .is_some()
    {
        return Ok(id);
    }
    let part = client_id_part(&id);
    let (found, _) = state
        .sessions
        .find(&format!("-{part}"), 1000, 0)
        .await
        .map_err(store_error)?;
    let mut candidates: Vec<String> = found
        .into_iter()
        .map(|m| m.id)
        .filter(|full| names(full, &part))
        .collect();
    match candidates.len() {
        1 => Ok(candidates.remove(0)),
        0 => Err(AdminError::Gateway(GatewayError::NotFound(format!(
            "no session {id:?}: session ids carry their tenant's prefix (`<prefix>-{part}`, as the answer's \
             x-ctxgate-session header names it); search with GET /admin/sessions?q={part}"
        )))),
        n => {
            candidates.truncate(NAMED);
            Err(AdminError::Gateway(GatewayError::NotFound(format!(
                "{n} sessions have the id {id:?} (one per tenant or dialect): {}; name one of them",
                candidates.join(", ")
            ))))
        }
    }
}

/// Whether the stored id `full` is `<tenant prefix>-<part>`, or that with a dialect scope (`.anthropic`, …).
fn names(full: &str, part: &str) -> bool {
    let Some((prefix, rest)) = full.split_once('-') else {
        return false;
    };
    let tenant = prefix == crate::session::tenant::ANONYMOUS
        || (prefix.len() == 16 && prefix.bytes().all(|b| b.is_ascii_hexdigit()));
    let scoped = rest.strip_prefix(part).is_some_and(|s| {
        s.is_empty()
            || crate::session::manager::DIALECT_NAMES
                .iter()
                .any(|d| s.strip_prefix('.') == Some(d))
    });
    tenant && scoped
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_raw_id_names_its_sessions_only() {
        use super::names;
        assert!(names("93050419df799ac3-demo-2", "demo-2"));
        assert!(names("anonymous-demo-2", "demo-2"));
        assert!(names("93050419df799ac3-demo-2.anthropic", "demo-2"));
        assert!(
            !names("93050419df799ac3-x-demo-2", "demo-2"),
            "another id ending alike"
        );
        assert!(!names("93050419df799ac3-demo-22", "demo-2"));
        assert!(!names("93050419df799ac3-demo-2.other", "demo-2"));
        assert!(!names("9305-demo-2", "demo-2"), "not a tenant prefix");
    }
}
