//! Append throughput (acknowledged appends per second) through `Store::submit_append` +
//! `Pending::wait`: 100 B, 4 KiB and 1 MiB bodies; 1 and 64 closed-loop writer threads; 1 and
//! 1000 streams; `Durability::Sync` and `Durability::Buffered`.
//!
//! `cargo bench --bench append` (filter with e.g. `-- sync/1stream`). `BROOK_BENCH_SECS` sets the
//! measurement time per case (default 3 s); `BROOK_BENCH_DIR` the parent of the store directories.
//! Each case is named `{mode}/{streams}stream/{body}/{writers}w`; criterion reports elements/s,
//! one element being one acknowledged append.

#![expect(missing_docs, reason = "criterion_group! generates undocumented items")]

mod common;

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use brook::{AppendRequest, Durability, Store, StreamName};
use bytes::Bytes;
use criterion::{
    BenchmarkId, Criterion, SamplingMode, Throughput, criterion_group, criterion_main,
};

const BODIES: [(usize, &str); 3] = [(100, "100B"), (4096, "4KiB"), (1 << 20, "1MiB")];
const WRITERS: [usize; 2] = [1, 64];
const STREAMS: [usize; 2] = [1, 1000];

/// Runs `iters` appends on each of `writers` threads (closed loop: submit, wait, repeat) and
/// returns the wall time from the moment all threads are ready until the last ack.
fn run(
    store: &Store,
    names: &Arc<Vec<StreamName>>,
    body: &Bytes,
    writers: usize,
    iters: u64,
) -> Duration {
    let append = |store: &Store, n: &StreamName| {
        let req = AppendRequest::new(body.clone());
        store
            .submit_append(n, req)
            .expect("submit")
            .wait()
            .expect("durable");
    };
    if writers == 1 {
        let start = Instant::now();
        for i in 0..iters as usize {
            append(store, &names[i % names.len()]);
        }
        return start.elapsed();
    }
    let barrier = Arc::new(Barrier::new(writers + 1));
    std::thread::scope(|sc| {
        for t in 0..writers {
            let (store, names, barrier) = (store.clone(), names.clone(), barrier.clone());
            sc.spawn(move || {
                barrier.wait();
                // Writers start on different streams and walk them in step, so with 1000 streams
                // each batch spreads over many of them.
                for i in 0..iters as usize {
                    append(&store, &names[(t * 7919 + i) % names.len()]);
                }
            });
        }
        barrier.wait();
        let start = Instant::now();
        // The scope joins every writer before returning; time it from here.
        start
    })
    .elapsed()
}

fn bench_append(c: &mut Criterion) {
    for durability in [Durability::Sync, Durability::Buffered] {
        for streams in STREAMS {
            let dir = common::tempdir();
            let store = Store::open(dir.path(), common::options(durability)).expect("open");
            let names: Arc<Vec<StreamName>> = Arc::new(
                (0..streams)
                    .map(|i| common::name(&format!("bench/s{i:04}")))
                    .collect(),
            );
            common::create_many(&store, &names, "application/octet-stream", 8);
            let mut group = c.benchmark_group(format!(
                "append/{}/{}stream",
                common::mode_name(durability),
                streams
            ));
            group.sampling_mode(SamplingMode::Flat);
            for (size, label) in BODIES {
                let body = Bytes::from(vec![b'x'; size]);
                for writers in WRITERS {
                    group.throughput(Throughput::Elements(writers as u64));
                    group.bench_function(BenchmarkId::new(label, format!("{writers}w")), |b| {
                        b.iter_custom(|iters| run(&store, &names, &body, writers, iters));
                    });
                }
            }
            group.finish();
            store.shutdown().expect("shutdown");
        }
    }
}

criterion_group! {
    name = benches;
    config = common::quick(Criterion::default());
    targets = bench_append
}
criterion_main!(benches);
