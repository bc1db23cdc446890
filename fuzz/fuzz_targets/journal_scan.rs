//! Recovery's journal scan over arbitrary file contents: never panics, never reads past the file.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    brook_fuzz::journal_scan(data);
});
