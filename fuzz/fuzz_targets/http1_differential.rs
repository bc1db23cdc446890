//! brook's HTTP/1.1 loop against hyper's on one connection's bytes: the same requests framed
//! the same way (method, target, headers, body) and the same statuses answered, or a panic
//! with both (`brook::fuzzing::Http1Check`). `src/bin/differential.rs` runs the same check on
//! generated inputs with a stable toolchain.
#![no_main]

use std::sync::OnceLock;

/// One check for the process, over a store in a directory kept until the process ends.
fn check() -> &'static brook::fuzzing::Http1Check {
    static CHECK: OnceLock<(tempfile::TempDir, brook::fuzzing::Http1Check)> = OnceLock::new();
    &CHECK
        .get_or_init(|| {
            let dir = tempfile::tempdir().expect("a temporary directory");
            let store = brook::Store::open(dir.path(), brook::Options::default()).expect("a store");
            (dir, brook::fuzzing::Http1Check::new(store))
        })
        .1
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    check().check(data);
});
