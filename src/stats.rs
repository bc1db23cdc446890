//! The engine's running figures: cheap atomic counters and fixed-bucket histograms bumped on the
//! write, read and checkpoint paths ([`Counters`]), and the plain snapshot of them that
//! [`Store::stats`](crate::Store::stats) returns ([`Stats`]).
//!
//! Recording costs a few relaxed atomic adds: no lock, no allocation. The HTTP server exposes
//! the snapshot in Prometheus form (`GET /__brook/metrics`); an embedding program can read it
//! directly.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Upper bounds (seconds) of the latency histograms' buckets: 50 us to 10 s.
pub(crate) const LATENCY_BOUNDS: &[f64] = &[
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0,
];

/// Upper bounds of the group-commit batch-size histogram's buckets (records per batch).
pub(crate) const BATCH_BOUNDS: &[f64] = &[
    1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 4096.0,
];

/// The most buckets any histogram here has (its bounds, plus the `+Inf` bucket).
const MAX_BUCKETS: usize = 18;

/// A histogram of observations as counts per bucket, read from the engine at one moment.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Histogram {
    /// Each bucket's upper bound and the observations at or below it (cumulative, as
    /// Prometheus wants them); the observations above the last bound count only in `count`.
    pub buckets: Vec<(f64, u64)>,
    /// The sum of every observation (seconds for latencies, records for batch sizes).
    pub sum: f64,
    /// How many observations there were.
    pub count: u64,
}

/// The engine's figures at one moment: counters since the store was opened, and gauges.
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct Stats {
    /// Appends accepted (including close-only appends and each create's initial data).
    pub appends: u64,
    /// Bytes those appends carried (in the stored representation).
    pub append_bytes: u64,
    /// Reads served (catch-up chunks, live reads, bootstrap message batches).
    pub reads: u64,
    /// Bytes those reads returned.
    pub read_bytes: u64,
    /// Streams created (forks included; an idempotent re-create is not counted).
    pub creates: u64,
    /// Streams deleted (including expired ones).
    pub deletes: u64,
    /// Records per journal batch: how many appends each group commit covered.
    pub commit_batch_records: Histogram,
    /// Seconds each journal `fdatasync` took (Sync mode only).
    pub journal_sync_seconds: Histogram,
    /// Seconds each checkpoint took (its two file-system syncs and the sidecars in between).
    pub checkpoint_seconds: Histogram,
    /// Streams open now (in the registry: their state and index maps in memory; their files
    /// open unless at rest).
    pub open_streams: u64,
    /// Streams closed by the open-stream cache whose state stays in memory (their resident
    /// records): opening one again reads neither its sidecar nor its directory listing.
    pub resident_streams: u64,
    /// Checkpoint files (DESIGN.md 2.8) holding some stream's newest image, over every shard.
    pub checkpoint_files: u64,
    /// Their bytes.
    pub checkpoint_file_bytes: u64,
    /// Stream images checkpoints have written to checkpoint files since the store opened (the
    /// streams they recorded without a sidecar write).
    pub checkpoint_images: u64,
    /// Streams opened from their files since the store opened (sidecar read, directory
    /// listed): lookups that found the stream neither open nor resident. After a stream's
    /// first open in a process its record keeps it resident, so this grows with the streams
    /// touched, not with the requests.
    pub stream_loads: u64,
    /// Descriptors the open streams' segment files hold now: kept within `max_stream_files`
    /// by putting idle streams at rest (their files closed, reopened on their next use).
    pub stream_files: u64,
    /// The descriptors the segment files may hold now (`max_stream_files`, or what
    /// [`Store::set_max_stream_files`](crate::Store::set_max_stream_files) set since).
    pub stream_file_budget: u64,
    /// Journal shards of the store.
    pub journal_shards: u64,
    /// Journal shards poisoned by a failed write or sync (0 on a healthy store).
    pub poisoned_shards: u64,
    /// Journal bytes the last open replayed.
    pub recovered_journal_bytes: u64,
    /// Streams the last open's replay touched.
    pub recovered_streams: u64,
    /// How long the last open took, in seconds.
    pub recovery_seconds: f64,
    /// Cold tier (feature `tier`; all zero without one): objects uploaded and verified.
    pub tier_uploads: u64,
    /// Bytes of those objects.
    pub tier_upload_bytes: u64,
    /// Failed tier operations: passes that failed (each retried with backoff) and cold reads.
    pub tier_failures: u64,
    /// Local segment logs removed because the tier holds them (the local budget was exceeded).
    pub tier_evictions: u64,
    /// Bytes of those logs.
    pub tier_evicted_bytes: u64,
    /// Cold reads served from the block cache.
    pub tier_cache_hits: u64,
    /// Cold reads that fetched a block from the tier.
    pub tier_cache_misses: u64,
    /// Bytes fetched from the tier for cold reads.
    pub tier_fetch_bytes: u64,
    /// Objects deleted from the tier (retention, deleted streams and snapshots).
    pub tier_deletes: u64,
    /// Streams waiting for the tier's next pass.
    pub tier_pending_streams: u64,
    /// Bytes of uploaded segment logs still on the local disk (what the local budget bounds).
    pub tier_local_bytes: u64,
    /// Bytes in the cold block cache now.
    pub tier_cache_bytes: u64,
    /// What the retention enforcer did.
    pub retention: crate::RetentionStats,
}

