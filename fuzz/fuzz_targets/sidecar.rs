//! The sidecar decoder: never panics; what it accepts re-encodes to a fixed point.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    brook_fuzz::sidecar(data);
});
