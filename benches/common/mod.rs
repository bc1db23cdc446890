//! Helpers shared by brook's criterion benches (not a bench target itself: `benches/common/`).
#![expect(dead_code, reason = "each bench uses only some of the helpers")]

use std::path::{Path, PathBuf};
use std::time::Duration;

use brook::{CreateOptions, Durability, Options, Store, StreamName};

/// `true` when the slow, large cases (100k streams, 64 MiB streams, 1 GiB journal) should run.
pub fn big() -> bool {
    std::env::var("BROOK_BENCH_BIG").is_ok_and(|v| !v.is_empty() && v != "0")
}

/// A directory on the real disk (fsync must reach the device; `/tmp` may be tmpfs elsewhere).
/// `BROOK_BENCH_DIR` overrides the parent directory; the default is the system temp dir.
pub fn tempdir() -> tempfile::TempDir {
    match std::env::var_os("BROOK_BENCH_DIR") {
        Some(p) => {
            std::fs::create_dir_all(&p).expect("create BROOK_BENCH_DIR");
            tempfile::tempdir_in(p).expect("tempdir")
        }
        None => tempfile::tempdir().expect("tempdir"),
    }
}

pub fn name(s: &str) -> StreamName {
    StreamName::new(s).expect("valid name")
}

pub fn options(d: Durability) -> Options {
    Options::default().with_durability(d)
}

pub fn mode_name(d: Durability) -> &'static str {
    match d {
        Durability::Sync => "sync",
        Durability::Buffered => "buffered",
    }
}

/// Creates `names` with `threads` threads submitting creates concurrently (so that in Sync mode
/// creates share syncs), waiting for every one.
pub fn create_many(store: &Store, names: &[StreamName], content_type: &str, threads: usize) {
    let per = names.len().div_ceil(threads.max(1));
    std::thread::scope(|sc| {
        for chunk in names.chunks(per.max(1)) {
            let store = store.clone();
            sc.spawn(move || {
                // Submit a window of creates, then wait for them, so many are in flight at once.
                for window in chunk.chunks(64) {
                    let pending: Vec<_> = window
                        .iter()
                        .map(|n| {
                            let req = CreateOptions::with_content_type(content_type);
                            store.submit_create(n, req).expect("create")
                        })
                        .collect();
                    for p in pending {
                        p.wait().expect("create durable");
                    }
                }
            });
        }
    });
}

/// Copies a directory tree (as the files stood), skipping the `LOCK` file at its top: the state
/// a crashed process leaves for the next one to open.
pub fn copy_crashed(from: &Path, to: &Path) {
    let status = std::process::Command::new("cp")
        .arg("-a")
        .arg(format!("{}/.", from.display()))
        .arg(to)
        .status()
        .expect("run cp");
    assert!(status.success(), "cp failed");
    let _ = std::fs::remove_file(to.join("LOCK"));
}

/// Bytes of all files under `dir`.
pub fn du(dir: &Path) -> u64 {
    let mut total = 0;
    let mut stack: Vec<PathBuf> = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        if let Ok(rd) = std::fs::read_dir(&d) {
            for e in rd.flatten() {
                match e.file_type() {
                    Ok(t) if t.is_dir() => stack.push(e.path()),
                    Ok(_) => total += e.metadata().map_or(0, |m| m.len()),
                    Err(_) => {}
                }
            }
        }
    }
    total
}

/// Criterion settings for these benches: small samples, a few seconds each, overridable with
/// `BROOK_BENCH_SECS` (measurement time per case).
pub fn quick(c: criterion::Criterion) -> criterion::Criterion {
    let secs: u64 = std::env::var("BROOK_BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    c.sample_size(10)
        .measurement_time(Duration::from_secs(secs))
        .warm_up_time(Duration::from_secs(1))
}
