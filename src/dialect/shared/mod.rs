//! What the dialects that convert to the neutral form (Anthropic, Responses, Gemini) share: the text a model reads in
//! an opaque value, the top-level checks every rewrite of a client's body must pass, rendering a rewrite back by
//! client message (`render.rs`), the adapter of their stream splicers to the dialect-neutral `Splice`, and (tests
//! only) the property tests' harness and common generators.

pub mod fields;
pub mod render;
pub mod splice;
#[cfg(test)]
pub mod test_support;
mod text;

pub use fields::{check_fields, conversation};
pub use splice::{RoundEnd, Spliced, StreamSplice};
pub use text::opaque_text;
