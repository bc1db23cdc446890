//! Integration tests through brook's public API, in one binary.

mod engine;
