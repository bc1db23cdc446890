//! Open time of a store:
//! * `crash/journal/{size}`: after a crash with `size` of 4 KiB appends in the journal
//!   (checkpoints put off by a 16 GiB `checkpoint_bytes`), so the open replays all of it.
//!   Bytes/s of journal.
//! * `crash/created/{n}`: after a crash right after creating `n` streams with default options
//!   (the journal holds what came after the last checkpoint: a shard checkpoints at the latest
//!   when `max_open_streams / (2 * shards)` of its streams are dirty). Elements/s = streams/s.
//! * `crash/checkpointed/{n}`: `n` checkpointed streams on disk, then one append on each of 1000
//!   of them before the crash. Elements/s counts the `n` streams on disk.
//! * `crash/churn/{n}`: after a crash with `n` streams created, appended to and deleted since
//!   the last checkpoint (the journal holds only churn). Elements/s = deleted streams/s.
//! * `clean/{n}`: `n` streams on disk after a clean shutdown.
//!
//! A crash image is made by a child process (this binary, re-run with `BROOK_RECOVER_CHILD`)
//! that writes and then exits without shutting the store down: the files stand as a killed
//! process leaves them (Buffered writes are in the journal file). Each timed open works on a
//! fresh copy of the image, `sync`ed first so the open's own checkpoint does not pay for
//! writing back the copy; the copy is warm in the page cache (a warm restart).
//!
//! `cargo bench --bench recover`. Defaults: 256 MiB journal, 10k streams. `BROOK_BENCH_BIG=1`:
//! 1 GiB journal and 100k streams (slow: minutes, mostly copying directories between samples).

#![expect(missing_docs, reason = "criterion_group! generates undocumented items")]

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use brook::{AppendRequest, Durability, Options, Store, StreamName};
use bytes::Bytes;
use criterion::{BenchmarkId, Criterion, SamplingMode, Throughput, criterion_group};

fn no_checkpoints() -> Options {
    Options::default()
        .with_durability(Durability::Buffered)
        .with_checkpoint_bytes(16 << 30)
}

/// Times `Store::open` on fresh crash copies of `image`, `iters` times.
fn time_crash_opens(image: &Path, iters: u64) -> Duration {
    let mut total = Duration::ZERO;
    for _ in 0..iters {
        let copy = common::tempdir();
        common::copy_crashed(image, copy.path());
        let _ = std::process::Command::new("sync").status();
        let start = Instant::now();
        let store = Store::open(copy.path(), Options::default()).expect("recover");
        total += start.elapsed();
        drop(store);
    }
    total
}

fn names(n: usize) -> Vec<StreamName> {
    (0..n)
        .map(|i| common::name(&format!("tenant-{}/stream-{i:06}", i % 97)))
        .collect()
}

