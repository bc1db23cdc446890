//! brook's `Store` against an embedded LSM key-value store (`fjall`) doing brook's job: appends
//! to streams and catch-up reads, at the same durability, in the same process, on the same disk.
//!
//! The fjall side is a stream store written the way a fjall user would write one: one `Database`,
//! a keyspace per stream, keys are big-endian `u64` byte offsets, values are the appended bytes.
//! Each stream keeps its next offset behind a mutex held across offset assignment and `insert`,
//! so a reader never sees a gap (brook gives readers a contiguous prefix; a fjall stream must do
//! the same to be a stream). Durability:
//!
//! * `sync`: brook `Durability::Sync` (an append is acknowledged once its record is `fdatasync`ed)
//!   against fjall `insert` followed by `Database::persist(PersistMode::SyncData)` on the writer's
//!   thread, which is how a fjall user acknowledges a write durably;
//! * `buffered`: brook `Durability::Buffered` (acknowledged once written to the OS) against fjall
//!   `insert` with its default journal handling (flushed to OS buffers on every write, i.e.
//!   `PersistMode::Buffer`, never synced by the writer).
//!
//! Cases, for each mode and each store (`brook`, `fjall`):
//!
//! * `append-100B-1stream-1w`: one writer thread, closed loop, 100 B appends to one stream;
//! * `append-100B-1stream-64w`: 64 writer threads, closed loop, all on one stream;
//! * `append-100B-1000streams-64w`: 64 writer threads over 1000 streams;
//! * `catchup-1MiB`: a reader walks a 1 MiB stream (256 appends of 4 KiB) from the start, copying
//!   every byte once into a reusable buffer. fjall is measured twice: `fjall-memtable` (the data
//!   still in its memtable, as right after writing) and `fjall-flushed` (the memtable flushed to a
//!   table, as for a stream written a while ago; its blocks then come from fjall's cache).
//!
//! Payloads are pseudo-random bytes, so fjall's LZ4 (journal and tables) gains nothing a stream
//! of real, varied data would not give it.
//!
//! `cargo bench --bench embedded` (filter with e.g. `-- sync/append`). `BROOK_BENCH_SECS` sets the
//! measurement time per case (default 3 s); `BROOK_BENCH_DIR` the parent of the store directories
//! (a real disk: `fdatasync` on tmpfs is free). Throughput is in elements/s: one element is one
//! acknowledged append; `catchup-1MiB` reports bytes/s of stream data.

#![allow(missing_docs)] // criterion_group! generates undocumented items

mod common;

use std::sync::Barrier;
use std::time::{Duration, Instant};

use brook::{AppendRequest, Durability, ReadFrom, ReadRequest, Store, StreamName};
use bytes::Bytes;
use criterion::{
    BenchmarkId, Criterion, SamplingMode, Throughput, criterion_group, criterion_main,
};
use fjall::{Database, Keyspace, KeyspaceCreateOptions, PersistMode};
use parking_lot::Mutex;

const SMALL: usize = 100;
const WRITERS: usize = 64;
const MANY: usize = 1000;
const READ_BYTES: usize = 1 << 20;
const READ_APPEND: usize = 4096;

/// Deterministic, incompressible bytes (xorshift64*).
fn noise(len: usize, seed: u64) -> Bytes {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        out.extend_from_slice(&x.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes());
    }
    out.truncate(len);
    out.into()
}

/// Runs `f(thread, i)` for `i in 0..iters` on each of `writers` threads, all started together;
/// returns the wall time from the start until the last call returned.
fn run_threads(writers: usize, iters: u64, f: &(dyn Fn(usize, u64) + Sync)) -> Duration {
    if writers == 1 {
        let start = Instant::now();
        for i in 0..iters {
            f(0, i);
        }
        return start.elapsed();
    }
    let barrier = Barrier::new(writers + 1);
    std::thread::scope(|sc| {
        for t in 0..writers {
            let barrier = &barrier;
            sc.spawn(move || {
                barrier.wait();
                for i in 0..iters {
                    f(t, i);
                }
            });
        }
        barrier.wait();
        // The scope joins every writer before returning; time it from here.
        Instant::now()
    })
    .elapsed()
}

