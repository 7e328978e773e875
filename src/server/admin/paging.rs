//! `limit` and `offset` of the admin API's pages, checked: a page size within bounds and an offset the stores can
//! seek to (at most `i64::MAX`), else 400 naming the parameter, never a silently different page.

use crate::error::GatewayError;

/// Sessions per page unless `limit` says otherwise.
pub const DEFAULT_LIMIT: u32 = 50;

/// Largest offset: the stores count rows in `i64`.
const MAX_OFFSET: u64 = i64::MAX as u64;

/// The page asked for: `limit` (default [`DEFAULT_LIMIT`], at most `max_limit`) and `offset` (default 0).
pub fn page(
    limit: Option<&str>,
    offset: Option<&str>,
    max_limit: u32,
) -> Result<(u32, u64), GatewayError> {
    page_of(limit, offset, DEFAULT_LIMIT, max_limit)
}

/// [`page`] with a default page size of its own (at most `max_limit`).
pub fn page_of(
    limit: Option<&str>,
    offset: Option<&str>,
    default_limit: u32,
    max_limit: u32,
) -> Result<(u32, u64), GatewayError> {
    let limit = match limit {
        None => default_limit.min(max_limit),
        Some(s) => s
            .parse::<u32>()
            .ok()
            .filter(|n| (1..=max_limit).contains(n))
            .ok_or_else(|| GatewayError::BadRequest {
                message: format!(
                    "limit: {:?} is not a page size from 1 to {max_limit}",
                    shorten(s)
                ),
                param: Some("limit"),
            })?,
    };
    let offset = match offset {
        None => 0,
        Some(s) => s
            .parse::<u64>()
            .ok()
            .filter(|n| *n <= MAX_OFFSET)
            .ok_or_else(|| GatewayError::BadRequest {
                message: format!(
                    "offset: {:?} is not a whole number from 0 to {MAX_OFFSET}",
                    shorten(s)
                ),
                param: Some("offset"),
            })?,
    };
    Ok((limit, offset))
}

/// A query string that does not parse at all (a parameter twice, bad percent-encoding): 400 in the gateway's
/// error shape.
pub fn bad_query(e: &axum::extract::rejection::QueryRejection) -> GatewayError {
    GatewayError::bad_request(format!(
        "the query string is not understood: {}",
        e.body_text()
    ))
}

/// At most 40 characters of a parameter, to repeat in an error.
fn shorten(s: &str) -> String {
    s.chars().take(40).collect()
}

#[cfg(test)]
mod tests {
    use super::page;

    #[test]
    fn pages_within_bounds_and_400_beyond() {
        assert_eq!(page(None, None, 1000).unwrap(), (50, 0));
        assert_eq!(page(None, None, 20).unwrap(), (20, 0));
        assert_eq!(page(Some("1000"), Some("7"), 1000).unwrap(), (1000, 7));
        assert_eq!(
            page(None, Some("9223372036854775807"), 1000).unwrap(),
            (50, i64::MAX as u64)
        );
        for (limit, offset, param) in [
            (Some("0"), None, "limit"),
            (Some("1001"), None, "limit"),
            (Some("4294967296"), None, "limit"),
            (Some("-1"), None, "limit"),
            (Some("ten"), None, "limit"),
            (None, Some("9223372036854775808"), "offset"),
            (None, Some("18446744073709551615"), "offset"),
            (None, Some("18446744073709551616"), "offset"),
            (None, Some("-1"), "offset"),
            (None, Some("1e3"), "offset"),
            (None, Some(""), "offset"),
        ] {
            let e = page(limit, offset, 1000).unwrap_err();
            assert_eq!(e.status(), 400);
            assert_eq!(e.body()["error"]["param"], param, "{limit:?} {offset:?}");
            assert!(e.to_string().starts_with(param), "{e}");
        }
    }
}