/// Makes a crash image in `dir` in a child process; returns what the child reports (bytes).
fn crash_image(kind: &str, dir: &Path, arg: u64) -> u64 {
    let out = std::process::Command::new(std::env::current_exe().expect("current exe"))
        .env(
            "BROOK_RECOVER_CHILD",
            format!("{kind}:{arg}:{}", dir.display()),
        )
        .output()
        .expect("run the image child");
    assert!(
        out.status.success(),
        "image child failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or(0)
}

/// The child: writes an image, prints a number, and exits without shutting the store down.
fn child(spec: &str) -> ! {
    let mut it = spec.splitn(3, ':');
    let (kind, arg, dir) = (
        it.next().unwrap_or(""),
        it.next().unwrap_or("0"),
        it.next().unwrap_or(""),
    );
    let arg: u64 = arg.parse().expect("child arg");
    let dir = Path::new(dir);
    let buffered = Options::default().with_durability(Durability::Buffered);
    let reported = match kind {
        "journal" => {
            let store = Store::open(dir, no_checkpoints()).expect("open");
            let ns = names(16);
            common::create_many(&store, &ns, "application/octet-stream", 4);
            let body = Bytes::from(vec![b'j'; 4096]);
            let mut written = 0u64;
            let mut pending = Vec::new();
            let mut i = 0;
            while written < arg {
                let req = AppendRequest::new(body.clone());
                pending.push(store.submit_append(&ns[i % ns.len()], req).expect("append"));
                i += 1;
                written += body.len() as u64;
                if pending.len() >= 1024 {
                    for p in pending.drain(..) {
                        p.wait().expect("append");
                    }
                }
            }
            for p in pending {
                p.wait().expect("append");
            }
            std::mem::forget(store); // leaving the arm must not shut the store down
            written
        }
        "created" => {
            let store = Store::open(dir, buffered).expect("open");
            common::create_many(&store, &names(arg as usize), "text/plain", 8);
            std::mem::forget(store);
            arg
        }
        "checkpointed" => {
            let store = Store::open(dir, buffered).expect("open");
            let ns = names(arg as usize);
            common::create_many(&store, &ns, "text/plain", 8);
            store.checkpoint().expect("checkpoint");
            let pending: Vec<_> = ns
                .iter()
                .step_by((arg as usize / 1000).max(1))
                .map(|n| {
                    store
                        .submit_append(n, AppendRequest::new("hello"))
                        .expect("append")
                })
                .collect();
            for p in pending {
                p.wait().expect("append");
            }
            std::mem::forget(store);
            arg
        }
        "churn" => {
            let store = Store::open(dir, no_checkpoints()).expect("open");
            for (i, n) in names(arg as usize).iter().enumerate() {
                store
                    .create(n, brook::CreateOptions::with_content_type("text/plain"))
                    .expect("create");
                store
                    .append(n, AppendRequest::new(format!("churn {i}")))
                    .expect("append");
                store.delete(n, &brook::Guard::NONE).expect("delete");
            }
            std::mem::forget(store);
            arg
        }
        "clean" => {
            let store = Store::open(dir, buffered).expect("open");
            common::create_many(&store, &names(arg as usize), "text/plain", 8);
            store.shutdown().expect("shutdown");
            arg
        }
        k => panic!("unknown image kind {k}"),
    };
    println!("{reported}");
    // A crash: no shutdown, no checkpoint, no destructors.
    std::process::exit(0)
}

fn bench_recover(c: &mut Criterion) {
    let big = common::big();
    let journal: u64 = if big { 1 << 30 } else { 256 << 20 };
    let n_streams: usize = if big { 100_000 } else { 10_000 };
    let mut group = c.benchmark_group("recover");
    group.sampling_mode(SamplingMode::Flat);

    let image = common::tempdir();
    let written = crash_image("journal", image.path(), journal);
    eprintln!(
        "recover: journal image {} bytes on disk",
        common::du(image.path())
    );
    group.throughput(Throughput::Bytes(written));
    group.bench_function(
        BenchmarkId::new("crash/journal", if big { "1GiB" } else { "256MiB" }),
        |b| {
            b.iter_custom(|iters| time_crash_opens(image.path(), iters));
        },
    );
    drop(image);

    for kind in ["created", "checkpointed", "churn"] {
        let image = common::tempdir();
        crash_image(kind, image.path(), n_streams as u64);
        group.throughput(Throughput::Elements(n_streams as u64));
        group.bench_function(BenchmarkId::new(format!("crash/{kind}"), n_streams), |b| {
            b.iter_custom(|iters| time_crash_opens(image.path(), iters));
        });
    }

    // Clean shutdown with many streams: the same directory is opened and shut down again.
    let dir = common::tempdir();
    crash_image("clean", dir.path(), n_streams as u64);
    group.throughput(Throughput::Elements(n_streams as u64));
    group.bench_function(BenchmarkId::new("clean", n_streams), |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let start = Instant::now();
                let store = Store::open(dir.path(), Options::default()).expect("open");
                total += start.elapsed();
                drop(store);
            }
            total
        });
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = common::quick(Criterion::default());
    targets = bench_recover
}

fn main() {
    if let Ok(spec) = std::env::var("BROOK_RECOVER_CHILD") {
        child(&spec);
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