/// A histogram of fixed buckets, recorded with relaxed atomic adds.
pub(crate) struct AtomicHistogram {
    /// Upper bounds of the buckets (the last bucket, `+Inf`, has none).
    bounds: &'static [f64],
    /// Observations per bucket (not cumulative); index `bounds.len()` is `+Inf`.
    counts: [AtomicU64; MAX_BUCKETS],
    /// The sum of the observations, in millionths of their unit (microseconds for latencies).
    sum_micros: AtomicU64,
}

impl AtomicHistogram {
    /// An empty histogram over `bounds` (at most `MAX_BUCKETS - 1` of them, ascending).
    pub(crate) fn new(bounds: &'static [f64]) -> AtomicHistogram {
        debug_assert!(bounds.len() < MAX_BUCKETS);
        AtomicHistogram {
            bounds,
            counts: std::array::from_fn(|_| AtomicU64::new(0)),
            sum_micros: AtomicU64::new(0),
        }
    }

    /// Records one observation of `value` (in the bounds' unit).
    pub(crate) fn observe(&self, value: f64) {
        let i = self
            .bounds
            .iter()
            .position(|b| value <= *b)
            .unwrap_or(self.bounds.len());
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        self.sum_micros
            .fetch_add((value * 1e6) as u64, Ordering::Relaxed);
    }

    /// Records a duration, in seconds.
    pub(crate) fn observe_duration(&self, d: Duration) {
        self.observe(d.as_secs_f64());
    }

    /// The histogram as it stands, with cumulative buckets.
    pub(crate) fn snapshot(&self) -> Histogram {
        let mut buckets = Vec::with_capacity(self.bounds.len());
        let mut running = 0;
        for (i, b) in self.bounds.iter().enumerate() {
            running += self.counts[i].load(Ordering::Relaxed);
            buckets.push((*b, running));
        }
        let count = running + self.counts[self.bounds.len()].load(Ordering::Relaxed);
        Histogram {
            buckets,
            sum: self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6,
            count,
        }
    }
}

