//! Operation sequences against a fresh store and a model: never panics; every outcome is the
//! model's; reads return exactly what was appended, across reopens.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let dir = tempfile::tempdir().expect("temporary directory");
    let mut run = brook_fuzz::Ops::open(dir.path()).expect("open a fresh store");
    run.run("f", data);
});
