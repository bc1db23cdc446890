//! Integration tests through brook's public API, in one binary.

mod engine;
mod model;
mod util;
#[cfg(all(feature = "client", feature = "http"))]
mod client_crash;
#[cfg(all(feature = "client", feature = "http"))]
mod client_recipes;
