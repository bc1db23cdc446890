//! In-process router tests.
