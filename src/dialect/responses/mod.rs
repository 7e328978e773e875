//! The OpenAI Responses dialect (`POST /v1/responses`): its input items converted to the neutral conversation and
//! rendered back with every untouched item borrowed, the request check and the validator of rewrites, its answers
//! (reply assembly, recall-round splicing, errors).

pub mod assemble;
pub mod convert;
pub mod errors;
pub mod from_chat;
mod rebuild;
pub mod request;
pub mod rounds;
pub mod splice;
pub mod unmanaged;
pub mod validate;

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests;
