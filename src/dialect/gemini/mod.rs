//! The Gemini API dialect (`POST /v1beta/models/{model}:generateContent`, `:streamGenerateContent`,
//! `:countTokens`): where a request was sent (`endpoint.rs`).

pub mod endpoint;