/// Which stream writer `t` appends to on its `i`-th append: writers start on different streams
/// and walk them in step, so with 1000 streams each moment's appends spread over many of them.
fn pick(streams: usize, t: usize, i: u64) -> usize {
    (t * 7919 + i as usize) % streams
}

// ---------------------------------------------------------------------------------------------
// brook

struct BrookSide {
    _dir: tempfile::TempDir,
    store: Store,
    one: Vec<StreamName>,
    many: Vec<StreamName>,
    read: StreamName,
}

impl BrookSide {
    fn open(d: Durability) -> BrookSide {
        let dir = common::tempdir();
        let store = Store::open(dir.path(), common::options(d)).expect("open brook");
        let one = vec![common::name("bench/one")];
        let many: Vec<StreamName> = (0..MANY)
            .map(|i| common::name(&format!("bench/s{i:04}")))
            .collect();
        let read = common::name("bench/read");
        common::create_many(&store, &one, "application/octet-stream", 1);
        common::create_many(&store, &many, "application/octet-stream", 8);
        common::create_many(
            &store,
            std::slice::from_ref(&read),
            "application/octet-stream",
            1,
        );
        let pending: Vec<_> = (0..READ_BYTES / READ_APPEND)
            .map(|k| {
                let req = AppendRequest::new(noise(READ_APPEND, k as u64));
                store.submit_append(&read, req).expect("fill")
            })
            .collect();
        for p in pending {
            p.wait().expect("fill durable");
        }
        BrookSide {
            _dir: dir,
            store,
            one,
            many,
            read,
        }
    }

    fn append(&self, n: &StreamName, data: &Bytes) {
        let req = AppendRequest::new(data.clone());
        self.store
            .submit_append(n, req)
            .expect("submit")
            .wait()
            .expect("acknowledged");
    }