/// The engine's counters, shared by the store's threads (one per store, behind an `Arc`).
pub(crate) struct Counters {
    /// See [`Stats::appends`].
    pub(crate) appends: AtomicU64,
    /// See [`Stats::append_bytes`].
    pub(crate) append_bytes: AtomicU64,
    /// See [`Stats::reads`].
    pub(crate) reads: AtomicU64,
    /// See [`Stats::read_bytes`].
    pub(crate) read_bytes: AtomicU64,
    /// See [`Stats::creates`].
    pub(crate) creates: AtomicU64,
    /// See [`Stats::deletes`].
    pub(crate) deletes: AtomicU64,
    /// See [`Stats::commit_batch_records`].
    pub(crate) batch_records: AtomicHistogram,
    /// See [`Stats::journal_sync_seconds`].
    pub(crate) journal_sync: AtomicHistogram,
    /// See [`Stats::checkpoint_seconds`].
    pub(crate) checkpoint: AtomicHistogram,
    /// Checkpoints that have recorded their streams' sidecars (and so made those streams
    /// closable): what tells the registry's eviction that a scan may find something new.
    pub(crate) sidecars_written: AtomicU64,
    /// Stream images written to checkpoint files (2.8).
    pub(crate) checkpoint_images: AtomicU64,
    /// See [`Stats::stream_loads`].
    pub(crate) stream_loads: AtomicU64,
    /// See [`Stats::retention`].
    pub(crate) retention: crate::retention::RetentionCounters,
    /// The descriptors the streams' segment files hold (see [`Stats::stream_files`]).
    pub(crate) stream_files: std::sync::Arc<crate::segment::SegmentUse>,
}

impl Default for Counters {
    /// Every counter at zero.
    fn default() -> Self {
        Counters {
            appends: AtomicU64::new(0),
            append_bytes: AtomicU64::new(0),
            reads: AtomicU64::new(0),
            read_bytes: AtomicU64::new(0),
            creates: AtomicU64::new(0),
            deletes: AtomicU64::new(0),
            batch_records: AtomicHistogram::new(BATCH_BOUNDS),
            journal_sync: AtomicHistogram::new(LATENCY_BOUNDS),
            checkpoint: AtomicHistogram::new(LATENCY_BOUNDS),
            sidecars_written: AtomicU64::new(0),
            checkpoint_images: AtomicU64::new(0),
            stream_loads: AtomicU64::new(0),
            retention: crate::retention::RetentionCounters::default(),
            stream_files: std::sync::Arc::default(),
        }
    }
}

impl Counters {
    /// Counts one accepted append of `bytes`.
    pub(crate) fn appended(&self, bytes: usize) {
        self.appends.fetch_add(1, Ordering::Relaxed);
        self.append_bytes.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    /// Counts one read that returned `bytes`.
    pub(crate) fn read(&self, bytes: u64) {
        self.reads.fetch_add(1, Ordering::Relaxed);
        self.read_bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    /// The counters' part of a [`Stats`] (the gauges are the engine's to fill in).
    pub(crate) fn snapshot(&self) -> Stats {
        Stats {
            appends: self.appends.load(Ordering::Relaxed),
            append_bytes: self.append_bytes.load(Ordering::Relaxed),
            reads: self.reads.load(Ordering::Relaxed),
            read_bytes: self.read_bytes.load(Ordering::Relaxed),
            creates: self.creates.load(Ordering::Relaxed),
            deletes: self.deletes.load(Ordering::Relaxed),
            stream_loads: self.stream_loads.load(Ordering::Relaxed),
            commit_batch_records: self.batch_records.snapshot(),
            journal_sync_seconds: self.journal_sync.snapshot(),
            checkpoint_seconds: self.checkpoint.snapshot(),
            retention: self.retention.snapshot(),
            ..Stats::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative_and_count_the_overflow() {
        let h = AtomicHistogram::new(&[1.0, 2.0]);
        h.observe(0.5);
        h.observe(2.0);
        h.observe(3.0);
        let s = h.snapshot();
        assert_eq!(s.buckets, vec![(1.0, 1), (2.0, 2)]);
        assert_eq!(s.count, 3);
        assert!((s.sum - 5.5).abs() < 1e-9);
    }
}
