//! Dialects: the wire formats ctxgate speaks (OpenAI chat completions, Anthropic Messages). A dialect parses a
//! request body into the neutral conversation (`crate::message`), renders a rewritten conversation back into its
//! own bytes, and knows its answers: reply assembly, SSE events, errors and usage. Nothing outside `dialect/`
//! knows a wire format.

pub mod anthropic;