    /// Reads the whole stream from the start; returns the bytes copied.
    fn read_all(&self, buf: &mut Vec<u8>) -> u64 {
        let mut from = ReadFrom::Start;
        let mut total = 0u64;
        loop {
            let chunk = self
                .store
                .read(&self.read, &ReadRequest::from(from))
                .expect("read");
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
}

// ---------------------------------------------------------------------------------------------
// fjall

/// A stream on fjall: its keyspace and its next byte offset.
struct FjallStream {
    ks: Keyspace,
    next: Mutex<u64>,
}

impl FjallStream {
    /// Appends `data` at the stream's tail (offset assignment and insert under the stream's lock,
    /// so the keys a reader sees are contiguous); returns when fjall has written it to the OS.
    fn insert(&self, data: &Bytes) {
        let mut next = self.next.lock();
        self.ks
            .insert(next.to_be_bytes(), data.as_ref())
            .expect("insert");
        *next += data.len() as u64;
    }
}

struct FjallSide {
    _dir: tempfile::TempDir,
    db: Database,
    durable: bool,
    one: Vec<FjallStream>,
    many: Vec<FjallStream>,
    read: FjallStream,
}

impl FjallSide {
    fn open(d: Durability) -> FjallSide {
        let dir = common::tempdir();
        let db = Database::builder(dir.path()).open().expect("open fjall");
        let stream = |name: &str| FjallStream {
            ks: db
                .keyspace(name, KeyspaceCreateOptions::default)
                .expect("keyspace"),
            next: Mutex::new(0),
        };
        let one = vec![stream("one")];
        let many: Vec<FjallStream> = (0..MANY).map(|i| stream(&format!("s{i:04}"))).collect();
        let read = stream("read");
        db.persist(PersistMode::SyncAll).expect("persist");
        let side = FjallSide {
            _dir: dir,
            durable: d == Durability::Sync,
            db,
            one,
            many,
            read,
        };
        for k in 0..READ_BYTES / READ_APPEND {
            side.read.insert(&noise(READ_APPEND, k as u64));
        }
        side.db.persist(PersistMode::SyncData).expect("persist");
        side
    }

    /// One acknowledged append: in the durable mode the writer then syncs fjall's journal.
    fn append(&self, s: &FjallStream, data: &Bytes) {
        s.insert(data);
        if self.durable {
            self.db.persist(PersistMode::SyncData).expect("persist");
        }
    }

    /// Reads the whole read stream from offset 0 in key order; returns the bytes copied.
    fn read_all(&self, buf: &mut Vec<u8>) -> u64 {
        buf.clear();
        for kv in self.read.ks.range(0u64.to_be_bytes()..) {
            let (_, v) = kv.into_inner().expect("read");
            buf.extend_from_slice(&v);
        }
        buf.len() as u64
    }
}

// ---------------------------------------------------------------------------------------------
// The cases

fn bench_embedded(c: &mut Criterion) {
    let body = noise(SMALL, 42);
    for durability in [Durability::Sync, Durability::Buffered] {
        let mode = common::mode_name(durability);
        let brook = BrookSide::open(durability);
        let fjall = FjallSide::open(durability);

        let cases: [(&str, usize, usize); 3] = [
            ("append-100B-1stream-1w", 1, 1),
            ("append-100B-1stream-64w", 1, WRITERS),
            ("append-100B-1000streams-64w", MANY, WRITERS),
        ];
        for (case, streams, writers) in cases {
            let mut group = c.benchmark_group(format!("embedded/{mode}/{case}"));
            group.sampling_mode(SamplingMode::Flat);
            group.throughput(Throughput::Elements(writers as u64));
            let names = if streams == 1 {
                &brook.one
            } else {
                &brook.many
            };
            group.bench_function(BenchmarkId::from_parameter("brook"), |b| {
                b.iter_custom(|iters| {
                    run_threads(writers, iters, &|t, i| {
                        brook.append(&names[pick(streams, t, i)], &body);
                    })
                });
            });
            let ks = if streams == 1 {
                &fjall.one
            } else {
                &fjall.many
            };
            group.bench_function(BenchmarkId::from_parameter("fjall"), |b| {
                b.iter_custom(|iters| {
                    run_threads(writers, iters, &|t, i| {
                        fjall.append(&ks[pick(streams, t, i)], &body);
                    })
                });
            });
            group.finish();
        }

        let mut group = c.benchmark_group(format!("embedded/{mode}/catchup-1MiB"));
        let mut buf = Vec::with_capacity(2 * READ_BYTES);
        let len = brook.read_all(&mut buf); // warm the page cache and the maps
        assert_eq!(len, READ_BYTES as u64);
        assert_eq!(fjall.read_all(&mut buf), len, "fjall holds the same stream");
        group.throughput(Throughput::Bytes(len));
        group.bench_function(BenchmarkId::from_parameter("brook"), |b| {
            b.iter(|| brook.read_all(&mut buf));
        });
        group.bench_function(BenchmarkId::from_parameter("fjall-memtable"), |b| {
            b.iter(|| fjall.read_all(&mut buf));
        });
        fjall
            .read
            .ks
            .rotate_memtable_and_wait()
            .expect("flush the memtable");
        assert_eq!(fjall.read_all(&mut buf), len, "fjall after the flush");
        group.bench_function(BenchmarkId::from_parameter("fjall-flushed"), |b| {
            b.iter(|| fjall.read_all(&mut buf));
        });
        group.finish();

        brook.store.shutdown().expect("shutdown");
    }
}

criterion_group! {
    name = benches;
    config = common::quick(Criterion::default());
    targets = bench_embedded
}
criterion_main!(benches);
