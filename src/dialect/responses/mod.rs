//! The OpenAI Responses dialect (`POST /v1/responses`).

pub mod assemble;
pub mod errors;
pub mod rounds;
pub mod splice;
