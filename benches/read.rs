//! Catch-up read throughput from the page cache: a reader walks a whole 1 MiB or 64 MiB stream
//! from the start with `Store::read` (default chunk bound, 8 MiB), copying every piece once into
//! a reusable buffer, as a socket write would. Byte streams (4 KiB appends) and JSON streams
//! (about 100-byte messages, appended in arrays of 100).
//!
//! `cargo bench --bench read`. Criterion reports bytes/s of stream data.

#![expect(missing_docs, reason = "criterion_group! generates undocumented items")]

mod common;

use std::fmt::Write as _;

use brook::{AppendRequest, CreateOptions, Durability, ReadFrom, ReadRequest, Store, StreamName};
use bytes::Bytes;
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};

const SIZES: [(usize, &str); 2] = [(1 << 20, "1MiB"), (64 << 20, "64MiB")];

fn fill(store: &Store, n: &StreamName, json: bool, size: usize) {
    let ct = if json {
        "application/json"
    } else {
        "application/octet-stream"
    };
    store
        .create(n, CreateOptions::with_content_type(ct))
        .expect("create");
    let mut written = 0;
    let mut i = 0u64;
    let mut pending = Vec::new();
    while written < size {
        let data: Bytes = if json {
            let mut s = String::from("[");
            for k in 0..100 {
                if k > 0 {
                    s.push(',');
                }
                // About 100 bytes per message.
                let _ = write!(
                    s,
                    "{{\"id\":{i:>12},\"kind\":\"event\",\"payload\":\"{:0>56}\"}}",
                    i % 1000
                );
                i += 1;
            }
            s.push(']');
            s.into()
        } else {
            Bytes::from(vec![b'a' + (i % 26) as u8; 4096])
        };
        i += 1;
        written += data.len();
        pending.push(
            store
                .submit_append(n, AppendRequest::new(data))
                .expect("append"),
        );
        if pending.len() >= 256 {
            for p in pending.drain(..) {
                p.wait().expect("durable");
            }
        }
    }
    for p in pending {
        p.wait().expect("durable");
    }
}

/// Reads the whole stream from the start; returns the bytes copied.
fn read_all(store: &Store, n: &StreamName, buf: &mut Vec<u8>) -> u64 {
    let mut from = ReadFrom::Start;
    let mut total = 0u64;
    loop {
        let chunk = store.read(n, &ReadRequest::from(from)).expect("read");
        buf.clear();
        for piece in &chunk.body {
            buf.extend_from_slice(piece);
        }
        total += buf.len() as u64;
        if chunk.up_to_date {
            return total;
        }
        from = ReadFrom::At(chunk.next);
    }
}

fn bench_read(c: &mut Criterion) {
    let dir = common::tempdir();
    let store = Store::open(dir.path(), common::options(Durability::Buffered)).expect("open");
    let mut group = c.benchmark_group("read");
    let mut buf = Vec::with_capacity(9 << 20);
    for json in [false, true] {
        for (size, label) in SIZES {
            let n = common::name(&format!(
                "read/{}/{label}",
                if json { "json" } else { "bytes" }
            ));
            fill(&store, &n, json, size);
            let len = read_all(&store, &n, &mut buf); // warm the page cache and the maps
            group.throughput(Throughput::Bytes(len));
            group.bench_function(
                BenchmarkId::new(if json { "json" } else { "bytes" }, label),
                |b| {
                    b.iter(|| read_all(&store, &n, &mut buf));
                },
            );
        }
    }
    group.finish();
    store.shutdown().expect("shutdown");
}

criterion_group! {
    name = benches;
    config = common::quick(Criterion::default());
    targets = bench_read
}
criterion_main!(benches);
