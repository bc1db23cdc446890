//! Open time of a store:
//! * `crash/journal/{size}`: after a crash-like stop (`std::mem::forget(store)`, then the directory
//!   copied without its `LOCK`) with `size` of 4 KiB appends in the journal (checkpoints disabled
//!   by a 16 GiB `checkpoint_bytes`), so the open replays all of it. Bytes/s of journal.
//! * `crash/created/{n}`: after a crash with `n` streams created since the last checkpoint
//!   (every Create record replayed). Elements/s = streams/s.
//! * `crash/checkpointed/{n}`: `n` checkpointed streams on disk, then one append on each of 1000
//!   of them before the crash. Elements/s counts the `n` streams on disk.
//! * `clean/{n}`: `n` streams on disk after a clean shutdown.
//!
//! The copy is `sync`ed before each timed open, so the open's own checkpoint does not pay for
//! writing back the copy. The copy is warm in the page cache (a warm restart).
//!
//! `cargo bench --bench recover`. Defaults: 256 MiB journal, 10k streams. `BROOK_BENCH_BIG=1`:
//! 1 GiB journal and 100k streams (slow: minutes, mostly copying directories between samples).

#![allow(missing_docs)] // criterion_group! generates undocumented items

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use brook::{AppendRequest, Durability, Options, Store, StreamName};
use bytes::Bytes;
use criterion::{BenchmarkId, Criterion, SamplingMode, Throughput, criterion_group, criterion_main};

fn no_checkpoints() -> Options {
    Options::default().durability(Durability::Buffered).checkpoint_bytes(16 << 30)
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
    (0..n).map(|i| common::name(&format!("tenant-{}/stream-{i:06}", i % 97))).collect()
}

fn bench_recover(c: &mut Criterion) {
    let big = common::big();
    let journal: u64 = if big { 1 << 30 } else { 256 << 20 };
    let n_streams: usize = if big { 100_000 } else { 10_000 };
    let mut group = c.benchmark_group("recover");
    group.sampling_mode(SamplingMode::Flat);

    // Crash with a large journal.
    {
        let image = common::tempdir();
        let store = Store::open(image.path(), no_checkpoints()).expect("open");
        let ns = names(16);
        common::create_many(&store, &ns, "application/octet-stream", 4);
        let body = Bytes::from(vec![b'j'; 4096]);
        let mut written = 0u64;
        let mut pending = Vec::new();
        let mut i = 0;
        while written < journal {
            let req = AppendRequest { data: body.clone(), ..Default::default() };
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
        std::mem::forget(store); // a crash: no shutdown, no checkpoint
        let label = if big { "1GiB" } else { "256MiB" };
        eprintln!("recover: journal image {} bytes on disk", common::du(image.path()));
        group.throughput(Throughput::Bytes(written));
        group.bench_function(BenchmarkId::new("crash/journal", label), |b| {
            b.iter_custom(|iters| time_crash_opens(image.path(), iters));
        });
    }

    // Crash with every stream created since the last checkpoint.
    {
        let image = common::tempdir();
        let store = Store::open(image.path(), no_checkpoints()).expect("open");
        common::create_many(&store, &names(n_streams), "text/plain", 8);
        std::mem::forget(store);
        group.throughput(Throughput::Elements(n_streams as u64));
        group.bench_function(BenchmarkId::new("crash/created", n_streams), |b| {
            b.iter_custom(|iters| time_crash_opens(image.path(), iters));
        });
    }

    // Crash with checkpointed streams on disk and a small journal.
    {
        let image = common::tempdir();
        let store = Store::open(image.path(), no_checkpoints()).expect("open");
        let ns = names(n_streams);
        common::create_many(&store, &ns, "text/plain", 8);
        store.checkpoint().expect("checkpoint");
        let pending: Vec<_> = ns
            .iter()
            .step_by(n_streams / 1000)
            .map(|n| store.submit_append(n, AppendRequest { data: "hello".into(), ..Default::default() }).expect("append"))
            .collect();
        for p in pending {
            p.wait().expect("append");
        }
        std::mem::forget(store);
        group.throughput(Throughput::Elements(n_streams as u64));
        group.bench_function(BenchmarkId::new("crash/checkpointed", n_streams), |b| {
            b.iter_custom(|iters| time_crash_opens(image.path(), iters));
        });
    }

    // Clean shutdown with many streams.
    {
        let dir = common::tempdir();
        {
            let store = Store::open(dir.path(), no_checkpoints()).expect("open");
            common::create_many(&store, &names(n_streams), "text/plain", 8);
            store.shutdown().expect("shutdown");
        }
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
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = common::quick(Criterion::default());
    targets = bench_recover
}
criterion_main!(benches);
