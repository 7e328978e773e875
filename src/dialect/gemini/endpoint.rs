//! Where a Gemini request was sent: `/{version}/models/{model}:{method}` — the model and method are in the path,
//! and `alt=sse` in the query asks for an SSE stream instead of one streamed JSON array.

use crate::context::models::MAX_MODEL_LEN;

/// The API versions ctxgate serves the Gemini API under (Gemini CLI and `@google/genai` use `v1beta`).
pub const VERSIONS: [&str; 3] = ["v1beta", "v1", "v1alpha"];

/// A model's method ctxgate manages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// `:generateContent`: one JSON answer.
    Generate,
    /// `:streamGenerateContent`: an SSE stream with `alt=sse`, else one JSON array sent as it is written.
    Stream,
    /// `:countTokens`.
    CountTokens,
}

impl Method {
    /// Its name in the path.
    pub fn as_str(self) -> &'static str {
        match self {
            Method::Generate => "generateContent",
            Method::Stream => "streamGenerateContent",
            Method::CountTokens => "countTokens",
        }
    }

    fn named(name: &str) -> Option<Method> {
        match name {
            "generateContent" => Some(Method::Generate),
            "streamGenerateContent" => Some(Method::Stream),
            "countTokens" => Some(Method::CountTokens),
            _ => None,
        }
    }
}

/// A parsed `/{version}/models/{model}:{method}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Endpoint<'a> {
    /// `v1beta`, `v1` or `v1alpha`.
    pub version: &'a str,
    /// The model, as in the path.
    pub model: &'a str,
    /// The method.
    pub method: Method,
}

impl<'a> Endpoint<'a> {
    /// The endpoint of `path` (from the root), when it is a managed method of a model under a served version: the
    /// model a non-empty name of at most `MAX_MODEL_LEN` bytes of letters, digits, `-`, `_` and `.`; the `:` may
    /// come percent-encoded (`%3A`).
    pub fn of(path: &'a str) -> Option<Endpoint<'a>> {
        let rest = path.strip_prefix('/')?;
        let (version, rest) = rest.split_once('/')?;
        if !VERSIONS.contains(&version) {
            return None;
        }
        let action = rest.strip_prefix("models/")?;
        let (model, method) = match action.rsplit_once(':') {
            Some(split) => split,
            None => {
                let at = action.to_ascii_lowercase().rfind("%3a")?;
                (&action[..at], &action[at + 3..])
            }
        };
        let model_ok = !model.is_empty()
            && model.len() <= MAX_MODEL_LEN
            && model
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
        let method = Method::named(method).filter(|_| model_ok)?;
        Some(Endpoint {
            version,
            model,
            method,
        })
    }

    /// Its path below the Gemini API's base URL (which has no version): `{version}/models/{model}:{method}`.
    pub fn upstream_path(&self) -> String {
        format!(
            "{}/models/{}:{}",
            self.version,
            self.model,
            self.method.as_str()
        )
    }
}

/// Whether the query asks for an SSE stream (`alt=sse`).
pub fn sse(query: Option<&str>) -> bool {
    query.is_some_and(|q| q.split('&').any(|p| p == "alt=sse"))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn model_and_method_come_from_the_path() {
        let e = Endpoint::of("/v1beta/models/gemini-2.5-flash:streamGenerateContent").unwrap();
        assert_eq!(
            (e.version, e.model, e.method),
            ("v1beta", "gemini-2.5-flash", Method::Stream)
        );
        assert_eq!(
            e.upstream_path(),
            "v1beta/models/gemini-2.5-flash:streamGenerateContent"
        );
        let e = Endpoint::of("/v1/models/gemini-2.0-flash%3AgenerateContent").unwrap();
        assert_eq!((e.model, e.method), ("gemini-2.0-flash", Method::Generate));
        assert_eq!(
            Endpoint::of("/v1beta/models/m:countTokens").unwrap().method,
            Method::CountTokens
        );
        for other in [
            "/v1/models/gpt-4o",
            "/v1/chat/completions",
            "/v1beta/models/m:embedContent",
            "/v1beta/models/:generateContent",
            "/v2/models/m:generateContent",
            "/v1beta/tunedModels/m:generateContent",
            "/v1beta/models/a/b:generateContent",
            "/v1beta/models/a%2Fb:generateContent",
        ] {
            assert_eq!(Endpoint::of(other), None, "{other}");
        }
        assert!(sse(Some("key=k&alt=sse")) && !sse(Some("alt=json")) && !sse(None));
    }
}
